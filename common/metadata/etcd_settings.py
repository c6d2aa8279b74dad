"""TLS to etcd as settings (the ``useTls``/``tls*`` keys of Pulsar's etcd metadata-store
config, in snake_case), shared by every service that opens an etcd metadata store: brokers,
bookies, proxies, ``magnetar bk``. Off by default."""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.common.config import ConfigError, setting
from magnetar.common.metadata.etcd import EtcdTls


@dataclass(slots=True)
class EtcdTlsSettings:
    etcd_use_tls: bool = setting(
        False, "reach the etcd of metadata_url over TLS (etcd's https:// client URLs)"
    )
    etcd_tls_trust_certs_file_path: str = setting(
        "",
        "PEM CA certificates etcd's certificate must chain to (empty: gRPC's public roots); "
        "that certificate must name the host given in metadata_url",
    )
    etcd_tls_certificate_file_path: str = setting(
        "", "PEM client certificate shown to etcd (for etcd's --client-cert-auth)"
    )
    etcd_tls_key_file_path: str = setting(
        "", "PEM unencrypted private key of etcd_tls_certificate_file_path"
    )

    def etcd_tls(self) -> EtcdTls | None:
        """TLS to etcd, or None when etcd_use_tls is off."""
        if not self.etcd_use_tls:
            return None
        return EtcdTls(
            trust_certs_file=self.etcd_tls_trust_certs_file_path,
            certificate_file=self.etcd_tls_certificate_file_path,
            key_file=self.etcd_tls_key_file_path,
        )

    def validate_etcd_tls(self, metadata_url: str) -> None:
        etcd_files = (
            self.etcd_tls_trust_certs_file_path,
            self.etcd_tls_certificate_file_path,
            self.etcd_tls_key_file_path,
        )
        if any(etcd_files) and not self.etcd_use_tls:
            raise ConfigError("etcd_tls_* files are set but etcd_use_tls is off: turn it on")
        if self.etcd_use_tls and not metadata_url.startswith("etcd://"):
            raise ConfigError(
                f"etcd_use_tls applies to an etcd:// metadata_url, not {metadata_url}"
            )
        if bool(self.etcd_tls_certificate_file_path) != bool(self.etcd_tls_key_file_path):
            raise ConfigError(
                "an etcd client certificate needs both etcd_tls_certificate_file_path and "
                "etcd_tls_key_file_path"
            )
