"""Broker configuration (``magnetar broker --help`` prints every setting with its default)."""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.common.config import ConfigError, setting


@dataclass(slots=True)
class BrokerConfig:
    metadata_url: str = setting(
        "etcd://127.0.0.1:2379", "metadata store URL (etcd://h:p[,h:p] or local:///path/meta.db)"
    )
    bind_address: str = setting("0.0.0.0", "address the Pulsar protocol and HTTP servers listen on")
    advertised_address: str = setting("127.0.0.1", "host name or IP clients are told to connect to")
    port: int = setting(6650, "Pulsar binary protocol port")
    http_port: int = setting(8080, "HTTP port: admin REST (/admin/v2/...) and health")
    max_message_size: int = setting(
        5 * 1024 * 1024, "largest message (payload and metadata) accepted"
    )
    ensemble_size: int = setting(2, "bookies per topic ledger (E)")
    write_quorum: int = setting(2, "copies of each entry (Qw)")
    ack_quorum: int = setting(2, "copies that must be stored before a send is acknowledged (Qa)")
    max_entries_per_ledger: int = setting(
        50_000, "a topic starts a new ledger after this many entries"
    )
    deduplication_enabled: bool = setting(
        False, "drop messages resent with an already stored producer name + sequence id"
    )
    dispatch_batch: int = setting(100, "entries read from storage per dispatch round at most")

    def validate(self) -> None:
        for name in ("port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {getattr(self, name)}")
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ConfigError("need ensemble_size >= write_quorum >= ack_quorum >= 1")
