"""A managed ledger's ledgers as stored: one ``LedgerInfo`` per ledger, in the record the
metadata store keeps at the managed ledger's key, as JSON::

    {"name": "persistent://t/ns/topic",
     "ledgers": [{"ledger_id": 7, "entries": 100, "size": 5120, "ctime_ms": ..., "closed": true},
                 {"ledger_id": 9, "entries": 0, "size": 0, "ctime_ms": ..., "closed": false}],
     "properties": {}}

The settings a managed ledger is opened with (``ManagedLedgerConfig``) are here too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from magnetar.broker.model.position import Position
from magnetar.common.ledger.metadata import LedgerMetadata

MiB = 1024 * 1024
#: Waits between rollovers whose ledgers took no entry: the first, doubled up to the last.
ROLL_BACKOFF_FIRST_S = 0.1
ROLL_BACKOFF_MAX_S = 5.0


@dataclass(slots=True, frozen=True)
class LedgerInfo:
    ledger_id: int
    entries: int = 0  # final count once closed; 0 for the ledger still open for writes
    size: int = 0
    ctime_ms: int = 0
    closed: bool = False
    closed_ms: int = 0  # when the broker closed it (0: unknown, use ctime_ms)

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "entries": self.entries,
            "size": self.size,
            "ctime_ms": self.ctime_ms,
            "closed": self.closed,
            "closed_ms": self.closed_ms,
        }

    def closed_as(self, metadata: LedgerMetadata) -> LedgerInfo:
        """This ledger closed, with the end its (closed or recovered) metadata gives."""
        return replace(
            self,
            entries=metadata.last_entry_id + 1,
            size=metadata.length,
            closed=True,
            closed_ms=int(time.time() * 1000),
        )

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LedgerInfo:
        return cls(
            int(d["ledger_id"]),
            int(d["entries"]),
            int(d["size"]),
            int(d["ctime_ms"]),
            bool(d["closed"]),
            int(d.get("closed_ms", 0)),
        )


@dataclass(slots=True)
class ManagedLedgerRecord:
    """The managed ledger's stored record: its ledgers in order and its properties.

    ``{"name": ..., "ledgers": [LedgerInfo.to_json(), ...], "properties": {...}}``"""

    name: str
    ledgers: list[LedgerInfo] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc = {
            "name": self.name,
            "ledgers": [i.to_json() for i in self.ledgers],
            "properties": self.properties,
        }
        return json.dumps(doc).encode()

    @classmethod
    def from_bytes(cls, name: str, data: bytes) -> ManagedLedgerRecord:
        doc = json.loads(data)
        return cls(
            name,
            [LedgerInfo.from_json(d) for d in doc["ledgers"]],
            dict(doc.get("properties", {})),
        )


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
