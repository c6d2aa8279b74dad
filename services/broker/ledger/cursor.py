"""ManagedCursor: the durable position of one subscription in a managed ledger.

State: the mark-delete position (it and everything before it are acknowledged), the positions
acknowledged individually above it (ack holes, kept as ranges by :class:`AckRanges`), and the
acknowledged batch indexes of entries only partly acknowledged.

Where the state is stored (Pulsar's ManagedCursorImpl): the record
``/magnetar/managed-ledgers/<ml>/cursors/<encoded cursor name>`` (JSON, CAS-written) holds the
whole state while it is small (``max_unacked_ranges_in_metadata`` ranges, see
``cursor_state.fits_metadata``). A larger state is appended, whole, to the cursor's own ledger
(``cursor_ledger.py``) and the record only says which ledger holds it, plus the mark-delete
position of the moment it switched ledgers. Loading reads the last entry of that ledger; if it
cannot be read, the cursor resumes from the record's mark-delete position: acknowledged
messages after it are delivered again, nothing unacknowledged is skipped.

Persistence bound: the state is written at most once every ``cursor_persist_interval_s``, and
on ``close``. An acknowledgement is therefore stored at most ``cursor_persist_interval_s``
(plus one write) after it was made; a crash loses only the acknowledgements of that last
interval, whose messages are then delivered again. Nothing unacknowledged is ever recorded as
acknowledged, so no message is lost. The read position is not stored: after a reload it
restarts just after the mark-delete position.

A cursor that cannot store its state says so once per change of condition (an ERROR log, and
``persist_error``), keeps its state in memory and retries with backoff. When only the bookies
fail, the record gets the mark-delete position and as many ranges as the bound allows, so a
restart redelivers as little as the metadata store can hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from magnetar.broker.ledger import compacted_reads
from magnetar.broker.ledger.ack_ranges import AckRanges
from magnetar.broker.ledger.cursor_ledger import CursorLedger, read_last_state
from magnetar.broker.ledger.cursor_state import (
    CursorRecord,
    CursorState,
    bounded,
    describe_loss,
    fits_metadata,
)
from magnetar.broker.model import keys
from magnetar.broker.model.position import Position
from magnetar.common.ledger.errors import LedgerFencedError
from magnetar.common.metadata import NOT_EXISTS, BadVersionError

if TYPE_CHECKING:
    from magnetar.broker.ledger.compacted_ledger import CompactedLedger
    from magnetar.broker.ledger.managed_ledger import ManagedLedger

__all__ = ["AckRanges", "ManagedCursor", "NonDurableCursor", "cursor_key", "delete_stored_cursor"]

log = logging.getLogger(__name__)

_NO_INDEXES: frozenset[int] = frozenset()

#: Longest wait between retries of a cursor whose state could not be stored.
MAX_RETRY_INTERVAL_S = 60.0


def cursor_key(ml: ManagedLedger, name: str) -> str:
    return keys.cursor_key(ml.key, name)


class ManagedCursor:
    """A durable subscription cursor. Get one from ``ManagedLedger.open_cursor``."""

    def __init__(self, ml: ManagedLedger, name: str, mark_delete: Position, version: int) -> None:
        self.ml = ml
        self.name = name
        self.key = cursor_key(ml, name)
        self._mark_delete = mark_delete
        #: Told the new mark-delete position each time an ack (``mark_delete``, ``delete``)
        #: moves it forward (the subscription's replicated-snapshot bookkeeping).
        self.on_mark_delete_moved: Callable[[Position], None] | None = None
        self._acked = AckRanges()
        self._batch_acks: dict[Position, set[int]] = {}
        self.read_position = ml.next_position(mark_delete)
        #: Bumped whenever the read position jumps (rewind, reset): a read in flight
        #: across a jump is dropped.
        self.moves = 0
        #: Read the compacted ledger up to its horizon, then the topic (``compacted_reads``).
        self.read_compacted = False
        #: (compacted ledger, read position, its entry there): where the last compacted read ended.
        self.compacted_hint: tuple[int, Position, int] | None = None
        self._version = version
        self._dirty = False
        self._flush: asyncio.Task[None] | None = None
        self._last_persist = 0.0
        self._fenced = False
        self._closed = False
        self._ledger = CursorLedger(ml, name)
        self._persist_lock = asyncio.Lock()
        self._failures = 0  # failed persists in a row: the retry backs off
        self._error_kind: str | None = None
        #: Why the cursor's state is not (fully) stored now, or None when it is.
        self.persist_error: str | None = None

    def __repr__(self) -> str:
        return f"ManagedCursor({self.ml.name!r}, {self.name!r}, md={self._mark_delete})"

    # -- load / create / persist ---------------------------------------------------------------

    @classmethod
    async def load(cls, ml: ManagedLedger, name: str) -> ManagedCursor | None:
        found = await ml.store.get(cursor_key(ml, name))
        if found is None:
            return None
        record = CursorRecord.from_bytes(found.value)
        named = record.cursor_ledger
        if record.state is not None:
            state = record.state
        else:
            mark_delete = record.mark_delete
            try:
                state = (await read_last_state(ml, named)).above(mark_delete)
            except Exception as e:
                log.error(
                    "cursor %s/%s: its state in cursor ledger %d cannot be read (%s: %s); "
                    "resuming from its stored mark-delete position %s: messages acknowledged "
                    "after it are delivered again. If the ledger's bookies come back before "
                    "this cursor stores a new state, reloading the topic reads it again",
                    ml.name,
                    name,
                    named,
                    type(e).__name__,
                    e,
                    mark_delete,
                )
                state = CursorState(mark_delete)
        cursor = cls(ml, name, state.mark_delete, found.version)
        cursor._ledger.named = named
        cursor._acked = state.acked()
        cursor._batch_acks = state.batch_ack_sets()
        cursor._advance()
        cursor.read_position = ml.next_position(cursor._mark_delete)
        log.info(
            "cursor %s/%s loaded at %s with %d acknowledged ranges above it",
            ml.name,
            name,
            cursor._mark_delete,
            cursor._acked.range_count,
        )
        return cursor

    @classmethod
    async def create(cls, ml: ManagedLedger, name: str, mark_delete: Position) -> ManagedCursor:
        cursor = cls(ml, name, mark_delete, NOT_EXISTS)
        await cursor.persist()
        log.info("cursor %s/%s created at %s", ml.name, name, mark_delete)
        return cursor

    @property
    def cursor_ledger(self) -> int | None:
        """The ledger the stored record names as holding the state (None: the record does)."""
        return self._ledger.named

    def persistence_stats(self) -> dict[str, Any]:
        """Where the state is stored and whether storing it works, in the shape of Pulsar's
        internalStats cursor fields (``cursorLedger`` -1: in the metadata store)."""
        return {
            "cursorLedger": -1 if self._ledger.named is None else self._ledger.named,
            "individuallyDeletedRanges": self._acked.range_count,
            "persistError": self.persist_error,
        }

    async def persist(self) -> None:
        """Store the state now: in the metadata record when it is small, else in the cursor
        ledger (the record naming it). Raises when neither took it (``persist_error`` says why).

        A conflict on the record is resolved by ownership epoch (the managed ledger's metadata
        version when its owner opened it): a write by an older owner, which may land just
        before it learns it was fenced, is overwritten; a write by a newer owner means this
        instance is stale and stops persisting. A fenced managed ledger never persists its
        cursors.
        """
        async with self._persist_lock:
            if self._fenced or self.ml.is_fenced:
                return
            self._dirty = False
            self._last_persist = asyncio.get_running_loop().time()
            state = CursorState.of(self._mark_delete, self._acked, self._batch_acks)
            try:
                await self._store(state)
            except asyncio.CancelledError:
                # close() cancels a periodic write in flight: it persists this state itself.
                self._dirty = True
                raise
            except Exception as e:
                self._dirty = True  # retried at the next interval
                self._failed(
                    "unpersisted",
                    f"its state could not be stored ({type(e).__name__}: {e}); check the "
                    "metadata store and the bookies. Retrying with backoff; until it "
                    "succeeds a restart delivers again what was acknowledged since the "
                    "last stored state",
                )
                raise

    async def _store(self, state: CursorState) -> None:
        bound = self.ml.config.max_unacked_ranges_in_metadata
        if fits_metadata(state, bound):
            if await self._put_record(CursorRecord.holding(self.name, self.ml.epoch, state)):
                self._ledger.named_now(None)
                await self._ledger.release_unnamed()
                self._stored()
            return
        try:
            ledger_id, written = await self._ledger.append(state)
        except LedgerFencedError:
            self._stop(f"its cursor ledger {self._ledger.current} was recovered by a newer owner")
            await self._ledger.release_unnamed()
            return
        except Exception as ledger_error:
            await self._store_bounded(state, bound, ledger_error)
            return
        if ledger_id != self._ledger.named:
            record = CursorRecord.naming(self.name, self.ml.epoch, state.mark_delete, ledger_id)
            if not await self._put_record(record):
                await self._ledger.release_unnamed()
                return
            self._ledger.named_now(ledger_id)
            log.info("cursor %s/%s: state in cursor ledger %d", self.ml.name, self.name, ledger_id)
        await self._ledger.release_unnamed()
        if written is state:
            self._stored()
        else:
            # Retrying does not help: the state is larger than one entry may be.
            self._failed(
                "truncated",
                f"its state does not fit in one entry of its cursor ledger; stored "
                f"{len(written.ranges)} of its {len(state.ranges)} acknowledged ranges: after a "
                f"restart {describe_loss(state, written)} would be delivered again. Acknowledge "
                "the oldest messages (or skip them) to shrink it",
                retry=False,
            )

    async def _store_bounded(self, state: CursorState, bound: int, cause: Exception) -> None:
        """The cursor ledger failed: the record gets what the metadata store may hold."""
        kept, _ = bounded(state, bound)
        try:
            written = await self._put_record(CursorRecord.holding(self.name, self.ml.epoch, kept))
        except Exception as store_error:
            raise RuntimeError(
                f"cursor ledger: {type(cause).__name__}: {cause}; metadata store: "
                f"{type(store_error).__name__}: {store_error}"
            ) from store_error
        if not written:
            return
        self._ledger.named_now(None)
        await self._ledger.release_unnamed()
        self._dirty = True  # the whole state is not stored: try the cursor ledger again
        self._failed(
            "partial",
            f"its cursor ledger cannot be written ({type(cause).__name__}: {cause}); the "
            f"metadata store holds its mark-delete position {state.mark_delete} and "
            f"{len(kept.ranges)} of its {len(state.ranges)} acknowledged ranges: after a "
            f"restart {describe_loss(state, kept)} would be delivered again. Check the bookies; "
            "retrying with backoff",
        )

    async def _put_record(self, record: CursorRecord) -> bool:
        """CAS the metadata record; False when a newer owner's record stands (then this
        instance stops persisting)."""
        value = record.to_bytes()
        while True:
            try:
                self._version = await self.ml.store.put(self.key, value, self._version)
                return True
            except BadVersionError:
                found = await self.ml.store.get(self.key)
                if found is None or CursorRecord.from_bytes(found.value).epoch > self.ml.epoch:
                    break
                # An older owner's late write, or our own from a write that was cancelled
                # after it reached the store (epochs are unique per owner): ours wins.
                self._version = found.version
        self._stop("changed or deleted by a newer owner")
        return False

    def _stop(self, why: str) -> None:
        self._fenced = True
        log.warning("cursor %s/%s: %s; no longer persisting it", self.ml.name, self.name, why)

    def _failed(self, kind: str, message: str, *, retry: bool = True) -> None:
        """Report a persist problem: logged once per change of condition, not per retry."""
        if retry:
            self._failures += 1
        if kind != self._error_kind:
            log.error("cursor %s/%s: %s", self.ml.name, self.name, message)
        self._error_kind = kind
        self.persist_error = message

    def _stored(self) -> None:
        if self._error_kind is not None:
            log.info(
                "cursor %s/%s: its state is stored again (%s)",
                self.ml.name,
                self.name,
                f"in cursor ledger {self._ledger.named}"
                if self._ledger.named is not None
                else "in the metadata store",
            )
        self._error_kind = None
        self.persist_error = None
        self._failures = 0

    def _retry_delay(self) -> float:
        interval = self.ml.config.cursor_persist_interval_s
        if not self._failures:
            return interval
        return min(max(interval, 1.0) * 2 ** min(self._failures - 1, 10), MAX_RETRY_INTERVAL_S)

    def _mark_dirty(self) -> None:
        self._dirty = True
        if self._flush is None and not self._closed:
            self._flush = asyncio.get_running_loop().create_task(
                self._flush_later(), name=f"cursor-{self.ml.name}-{self.name}-flush"
            )

    async def _flush_later(self) -> None:
        """Persist once the interval since the last write has passed (bounds the write rate);
        after failures, once the backoff has passed."""
        try:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(max(self._last_persist + self._retry_delay() - loop.time(), 0))
            if self._dirty:
                await self.persist()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # reported by persist (persist_error, one ERROR per condition)
            log.debug("cursor %s/%s: persist failed: %s", self.ml.name, self.name, e)
        finally:
            if self._flush is asyncio.current_task():
                self._flush = None
        if self._dirty and not self._closed:
            self._mark_dirty()  # acks that came during the write, or a retry: next interval

    async def abandon(self) -> None:
        """Stop persisting without writing anything, as a broker that died would (tests)."""
        self._closed = True
        if self._flush is not None:
            self._flush.cancel()
            await asyncio.gather(self._flush, return_exceptions=True)
            self._flush = None

    async def close(self) -> None:
        """Persist pending acknowledgements; the cursor stays readable in memory."""
        if self._closed:
            return
        self._closed = True
        if self._flush is not None:
            self._flush.cancel()
            await asyncio.gather(self._flush, return_exceptions=True)
            self._flush = None
        try:
            if self._dirty:
                await self.persist()
        finally:
            async with self._persist_lock:
                await self._ledger.close()
        log.info(
            "cursor %s/%s closed at %s with %d acknowledged ranges above it%s",
            self.ml.name,
            self.name,
            self._mark_delete,
            self._acked.range_count,
            "" if self.persist_error is None else f" (not all stored: {self.persist_error})",
        )

    async def remove(self) -> None:
        """Delete the cursor's stored state (the subscription is gone): its record, then its
        cursor ledgers."""
        self._closed = True
        if self._flush is not None:
            self._flush.cancel()
            await asyncio.gather(self._flush, return_exceptions=True)
        async with self._persist_lock:
            self._fenced = True  # nothing more is written for it
            await self.ml.store.delete(self.key)
            await self._ledger.delete_all()

    # -- state ---------------------------------------------------------------------------------

    @property
    def mark_delete_position(self) -> Position:
        return self._mark_delete

    @property
    def individually_acked(self) -> AckRanges:
        return self._acked

    def acked_batch_indexes(self, position: Position) -> frozenset[int]:
        found = self._batch_acks.get(position) if self._batch_acks else None
        return frozenset(found) if found else _NO_INDEXES

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
        before = self._mark_delete
        self._mark_delete = position
        self.ml.stats.mark_deletes += 1
        self._forget_through(position)
        self._advance()
        self._after_ack(before)

    def delete(self, positions: Iterable[Position]) -> None:
        """Individual acks; the mark-delete position moves over any contiguous acked run."""
        mark_delete = self._mark_delete
        above = [p for p in positions if p > mark_delete]
        if self._batch_acks:
            for position in above:
                self._batch_acks.pop(position, None)
        if self._acked.add_all(above):
            self.ml.stats.mark_deletes += 1
            self._advance()
            self._after_ack(mark_delete)

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

    def _after_ack(self, mark_delete_before: Position) -> None:
        if self.read_position <= self._mark_delete:
            self.read_position = self._following(self._mark_delete)
        self._mark_dirty()
        if self._mark_delete > mark_delete_before and self.on_mark_delete_moved is not None:
            self.on_mark_delete_moved(self._mark_delete)

    # -- reading -------------------------------------------------------------------------------

    def compacted_view(self) -> CompactedLedger | None:
        """The compacted ledger this cursor reads now (None: it reads the topic's ledgers)."""
        view = self.ml.compacted
        if self.read_compacted and view is not None and self.read_position <= view.horizon:
            return view
        return None

    def _following(self, position: Position) -> Position:
        """Where reading goes on after ``position``: below the horizon of a compacted view the
        next position whatever the topic still holds (its ledgers there may be gone)."""
        view = self.ml.compacted
        if self.read_compacted and view is not None and position < view.horizon:
            return Position(position.ledger_id, position.entry_id + 1)
        return self.ml.next_position(position)

    async def read_entries(self, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` unacknowledged entries from the read position, which moves
        past them. A read that fails leaves the read position where it was. A cursor that
        reads compacted reads the compacted ledger first, then the topic after its horizon."""
        view = self.compacted_view()
        if view is None:
            return await self._read_ledgers(max_entries)
        moves = self.moves
        result = await compacted_reads.read(self, view, max_entries)
        if self.moves != moves or len(result) >= max_entries or self.compacted_view() is not None:
            return result
        try:
            return result + await self._read_ledgers(max_entries - len(result))
        except Exception:
            if result:
                return result  # the topic's entries are read next time
            raise

    async def _read_ledgers(self, max_entries: int) -> list[tuple[Position, bytes]]:
        result: list[tuple[Position, bytes]] = []
        moves = self.moves
        start = self.read_position
        reads = 0
        while len(result) < max_entries:
            reads += 1
            wanted = max_entries - len(result)
            try:
                batch = await self.ml.read_entries(self.read_position, wanted)
            except BaseException as e:
                if self.moves == moves:
                    if result and isinstance(e, Exception):
                        break  # what was read before the failure; the next read retries
                    self.read_position = start
                raise
            if self.moves != moves:
                # Rewound or reset while the read waited on storage: what was read is
                # from before that, and the read position is the new one. Nothing to give.
                return []
            if not batch:
                break
            # Acknowledged as of now, not as of when the read started: an ack that came while
            # the read waited may have moved mark-delete over these entries (dropping their
            # ranges from ``_acked``), and those must not go out again.
            result.extend(self._unacked(batch))
            self.read_position = self.ml.next_position(batch[-1][0])
            if len(batch) < wanted:
                # The managed ledger gave all it has now: another read would come back empty
                # (and make the entries read so far be checked against the acks again).
                break
        if reads > 1:  # entries of an earlier read may have been acked while later ones waited
            result = self._unacked(result)
        return result

    def _unacked(self, entries: list[tuple[Position, bytes]]) -> list[tuple[Position, bytes]]:
        """``is_acked`` of every entry read (in position order), in one pass."""
        mark_delete = self._mark_delete
        return self._acked.without([entry for entry in entries if entry[0] > mark_delete])

    def skip_past(self, position: Position) -> None:
        """Reading goes on after ``position`` (an entry that cannot be read)."""
        if self.read_position <= position:
            self.read_position = self.ml.next_position(position)

    def unread(self, position: Position) -> None:
        """Entries from ``position`` on were read but not sent: read them again next time."""
        if position < self.read_position:
            self.read_position = position

    @property
    def has_more_entries(self) -> bool:
        if self.compacted_view() is not None:
            return True  # the compacted ledger, or else the topic after its horizon
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
        self.read_position = self._following(self._mark_delete)


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


async def delete_stored_cursor(ml: ManagedLedger, name: str) -> None:
    """Delete the stored state of a cursor that is not loaded: its record and cursor ledgers."""
    key = cursor_key(ml, name)
    found = await ml.store.get(key)
    await ml.store.delete(key)
    named = CursorRecord.from_bytes(found.value).cursor_ledger if found is not None else None
    if named is not None:
        await CursorLedger(ml, name, named).delete_all()
