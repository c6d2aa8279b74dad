"""TLS for Magnetar's listeners and its own clients, on Python's ``ssl`` module (OpenSSL).

- :class:`ServerTls` is the server side of ``pulsar+ssl://`` and HTTPS, built from Pulsar's
  settings (``tls_certificate_file_path``, ``tls_key_file_path``, ``tls_trust_certs_file_path``,
  ``tls_require_trusted_client_cert_on_connect``, ``tls_cert_refresh_check_duration_sec``):
  TLS 1.2 or later, and the certificate files reloaded without a restart, as Pulsar does.
- :func:`peer_certificate_der` is the client certificate a connection showed, for the ``tls``
  authentication provider.
- :func:`client_context` is what our own clients (broker to broker, tests) connect with.

How reload works: a listening socket keeps the ``SSLContext`` it was created with, so
:attr:`ServerTls.context` is an outer context whose ``sni_callback`` (called by OpenSSL on every
ClientHello, with or without a server name in it) first checks whether the files changed, then
points the handshake's ``SSLObject.context`` at the current inner context, the one built from the
newest good files. That is the documented way to choose a certificate per handshake; connections
already established keep the context they were made with.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_pem_private_key

log = logging.getLogger(__name__)

#: Oldest protocol version either side accepts: TLS 1.0 and 1.1 are deprecated (RFC 8996).
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2

#: A file's identity for change detection: (mtime in ns, size, inode), None while it is missing.
#: The inode catches an atomic rename (Kubernetes swaps a secret volume's symlink) that keeps
#: mtime and size.
FileStamp = tuple[int, int, int] | None


class TlsConfigError(ValueError):
    """A TLS file that cannot be used; the message names the setting and the file, never the
    key material."""


class _SslSource(Protocol):
    def get_extra_info(self, name: str, default: object = None) -> object: ...


def _stamp(path: str) -> FileStamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino)


def _refuse_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
    raise TlsConfigError("the key is encrypted; give an unencrypted PEM key")


def _load_chain(
    context: ssl.SSLContext,
    certificate_file: str,
    key_file: str,
    certificate_setting: str,
    key_setting: str,
) -> None:
    """``load_cert_chain`` with an error that says which file is wrong and how.

    OpenSSL's own message ("PEM lib", "KEY_VALUES_MISMATCH") does not say which of the two files
    it failed on, so on failure the files are parsed again with ``cryptography`` to tell."""
    for setting, path in ((certificate_setting, certificate_file), (key_setting, key_file)):
        if not os.path.isfile(path):
            raise TlsConfigError(f"{setting}: {path} is not a readable file")
    try:
        context.load_cert_chain(certificate_file, key_file, password=_refuse_password)
        return
    except TlsConfigError as e:
        raise TlsConfigError(f"{key_setting}: {key_file}: {e}") from None
    except (ssl.SSLError, OSError) as e:
        failure = e
    try:
        with open(certificate_file, "rb") as f:
            x509.load_pem_x509_certificates(f.read())
    except (ValueError, OSError):
        raise TlsConfigError(
            f"{certificate_setting}: no PEM certificate can be read from {certificate_file}"
        ) from None
    try:
        with open(key_file, "rb") as f:
            load_pem_private_key(f.read(), password=None)
    except TypeError:
        raise TlsConfigError(
            f"{key_setting}: the key in {key_file} is encrypted; give an unencrypted PEM key"
        ) from None
    except (ValueError, UnsupportedAlgorithm, OSError):
        raise TlsConfigError(
            f"{key_setting}: no PEM private key can be read from {key_file}"
        ) from None
    reason = getattr(failure, "reason", None) or type(failure).__name__
    if reason == "KEY_VALUES_MISMATCH":
        raise TlsConfigError(
            f"{key_setting}: the key in {key_file} does not belong to the certificate in "
            f"{certificate_file} ({certificate_setting})"
        ) from None
    raise TlsConfigError(
        f"{certificate_setting}/{key_setting}: {certificate_file} and {key_file} cannot be "
        f"used ({reason})"
    ) from None


def _load_trust(context: ssl.SSLContext, trust_file: str, setting: str) -> None:
    if not os.path.isfile(trust_file):
        raise TlsConfigError(f"{setting}: {trust_file} is not a readable file")
    try:
        context.load_verify_locations(cafile=trust_file)
    except (ssl.SSLError, OSError) as e:
        reason = getattr(e, "reason", None) or type(e).__name__
        raise TlsConfigError(
            f"{setting}: no PEM CA certificate can be read from {trust_file} ({reason})"
        ) from None


class ServerTls:
    """The server side of TLS, reloading its files without a restart (Pulsar's
    ``tlsCertRefreshCheckDurationSec``).

    Pass :attr:`context` to ``loop.create_server(ssl=...)`` or aiohttp's
    ``TCPSite(ssl_context=...)``. At most every ``refresh_seconds`` (0: at every new connection)
    a handshake first compares the files' stamps (mtime, size, inode) with those last read; on a
    change a new context is built from them. New connections then use it; established ones keep
    theirs. The check is a few ``stat`` calls in the event loop; the files (a few KB of PEM) are
    read only after a change, there too, because the handshake waiting for them must use them.
    If the new files cannot be used (half-written, key not matching the certificate),
    the previous context keeps serving and one WARNING is logged for that change.

    With ``trust_file``, client certificates are checked against its CAs: required with
    ``require_client_cert`` (``tls_require_trusted_client_cert_on_connect``), otherwise optional,
    so that a client may still show one for the ``tls`` authentication provider while others
    authenticate with a token. A certificate that is shown is always verified; an untrusted or
    expired one fails the handshake either way.

    Start-up errors raise :class:`TlsConfigError`.
    """

    def __init__(
        self,
        certificate_file: str,
        key_file: str,
        trust_file: str = "",
        require_client_cert: bool = False,
        refresh_seconds: float = 60.0,
    ) -> None:
        if not certificate_file or not key_file:
            raise TlsConfigError("TLS needs both tls_certificate_file_path and tls_key_file_path")
        if require_client_cert and not trust_file:
            raise TlsConfigError(
                "tls_require_trusted_client_cert_on_connect needs tls_trust_certs_file_path"
            )
        if refresh_seconds < 0:
            raise TlsConfigError("tls_cert_refresh_check_duration_sec must be 0 or more")
        self.certificate_file = certificate_file
        self.key_file = key_file
        self.trust_file = trust_file
        self.require_client_cert = require_client_cert
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._stamps = self._read_stamps()
        #: Stamps of the last files that could not be used: warned about once, not rebuilt
        #: again at every handshake until they change.
        self._refused_stamps: tuple[FileStamp, ...] | None = None
        self._checked_at = time.monotonic()
        #: The context to serve with. Built like the inner ones, so that it would serve on its
        #: own; its ``sni_callback`` hands each handshake the current inner context.
        self.context = self._build()
        self.context.sni_callback = self._before_handshake
        self._current = self.context
        #: How many times new files were taken into use (for logs and tests).
        self.reloads = 0

    def _files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.certificate_file, self.key_file, self.trust_file) if f)

    def _read_stamps(self) -> tuple[FileStamp, ...]:
        return tuple(_stamp(path) for path in self._files())

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = MINIMUM_VERSION
        # The tls provider reads the client certificate once, after the handshake; a TLS 1.2
        # renegotiation could show another one under the role already granted.
        context.options |= ssl.OP_NO_RENEGOTIATION
        _load_chain(
            context,
            self.certificate_file,
            self.key_file,
            "tls_certificate_file_path",
            "tls_key_file_path",
        )
        if self.trust_file:
            _load_trust(context, self.trust_file, "tls_trust_certs_file_path")
            context.verify_mode = (
                ssl.CERT_REQUIRED if self.require_client_cert else ssl.CERT_OPTIONAL
            )
        return context

    def reload_if_changed(self) -> bool:
        """Build a new context if the files changed since they were last read; True if new
        files were taken into use. Never raises: unusable files are logged and skipped."""
        with self._lock:
            stamps = self._read_stamps()
            if stamps == self._stamps or stamps == self._refused_stamps:
                return False
            try:
                context = self._build()
            except TlsConfigError as e:
                self._refused_stamps = stamps
                log.warning(
                    "TLS files changed but cannot be used, still serving the previous ones: %s",
                    e,
                )
                return False
            # Files replaced while being read: the next check sees other stamps and reads them
            # again, so nothing is lost by keeping the stamps from before the read.
            self._stamps = stamps
            self._refused_stamps = None
            self._current = context
            self.reloads += 1
        log.info(
            "TLS certificate reloaded from %s",
            ", ".join(self._files()),
        )
        return True

    def _before_handshake(
        self, ssl_object: ssl.SSLObject, server_name: str | None, outer: ssl.SSLContext
    ) -> None:
        # Called by OpenSSL inside the handshake: an exception here would fail it with an
        # unraisable-exception report, so the reload check never raises.
        now = time.monotonic()
        if now - self._checked_at >= self.refresh_seconds:
            self._checked_at = now
            try:
                self.reload_if_changed()
            except Exception:
                log.exception("TLS file check failed; serving the previous certificate")
        current = self._current
        if current is not outer:
            ssl_object.context = current
        return None


def peer_certificate_der(source: _SslSource | ssl.SSLObject | ssl.SSLSocket) -> bytes | None:
    """The DER of the certificate the peer showed, or None (plain TCP, or no certificate).

    ``source`` is an asyncio transport, an aiohttp request (both answer ``get_extra_info``), or
    an ``SSLObject`` / ``SSLSocket`` itself. The certificate was verified in the handshake
    against the server's trusted CAs; it is only returned, not checked again."""
    if isinstance(source, ssl.SSLObject | ssl.SSLSocket):
        ssl_object: object = source
    else:
        ssl_object = source.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    assert isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket)
    try:
        return ssl_object.getpeercert(binary_form=True)
    except ValueError:
        # Handshake not complete: nothing was shown yet.
        return None


def client_context(
    trust_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    verify_hostname: bool = True,
) -> ssl.SSLContext:
    """A client context for our own connections (broker to broker, tests): TLS 1.2 or later,
    the server's certificate verified against ``trust_file``'s CAs (the system's without it),
    its name checked unless ``verify_hostname`` is False, and a client certificate shown if
    ``cert_file`` is given (its key in ``key_file``, or in ``cert_file`` itself).

    The settings named in errors are the broker's own client ones
    (``broker_client_trust_certs_file_path``, ``tlsCertFile``/``tlsKeyFile``)."""
    if trust_file:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_trust(context, trust_file, "broker_client_trust_certs_file_path")
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = MINIMUM_VERSION
    context.check_hostname = verify_hostname
    if cert_file:
        _load_chain(context, cert_file, key_file or cert_file, "tlsCertFile", "tlsKeyFile")
    elif key_file:
        raise TlsConfigError("tlsKeyFile is set but tlsCertFile is not")
    return context
