"""What a managed ledger counts for metrics (Pulsar's ``ManagedLedgerMBean``): plain integers
and bucket arrays, incremented where adds, reads, rollovers and mark-deletes happen, read at
scrape time. Rates and per-period bucket counts are deltas between scrapes, taken by the
metrics module above; nothing here knows Prometheus.

Buckets are Pulsar's: latencies in milliseconds up to 0.5, 1, 5, 10, 20, 50, 100, 200 and 1000
(then overflow), entry sizes in bytes up to 128, 512, 1 KiB, 2 KiB, 4 KiB, 16 KiB, 100 KiB and
1 MiB (then overflow); a value equal to a bound falls in that bound's bucket, as in Pulsar's
``(lower, upper]`` ranges. Latency sums are kept in microseconds, as Pulsar keeps them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Upper bounds of the latency buckets (ms); one more bucket holds what is above the last.
LATENCY_BOUNDS_MS: tuple[float, ...] = (0.5, 1, 5, 10, 20, 50, 100, 200, 1000)
#: Upper bounds of the entry size buckets (bytes); one more bucket holds what is above.
ENTRY_SIZE_BOUNDS: tuple[int, ...] = (128, 512, 1024, 2048, 4096, 16384, 102400, 1048576)


@dataclass(slots=True)
class Buckets:
    """Counts of values per bucket (not cumulative), their number and sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def add(self, value: float) -> None:
        """Count ``value`` in its bucket and the sum."""
        self.add_all((value,))

    def add_all(self, values: Iterable[float]) -> None:
        """Count each value in its bucket, and add it to the sum: one call for the entries of
        a stored group."""
        counts, bounds = self.counts, self.bounds
        added, total = 0, 0.0
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            added += 1
            total += value
        self.count += added
        self.sum += total

    def add_latency(self, seconds: float, times: int = 1) -> None:
        """A latency (``times`` times): bucketed in ms, summed in µs (Pulsar's units)."""
        ms = seconds * 1000.0
        self.counts[bisect.bisect_left(self.bounds, ms)] += times
        self.count += times
        self.sum += ms * 1000.0 * times

    def snapshot(self) -> tuple[int, ...]:
        """Every bucket's count, then the number of values (for deltas between scrapes)."""
        return (*self.counts, self.count)


@dataclass(slots=True)
class ManagedLedgerStats:
    """One managed ledger's counters since it was opened on this broker."""

    adds_succeeded: int = 0
    adds_failed: int = 0
    add_bytes: int = 0
    reads_succeeded: int = 0  # entries read (cache or bookies)
    reads_failed: int = 0
    read_bytes: int = 0
    cache_hits: int = 0  # entries served from the entry cache
    cache_hit_bytes: int = 0
    cache_misses: int = 0  # entries read from the bookies
    cache_miss_bytes: int = 0
    mark_deletes: int = 0
    #: From the add's call to its acknowledgement (queue included): Pulsar's AddEntryLatency.
    add_latency: Buckets = field(default_factory=lambda: Buckets(LATENCY_BOUNDS_MS))
    #: From the entry's push to the ledger to its acknowledgement: LedgerAddEntryLatency.
    ledger_add_latency: Buckets = field(default_factory=lambda: Buckets(LATENCY_BOUNDS_MS))
    ledger_switch_latency: Buckets = field(default_factory=lambda: Buckets(LATENCY_BOUNDS_MS))
    entry_size: Buckets = field(default_factory=lambda: Buckets(ENTRY_SIZE_BOUNDS))

    def counters(self) -> tuple[int, ...]:
        """The counters that rates are taken of, in a fixed order: adds, add bytes, reads,
        read bytes, cache hits, hit bytes, misses, miss bytes, mark-deletes."""
        return (
            self.adds_succeeded,
            self.add_bytes,
            self.reads_succeeded,
            self.read_bytes,
            self.cache_hits,
            self.cache_hit_bytes,
            self.cache_misses,
            self.cache_miss_bytes,
            self.mark_deletes,
        )
