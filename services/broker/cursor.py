"""ManagedCursor: the durable position of one subscription in a managed ledger.

State: the mark-delete position (it and everything before it are acknowledged), the positions
acknowledged individually above it (ack holes, kept as ranges by :class:`AckRanges`), and the
acknowledged batch indexes of entries only partly acknowledged.

Persistence bound: the state is written as JSON to
``/magnetar/managed-ledgers/<ml>/cursors/<encoded cursor name>`` by CAS, at most once every
``cursor_persist_interval_s``, and on ``close``. An acknowledgement is therefore stored at most
``cursor_persist_interval_s`` (plus one metadata-store write) after it was made; a crash loses
only the acknowledgements of that last interval, whose messages are then delivered again.
Nothing unacknowledged is ever recorded as acknowledged, so no message is lost. The read
position is not stored: after a reload it restarts just after the mark-delete position.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from magnetar.broker import keys
from magnetar.broker.position import Position
from magnetar.common.metadata import NOT_EXISTS, BadVersionError

if TYPE_CHECKING:
    from magnetar.broker.managed_ledger import ManagedLedger

log = logging.getLogger(__name__)


def cursor_key(ml: ManagedLedger, name: str) -> str:
    return keys.cursor_key(ml.key, name)


class AckRanges:
    """A set of positions stored as inclusive ranges of consecutive entry ids of one ledger.

    Pure bookkeeping, no I/O. Ranges never span ledgers: entry ids are consecutive only within
    a ledger; the cursor joins ranges across ledger boundaries using the ledger list.
    """

    __slots__ = ("_ranges",)

    def __init__(self, ranges: Iterable[tuple[int, int, int]] = ()) -> None:
        # Sorted, disjoint, non-adjacent (ledger_id, first_entry, last_entry) triples.
        self._ranges: list[tuple[int, int, int]] = []
        for ledger_id, first, last in ranges:
            self._add_range(ledger_id, first, last)

    def __len__(self) -> int:
        return sum(last - first + 1 for _, first, last in self._ranges)

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

    def add(self, position: Position) -> bool:
        """Add one position; False if it was already there."""
        if position in self:
            return False
        self._add_range(position.ledger_id, position.entry_id, position.entry_id)
        return True

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
        # Swallow following ranges that touch or overlap.
        while index < len(self._ranges):
            n_ledger, n_first, n_last = self._ranges[index]
            if n_ledger != ledger_id or n_first > last + 1:
                break
            last = max(last, n_last)
            del self._ranges[index]
        self._ranges.insert(index, (ledger_id, first, last))

    def remove_through(self, position: Position) -> None:
        """Forget every position at or before ``position``."""
        kept: list[tuple[int, int, int]] = []
        for ledger_id, first, last in self._ranges:
            if (ledger_id, last) <= (position.ledger_id, position.entry_id):
                continue
            if ledger_id == position.ledger_id and first <= position.entry_id:
                first = position.entry_id + 1
            kept.append((ledger_id, first, last))
        self._ranges = kept

    def to_json(self) -> list[list[int]]:
        return [list(r) for r in self._ranges]

    @classmethod
    def from_json(cls, data: Iterable[Iterable[int]]) -> AckRanges:
        ranges = cls()
        for ledger_id, first, last in (tuple(r) for r in data):
            ranges._add_range(ledger_id, first, last)
        return ranges


class ManagedCursor:
    """A durable subscription cursor. Get one from ``ManagedLedger.open_cursor``."""

    def __init__(self, ml: ManagedLedger, name: str, mark_delete: Position, version: int) -> None:
        self.ml = ml
        self.name = name
        self.key = cursor_key(ml, name)
        self._mark_delete = mark_delete
        self._acked = AckRanges()
        self._batch_acks: dict[Position, set[int]] = {}
        self.read_position = ml.next_position(mark_delete)
        #: Bumped whenever the read position jumps (rewind, reset): a read in flight
        #: across a jump is dropped.
        self.moves = 0
        self._version = version
        self._dirty = False
        self._flush: asyncio.Task[None] | None = None
        self._last_persist = 0.0
        self._fenced = False
        self._closed = False

    def __repr__(self) -> str:
        return f"ManagedCursor({self.ml.name!r}, {self.name!r}, md={self._mark_delete})"

    # -- load / create / persist ---------------------------------------------------------------

    @classmethod
    async def load(cls, ml: ManagedLedger, name: str) -> ManagedCursor | None:
        found = await ml.store.get(cursor_key(ml, name))
        if found is None:
            return None
        doc = json.loads(found.value)
        cursor = cls(ml, name, Position(*doc["mark_delete"]), found.version)
        cursor._acked = AckRanges.from_json(doc.get("acked", []))
        cursor._batch_acks = {
            Position(ledger_id, entry_id): set(indexes)
            for ledger_id, entry_id, indexes in doc.get("batch_acks", [])
        }
        cursor._advance()
        cursor.read_position = ml.next_position(cursor._mark_delete)
        return cursor

    @classmethod
    async def create(cls, ml: ManagedLedger, name: str, mark_delete: Position) -> ManagedCursor:
        cursor = cls(ml, name, mark_delete, NOT_EXISTS)
        await cursor.persist()
        log.info("cursor %s/%s created at %s", ml.name, name, mark_delete)
        return cursor

    def _to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "epoch": self.ml.epoch,
            "mark_delete": [self._mark_delete.ledger_id, self._mark_delete.entry_id],
            "acked": self._acked.to_json(),
            "batch_acks": [
                [p.ledger_id, p.entry_id, sorted(indexes)]
                for p, indexes in sorted(self._batch_acks.items())
            ],
        }

    async def persist(self) -> None:
        """Write the state now (CAS on the key version).

        A conflict is resolved by ownership epoch (the managed ledger's metadata version when
        its owner opened it): a write by an older owner, which may land just before it learns it
        was fenced, is overwritten; a write by a newer owner means this instance is stale and
        stops persisting. A fenced managed ledger never persists its cursors.
        """
        if self._fenced or self.ml.is_fenced:
            return
        self._dirty = False
        self._last_persist = asyncio.get_running_loop().time()
        value = json.dumps(self._to_json()).encode()
        try:
            while True:
                try:
                    self._version = await self.ml.store.put(self.key, value, self._version)
                    return
                except BadVersionError:
                    found = await self.ml.store.get(self.key)
                    if found is None or json.loads(found.value).get("epoch", 0) > self.ml.epoch:
                        break
                    # An older owner's late write, or our own from a write that was cancelled
                    # after it reached the store (epochs are unique per owner): ours wins.
                    self._version = found.version
        except Exception:
            self._dirty = True  # retried at the next interval
            raise
        self._fenced = True
        log.warning(
            "cursor %s/%s: changed or deleted by a newer owner; no longer persisting it",
            self.ml.name,
            self.name,
        )

    def _mark_dirty(self) -> None:
        self._dirty = True
        if self._flush is None and not self._closed:
            self._flush = asyncio.get_running_loop().create_task(
                self._flush_later(), name=f"cursor-{self.ml.name}-{self.name}-flush"
            )

    async def _flush_later(self) -> None:
        """Persist once the interval since the last write has passed (bounds the write rate)."""
        try:
            loop = asyncio.get_running_loop()
            interval = self.ml.config.cursor_persist_interval_s
            await asyncio.sleep(max(self._last_persist + interval - loop.time(), 0))
            if self._dirty:
                await self.persist()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("cursor %s/%s: persist failed: %s", self.ml.name, self.name, e)
        finally:
            if self._flush is asyncio.current_task():
                self._flush = None
        if self._dirty and not self._closed:
            self._mark_dirty()  # acks that came during the write: next interval

    async def close(self) -> None:
        """Persist pending acknowledgements; the cursor stays readable in memory."""
        if self._closed:
            return
        self._closed = True
        if self._flush is not None:
            self._flush.cancel()
            await asyncio.gather(self._flush, return_exceptions=True)
            self._flush = None
        if self._dirty:
            await self.persist()

    async def remove(self) -> None:
        """Delete the cursor's stored state (the subscription is gone)."""
        self._closed = True
        if self._flush is not None:
            self._flush.cancel()
            await asyncio.gather(self._flush, return_exceptions=True)
        await self.ml.store.delete(self.key)

    # -- state ---------------------------------------------------------------------------------

    @property
    def mark_delete_position(self) -> Position:
        return self._mark_delete

    @property
    def individually_acked(self) -> AckRanges:
        return self._acked

    def acked_batch_indexes(self, position: Position) -> frozenset[int]:
        return frozenset(self._batch_acks.get(position, ()))

    def is_acked(self, position: Position) -> bool:
        return position <= self._mark_delete or position in self._acked

    @property
    def backlog(self) -> int:
        """Entries not acknowledged (partly acknowledged batches count as unacknowledged)."""
        return max(self.ml.entries_after(self._mark_delete) - len(self._acked), 0)

    # -- acknowledgements ----------------------------------------------------------------------

    def mark_delete(self, position: Position) -> None:
        """Cumulative ack: ``position`` and everything before it."""
        if position <= self._mark_delete:
            return
        self._mark_delete = position
        self._forget_through(position)
        self._advance()
        self._after_ack()

    def delete(self, positions: Iterable[Position]) -> None:
        """Individual acks; the mark-delete position moves over any contiguous acked run."""
        changed = False
        for position in positions:
            if position <= self._mark_delete:
                continue
            self._batch_acks.pop(position, None)
            changed |= self._acked.add(position)
        if changed:
            self._advance()
            self._after_ack()

    def delete_batch_indexes(
        self, position: Position, indexes: Iterable[int], batch_size: int
    ) -> None:
        """Ack some messages of a batch entry; the entry is acked once all ``batch_size`` are."""
        if self.is_acked(position):
            return
        acked = self._batch_acks.setdefault(position, set())
        acked.update(i for i in indexes if 0 <= i < batch_size)
        if len(acked) >= batch_size:
            self.delete([position])
        else:
            self._mark_dirty()

    def _forget_through(self, position: Position) -> None:
        self._acked.remove_through(position)
        for p in [p for p in self._batch_acks if p <= position]:
            del self._batch_acks[p]

    def _advance(self) -> None:
        """Move mark-delete over acked positions that directly follow it. "Directly" skips
        positions that do not exist, e.g. from the last entry of a ledger to the first of the
        next, or over empty/trimmed ledgers."""
        moved = False
        while self._acked:
            following = self.ml.first_at_or_after(
                Position(self._mark_delete.ledger_id, self._mark_delete.entry_id + 1)
            )
            if following is None:
                break
            run = self._acked.range_of(following)
            if run is None:
                break
            self._mark_delete = Position(run[0], run[2])
            moved = True
        if moved:
            self._forget_through(self._mark_delete)

    def _after_ack(self) -> None:
        if self.read_position <= self._mark_delete:
            self.read_position = self.ml.next_position(self._mark_delete)
        self._mark_dirty()

    # -- reading -------------------------------------------------------------------------------

    async def read_entries(self, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` unacknowledged entries from the read position, which moves
        past them. A read that fails leaves the read position where it was."""
        result: list[tuple[Position, bytes]] = []
        moves = self.moves
        start = self.read_position
        while len(result) < max_entries:
            try:
                batch = await self.ml.read_entries(self.read_position, max_entries - len(result))
            except BaseException:
                if self.moves == moves:
                    self.read_position = start
                raise
            if self.moves != moves:
                # Rewound or reset while the read waited on storage: what was read is
                # from before that, and the read position is the new one. Nothing to give.
                return []
            if not batch:
                break
            result.extend((p, data) for p, data in batch if p not in self._acked)
            self.read_position = self.ml.next_position(batch[-1][0])
        return result

    def unread(self, position: Position) -> None:
        """Entries from ``position`` on were read but not sent: read them again next time."""
        if position < self.read_position:
            self.read_position = position

    @property
    def has_more_entries(self) -> bool:
        return self.ml.first_at_or_after(self.read_position) is not None

    def reset(self, position: Position) -> None:
        """Seek: everything before ``position`` counts as acknowledged, everything from it on
        as not (including what was acknowledged before)."""
        self._mark_delete = Position(position.ledger_id, position.entry_id - 1)
        self._acked = AckRanges()
        self._batch_acks.clear()
        self.moves += 1
        self.read_position = position
        self._mark_dirty()

    def rewind(self) -> None:
        """Dispatch again from the first unacknowledged entry."""
        self.moves += 1
        self.read_position = self.ml.next_position(self._mark_delete)


class NonDurableCursor(ManagedCursor):
    """A reader's cursor: starts at a given entry (inclusive; the client drops the start entry
    itself when the reader asked for an exclusive start), is never persisted, and does not hold
    back trimming. It lives as long as its reader."""

    def __init__(self, ml: ManagedLedger, name: str, start: Position) -> None:
        super().__init__(ml, name, Position(start.ledger_id, start.entry_id - 1), NOT_EXISTS)
        self.read_position = start

    def _mark_dirty(self) -> None:
        pass

    async def persist(self) -> None:
        pass

    async def close(self) -> None:
        self._closed = True

    async def remove(self) -> None:
        self._closed = True
