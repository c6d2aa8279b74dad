"""The basic provider's rules, without a broker: htpasswd files read as Pulsar reads
``basicAuthConf``, passwords accepted and refused as Pulsar's AuthenticationProviderBasic does.
The hashes come from tools other than the verifier: Apache's htpasswd (recorded below, and run
again when installed), ``openssl passwd -apr1`` and the bcrypt package."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import bcrypt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.auth.basic import (
    MAX_CREDENTIALS_BYTES,
    REFUSED,
    BasicAuthenticator,
    from_http_header,
)
from magnetar.common.auth.keys import KeyConfigError
from magnetar.common.auth.provider import AuthenticationError, Credentials

LONG_PASSWORD = "d" * 80
#: Users and passwords of HTPASSWD.
PASSWORDS = {
    "alice": "apr1 secret",
    "bob": "des1",
    "carol": "bcrypt secret: with colon",
    "dave": LONG_PASSWORD,
    "eve": "pässwörd",
}
#: Written by Apache's htpasswd 2.4.71: -m (alice, eve), -d (bob), -B -C 4 (carol, dave).
HTPASSWD = """\
# made with htpasswd -nb[m|d|B]
alice:$apr1$viCuwyCv$40nCCOpGZqWgOl2tr8Ynm/
bob:VMHb1qyI.O4cE

