"""Positions in a managed ledger's sequence of ledgers, the last of which may be open for writes:
what exists, what comes next, how much is there. Read-only arithmetic over the ledger list and
the write handle's LAC; the managed ledger (a subclass) owns and changes both."""

from __future__ import annotations

from magnetar.broker.ledger.ledger_info import entries_after
from magnetar.broker.model.position import Position
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.managed_ledger_list import LedgerInfo


class LedgerPositions:
    """Entry positions over ``_ledgers`` (in order) and ``_current``, the ledger being written
    (readable up to its LAC)."""

    _ledgers: list[LedgerInfo]
    _current: LedgerHandle | None

    @property
    def ledger_ids(self) -> list[int]:
        return [i.ledger_id for i in self._ledgers]

    def _readable(self, info: LedgerInfo) -> int:
        """Entries of the ledger that can be read: the current ledger's LAC + 1."""
        current = self._current
        if current is not None and info.ledger_id == current.ledger_id:
            return current.last_add_confirmed + 1
        return info.entries

    def ledger_sizes(self) -> list[tuple[LedgerInfo, int, int]]:
        """(ledger, readable entries, bytes) of every ledger, in order; the open ledger's bytes
        are what its writer has stored so far."""
        current = self._current
        return [
            (
                info,
                self._readable(info),
                current.length
                if current is not None and info.ledger_id == current.ledger_id
                else info.size,
            )
            for info in self._ledgers
        ]

    def ledger_extents(self) -> list[tuple[int, int]]:
        """(ledger id, readable entry count) of every ledger, in order."""
        return [(i.ledger_id, self._readable(i)) for i in self._ledgers]

    def first_at_or_after(self, position: Position) -> Position | None:
        """The first existing entry at or after ``position``, or None."""
        for info in self._ledgers:
            if info.ledger_id < position.ledger_id:
                continue
            start = max(position.entry_id, 0) if info.ledger_id == position.ledger_id else 0
            if start < self._readable(info):
                return Position(info.ledger_id, start)
        return None

    def _end_position(self) -> Position:
        """Where the next added entry will go, as far as is known now."""
        if self._current is not None:
            return Position(self._current.ledger_id, self._current.last_add_confirmed + 1)
        if self._ledgers:
            return Position(self._ledgers[-1].ledger_id, self._ledgers[-1].entries)
        return Position(-1, 0)

    def next_position(self, position: Position) -> Position:
        """The entry after ``position``: an existing one, else where the next add will go."""
        following = Position(position.ledger_id, position.entry_id + 1)
        found = self.first_at_or_after(following)
        if found is not None:
            return found
        return max(self._end_position(), following)

    @property
    def first_position(self) -> Position:
        """The first existing entry (or where the first entry will go, when empty)."""
        found = self.first_at_or_after(Position(-1, 0))
        return found if found is not None else self._end_position()

    @property
    def last_confirmed_position(self) -> Position:
        """The last acknowledged entry; ``(first ledger, -1)`` when there is none."""
        for ledger_id, count in reversed(self.ledger_extents()):
            if count > 0:
                return Position(ledger_id, count - 1)
        first = self._ledgers[0].ledger_id if self._ledgers else -1
        return Position(first, -1)

    @property
    def number_of_entries(self) -> int:
        return sum(count for _, count in self.ledger_extents())

    @property
    def total_size(self) -> int:
        size = sum(i.size for i in self._ledgers if i.closed)
        if self._current is not None:
            size += self._current.length
        return size

    def entries_after(self, position: Position) -> int:
        """How many existing entries are strictly after ``position``."""
        return entries_after(self.ledger_extents(), position)

    def entries_between(self, start: Position, end: Position) -> int:
        """How many existing entries are after ``start`` and at or before ``end``."""
        extents = self.ledger_extents()
        return max(entries_after(extents, start) - entries_after(extents, end), 0)

    def previous_position(self, position: Position) -> Position | None:
        """The existing entry just before ``position``, or None."""
        found = None
        for ledger_id, count in self.ledger_extents():
            if ledger_id > position.ledger_id:
                break
            if count <= 0:
                continue
            last = (
                count - 1 if ledger_id < position.ledger_id else min(count, position.entry_id) - 1
            )
            if last >= 0:
                found = Position(ledger_id, last)
        return found
