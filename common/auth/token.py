"""The ``token`` authentication provider (Pulsar's AuthenticationProviderToken): a JWT as the
client's ``auth_data`` on the binary protocol or ``Authorization: Bearer`` over HTTP.

- HS256 with ``token_secret_key``; RS256/ES256 (``token_public_alg``) with ``token_public_key``,
  DER or PEM (values read as Pulsar reads them: ``keys.read_key``).
- The role is the ``token_auth_claim`` claim (default ``sub``), a non-empty string.
- ``token_audience_claim`` + ``token_audience``: the claim must hold the audience (a string, or
  a list containing it); a claim without an audience is a start-up error, as in Pulsar.
- ``exp`` is honoured; a token without ``exp`` never expires.

Refusals say why without repeating the token: callers log them and answer the client.
"""

from __future__ import annotations

from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

from magnetar.common.auth.keys import KeyConfigError, read_key
from magnetar.common.auth.provider import Authenticated, AuthenticationError, Credentials

#: Longest credential examined; a larger one is refused before it is parsed.
MAX_TOKEN_BYTES = 64 * 1024
PUBLIC_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256")


@dataclass(slots=True, frozen=True)
class TokenSettings:
    secret_key: str | None = None
    public_key: str | None = None
    public_alg: str = "RS256"
    auth_claim: str = "sub"
    audience_claim: str | None = None
    audience: str | None = None


class TokenAuthenticator:
    """Validates JWTs against one key, chosen at start-up (``KeyConfigError`` if unusable)."""

    method = "token"

    def __init__(self, settings: TokenSettings) -> None:
        if settings.audience_claim and not settings.audience:
            raise KeyConfigError("token_audience_claim is set but token_audience is not")
        if settings.secret_key:
            self._key: object = read_key(settings.secret_key, "token_secret_key")
            self._algorithms = ["HS256", "HS384", "HS512"]
        elif settings.public_key:
            if settings.public_alg not in PUBLIC_ALGORITHMS:
                raise KeyConfigError(
                    f"token_public_alg {settings.public_alg!r} is not one of "
                    f"{', '.join(PUBLIC_ALGORITHMS)}"
                )
            raw = read_key(settings.public_key, "token_public_key")
            try:
                self._key = (
                    load_pem_public_key(raw)
                    if raw.lstrip().startswith(b"-----")
                    else load_der_public_key(raw)
                )
            except ValueError:
                raise KeyConfigError("token_public_key: not a DER or PEM public key") from None
            self._algorithms = [settings.public_alg]
        else:
            raise KeyConfigError("the token provider needs token_secret_key or token_public_key")
        self.settings = settings

    def authenticate(self, credentials: Credentials | bytes | str) -> Authenticated:
        if isinstance(credentials, Credentials):
            credentials = credentials.data
        token = (
            credentials.decode("utf-8", "replace")
            if isinstance(credentials, bytes)
            else credentials
        )
        if not token:
            raise AuthenticationError("no token given")
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationError(f"token longer than {MAX_TOKEN_BYTES} bytes")
        try:
            claims = jwt.decode(
                token,
                self._key,  # type: ignore[arg-type]
                algorithms=self._algorithms,
                options={"verify_aud": False, "require": []},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("token expired") from None
        except jwt.InvalidTokenError as e:
            raise AuthenticationError(f"token not valid: {type(e).__name__}") from None
        role = claims.get(self.settings.auth_claim)
        if not isinstance(role, str) or not role:
            raise AuthenticationError(
                f"token has no {self.settings.auth_claim!r} claim naming a role"
            )
        if self.settings.audience_claim:
            found = claims.get(self.settings.audience_claim)
            audiences = found if isinstance(found, list) else [found]
            if self.settings.audience not in audiences:
                raise AuthenticationError(
                    f"token's {self.settings.audience_claim!r} claim does not name this audience"
                )
        expires = claims.get("exp")
        return Authenticated(role, float(expires) if isinstance(expires, int | float) else None)
