"""The ``tls`` authentication provider (Pulsar's AuthenticationProviderTls): the role is the
common name (CN) of the certificate the client showed in the TLS handshake.

This provider trusts the handshake: the certificate reaches it only after OpenSSL verified its
chain against ``tls_trust_certs_file_path`` and its validity dates (see
:class:`magnetar.common.tls.ServerTls`). It checks nothing cryptographic itself; it reads the
subject. A client without a certificate, or with one whose subject has no CN, is refused.

Like Pulsar, which takes the first ``CN=`` of the subject written as RFC 2253 (most specific
attribute first), the CN used is the last one in the certificate's subject sequence.
"""

from __future__ import annotations

import time

from cryptography import x509
from cryptography.x509.oid import NameOID

from magnetar.common.auth.provider import Authenticated, AuthenticationError, Credentials


class TlsAuthenticator:
    """Turns the DER of a client certificate (``Credentials.peer_certificate``) into its CN."""

    method = "tls"

    def authenticate(self, credentials: Credentials) -> Authenticated:
        der = credentials.peer_certificate
        if not der:
            raise AuthenticationError("Client did not present a TLS certificate")
        try:
            certificate = x509.load_der_x509_certificate(der)
            names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        except ValueError:
            raise AuthenticationError("the client's TLS certificate cannot be read") from None
        role = str(names[-1].value) if names else ""
        if not role:
            raise AuthenticationError("the client's TLS certificate has no common name (CN)")
        expires_at = certificate.not_valid_after_utc.timestamp()
        # The handshake checked the dates; this catches a connection re-authenticated (by the
        # broker's refresh check) after its certificate ran out.
        if expires_at <= time.time():
            raise AuthenticationError(
                f"the client's TLS certificate expired at "
                f"{certificate.not_valid_after_utc.isoformat()}"
            )
        return Authenticated(role=role, expires_at=expires_at)