carol:$2y$04$9WYGXNZ3w231qHVbUPB28uqkPNkcfFXWkU6At8bkSEZPWt..n.2Zy
dave:$2y$04$oWxmldDAp67MdcUDGuMwseMnNViFTSwL2z3sVryP41jbaKg0MMP7q
eve:$apr1$67hJXuw/$DiC01aZldjpJdtM.RSCNn.
"""


def data_url(content: str | bytes) -> str:
    raw = content.encode() if isinstance(content, str) else content
    return "data:;base64," + base64.b64encode(raw).decode()


def basic(user: str, password: str | bytes) -> Credentials:
    secret = password.encode() if isinstance(password, str) else password
    return Credentials(data=user.encode() + b":" + secret)


@pytest.fixture(scope="module")
def auth() -> BasicAuthenticator:
    return BasicAuthenticator(data_url(HTPASSWD))


@pytest.mark.parametrize("user", sorted(PASSWORDS))
def test_htpasswd_users_are_accepted_with_their_password(
    auth: BasicAuthenticator, user: str
) -> None:
    found = auth.authenticate(basic(user, PASSWORDS[user]))
    assert (found.role, found.expires_at) == (user, None)
    assert auth.method == "basic"


def test_each_value_form_of_basic_auth_conf_is_read(tmp_path: Path) -> None:
    path = tmp_path / "htpasswd"
    path.write_text(HTPASSWD)
    for conf in (
        str(path),
        f"file://{path}",
        data_url(HTPASSWD),
        base64.b64encode(HTPASSWD.encode()).decode(),
    ):
        assert BasicAuthenticator(conf).users == frozenset(PASSWORDS), conf


def test_hashes_made_by_other_tools_are_accepted(tmp_path: Path) -> None:
    lines = [
        "b2b:" + bcrypt.hashpw(b"two b", bcrypt.gensalt(4, prefix=b"2b")).decode(),
        "b2a:" + bcrypt.hashpw(b"two a", bcrypt.gensalt(4, prefix=b"2a")).decode(),
    ]
    passwords = {"b2b": "two b", "b2a": "two a"}
    if shutil.which("openssl"):
        made = subprocess.run(
            ["openssl", "passwd", "-apr1", "openssl made"],
            capture_output=True,
            text=True,
            check=True,
        )
        lines.append("ossl:" + made.stdout.strip())
        passwords["ossl"] = "openssl made"
    auth = BasicAuthenticator(data_url("\r\n".join(lines) + "\r\n"))  # CRLF lines too
    for user, password in passwords.items():
        assert auth.authenticate(basic(user, password)).role == user
        with pytest.raises(AuthenticationError):
            auth.authenticate(basic(user, password + "!"))


def test_a_file_htpasswd_writes_now_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "users"
    for flag, user in (("-m", "md5"), ("-d", "crypt"), ("-B", "bcrypt")):
        create = ["-c"] if not path.exists() else []
        subprocess.run(
            ["htpasswd", "-b", *create, flag, str(path), user, f"{user} pw"],
            capture_output=True,
            check=True,
        )
    auth = BasicAuthenticator(f"file://{path}")
    for user in ("md5", "crypt", "bcrypt"):
        assert auth.authenticate(basic(user, f"{user} pw")).role == user


def test_refusals_are_the_same_for_unknown_users_and_wrong_passwords(
    auth: BasicAuthenticator,
) -> None:
    refused = {
        "wrong password": basic("alice", "apr1 secreT"),
        "unknown user": basic("mallory", "apr1 secret"),
        "empty password": basic("alice", ""),
        "truncated password": basic("carol", PASSWORDS["carol"][:-1]),
        "another user's password": basic("alice", PASSWORDS["carol"]),
        "user name not UTF-8": Credentials(data=b"\xff\xfe:apr1 secret"),
        "NUL in a crypt password": basic("bob", b"des1\x00"),
        "empty user": basic("", "apr1 secret"),
    }
    for what, credentials in refused.items():
        with pytest.raises(AuthenticationError) as refusal:
            auth.authenticate(credentials)
        assert str(refusal.value) == REFUSED, what


def test_malformed_or_oversized_credentials_are_refused_without_echo(
    auth: BasicAuthenticator,
) -> None:
    huge = b"alice:" + b"a" * (1024 * 1024)
    for data in (
        b"",
        b"alice",
        b"alice apr1 secret",
        huge,
        b"alice:" + b"x" * MAX_CREDENTIALS_BYTES,
    ):
        with pytest.raises(AuthenticationError) as refusal:
            auth.authenticate(Credentials(data=data))
        assert "secret" not in str(refusal.value) and "aaaa" not in str(refusal.value)


def test_password_lengths_follow_the_hash_kind(auth: BasicAuthenticator) -> None:
    # bcrypt reads 72 bytes and traditional crypt 8, in Apache as here.
    assert auth.authenticate(basic("dave", LONG_PASSWORD[:72] + "anything")).role == "dave"
    with pytest.raises(AuthenticationError):
        auth.authenticate(basic("dave", LONG_PASSWORD[:71]))
    assert auth.authenticate(basic("bob", "des1")).role == "bob"


def test_http_basic_header_gives_the_binary_protocol_credentials(
    auth: BasicAuthenticator,
) -> None:
    header = base64.b64encode("eve:pässwörd".encode()).decode()
    assert from_http_header(header) == basic("eve", "pässwörd")
    assert auth.authenticate(from_http_header(f" {header} ")).role == "eve"
    for bad in ("not base64!", "YWxpY2U", "=" * 8):
        with pytest.raises(AuthenticationError):
            auth.authenticate(from_http_header(bad))
    with pytest.raises(AuthenticationError, match="longer than"):
        from_http_header("A" * (1024 * 1024))


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("alice:$apr1$viCuwyCv$40nCCOpGZqWgOl2tr8Ynm/\nno colon here\n", "line 2 is not user:hash"),
        (":VMHb1qyI.O4cE\n", "line 1 is not user:hash"),
        ("bob:\n", "line 1 is not user:hash"),
        ("bob:VMHb1qyI.O4cE:extra\n", "line 1 is not user:hash"),
        ("\n# c\nsha:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n", "line 3 .user 'sha'.: the hash is not"),
        ("plain:mypassword\n", "line 1 .user 'plain'.: the hash is not"),
        ("cut:$apr1$viCuwyCv$40nCCOpGZqWgOl2tr8Yn\n", "line 1 .user 'cut'.: the hash is not"),
        ("sha512:$6$saltsalt$abcdefghijklmnop\n", "line 1 .user 'sha512'.: the hash is not"),
        ("bob:VMHb1qyI.O4cE\nbob:VMHb1qyI.O4cE\n", "line 2 names user 'bob' a second time"),
        ("# only a comment\n\n", "names no user"),
    ],
)
def test_malformed_htpasswd_files_are_start_up_errors(content: str, error: str) -> None:
    with pytest.raises(KeyConfigError, match=error) as refused:
        BasicAuthenticator(data_url(content))
    for secret in ("VMHb1qyI", "W6ph5Mm5", "mypassword", "40nCCOpG", "saltsalt"):
        assert secret not in str(refused.value)


def test_unreadable_conf_values_are_start_up_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyConfigError, match="needs basic_auth_conf"):
        BasicAuthenticator("")
    with pytest.raises(KeyConfigError, match="cannot read"):
        BasicAuthenticator(f"file://{tmp_path}/missing")
    with pytest.raises(KeyConfigError, match="not UTF-8"):
        BasicAuthenticator(data_url(b"alice:\xff\xfe\n"))


@given(st.binary(max_size=4096))
def test_random_bytes_never_authenticate(auth: BasicAuthenticator, data: bytes) -> None:
    with pytest.raises(AuthenticationError):
        auth.authenticate(Credentials(data=data))


@given(st.sampled_from(sorted(PASSWORDS)), st.binary(max_size=256))
def test_known_users_with_random_passwords_are_refused(
    auth: BasicAuthenticator, user: str, password: bytes
) -> None:
    if password.startswith(PASSWORDS[user].encode()[: 8 if user == "bob" else 72]):
        return  # the password itself (crypt reads 8 bytes, bcrypt 72)
    with pytest.raises(AuthenticationError, match=REFUSED):
        auth.authenticate(basic(user, password))


@given(st.text(max_size=512))
def test_random_http_header_values_are_refused_with_an_authentication_error(
    auth: BasicAuthenticator, value: str
) -> None:
    with pytest.raises(AuthenticationError):
        auth.authenticate(from_http_header(value))
