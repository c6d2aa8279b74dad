"""Bookie configuration (``magnetar bookie --help`` prints every setting with its default)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from magnetar.common.config import ConfigError, setting
from magnetar.common.metadata.etcd_settings import EtcdTlsSettings

if TYPE_CHECKING:
    from magnetar.common.ledger.bookie_client import BookieTls

MiB = 1024 * 1024


@dataclass(slots=True)
class BookieConfig(EtcdTlsSettings):
    metadata_url: str = setting(
        "etcd://127.0.0.1:2379", "metadata store URL (etcd://h:p[,h:p] or local:///path/meta.db)"
    )
    bind_address: str = setting("0.0.0.0", "address the gRPC and HTTP servers listen on")
    advertised_address: str = setting(
        "", "host name or IP clients use to reach this bookie (default: this host's IP)"
    )
    port: int = setting(3181, "gRPC port of the bookie protocol")
    http_port: int = setting(8000, "HTTP port for /health, /ready, /metrics and the admin API")
    journal_dir: str = setting(
        "data/bookie/journal", "journal directory (put it on the fastest disk)"
    )
    ledger_dir: str = setting("data/bookie/ledgers", "entry logs and index directory")
    journal_sync: bool = setting(
        True, "fsync the journal before acknowledging an add (turn off only for tests)"
    )
    journal_max_group_wait_ms: float = setting(
        0.0,
        "longest an add waits for others to share its fsync (0: write at once when the journal "
        "is idle; adds arriving during a write still share the next fsync)",
    )
    journal_max_group_bytes: int = setting(
        512 * 1024, "bytes after which a group is written without waiting"
    )
    journal_file_max_bytes: int = setting(
        256 * MiB, "journal file size at which a new file is started"
    )
    write_cache_bytes: int = setting(
        128 * MiB, "memtable budget; half of it triggers a flush, all of it makes adds wait"
    )
    checkpoint_interval_s: float = setting(
        10.0, "seconds between checkpoints (memtable flush + journal trim)"
    )
    entry_log_max_bytes: int = setting(
        1024 * MiB, "entry log file size at which a new file is started"
    )
    read_cache_bytes: int = setting(32 * MiB, "cache of entries read from entry logs")
    max_entry_size: int = setting(
        5 * MiB + 10 * 1024,
        "largest entry accepted, header included (Pulsar's 5 MiB message + 10 KiB of headers)",
    )
    gc_interval_s: float = setting(
        300.0, "seconds between garbage-collection runs (0: only on request)"
    )
    gc_orphan_min_idle_s: float = setting(
        300.0,
        "a ledger the metadata store no longer has is garbage-collected only after this many "
        "seconds without an add here (guards ledgers whose metadata is still being written)",
    )
    compaction_threshold: float = setting(
        0.5, "entry logs with a smaller live fraction are compacted"
    )
    disk_usage_threshold: float = setting(
        0.95, "disk usage fraction at which the bookie turns read-only"
    )
    disk_usage_lwm: float = setting(
        0.90, "disk usage fraction under which a read-only bookie is writable again"
    )
    disk_quota_bytes: int = setting(
        0, "if > 0, usage = bytes in journal and ledger dirs / this quota, not the disk's own usage"
    )
    disk_check_interval_s: float = setting(5.0, "seconds between disk usage checks")
    session_ttl_s: int = setting(
        10, "metadata session TTL; a bookie silent that long is considered gone"
    )
    # -- autorecovery (BookKeeper's names, in snake_case) --
    auto_recovery_daemon_enabled: bool = setting(
        True,
        "run a replication worker in this bookie and stand for the auditor role; "
        "`magnetar bk autorecovery disable|enable` pauses and resumes them cluster-wide at run time",
    )
    lost_bookie_recovery_delay: float = setting(
        60.0,
        "seconds a bookie may be gone before the auditor marks its ledgers under-replicated "
        "(BookKeeper's default is 0; a minute lets a restart or a short outage copy nothing); "
        "`magnetar bk lostbookierecoverydelay` overrides it cluster-wide",
    )
    auditor_periodic_check_interval: float = setting(
        604800.0,
        "seconds between the auditor's full checks of every ledger's ensembles against the "
        "registered bookies (0: never); it catches what the registration watch missed",
    )
    auditor_periodic_bookie_check_interval: float = setting(
        86400.0,
        "seconds between the auditor's sampled entry-presence checks: a few entries of each "
        "closed ledger read from every replica that should hold them (0: never)",
    )
    rereplication_entry_batch_size: int = setting(
        100, "entries a replication worker copies concurrently"
    )
    replication_rate_by_bytes: int = setting(
        0, "bytes per second one replication worker copies at most (0: no limit)"
    )
    open_ledger_rereplication_grace_period: float = setting(
        30.0,
        "seconds an open ledger may keep a lost bookie in its last ensemble before a replication "
        "worker takes its writer for gone, fences and recovers it, and copies the rest",
    )

    # -- TLS of the bookie protocol (BookKeeper's PEM settings, in snake_case; off by default) --
    tls_certificate_path: str = setting(
        "",
        "PEM certificate (chain) of this bookie; with tls_key_store, the gRPC port serves TLS "
        "only (BookKeeper's tlsCertificatePath). It must name the host of advertised_address "
        "(subjectAltName DNS or IP): clients check it. Empty: plain gRPC",
    )
    tls_key_store: str = setting(
        "",
        "PEM file with the unencrypted private key of tls_certificate_path (BookKeeper's "
        "tlsKeyStore with tlsKeyStoreType=PEM, the only type here)",
    )
    tls_trust_store: str = setting(
        "",
        "PEM CA certificates (BookKeeper's tlsTrustStore, PEM): client certificates must chain "
        "to them under tls_client_authentication, and this bookie's own autorecovery client "
        "checks other bookies against them (empty: gRPC's public roots)",
    )
    tls_client_authentication: bool = setting(
        False,
        "require a client certificate chaining to tls_trust_store on every connection "
        "(BookKeeper's tlsClientAuthentication); this bookie's autorecovery then shows "
        "tls_certificate_path to other bookies, so it needs the clientAuth key usage too",
    )

    def validate(self) -> None:
        for name in ("port", "http_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {value}")
        if not 0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1:
            raise ConfigError("need 0 < disk_usage_lwm <= disk_usage_threshold <= 1")
        if self.max_entry_size > self.write_cache_bytes // 2:
            raise ConfigError(
                "max_entry_size must fit in half the write cache (write_cache_bytes / 2)"
            )
        if self.journal_max_group_bytes <= 0 or self.journal_file_max_bytes <= 0:
            raise ConfigError("journal sizes must be positive")
        if self.gc_orphan_min_idle_s < 0:
            raise ConfigError("gc_orphan_min_idle_s must be >= 0")
        if self.lost_bookie_recovery_delay < 0 or self.open_ledger_rereplication_grace_period < 0:
            raise ConfigError(
                "lost_bookie_recovery_delay and open_ledger_rereplication_grace_period must be >= 0"
            )
        if self.rereplication_entry_batch_size <= 0:
            raise ConfigError("rereplication_entry_batch_size must be positive")
        if not 0 <= self.compaction_threshold < 1:
            raise ConfigError("compaction_threshold must be in [0, 1)")
        self._validate_tls()

    def _validate_tls(self) -> None:
        if bool(self.tls_certificate_path) != bool(self.tls_key_store):
            raise ConfigError(
                "bookie TLS needs both tls_certificate_path and tls_key_store (or neither)"
            )
        if self.tls_client_authentication and not (
            self.tls_certificate_path and self.tls_trust_store
        ):
            raise ConfigError(
                "tls_client_authentication needs TLS on (tls_certificate_path, tls_key_store) "
                "and tls_trust_store, the CAs client certificates must chain to"
            )
        if self.tls_trust_store and not self.tls_certificate_path:
            raise ConfigError(
                "tls_trust_store is set but TLS is off: set tls_certificate_path and "
                "tls_key_store too"
            )
        self.validate_etcd_tls(self.metadata_url)

    @property
    def tls_enabled(self) -> bool:
        """The bookie protocol is served over TLS."""
        return bool(self.tls_certificate_path)

    def client_tls(self) -> BookieTls | None:
        """TLS of this bookie's own ledger client (autorecovery) to other bookies: on with the
        bookie's TLS, as BookKeeper's autorecovery uses the bookie's tls* settings; the bookie's
        certificate is shown only under tls_client_authentication."""
        if not self.tls_enabled:
            return None
        from magnetar.common.ledger.bookie_client import BookieTls

        show = self.tls_client_authentication
        return BookieTls(
            trust_certs_file=self.tls_trust_store,
            certificate_file=self.tls_certificate_path if show else "",
            key_file=self.tls_key_store if show else "",
        )

    def resolved_address(self) -> str:
        """The ``host:port`` this bookie registers under."""
        host = self.advertised_address
        if not host:
            if self.bind_address not in ("0.0.0.0", "::", ""):
                host = self.bind_address
            else:
                try:
                    host = socket.gethostbyname(socket.gethostname())
                except OSError:
                    host = "127.0.0.1"
        return f"{host}:{self.port}"
