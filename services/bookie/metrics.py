"""Prometheus metrics of one bookie, in a registry of its own (several bookies may share a
process in tests and in standalone mode), with the process and interpreter collectors
(``common/metrics.py``). BookKeeper's own names are in ``bookkeeper_stats.py``."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from magnetar.bookie.bookkeeper_stats import BookKeeperStats
from magnetar.common.metrics import service_registry

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class BookieMetrics:
    def __init__(self) -> None:
        self.registry = r = service_registry()
        #: BookKeeper's families, written by ``bookkeeper_stats`` after these.
        self.bookkeeper = BookKeeperStats()
        self.adds = Counter(
            "magnetar_bookie_add_entries", "Add requests by outcome", ["status"], registry=r
        )
        self.add_bytes = Counter("magnetar_bookie_add_bytes", "Bytes of entries added", registry=r)
        self.reads = Counter(
            "magnetar_bookie_read_entries", "Read requests by outcome", ["status"], registry=r
        )
        self.add_latency = Histogram(
            "magnetar_bookie_add_latency_seconds",
            "Time from receiving an add request to its durable acknowledgement",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.journal_fsync = Histogram(
            "magnetar_bookie_journal_fsync_latency_seconds",
            "Time to write and fsync one journal group",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.journal_group_entries = Counter(
            "magnetar_bookie_journal_group_records", "Records written in journal groups", registry=r
        )
        self.memtable_bytes = Gauge(
            "magnetar_bookie_memtable_bytes", "Bytes held in the memtable", registry=r
        )
        self.entry_log_bytes = Gauge(
            "magnetar_bookie_entry_log_bytes", "Bytes in entry log files", registry=r
        )
        self.checkpoints = Counter(
            "magnetar_bookie_checkpoints", "Completed checkpoints", registry=r
        )
        self.read_only = Gauge(
            "magnetar_bookie_read_only", "1 while the bookie refuses writes", registry=r
        )
        self.disk_usage = Gauge(
            "magnetar_bookie_disk_usage_ratio",
            "Disk usage compared with the thresholds",
            registry=r,
        )
        self.digest_errors = Counter(
            "magnetar_bookie_digest_errors",
            "Entries that failed their CRC32C check on read",
            registry=r,
        )
        self.gc_freed_bytes = Counter(
            "magnetar_bookie_gc_freed_bytes", "Entry log bytes reclaimed by GC", registry=r
        )
        self.gc_orphan_ledgers = Counter(
            "magnetar_bookie_gc_orphan_ledgers",
            "Ledgers deleted by GC because the metadata store no longer has them",
            registry=r,
        )
        self.gc_orphan_scans = Counter(
            "magnetar_bookie_gc_orphan_scans",
            "Orphan-ledger scans by outcome (done, skipped: the store could not be trusted "
            "or reached)",
            ["outcome"],
            registry=r,
        )
        self.unreferenced_ledgers = Gauge(
            "magnetar_bookie_unreferenced_ledgers",
            "Ledgers with entries here that no topic refers to, as the last GC round found "
            "them (reason: unlisted, topic-missing, above-counter); kept for an operator to "
            "adopt or delete",
            ["reason"],
            registry=r,
        )
        # Autorecovery (set by the auditor on the bookie that holds the auditor role; the
        # counters by this bookie's replication worker).
        self.under_replicated_ledgers = Gauge(
            "magnetar_bookie_under_replicated_ledgers",
            "Ledgers marked under-replicated, as the auditor last counted them",
            registry=r,
        )
        self.replication_lag = Gauge(
            "magnetar_bookie_replication_lag_seconds",
            "Age of the oldest under-replicated mark, as the auditor last saw it",
            registry=r,
        )
        self.auditor = Gauge(
            "magnetar_bookie_auditor", "1 while this bookie holds the auditor role", registry=r
        )
        self.fragments_replicated = Counter(
            "magnetar_bookie_fragments_replicated",
            "Ledger fragments this bookie's replication worker copied and committed",
            registry=r,
        )
        self.replicated_bytes = Counter(
            "magnetar_bookie_replicated_bytes",
            "Entry bytes this bookie's replication worker copied to new bookies",
            registry=r,
        )
