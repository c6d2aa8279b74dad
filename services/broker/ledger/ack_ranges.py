"""AckRanges: the positions a cursor acknowledged individually above its mark-delete position.

Pure bookkeeping, no I/O (Pulsar's ``individualDeletedMessages`` range set).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import TypeVar

from magnetar.broker.model.position import Position

T = TypeVar("T")


class AckRanges:
    """A set of positions stored as inclusive ranges of consecutive entry ids of one ledger.

    Ranges never span ledgers: entry ids are consecutive only within a ledger; the cursor joins
    ranges across ledger boundaries using the ledger list.
    """

    __slots__ = ("_count", "_ranges")

    def __init__(self, ranges: Iterable[tuple[int, int, int]] = ()) -> None:
        # Sorted, disjoint, non-adjacent (ledger_id, first_entry, last_entry) triples.
        self._ranges: list[tuple[int, int, int]] = []
        self._count = 0  # positions held: the cursor's backlog asks for it on every stats call
        for ledger_id, first, last in ranges:
            self._add_range(ledger_id, first, last)

    @classmethod
    def from_sorted(cls, ranges: Iterable[tuple[int, int, int]]) -> AckRanges:
        """Ranges as ``ranges()`` gives them (sorted, disjoint, non-adjacent), taken in linear
        time; raises ValueError when they are not."""
        result = cls()
        kept = result._ranges
        count = 0
        previous: tuple[int, int, int] | None = None
        for ledger_id, first, last in ranges:
            if first > last or first < 0:
                raise ValueError(f"bad range {ledger_id}:{first}..{last}")
            if previous is not None and (
                ledger_id < previous[0] or (ledger_id == previous[0] and first <= previous[2] + 1)
            ):
                raise ValueError(f"range {ledger_id}:{first}..{last} is out of order")
            previous = (ledger_id, first, last)
            kept.append(previous)
            count += last - first + 1
        result._count = count
        return result

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __contains__(self, position: object) -> bool:
        if not isinstance(position, Position):
            return False
        return self.range_of(position) is not None

    def __iter__(self) -> Iterator[Position]:
        for ledger_id, first, last in self._ranges:
            for entry_id in range(first, last + 1):
                yield Position(ledger_id, entry_id)

    @property
    def range_count(self) -> int:
        return len(self._ranges)

    def ranges(self) -> list[tuple[int, int, int]]:
        return list(self._ranges)

    def range_of(self, position: Position) -> tuple[int, int, int] | None:
        """The range holding ``position``, or None."""
        index = bisect.bisect_right(self._ranges, (position.ledger_id, position.entry_id, 2**63))
        if index == 0:
            return None
        ledger_id, first, last = self._ranges[index - 1]
        if ledger_id == position.ledger_id and first <= position.entry_id <= last:
            return ledger_id, first, last
        return None

    def without(self, entries: list[tuple[Position, T]]) -> list[tuple[Position, T]]:
        """``entries`` (in position order) less those whose position is in a range: one walk
        along the ranges, not a search per entry."""
        ranges = self._ranges
        if not ranges or not entries:
            return entries
        count = len(ranges)
        first = entries[0][0]
        index = max(bisect.bisect_right(ranges, (first[0], first[1], 2**63)) - 1, 0)
        kept = []
        for item in entries:
            ledger_id, entry_id = item[0]
            acked = False
            while index < count:
                range_ledger, range_first, range_last = ranges[index]
                if range_ledger < ledger_id or (
                    range_ledger == ledger_id and range_last < entry_id
                ):
                    index += 1  # this range ends before the entry (and every later one)
                    continue
                acked = range_ledger == ledger_id and range_first <= entry_id
                break
            if not acked:
                kept.append(item)
        return kept

    def add(self, position: Position) -> bool:
        """Add one position; False if it was already there."""
        if position in self:
            return False
        self._add_range(position.ledger_id, position.entry_id, position.entry_id)
        return True

    def add_all(self, positions: Iterable[Position]) -> bool:
        """Add many positions as ranges of consecutive entries (a grouped ACK is mostly one
        run): one merge per run instead of one per position. True if any was new."""
        before = self._count
        run: list[int] | None = None  # [ledger_id, first, last] of the run being collected
        for ledger_id, entry_id in sorted(positions):  # a Position is a (ledger, entry) tuple
            if run is not None and ledger_id == run[0] and run[2] <= entry_id <= run[2] + 1:
                run[2] = entry_id
                continue
            if run is not None:
                self._add_range(*run)
            run = [ledger_id, entry_id, entry_id]
        if run is not None:
            self._add_range(*run)
        return self._count != before

    def _add_range(self, ledger_id: int, first: int, last: int) -> None:
        index = bisect.bisect_left(self._ranges, (ledger_id, first, first))
        # Merge with the previous range when it touches or overlaps.
        if index > 0:
            p_ledger, p_first, p_last = self._ranges[index - 1]
            if p_ledger == ledger_id and p_last >= first - 1:
                index -= 1
                first = min(first, p_first)
                last = max(last, p_last)
                del self._ranges[index]
                self._count -= p_last - p_first + 1
        # Swallow following ranges that touch or overlap.
        while index < len(self._ranges):
            n_ledger, n_first, n_last = self._ranges[index]
            if n_ledger != ledger_id or n_first > last + 1:
                break
            last = max(last, n_last)
            del self._ranges[index]
            self._count -= n_last - n_first + 1
        self._ranges.insert(index, (ledger_id, first, last))
        self._count += last - first + 1

    def remove_through(self, position: Position) -> None:
        """Forget every position at or before ``position``."""
        # Ranges wholly at or before ``position`` form a prefix: cut it, then trim the next one.
        cut = bisect.bisect_right(self._ranges, (position.ledger_id, position.entry_id, 2**63))
        while cut > 0 and (self._ranges[cut - 1][0], self._ranges[cut - 1][2]) > (
            position.ledger_id,
            position.entry_id,
        ):
            cut -= 1
        if cut:
            self._count -= sum(last - first + 1 for _, first, last in self._ranges[:cut])
            del self._ranges[:cut]
        if self._ranges:
            ledger_id, first, last = self._ranges[0]
            if ledger_id == position.ledger_id and first <= position.entry_id:
                self._ranges[0] = (ledger_id, position.entry_id + 1, last)
                self._count -= position.entry_id + 1 - first

    def to_json(self) -> list[list[int]]:
        return [list(r) for r in self._ranges]

    @classmethod
    def from_json(cls, data: Iterable[Iterable[int]]) -> AckRanges:
        ranges = cls()
        for ledger_id, first, last in (tuple(r) for r in data):
            ranges._add_range(ledger_id, first, last)
        return ranges
