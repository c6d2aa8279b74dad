"""Bookie configuration (``magnetar bookie --help`` prints every setting with its default)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from magnetar.common.config import ConfigError, setting

MiB = 1024 * 1024


@dataclass(slots=True)
class BookieConfig:
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
