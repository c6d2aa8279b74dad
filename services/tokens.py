"""``magnetar tokens``: keys and JWTs for the token provider, as Pulsar's ``pulsar tokens`` makes
them, with its sub-commands and flag names.

- ``create-secret-key``: 32 random bytes for HS256 (raw to ``--output``, or base64 with
  ``--base64``; base64 on standard output without ``--output``).
- ``create-key-pair``: an RSA (RS256) or EC (ES256) key pair, DER-encoded as Pulsar writes them:
  PKCS#8 private key, SubjectPublicKeyInfo public key.
- ``create``: a JWT with ``sub`` (and ``exp`` with ``--expiry-time``), signed with a secret or
  private key given as Pulsar's key values (``file:///path``, ``data:;base64,...``, a path or
  base64; read by ``keys.read_key``).
- ``show``: a token's header and claims, not verified.
- ``validate``: verifies a token with the broker's own :class:`TokenAuthenticator` and prints its
  claims; exit status 1, the reason on standard error, if it is refused.

A token is given as an argument, from a file (``-f``), or on standard input (``-i``, Pulsar's
``--stdin``); an argument wins, so ``show -i TOKEN`` works too.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import sys
import time
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from magnetar.common.auth.keys import KeyConfigError, read_key
from magnetar.common.auth.provider import AuthenticationError
from magnetar.common.auth.token import TokenAuthenticator, TokenSettings

SECRET_KEY_BYTES = 32
RSA_KEY_BITS = 2048
SECRET_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512")
#: Each ES algorithm is defined on one curve (RFC 7518, 3.4).
EC_CURVES: dict[str, ec.EllipticCurve] = {
    "ES256": ec.SECP256R1(),
    "ES384": ec.SECP384R1(),
    "ES512": ec.SECP521R1(),
}
#: Pulsar's RelativeTimeUtil units; a number without a unit is seconds.
EXPIRY_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


class TokenToolError(Exception):
    """A wrong input to the tool: printed as it is, exit status 2."""


def parse_expiry(value: str) -> int:
    """Seconds in a relative time as Pulsar writes it: ``30``, ``10m``, ``1h``, ``3d``, ``1y``."""
    found = re.fullmatch(r"(\d+)([smhdwy]?)", value.strip())
    if not found:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a relative time (a number with s, m, h, d, w or y)"
        )
    return int(found[1]) * EXPIRY_UNITS[found[2] or "s"]


def _algorithm_option(parser: argparse.ArgumentParser, default: str | None, help_text: str) -> None:
    parser.add_argument(
        "-a",
        "--signature-algorithm",
        "--algorithm",
        dest="algorithm",
        default=default,
        help=help_text,
    )


def _token_input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("token", nargs="?", help="the token (else -f or -i)")
    parser.add_argument("-f", "--token-file", help="read the token from this file")
    parser.add_argument(
        "-i", "--stdin", action="store_true", help="read the token from standard input"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")

    p = sub.add_parser("create-secret-key", help="a random HS256 key")
    _algorithm_option(p, "HS256", f"one of {', '.join(SECRET_ALGORITHMS)} [default: HS256]")
    p.add_argument("-o", "--output", help="write the key to this file (else base64 to stdout)")
    p.add_argument(
        "-b", "--base64", action="store_true", help="write the key in base64, not raw bytes"
    )
    p.set_defaults(action=create_secret_key)

    p = sub.add_parser("create-key-pair", help="an RSA or EC key pair, DER-encoded")
    _algorithm_option(
        p,
        "RS256",
        f"one of {', '.join(RSA_ALGORITHMS + tuple(EC_CURVES))} [default: RS256]",
    )
    p.add_argument("--output-private-key", required=True, help="file of the PKCS#8 private key")
    p.add_argument("--output-public-key", required=True, help="file of the public key")
    p.set_defaults(action=create_key_pair)

    p = sub.add_parser("create", help="a signed token for a role")
    keys = p.add_mutually_exclusive_group(required=True)
    keys.add_argument("-sk", "--secret-key", help="HS key: file:///path, data:, a path or base64")
    keys.add_argument("-pk", "--private-key", help="RS/ES private key (DER or PEM), as above")
    p.add_argument("-s", "--subject", required=True, help="the role (the token's sub claim)")
    p.add_argument(
        "-e",
        "--expiry-time",
        type=parse_expiry,
        help="valid for this long: 30s, 10m, 1h, 3d, 2w, 1y [default: never expires]",
    )
    _algorithm_option(p, None, "[default: HS256 with a secret key, else from the key's type]")
    p.set_defaults(action=create_token)

    p = sub.add_parser("show", help="a token's header and claims, not verified")
    _token_input_options(p)
    p.set_defaults(action=show_token)

    p = sub.add_parser("validate", help="verify a token as the token provider does")
    keys = p.add_mutually_exclusive_group(required=True)
    keys.add_argument("-sk", "--secret-key", help="HS key: file:///path, data:, a path or base64")
    keys.add_argument("-pk", "--public-key", help="RS/ES public key (DER or PEM), as above")
    _algorithm_option(p, None, "with --public-key [default: from the key's type]")
    _token_input_options(p)
    p.set_defaults(action=validate_token)


def run(args: argparse.Namespace) -> int:
    try:
        return int(args.action(args))
    except (TokenToolError, KeyConfigError) as e:
        print(f"magnetar tokens {args.tokens_command}: {e}", file=sys.stderr)
        return 2


def _write_file(path: str, data: bytes, private: bool) -> None:
    """Secret and private keys are made readable by their owner only, as they are created."""
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def create_secret_key(args: argparse.Namespace) -> int:
    if args.algorithm not in SECRET_ALGORITHMS:
        raise TokenToolError(f"--signature-algorithm must be one of {', '.join(SECRET_ALGORITHMS)}")
    key = secrets.token_bytes(SECRET_KEY_BYTES)
    if args.output is None:
        print(base64.b64encode(key).decode())
    else:
        _write_file(args.output, base64.b64encode(key) if args.base64 else key, private=True)
    return 0


def create_key_pair(args: argparse.Namespace) -> int:
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if args.algorithm in RSA_ALGORITHMS:
        private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    elif args.algorithm in EC_CURVES:
        private = ec.generate_private_key(EC_CURVES[args.algorithm])
    else:
        raise TokenToolError(
            f"--signature-algorithm must be one of {', '.join(RSA_ALGORITHMS + tuple(EC_CURVES))}"
        )
    _write_file(
        args.output_private_key,
        private.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        private=True,
    )
    _write_file(
        args.output_public_key,
        private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        private=False,
    )
    return 0


def _key_algorithm(key: object, setting: str) -> str:
    """The algorithm Pulsar's default (RS256) or the key's curve calls for."""
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        for algorithm, curve in EC_CURVES.items():
            if key.curve.name == curve.name:
                return algorithm
    raise KeyConfigError(f"{setting}: an RSA key or an EC key on P-256, P-384 or P-521 is needed")


def _load_private_key(value: str) -> rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey:
    raw = read_key(value, "--private-key")
    try:
        key = (
            serialization.load_pem_private_key(raw, password=None)
            if raw.lstrip().startswith(b"-----")
            else serialization.load_der_private_key(raw, password=None)
        )
    except (ValueError, TypeError):
        raise KeyConfigError("--private-key: not an unencrypted DER or PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise KeyConfigError("--private-key: an RSA or EC key is needed")
    return key


def _load_public_key(value: str) -> object:
    raw = read_key(value, "--public-key")
    try:
        if raw.lstrip().startswith(b"-----"):
            return serialization.load_pem_public_key(raw)
        return serialization.load_der_public_key(raw)
    except ValueError:
        raise KeyConfigError("--public-key: not a DER or PEM public key") from None


def create_token(args: argparse.Namespace) -> int:
    key: object
    if args.secret_key is not None:
        key = read_key(args.secret_key, "--secret-key")
        algorithm = args.algorithm or "HS256"
        if algorithm not in SECRET_ALGORITHMS:
            raise TokenToolError(f"a secret key signs with {', '.join(SECRET_ALGORITHMS)}")
    else:
        key = _load_private_key(args.private_key)
        algorithm = args.algorithm or _key_algorithm(key, "--private-key")
        fits = RSA_ALGORITHMS if isinstance(key, rsa.RSAPrivateKey) else tuple(EC_CURVES)
        if algorithm not in fits or (
            algorithm in EC_CURVES and _key_algorithm(key, "--private-key") != algorithm
        ):
            raise TokenToolError(f"--signature-algorithm {algorithm} does not fit this key")
    claims: dict[str, object] = {"sub": args.subject}
    if args.expiry_time is not None:
        claims["exp"] = int(time.time()) + args.expiry_time
    print(jwt.encode(claims, key, algorithm=algorithm))  # type: ignore[arg-type]
    return 0


def _read_token(args: argparse.Namespace) -> str:
    if args.token is not None:
        token = args.token
    elif args.token_file is not None:
        try:
            token = Path(args.token_file).read_text()
        except OSError as e:
            raise TokenToolError(f"cannot read {args.token_file}: {e.strerror}") from None
    elif args.stdin:
        token = sys.stdin.read()
    else:
        raise TokenToolError("give the token as an argument, with -f FILE or with -i (stdin)")
    token = token.strip()
    if not token:
        raise TokenToolError("the token is empty")
    return token


def show_token(args: argparse.Namespace) -> int:
    token = _read_token(args)
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError as e:
        print(f"not a JWT: {type(e).__name__}", file=sys.stderr)
        return 1
    print(json.dumps(header))
    print("---")
    print(json.dumps(claims))
    return 0


def validate_token(args: argparse.Namespace) -> int:
    if args.secret_key is not None:
        settings = TokenSettings(secret_key=args.secret_key)
    else:
        algorithm = args.algorithm or _key_algorithm(
            _load_public_key(args.public_key), "--public-key"
        )
        settings = TokenSettings(public_key=args.public_key, public_alg=algorithm)
    authenticator = TokenAuthenticator(settings)
    token = _read_token(args)
    try:
        authenticator.authenticate(token)
    except AuthenticationError as e:
        print(f"token refused: {e}", file=sys.stderr)
        return 1
    print(json.dumps(jwt.decode(token, options={"verify_signature": False})))
    return 0
