"""Recently added entries of a managed ledger, kept for tailing readers."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from magnetar.broker.model.position import Position


@dataclass(slots=True)
class EntryCache:
    """Recently added entries, oldest evicted first once over ``max_bytes``."""

    max_bytes: int
    entries: collections.OrderedDict[Position, bytes] = field(
        default_factory=collections.OrderedDict
    )
    size: int = 0
    #: Entries put in, and entries evicted to make room, since it was made (for metrics).
    inserted: int = 0
    evicted: int = 0

    def put(self, position: Position, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        self.entries[position] = data
        self.size += len(data)
        self.inserted += 1
        self._evict()

    def put_all(self, positions: list[Position], datas: list[bytes], size: int) -> None:
        """``put`` of a stored group's entries, ``size`` bytes in all, in one call."""
        if size > self.max_bytes:  # one may be too large to keep: each on its own
            for position, data in zip(positions, datas, strict=True):
                self.put(position, data)
            return
        self.entries.update(zip(positions, datas, strict=True))
        self.size += size
        self.inserted += len(positions)
        self._evict()

    def _evict(self) -> None:
        while self.size > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.size -= len(old)
            self.evicted += 1

    def get(self, position: Position) -> bytes | None:
        return self.entries.get(position)

    def drop_ledger(self, ledger_id: int) -> None:
        for position in [p for p in self.entries if p.ledger_id == ledger_id]:
            self.size -= len(self.entries.pop(position))

    def clear(self) -> None:
        """Forget every entry (reads go to the bookies again)."""
        self.entries.clear()
        self.size = 0
