"""The memtable (write cache): acknowledged entries held in memory until a checkpoint flushes them.

Tailing reads are served from here. The bookie keeps two: the active one taking adds and, while a
checkpoint runs, the one being flushed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from magnetar.bookie.entry_logger import EntryRun


class Memtable:
    __slots__ = ("_last", "_ledgers", "size")

    def __init__(self) -> None:
        self._ledgers: dict[int, dict[int, bytes]] = {}
        self._last: dict[int, int] = {}
        self.size = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._ledgers.values())

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = {}
            self._last[ledger_id] = entry_id
        elif entry_id > self._last[ledger_id]:
            self._last[ledger_id] = entry_id
        old = entries.get(entry_id)
        if old is not None:
            self.size -= len(old)
        entries[entry_id] = entry
        self.size += len(entry)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self._ledgers.get(ledger_id)
        return None if entries is None else entries.get(entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        return self._last.get(ledger_id, -1)

    def has_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def drop_ledger(self, ledger_id: int) -> None:
        entries = self._ledgers.pop(ledger_id, None)
        self._last.pop(ledger_id, None)
        if entries:
            self.size -= sum(len(e) for e in entries.values())

    def sorted_entries(self) -> Iterator[tuple[int, int, bytes]]:
        """(ledger id, entry id, entry) in ledger then entry order: one sequential run per ledger
        in the entry log, which keeps catch-up reads of a ledger close together on disk."""
        for ledger_id in sorted(self._ledgers):
            entries = self._ledgers[ledger_id]
            for entry_id in sorted(entries):
                yield ledger_id, entry_id, entries[entry_id]

    def runs(self, skip: Collection[int] = ()) -> Iterator[EntryRun]:
        """(ledger id, entry ids, entries) per ledger, in ledger then entry order, for a flush
        to write back to back (one sequential run per ledger in the entry log, which keeps
        catch-up reads of a ledger close together on disk); ledgers in ``skip`` left out. The
        ids are a ``range`` when they follow each other (the usual case)."""
        for ledger_id in sorted(self._ledgers):
            if ledger_id in skip:
                continue
            entries = self._ledgers[ledger_id]
            ids: Sequence[int] = sorted(entries)
            if ids[-1] - ids[0] == len(ids) - 1:
                ids = range(ids[0], ids[-1] + 1)
            yield ledger_id, ids, [entries[i] for i in ids]
