"""The ``tls`` provider's rules without sockets: the role is the CN of the certificate the
client showed, as in Pulsar's AuthenticationProviderTls; anything else is refused."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.auth.provider import AuthenticationError, Credentials
from magnetar.common.auth.tls import TlsAuthenticator
from tests.support.certs import CertificateFiles, Pki, issue_client, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), client_role="alice")


def shown(files: CertificateFiles) -> Credentials:
    return Credentials(peer_certificate=files.certificate_der())


def self_signed(subject: x509.Name, not_after: datetime.datetime) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_after - datetime.timedelta(days=60))
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.DER)


def test_the_role_is_the_common_name(pki: Pki) -> None:
    authenticator = TlsAuthenticator()
    assert authenticator.method == "tls"
    identity = authenticator.authenticate(shown(pki.client))
    assert identity.role == "alice"
    other = issue_client(pki, "bob", "bob@example.com")
    assert authenticator.authenticate(shown(other)).role == "bob@example.com"


def test_the_identity_expires_with_the_certificate(pki: Pki) -> None:
    identity = TlsAuthenticator().authenticate(shown(pki.client))
    certificate = x509.load_pem_x509_certificate(pki.client.certificate.read_bytes())
    assert identity.expires_at == certificate.not_valid_after_utc.timestamp()


def test_an_expired_certificate_is_refused(pki: Pki) -> None:
    with pytest.raises(AuthenticationError, match="expired"):
        TlsAuthenticator().authenticate(shown(pki.expired_client))


@pytest.mark.parametrize("der", [None, b""])
def test_no_certificate_is_refused(der: bytes | None) -> None:
    with pytest.raises(AuthenticationError, match="did not present a TLS certificate"):
        TlsAuthenticator().authenticate(Credentials(peer_certificate=der))


def test_a_token_is_not_a_certificate() -> None:
    with pytest.raises(AuthenticationError, match="did not present"):
        TlsAuthenticator().authenticate(Credentials(data=b"eyJhbGciOiJIUzI1NiJ9.e30.x"))


def test_a_certificate_without_common_name_is_refused(pki: Pki) -> None:
    with pytest.raises(AuthenticationError, match="no common name"):
        TlsAuthenticator().authenticate(shown(pki.nameless_client))


def test_with_several_common_names_the_most_specific_one_is_the_role() -> None:
    """Pulsar takes the first CN= of the RFC 2253 form, which lists the subject's attributes
    most specific (last) first."""
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "team"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example"),
            x509.NameAttribute(NameOID.COMMON_NAME, "carol"),
        ]
    )
    assert subject.rfc4514_string().startswith("CN=carol,")
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    credentials = Credentials(peer_certificate=self_signed(subject, later))
    assert TlsAuthenticator().authenticate(credentials).role == "carol"


def test_a_pem_certificate_is_not_taken_for_der(pki: Pki) -> None:
    pem = pki.client.certificate.read_bytes()
    with pytest.raises(AuthenticationError, match="cannot be read"):
        TlsAuthenticator().authenticate(Credentials(peer_certificate=pem))


@given(st.binary(min_size=1, max_size=2048))
def test_garbage_is_refused_and_nothing_else_escapes(garbage: bytes) -> None:
    with pytest.raises(AuthenticationError):
        TlsAuthenticator().authenticate(Credentials(peer_certificate=garbage))


def test_a_truncated_certificate_is_refused(pki: Pki) -> None:
    der = pki.client.certificate_der()
    for length in (1, 10, len(der) // 2, len(der) - 1):
        with pytest.raises(AuthenticationError):
            TlsAuthenticator().authenticate(Credentials(peer_certificate=der[:length]))
