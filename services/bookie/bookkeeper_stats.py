"""BookKeeper's own metric names on a Magnetar bookie, written as BookKeeper's Prometheus
provider (``bookkeeper-stats-providers/prometheus-metrics-provider``) writes them, so the stock
BookKeeper and Pulsar dashboards and alerts read our bookies unchanged.

BookKeeper's names are scopes joined by ``_`` (``bookie`` for the storage, ``bookkeeper_server``
for request processing, ``bookie_journal``, and ``replication`` for an autorecovery daemon run
inside the bookie, with its ``auditor`` and ``replication_worker`` scopes). Its three kinds:

- a counter is written under its bare name, typed ``counter``, without ``_total`` (which
  prometheus_client would add, hence this module writing the text itself);
- a gauge is typed ``gauge``;
- an OpStatsLogger is a ``summary`` per outcome (label ``success="true"|"false"``): quantiles
  0.5 ... 1.0 of recent values, ``_count`` and ``_sum``; latencies are in milliseconds.

BookKeeper's quantiles come from a sketch rotated every few seconds; here from the last
:data:`RECENT` values of each outcome (NaN before the first), which a dashboard's p99 reads
the same way. DbLedgerStorage's gauges carry ``ledgerDir``/``indexDir`` labels, as in
BookKeeper since 4.15; the index lives in the ledger directory here, so both name it.

Pure code: :class:`BookKeeperStats` is fed by the storage, the replication worker and the
auditor, and :meth:`BookKeeperStats.render` is given the gauges read at scrape time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

QUANTILES = (0.5, 0.75, 0.95, 0.99, 0.999, 0.9999, 1.0)
RECENT = 1024


def _number(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


class OpStats:
    """One OpStatsLogger: per outcome, the number of events, their sum and recent values."""

    def __init__(self) -> None:
        self._count = {True: 0, False: 0}
        self._sum = {True: 0.0, False: 0.0}
        self._recent: dict[bool, deque[float]] = {
            True: deque(maxlen=RECENT),
            False: deque(maxlen=RECENT),
        }

    def record(self, value: float, *, success: bool = True, events: int = 1) -> None:
        """``events`` events of ``value`` each (a batch of entries answered together)."""
        if events <= 0:
            return
        self._count[success] += events
        self._sum[success] += value * events
        self._recent[success].append(value)

    def record_latency(self, seconds: float, *, success: bool = True, events: int = 1) -> None:
        self.record(seconds * 1000.0, success=success, events=events)

    def count(self, success: bool = True) -> int:
        return self._count[success]

    def quantile(self, q: float, success: bool = True) -> float:
        return _quantile(sorted(self._recent[success]), q)

    def lines(self, name: str, labels: tuple[tuple[str, str], ...] = ()) -> list[str]:
        out = [f"# TYPE {name} summary"]
        for success in (False, True):
            outcome = (*labels, ("success", "true" if success else "false"))
            values = sorted(self._recent[success])
            for q in QUANTILES:
                value = _quantile(values, q)
                out.append(f"{name}{_labels((*outcome, ('quantile', str(q))))} {_number(value)}")
            out.append(f"{name}_count{_labels(outcome)} {_number(float(self._count[success]))}")
            out.append(f"{name}_sum{_labels(outcome)} {_number(self._sum[success])}")
        return out


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (NaN for none)."""
    if not values:
        return math.nan
    return values[max(math.ceil(q * len(values)) - 1, 0)]


@dataclass(slots=True)
class StorageGauges:
    """What the bookie reads at scrape time for BookKeeper's gauges."""

    writable: bool
    journal_queue_size: int
    ledgers: int
    entries: int
    write_cache_bytes: int
    read_cache_bytes: int
    ledger_dir: str
    index_dir: str


