"""The ``basic`` authentication provider (Pulsar's AuthenticationProviderBasic): a user name and
password checked against an htpasswd file.

- ``basic_auth_conf`` is read as Pulsar reads key values (``keys.read_key``: a path, a
  ``file://`` or ``data:`` URL, or base64 of the file). Its lines are ``user:hash``; blank lines
  and ``#`` comments are skipped. A line that is not ``user:hash`` with a hash of a known kind,
  or a user named twice, is a start-up error naming the line, never its hash.
- Hashes as Apache's ``htpasswd`` writes them: ``$apr1$`` (``-m``, the MD5-based crypt),
  traditional DES crypt (``-d``, 13 characters; only a password's first 8 bytes count) and
  bcrypt (``-B``: ``$2y$``, ``$2b$``, ``$2a$``; only the first 72 bytes count, as in Apache).
- On the binary protocol the client's ``auth_data`` is ``user:password`` (the official clients'
  AuthenticationBasic, method ``basic``); over HTTP it is the base64 after ``Basic`` in the
  ``Authorization`` header (:func:`from_http_header`). The user name is the role.
- An unknown user and a wrong password get the same refusal, and no refusal repeats the
  password or a hash. The hash libraries compare in constant time.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from enum import Enum

import bcrypt
from passlib.hash import apr_md5_crypt, des_crypt

from magnetar.common.auth.keys import KeyConfigError, read_key
from magnetar.common.auth.provider import Authenticated, AuthenticationError, Credentials

#: Longest credential examined; a larger one is refused before it is parsed.
MAX_CREDENTIALS_BYTES = 64 * 1024
#: bcrypt reads no further than this; Apache's htpasswd hashed only these bytes.
BCRYPT_PASSWORD_BYTES = 72
REFUSED = "Unknown user or wrong password"

_SALT_CHARS = "[./0-9A-Za-z]"


class HashKind(Enum):
    APR1 = "apr1"
    DES_CRYPT = "crypt"
    BCRYPT = "bcrypt"


_HASH_FORMS = (
    (HashKind.APR1, re.compile(rf"\$apr1\${_SALT_CHARS}{{1,8}}\${_SALT_CHARS}{{22}}")),
    (HashKind.BCRYPT, re.compile(rf"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\${_SALT_CHARS}{{53}}")),
    (HashKind.DES_CRYPT, re.compile(rf"{_SALT_CHARS}{{13}}")),
)


@dataclass(slots=True, frozen=True)
class PasswordHash:
    """One user's hash from the htpasswd file (kept out of ``repr`` so it never reaches a log)."""

    kind: HashKind
    text: str = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> PasswordHash:
        for kind, form in _HASH_FORMS:
            if form.fullmatch(text):
                return cls(kind, text)
        raise ValueError(
            "the hash is not an $apr1$, bcrypt ($2y$, $2b$, $2a$) or 13-character crypt hash "
            "(make it with htpasswd -m, -B or -d)"
        )

    def matches(self, password: bytes) -> bool:
        try:
            if self.kind is HashKind.APR1:
                return apr_md5_crypt.verify(password, self.text)
            if self.kind is HashKind.DES_CRYPT:
                return des_crypt.verify(password, self.text)
            return bcrypt.checkpw(password[:BCRYPT_PASSWORD_BYTES], self.text.encode())
        except ValueError:  # e.g. a NUL byte, which no crypt password can hold
            return False


def parse_htpasswd(content: bytes, setting: str = "basic_auth_conf") -> dict[str, PasswordHash]:
    """The users and hashes of an htpasswd file; ``KeyConfigError`` names a bad line by number."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyConfigError(f"{setting}: the htpasswd file is not UTF-8 text") from None
    users: dict[str, PasswordHash] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed or ":" in hashed:
            raise KeyConfigError(f"{setting}: line {number} is not user:hash")
        try:
            password_hash = PasswordHash.parse(hashed)
        except ValueError as e:
            raise KeyConfigError(f"{setting}: line {number} (user {user!r}): {e}") from None
        if user in users:
            raise KeyConfigError(f"{setting}: line {number} names user {user!r} a second time")
        users[user] = password_hash
    if not users:
        raise KeyConfigError(f"{setting}: the htpasswd file names no user")
    return users


def from_http_header(value: str) -> Credentials:
    """The credentials of an HTTP ``Authorization: Basic <base64>`` header, ``value`` being what
    follows the scheme: the same ``user:password`` bytes the binary protocol carries."""
    value = value.strip()
    if len(value) > MAX_CREDENTIALS_BYTES * 4 // 3 + 4:
        raise AuthenticationError(f"credentials longer than {MAX_CREDENTIALS_BYTES} bytes")
    try:
        return Credentials(data=base64.b64decode(value, validate=True))
    except ValueError:  # binascii.Error, or a character outside ASCII
        raise AuthenticationError("Basic credentials are not valid base64") from None


class BasicAuthenticator:
    """Checks ``user:password`` credentials against the htpasswd file named by ``conf`` (the
    ``basic_auth_conf`` value), read once at start-up (``KeyConfigError`` if unusable)."""

    method = "basic"

    def __init__(self, conf: str) -> None:
        if not conf:
            raise KeyConfigError("the basic provider needs basic_auth_conf")
        self._users = parse_htpasswd(read_key(conf, "basic_auth_conf"))

    @property
    def users(self) -> frozenset[str]:
        """The user names the file holds (for start-up logs; never the hashes)."""
        return frozenset(self._users)

    def authenticate(self, credentials: Credentials) -> Authenticated:
        data = credentials.data
        if not data:
            raise AuthenticationError("no credentials given")
        if len(data) > MAX_CREDENTIALS_BYTES:
            raise AuthenticationError(f"credentials longer than {MAX_CREDENTIALS_BYTES} bytes")
        user_bytes, sep, password = data.partition(b":")
        if not sep:
            raise AuthenticationError("basic credentials must be user:password")
        try:
            user = user_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError(REFUSED) from None
        known = self._users.get(user)
        if known is None or not known.matches(password):
            raise AuthenticationError(REFUSED)
        return Authenticated(role=user, expires_at=None)
