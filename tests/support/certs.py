"""A throwaway PKI for TLS tests, made with ``cryptography`` (no ``openssl`` command needed).

:func:`make_pki` writes into a directory, as PEM files: a CA, a second CA nobody trusts, a
server certificate for ``localhost`` (SAN DNS:localhost and IP:127.0.0.1) signed by the CA, and
client certificates: one with a given CN signed by the CA, one signed by the untrusted CA, one
expired, one whose subject has no CN. :func:`reissue_server` writes a new server certificate and
key (new serial) over the same paths, as an operator rotating certificates would, to test reload.

Keys are EC P-256: quick to generate, and accepted by TLS 1.2 and 1.3 alike.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(slots=True, frozen=True)
class CertificateFiles:
    """A certificate and its private key, each a PEM file."""

    certificate: Path
    key: Path

    def certificate_der(self) -> bytes:
        """The certificate now in :attr:`certificate`, as DER (what a TLS peer sees)."""
        return x509.load_pem_x509_certificate(self.certificate.read_bytes()).public_bytes(
            serialization.Encoding.DER
        )

    def serial(self) -> int:
        """The serial number of the certificate now in :attr:`certificate`."""
        return x509.load_pem_x509_certificate(self.certificate.read_bytes()).serial_number


@dataclass(slots=True, frozen=True)
class Pki:
    directory: Path
    #: The trusted CA: ``ca.certificate`` is the trust file of servers and clients.
    ca: CertificateFiles
    #: A CA that no test configuration trusts.
    untrusted_ca: CertificateFiles
    #: ``localhost`` / 127.0.0.1, signed by :attr:`ca`.
    server: CertificateFiles
    #: CN = :attr:`client_role`, signed by :attr:`ca`.
    client: CertificateFiles
    client_role: str
    #: CN = :attr:`client_role`, signed by :attr:`untrusted_ca`.
    untrusted_client: CertificateFiles
    #: Signed by :attr:`ca`, valid until yesterday.
    expired_client: CertificateFiles
    #: Signed by :attr:`ca`, subject with an O but no CN.
    nameless_client: CertificateFiles


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes) -> None:
    # Write then rename, as a secret rotation does: a reader sees the old or the new file whole.
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _write_pair(
    directory: Path, name: str, certificate: x509.Certificate, key: PrivateKey
) -> CertificateFiles:
    files = CertificateFiles(directory / f"{name}.cert.pem", directory / f"{name}.key.pem")
    _write(files.key, _key_pem(key))
    _write(files.certificate, certificate.public_bytes(serialization.Encoding.PEM))
    return files


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load(files: CertificateFiles) -> tuple[x509.Certificate, PrivateKey]:
    certificate = x509.load_pem_x509_certificate(files.certificate.read_bytes())
    key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return certificate, key


def _ca(common_name: str) -> tuple[x509.Certificate, PrivateKey]:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(days=1))
        .not_valid_after(_now() + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def _issue(
    issuer: tuple[x509.Certificate, PrivateKey],
    subject: x509.Name,
    *,
    server: bool,
    expired: bool = False,
) -> tuple[x509.Certificate, PrivateKey]:
    issuer_certificate, issuer_key = issuer
    key = _new_key()
    if expired:
        not_before = _now() - datetime.timedelta(days=30)
        not_after = _now() - datetime.timedelta(days=1)
    else:
        not_before = _now() - datetime.timedelta(days=1)
        not_after = _now() + datetime.timedelta(days=30)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256()), key


def _named(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Magnetar tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def make_pki(directory: Path, client_role: str = "client-role") -> Pki:
    """Write a fresh PKI into ``directory`` (created if missing) and return its files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("Magnetar test CA")
    untrusted_ca = _ca("Magnetar untrusted test CA")
    return Pki(
        directory=directory,
        ca=_write_pair(directory, "ca", *ca),
        untrusted_ca=_write_pair(directory, "untrusted-ca", *untrusted_ca),
        server=_write_pair(directory, "server", *_issue(ca, _named("localhost"), server=True)),
        client=_write_pair(directory, "client", *_issue(ca, _named(client_role), server=False)),
        client_role=client_role,
        untrusted_client=_write_pair(
            directory, "untrusted-client", *_issue(untrusted_ca, _named(client_role), server=False)
        ),
        expired_client=_write_pair(
            directory,
            "expired-client",
            *_issue(ca, _named(client_role), server=False, expired=True),
        ),
        nameless_client=_write_pair(
            directory,
            "nameless-client",
            *_issue(
                ca,
                x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Magnetar tests")]),
                server=False,
            ),
        ),
    )


def issue_client(pki: Pki, name: str, common_name: str) -> CertificateFiles:
    """Another client certificate signed by the trusted CA, written as ``<name>.cert.pem`` and
    ``<name>.key.pem``."""
    return _write_pair(
        pki.directory, name, *_issue(_load(pki.ca), _named(common_name), server=False)
    )


def reissue_server(pki: Pki) -> int:
    """Replace the server certificate and key (same paths, new key, new serial) and return the
    new serial. The key is written first, so a reader between the two renames sees the new key
    with the old certificate: a mismatch a reloading server must survive."""
    certificate, key = _issue(_load(pki.ca), _named("localhost"), server=True)
    _write_pair(pki.directory, "server", certificate, key)
    return certificate.serial_number


def tls_flags(pki: Pki, tls_port: int, https_port: int) -> list[str]:
    """``magnetar standalone``/``broker`` flags serving TLS on ``tls_port`` (pulsar+ssl://) and
    HTTPS on ``https_port`` with ``pki``'s server certificate, trusting its CA."""
    return [
        "--broker-service-port-tls", str(tls_port),
        "--web-service-port-tls", str(https_port),
        "--tls-certificate-file-path", str(pki.server.certificate),
        "--tls-key-file-path", str(pki.server.key),
        "--tls-trust-certs-file-path", str(pki.ca.certificate),
    ]  # fmt: skip
