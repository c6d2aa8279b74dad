"""`magnetar tokens` as a separate process: keys and tokens it makes are the ones the token
provider (TokenAuthenticator) accepts, and `validate` refuses what the provider refuses."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from magnetar.common.auth.keys import read_key
from magnetar.common.auth.provider import AuthenticationError
from magnetar.common.auth.token import TokenAuthenticator, TokenSettings


def tokens(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "magnetar", "tokens", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(*args: str, stdin: str | None = None) -> str:
    done = tokens(*args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def shown(token: str) -> tuple[dict, dict]:
    header, separator, claims = ok("show", token).splitlines()
    assert separator == "---"
    return json.loads(header), json.loads(claims)


def test_secret_key_create_and_validate_round_trip(tmp_path: Path) -> None:
    key = tmp_path / "secret.key"
    ok("create-secret-key", "--output", str(key))
    assert len(key.read_bytes()) == 32
    assert key.stat().st_mode & 0o077 == 0  # a secret key is its owner's alone
    token = ok("create", "--secret-key", f"file://{key}", "--subject", "alice")
    assert shown(token) == ({"alg": "HS256", "typ": "JWT"}, {"sub": "alice"})
    assert json.loads(ok("validate", "-sk", f"file://{key}", token)) == {"sub": "alice"}
    found = TokenAuthenticator(TokenSettings(secret_key=str(key))).authenticate(token)
    assert (found.role, found.expires_at) == ("alice", None)


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_key_pair_create_and_validate_round_trip(tmp_path: Path, algorithm: str) -> None:
    private_file, public_file = tmp_path / "private.der", tmp_path / "public.der"
    ok(
        "create-key-pair",
        "--algorithm",
        algorithm,
        "--output-private-key",
        str(private_file),
        "--output-public-key",
        str(public_file),
    )
    # DER as Pulsar writes it: PKCS#8 private key, SubjectPublicKeyInfo public key.
    private = serialization.load_der_private_key(private_file.read_bytes(), password=None)
    expected_type = rsa.RSAPrivateKey if algorithm == "RS256" else ec.EllipticCurvePrivateKey
    assert isinstance(private, expected_type)
    assert private_file.read_bytes() == private.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    assert public_file.read_bytes() == private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )

    token = ok(
        "create", "--private-key", f"file://{private_file}", "-s", "svc", "--expiry-time", "1h"
    )
    header, claims = shown(token)
    assert header["alg"] == algorithm and claims["sub"] == "svc"
    assert abs(claims["exp"] - (time.time() + 3600)) < 60
    validated = json.loads(ok("validate", "--public-key", f"file://{public_file}", token))
    assert validated == claims
    authenticator = TokenAuthenticator(
        TokenSettings(public_key=f"file://{public_file}", public_alg=algorithm)
    )
    assert authenticator.authenticate(token).expires_at == float(claims["exp"])


def test_expired_or_foreign_tokens_are_refused_by_validate(tmp_path: Path) -> None:
    key, other = tmp_path / "secret.key", tmp_path / "other.key"
    ok("create-secret-key", "-o", str(key))
    ok("create-secret-key", "-o", str(other))
    expired = jwt.encode(
        {"sub": "alice", "exp": int(time.time()) - 60}, key.read_bytes(), algorithm="HS256"
    )
    refused = tokens("validate", "-sk", f"file://{key}", expired)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "token expired" in refused.stderr

    foreign = ok("create", "-sk", f"file://{other}", "-s", "alice")
    refused = tokens("validate", "-sk", f"file://{key}", foreign)
    assert refused.returncode == 1 and "not valid" in refused.stderr
    with pytest.raises(AuthenticationError):
        TokenAuthenticator(TokenSettings(secret_key=f"file://{key}")).authenticate(foreign)


def test_expiry_units_are_pulsars(tmp_path: Path) -> None:
    key = tmp_path / "secret.key"
    ok("create-secret-key", "-o", str(key))
    for expiry, seconds in (("90", 90), ("10m", 600), ("2d", 2 * 86400), ("1y", 365 * 86400)):
        before = int(time.time())
        token = ok("create", "-sk", f"file://{key}", "-s", "a", "-e", expiry)
        after = int(time.time()) + 1
        # exp is the creation second plus the expiry: between the command's start and end.
        assert before + seconds <= shown(token)[1]["exp"] <= after + seconds, expiry
    refused = tokens("create", "-sk", f"file://{key}", "-s", "a", "-e", "3 months")
    assert refused.returncode == 2 and "relative time" in refused.stderr


def test_base64_secret_key_file_is_a_token_secret_key_value(tmp_path: Path) -> None:
    key = tmp_path / "secret.b64"
    ok("create-secret-key", "--output", str(key), "--base64")
    value = key.read_text().strip()
    assert len(read_key(value, "token_secret_key")) == 32
    token = ok("create", "--secret-key", value, "--subject", "bob")
    for setting in (value, "data:;base64," + value):
        assert (
            TokenAuthenticator(TokenSettings(secret_key=setting)).authenticate(token).role == "bob"
        )
    # Without --output the key is printed in base64: the same kind of value.
    printed = ok("create-secret-key")
    assert len(base64.b64decode(printed, validate=True)) == 32


def test_tokens_are_read_from_an_argument_a_file_or_standard_input(tmp_path: Path) -> None:
    key = tmp_path / "secret.key"
    ok("create-secret-key", "-o", str(key))
    token = ok("create", "-sk", f"file://{key}", "-s", "carol")
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    expected = ok("show", token)
    assert ok("show", "-f", str(token_file)) == expected
    assert ok("show", "-i", stdin=token + "\n") == expected
    assert ok("show", "-i", token) == expected  # an argument given with -i wins
    assert json.loads(ok("validate", "-sk", f"file://{key}", "-i", stdin=token)) == {"sub": "carol"}
    nothing = tokens("show")
    assert nothing.returncode == 2 and "-f FILE" in nothing.stderr
    garbage = tokens("show", "not-a-jwt")
    assert garbage.returncode == 1 and "not a JWT" in garbage.stderr


def test_unusable_keys_are_reported_without_their_content(tmp_path: Path) -> None:
    missing = tokens("create", "-sk", f"file://{tmp_path}/missing.key", "-s", "a")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    secret = tmp_path / "secret.key"
    ok("create-secret-key", "-o", str(secret))
    not_a_key = tokens("create", "-pk", f"file://{secret}", "-s", "a")
    assert not_a_key.returncode == 2 and "--private-key" in not_a_key.stderr
    wrong_algorithm = tokens(
        "create-key-pair",
        "-a",
        "HS256",
        "--output-private-key",
        str(tmp_path / "p"),
        "--output-public-key",
        str(tmp_path / "q"),
    )
    assert wrong_algorithm.returncode == 2 and "RS256" in wrong_algorithm.stderr
