"""The settings a managed ledger is opened with (``ManagedLedgerConfig``) and arithmetic over
its ledgers. The record it stores (``LedgerInfo``, ``ManagedLedgerRecord``) is common's
(``common/ledger/managed_ledger_list.py``): the bookie's GC and the Spark source read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.broker.model.position import Position

MiB = 1024 * 1024
#: Waits between rollovers whose ledgers took no entry: the first, doubled up to the last.
ROLL_BACKOFF_FIRST_S = 0.1
ROLL_BACKOFF_MAX_S = 5.0


@dataclass(slots=True)
class ManagedLedgerConfig:
    ensemble_size: int = 1
    write_quorum: int = 1
    ack_quorum: int = 1
    max_entries_per_ledger: int = 50_000
    max_ledger_size_bytes: int = 512 * MiB
    max_ledger_age_s: float = 4 * 3600.0  # checked when an add arrives
    cursor_persist_interval_s: float = 1.0
    #: A cursor with more ack-hole ranges than this stores its state in a cursor ledger.
    max_unacked_ranges_in_metadata: int = 1000
    cursor_ledger_max_entries: int = 10_000  # a cursor ledger rolls after this many states
    cursor_ledger_max_bytes: int = 64 * MiB  # ... or this many bytes
    cache_bytes: int = 16 * MiB  # recently added entries kept for tailing readers

    def full(self, entries: int, size: int, age_s: float) -> bool:
        """Whether a ledger with ``entries`` adds (``size`` bytes, ``age_s`` old) rolls over
        before the next add; an empty ledger never does (it gains nothing)."""
        if entries == 0:
            return False
        return (
            entries >= self.max_entries_per_ledger
            or size >= self.max_ledger_size_bytes
            or age_s >= self.max_ledger_age_s
        )


def roll_backoff(failed_rolls: int) -> float:
    """The wait before the next rollover after ``failed_rolls`` in a row gave ledgers nobody
    could write to (from the second on): doubling from ROLL_BACKOFF_FIRST_S, up to
    ROLL_BACKOFF_MAX_S, so failing bookies do not turn every add into a new empty ledger."""
    return min(ROLL_BACKOFF_FIRST_S * 2 ** (failed_rolls - 2), ROLL_BACKOFF_MAX_S)


def entries_after(extents: list[tuple[int, int]], position: Position) -> int:
    """How many entries of ``extents`` ((ledger id, entry count) in order) are strictly after
    ``position``."""
    total = 0
    for ledger_id, count in extents:
        if ledger_id > position.ledger_id:
            total += count
        elif ledger_id == position.ledger_id:
            total += max(count - (position.entry_id + 1), 0)
    return total