class BookKeeperStats:
    """BookKeeper's families of one bookie."""

    def __init__(self) -> None:
        # bookkeeper_server: from an add's (read's) receipt to its answer. Magnetar has one
        # stage where BookKeeper has two (the request queue, then the processing), so the
        # _REQUEST families are written from the same figures as the plain ones.
        self.add_entry = OpStats()
        self.read_entry = OpStats()
        # bookie
        self.write_bytes = 0
        self.read_bytes = 0
        # bookie_journal: one journal group written and fsynced
        self.journal_sync = OpStats()
        # replication_auditor: the number found at each count of under-replicated ledgers,
        # the ledgers looked at by each check of all ledgers and how long it took, how long
        # marking the ledgers of lost bookies took
        self.auditor_under_replicated = OpStats()
        self.ledgers_checked = 0
        self.check_all_ledgers_time = OpStats()
        self.publish_time_for_lost_bookie = OpStats()
        # replication_replication_worker: fragments re-replicated, entries and bytes read from
        # surviving replicas and written to new ones, each ledger's re-replication (ms)
        self.replicated_fragments = 0
        self.entries_read = 0
        self.bytes_read = 0
        self.entries_written = 0
        self.bytes_written = 0
        self.rereplicate = OpStats()

    # -- events ------------------------------------------------------------------------------

    def added(self, seconds: float, entries: int, size: int, *, success: bool = True) -> None:
        self.add_entry.record_latency(seconds, success=success, events=entries)
        if success:
            self.write_bytes += size

    def read(self, seconds: float, size: int, *, success: bool = True) -> None:
        self.read_entry.record_latency(seconds, success=success)
        if success:
            self.read_bytes += size

    # -- exposition --------------------------------------------------------------------------

    def render(self, gauges: StorageGauges) -> str:
        dirs = (("ledgerDir", gauges.ledger_dir), ("indexDir", gauges.index_dir))
        out: list[str] = []

        def gauge(name: str, value: float, labels: tuple[tuple[str, str], ...] = ()) -> None:
            out.extend((f"# TYPE {name} gauge", f"{name}{_labels(labels)} {_number(value)}"))

        def counter(name: str, value: int) -> None:
            out.extend((f"# TYPE {name} counter", f"{name} {value}"))

        gauge("bookie_SERVER_STATUS", 1 if gauges.writable else 0)
        counter("bookie_WRITE_BYTES", self.write_bytes)
        counter("bookie_READ_BYTES", self.read_bytes)
        gauge("bookie_ledgers_count", gauges.ledgers, dirs)
        gauge("bookie_entries_count", gauges.entries, dirs)
        gauge("bookie_write_cache_size", gauges.write_cache_bytes, dirs)
        gauge("bookie_read_cache_size", gauges.read_cache_bytes, dirs)
        gauge("bookie_journal_JOURNAL_QUEUE_SIZE", gauges.journal_queue_size)
        out.extend(self.journal_sync.lines("bookie_journal_JOURNAL_SYNC"))
        out.extend(self.add_entry.lines("bookkeeper_server_ADD_ENTRY"))
        out.extend(self.add_entry.lines("bookkeeper_server_ADD_ENTRY_REQUEST"))
        out.extend(self.read_entry.lines("bookkeeper_server_READ_ENTRY"))
        out.extend(self.read_entry.lines("bookkeeper_server_READ_ENTRY_REQUEST"))
        auditor = "replication_auditor"
        out.extend(self.auditor_under_replicated.lines(f"{auditor}_NUM_UNDER_REPLICATED_LEDGERS"))
        counter(f"{auditor}_NUM_LEDGERS_CHECKED", self.ledgers_checked)
        out.extend(self.check_all_ledgers_time.lines(f"{auditor}_CHECK_ALL_LEDGERS_TIME"))
        out.extend(
            self.publish_time_for_lost_bookie.lines(f"{auditor}_URL_PUBLISH_TIME_FOR_LOST_BOOKIE")
        )
        worker = "replication_replication_worker"
        counter(f"{worker}_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED", self.replicated_fragments)
        counter(f"{worker}_NUM_ENTRIES_READ", self.entries_read)
        counter(f"{worker}_NUM_BYTES_READ", self.bytes_read)
        counter(f"{worker}_NUM_ENTRIES_WRITTEN", self.entries_written)
        counter(f"{worker}_NUM_BYTES_WRITTEN", self.bytes_written)
        out.extend(self.rereplicate.lines(f"{worker}_rereplicate"))
        return "\n".join(out) + "\n"
