"""A topic's compacted ledger (Pulsar's CompactedTopicImpl): the latest message of each key up to
the *compaction horizon*, read by consumers and readers with ``read_compacted``.

Each entry is Pulsar's RawMessage layout: ``[id size u32][MessageIdData][size u32][stored]``,
the stored entry (a producer's payload section, a batch rewritten to the messages it keeps) after
the position it had in the topic. Entries are in position order, so a reader finds where to
start by bisecting the ledger.

Where it is recorded: the managed ledger's properties hold the ledger id and the horizon
(``CompactedTopicLedger``, ``CompactionHorizon``), written together by one compare-and-set, so
a reader sees the old pair or the new one, never a mix. A run that created a ledger it has not
recorded yet names it in ``CompactionPendingLedger`` first: the next run (or the topic's delete)
deletes it, so a crash at any point leaves no ledger nobody refers to.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

from magnetar.broker.model.message_id import from_wire, to_wire
from magnetar.broker.model.position import Position
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.managed_ledger_list import COMPACTED_LEDGER_PROPERTIES
from magnetar.common.proto import pulsar_api_pb2 as pb

log = logging.getLogger(__name__)

#: Managed-ledger properties (Pulsar names the first as its compaction cursor's property); the
#: bookie's GC counts the ledgers they name as the topic's (``COMPACTED_LEDGER_PROPERTIES``).
LEDGER_PROPERTY, PENDING_PROPERTY = COMPACTED_LEDGER_PROPERTIES
HORIZON_PROPERTY = "CompactionHorizon"

_U32 = struct.Struct(">I")
#: Entries kept in memory per compacted ledger for bisection and tailing (position, bytes).
CACHE_ENTRIES = 256


def encode_entry(position: Position, stored: bytes) -> bytes:
    """A compacted-ledger entry: the message id, then the stored entry."""
    message_id = to_wire(position).SerializeToString()
    return b"".join((_U32.pack(len(message_id)), message_id, _U32.pack(len(stored)), stored))


def decode_entry(data: bytes) -> tuple[Position, bytes]:
    (id_size,) = _U32.unpack_from(data, 0)
    position = from_wire(pb.MessageIdData.FromString(data[4 : 4 + id_size]))
    (size,) = _U32.unpack_from(data, 4 + id_size)
    start = 8 + id_size
    if start + size != len(data):
        raise ValueError(f"compacted entry of {len(data)} bytes says {size} bytes follow its id")
    return position, data[start:]


@dataclass(slots=True, frozen=True)
class CompactionRecord:
    """What the managed ledger's properties say about its compaction."""

    ledger_id: int
    horizon: Position

    def properties(self) -> dict[str, str | None]:
        return {
            LEDGER_PROPERTY: str(self.ledger_id),
            HORIZON_PROPERTY: str(self.horizon),
            PENDING_PROPERTY: None,
        }

    @classmethod
    def of(cls, properties: dict[str, str]) -> CompactionRecord | None:
        ledger = properties.get(LEDGER_PROPERTY)
        horizon = properties.get(HORIZON_PROPERTY)
        if ledger is None or horizon is None:
            return None
        ledger_id, _, entry_id = horizon.partition(":")
        return cls(int(ledger), Position(int(ledger_id), int(entry_id)))


def referenced_ledgers(properties: dict[str, str]) -> list[int]:
    """The compacted ledgers the properties name (recorded and pending): deleted with the
    topic."""
    return [int(properties[k]) for k in (LEDGER_PROPERTY, PENDING_PROPERTY) if k in properties]


class CompactedLedger:
    """A recorded compacted ledger, open for reading."""

    def __init__(self, record: CompactionRecord, handle: LedgerHandle) -> None:
        self.record = record
        self.handle = handle
        self._cache: dict[int, tuple[Position, bytes]] = {}

    def __repr__(self) -> str:
        return f"CompactedLedger({self.ledger_id}, horizon={self.horizon}, entries={self.entries})"

    @classmethod
    async def open(cls, client: LedgerClient, record: CompactionRecord) -> CompactedLedger:
        return cls(record, await client.open_ledger(record.ledger_id, recovery=False))

    @property
    def ledger_id(self) -> int:
        return self.record.ledger_id

    @property
    def horizon(self) -> Position:
        return self.record.horizon

    @property
    def entries(self) -> int:
        return self.handle.metadata.last_entry_id + 1

    @property
    def size(self) -> int:
        return self.handle.metadata.length

    async def read(self, first: int, max_entries: int) -> list[tuple[int, Position, bytes]]:
        """Entries ``first..`` (at most ``max_entries``): (entry id, position, stored)."""
        last = min(self.entries - 1, first + max_entries - 1)
        if first > last:
            return []
        found = {i: self._cache[i] for i in range(first, last + 1) if i in self._cache}
        missing = [i for i in range(first, last + 1) if i not in found]
        if missing:
            for entry in await self.handle.read(missing[0], missing[-1]):
                found[entry.entry_id] = decoded = decode_entry(entry.payload)
                if len(self._cache) >= CACHE_ENTRIES:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[entry.entry_id] = decoded
        return [(i, *found[i]) for i in range(first, last + 1) if i in found]

    async def find(self, position: Position) -> int:
        """The first entry whose position is at or after ``position`` (``entries``: none)."""
        low, high = 0, self.entries
        while low < high:
            middle = (low + high) // 2
            found = await self.read(middle, 1)
            if found[0][1] < position:
                low = middle + 1
            else:
                high = middle
        return low

    async def last(self) -> tuple[Position, bytes] | None:
        """The last entry, or None when compaction kept nothing."""
        if self.entries == 0:
            return None
        found = await self.read(self.entries - 1, 1)
        return found[0][1], found[0][2]

    async def close(self) -> None:
        await self.handle.close()
