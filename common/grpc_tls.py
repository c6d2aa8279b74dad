"""TLS of the gRPC clients inside the cluster: the ledger client towards bookies and the
metadata store towards etcd. One shape for both: a CA file, and a client certificate with its
key for servers that require one; read into gRPC credentials with errors that name the peer
and the file, never key material."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import grpc


@dataclass(slots=True, frozen=True)
class GrpcClientTls:
    """The files of one gRPC client's TLS; subclasses name the peer (``PEER``) and the error
    raised for unusable files (``ERROR``)."""

    PEER: ClassVar[str] = "server"
    ERROR: ClassVar[type[ValueError]] = ValueError

    trust_certs_file: str = ""
    certificate_file: str = ""
    key_file: str = ""

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """The files read into gRPC credentials (read once: new files need a new client)."""
        if bool(self.certificate_file) != bool(self.key_file):
            raise self.ERROR(
                f"{self.PEER} TLS: a client certificate needs both its certificate file and its "
                f"key file (got certificate {self.certificate_file!r}, key {self.key_file!r})"
            )
        root = self._read_pem(self.trust_certs_file, "CA certificates", b"CERTIFICATE-----")
        chain = self._read_pem(self.certificate_file, "client certificate", b"CERTIFICATE-----")
        key = self._read_pem(self.key_file, "client key", b"PRIVATE KEY-----")
        if key is not None and b"ENCRYPTED" in key:
            raise self.ERROR(
                f"{self.PEER} TLS: the key in {self.key_file} is encrypted; give an unencrypted "
                "PEM key"
            )
        return grpc.ssl_channel_credentials(
            root_certificates=root, private_key=key, certificate_chain=chain
        )

    def _read_pem(self, path: str, what: str, marker: bytes) -> bytes | None:
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise self.ERROR(
                f"{self.PEER} TLS: cannot read the {what} file {path}: {e.strerror}"
            ) from None
        if marker not in data:
            raise self.ERROR(f"{self.PEER} TLS: {path} holds no PEM {what}")
        return data
