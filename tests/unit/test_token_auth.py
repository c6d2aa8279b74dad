"""The token provider's rules, without a broker: keys read as Pulsar reads them, JWTs accepted
and refused as Pulsar's AuthenticationProviderToken does."""

from __future__ import annotations

import base64
import hmac
import json
import logging
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.auth.keys import KeyConfigError, read_key
from magnetar.common.auth.service import FailureLog
from magnetar.common.auth.token import (
    MAX_TOKEN_BYTES,
    AuthenticationError,
    TokenAuthenticator,
    TokenSettings,
)

SECRET = b"0123456789abcdef0123456789abcdef"
SECRET_DATA_URL = "data:;base64," + base64.b64encode(SECRET).decode()


def hs_token(claims: dict[str, object], key: bytes = SECRET) -> str:
    return jwt.encode(claims, key, algorithm="HS256")


def forged_hs256(claims: dict[str, object], key: bytes) -> str:
    """An HS256 token signed with ``key`` by hand (PyJWT refuses to sign with a public key):
    the algorithm-confusion attack on a public-key verifier."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signed = (
        part(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        + "."
        + part(json.dumps(claims).encode())
    )
    return signed + "." + part(hmac.digest(key, signed.encode(), "sha256"))


def test_key_values_are_read_as_pulsar_reads_them(tmp_path: Path) -> None:
    key_file = tmp_path / "secret.key"
    key_file.write_bytes(SECRET)
    assert read_key(SECRET_DATA_URL, "k") == SECRET
    assert read_key(f"file://{key_file}", "k") == SECRET
    assert read_key(str(key_file), "k") == SECRET
    assert read_key(base64.b64encode(SECRET).decode(), "k") == SECRET
    with pytest.raises(KeyConfigError, match="cannot read"):
        read_key(f"file://{tmp_path}/missing.key", "token_secret_key")
    with pytest.raises(KeyConfigError, match="token_secret_key") as refused:
        read_key("not base64 and no file!", "token_secret_key")
    assert "no file!" not in str(refused.value)  # a key's text is never repeated


def test_hs256_token_gives_its_subject_and_expiry() -> None:
    auth = TokenAuthenticator(TokenSettings(secret_key=SECRET_DATA_URL))
    expires = int(time.time()) + 3600
    found = auth.authenticate(hs_token({"sub": "alice", "exp": expires}).encode())
    assert (found.role, found.expires_at) == ("alice", float(expires))
    assert auth.authenticate(hs_token({"sub": "bob"})).expires_at is None  # no exp: never


def test_refusals_name_the_reason_never_the_token() -> None:
    auth = TokenAuthenticator(TokenSettings(secret_key=SECRET_DATA_URL))
    good = hs_token({"sub": "alice"})
    bad = {
        "expired": hs_token({"sub": "alice", "exp": int(time.time()) - 10}),
        "wrong key": hs_token({"sub": "alice"}, key=b"another key, another signature...."),
        "truncated": good[:-5],
        "empty": "",
        "huge": "a" * (MAX_TOKEN_BYTES + 1),
        "no role": hs_token({"name": "alice"}),
        "none algorithm": jwt.encode({"sub": "alice"}, None, algorithm="none"),
    }
    for what, token in bad.items():
        with pytest.raises(AuthenticationError) as refused:
            auth.authenticate(token)
        assert token[:20] not in str(refused.value) or not token, what


@given(st.binary(max_size=2048))
def test_random_bytes_are_refused_with_an_authentication_error(data: bytes) -> None:
    auth = TokenAuthenticator(TokenSettings(secret_key=SECRET_DATA_URL))
    with pytest.raises(AuthenticationError):
        auth.authenticate(data)


@pytest.mark.parametrize("encoding", [serialization.Encoding.PEM, serialization.Encoding.DER])
@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_public_key_tokens_in_der_or_pem(
    tmp_path: Path, encoding: serialization.Encoding, algorithm: str
) -> None:
    private = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if algorithm == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    public = private.public_key().public_bytes(
        encoding, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "public.key").write_bytes(public)
    auth = TokenAuthenticator(
        TokenSettings(public_key=f"file://{tmp_path}/public.key", public_alg=algorithm)
    )
    assert auth.authenticate(jwt.encode({"sub": "svc"}, private, algorithm=algorithm)).role == "svc"
    with pytest.raises(AuthenticationError):  # an HS256 token signed with the public key's bytes
        auth.authenticate(forged_hs256({"sub": "svc"}, key=public))


def test_role_claim_and_audience_claim() -> None:
    settings = TokenSettings(
        secret_key=SECRET_DATA_URL, auth_claim="role", audience_claim="aud2", audience="magnetar"
    )
    auth = TokenAuthenticator(settings)
    assert auth.authenticate(hs_token({"role": "ops", "aud2": "magnetar"})).role == "ops"
    assert auth.authenticate(hs_token({"role": "ops", "aud2": ["x", "magnetar"]})).role == "ops"
    for claims in (
        {"role": "ops"},
        {"role": "ops", "aud2": "other"},
        {"sub": "x", "aud2": "magnetar"},
    ):
        with pytest.raises(AuthenticationError):
            auth.authenticate(hs_token(claims))


def test_unusable_settings_are_start_up_errors() -> None:
    with pytest.raises(KeyConfigError, match="token_secret_key or token_public_key"):
        TokenAuthenticator(TokenSettings())
    with pytest.raises(KeyConfigError, match="token_audience"):
        TokenAuthenticator(TokenSettings(secret_key=SECRET_DATA_URL, audience_claim="aud"))
    with pytest.raises(KeyConfigError, match="token_public_alg"):
        TokenAuthenticator(TokenSettings(public_key=SECRET_DATA_URL, public_alg="HS256"))
    with pytest.raises(KeyConfigError, match="not a DER or PEM"):
        TokenAuthenticator(TokenSettings(public_key=SECRET_DATA_URL))


def test_refusals_are_logged_a_few_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    failures = FailureLog(per_interval=5, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="magnetar.common.auth.service")
    for _ in range(30):
        failures.refused("CONNECT", "10.0.0.1:5000", "token expired")
    assert len(caplog.records) == 5
    now[0] += 10.5
    failures.refused("CONNECT", "10.0.0.1:5000", "token expired")
    lines = [r.getMessage() for r in caplog.records]
    assert "25 more authentication failures in the last 10 s were not logged" in lines
    assert lines[-1] == "CONNECT from 10.0.0.1:5000 refused: token expired"
    assert failures.total == 31
