"""LedgerHandle: writing and reading one ledger over its ensembles.

Writer rules (ARCHITECTURE.md "Storage layer"): entry ``i`` is sent to its write set
``(i + k) mod E``; it is acknowledged to the caller once ``Qa`` of them stored it and every
earlier entry was acknowledged (completion strictly in entry order); it carries the LAC known
when it was sent. A bookie that fails or times out is replaced: a new fragment starting at the
first unacknowledged entry is CAS-ed into the metadata and the pending entries are resent to the
replacement; no add completes while the change is under way (an ack of the replaced bookie no
longer counts for an entry the new fragment holds). A FENCED answer, or finding the metadata
IN_RECOVERY or CLOSED, means another owner took the ledger: every pending add fails with
LedgerFencedError (those entries may or may not be in the ledger; recovery decides).

Entry size: an entry over ``max_entry_size`` (the smallest limit the ensemble's bookies state)
is refused before it gets an entry id, so only that add fails. A TOO_LARGE answer is the
caller's error, never a bookie failure: no ensemble change. If it still comes (a bookie's limit
is lower than the client knew), the refused entry and the later ones not yet acknowledged are
taken back (their ids are reused by the next adds), so the handle goes on without a hole.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from magnetar.common.ledger.bookie_client import (
    BookieError,
    BookieUnavailableError,
    add_entries,
)
from magnetar.common.ledger.distribution import AckSet
from magnetar.common.ledger.ensemble import commit_change, plan_change
from magnetar.common.ledger.entry import HEADER_SIZE, decode_header, encode_entry
from magnetar.common.ledger.errors import (
    EntryTooLargeError,
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    LedgerUnauthorizedError,
    NoSuchEntryError,
    ReadError,
)
from magnetar.common.ledger.metadata import Fragment, LedgerMetadata, LedgerState, ledger_key
from magnetar.common.ledger.placement import NotEnoughBookiesError
from magnetar.common.metadata import BadVersionError
from magnetar.common.proto import bookie_pb2 as pb

if TYPE_CHECKING:
    from magnetar.common.ledger.client import LedgerClient

log = logging.getLogger(__name__)

#: Told how an add ended, in the turn that ends it: (entry id, None) once it is acknowledged,
#: (-1, the error) if it failed.
AddListener = Callable[[int, "BaseException | None"], None]


@dataclass(slots=True, frozen=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    payload: bytes
    length: int  # ledger length up to and including this entry

    @classmethod
    def from_entry(cls, entry: bytes) -> LedgerEntry:
        header = decode_header(entry)
        return cls(header.ledger_id, header.entry_id, entry[HEADER_SIZE:], header.length)


class _PendingAdd:
    """One add in flight, or a group of consecutive adds sent and acknowledged together: the
    encoded ``entries`` from ``entry_id``."""

    __slots__ = (
        "acks",
        "count",
        "done",
        "entries",
        "entry_id",
        "future",
        "length",
        "listener",
        "sent",
        "sent_at",
        "settled",
        "size",
    )

    def __init__(
        self,
        entry_id: int,
        entries: list[bytes],
        acks: AckSet,
        future: asyncio.Future[int] | None,
        length: int,
        listener: AddListener | None = None,
    ) -> None:
        self.entry_id = entry_id
        self.listener = listener
        self.entries = entries
        self.count = len(entries)
        self.size = sum(map(len, entries))
        self.acks = acks
        self.future = future
        self.length = length  # the ledger's length with the last of them
        self.sent: dict[int, str] = {}  # ensemble position -> bookie it was last sent to
        self.sent_at = 0.0
        self.done = False
        self.settled = False


class LedgerHandle:
    """A ledger opened for writing (``create_ledger``) or for reading (``open_ledger``)."""

    def __init__(
        self,
        client: LedgerClient,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        *,
        writable: bool,
        max_entry_size: int | None = None,
    ) -> None:
        self.client = client
        #: Largest entry (header included) this handle sends; larger adds fail alone, locally.
        self.max_entry_size = max_entry_size or client.config.max_entry_size
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._version = version
        self.writable = writable
        self._quorum = metadata.quorum
        self._ensemble = list(metadata.last_fragment.bookies)
        closed = metadata.is_closed
        self.last_add_confirmed = metadata.last_entry_id if closed else -1
        self.length = metadata.length if closed else 0
        self._last_add_pushed = self.last_add_confirmed
        self._pushed_length = self.length
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._pending_bytes = 0
        self._pending_entries = 0  # adds in _pending (a group counts each of its entries)
        self._room = asyncio.Event()  # set while the in-flight window has room
        self._drained: asyncio.Event | None = None  # made by close() to wait for the last add
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first try_add
        self._room.set()
        self._error: LedgerError | None = None
        self._failed_positions: set[int] = set()
        self._read_metadata: LedgerMetadata | None = None  # see _read_view
        self._changing: asyncio.Task[None] | None = None
        self._closed = closed
        self._timer: asyncio.Task[None] | None = None
        if writable:
            self._timer = asyncio.create_task(
                self._watch_timeouts(), name=f"ledger-{ledger_id}-timeouts"
            )

    def __repr__(self) -> str:
        return f"LedgerHandle({self.ledger_id}, {self.metadata.state.name}, lac={self.last_add_confirmed})"

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def ensemble(self) -> tuple[str, ...]:
        return tuple(self._ensemble)

    # -- adds ------------------------------------------------------------------------------

    async def add(self, payload: bytes) -> int:
        """Append one entry and wait until it is acknowledged; returns its entry id."""
        return await (await self.add_async(payload))

    async def add_async(self, payload: bytes) -> asyncio.Future[int]:
        """Append one entry; waits only for room in the in-flight window. The future gives the
        entry id once the entry is acknowledged (futures complete in entry order).
        Raises EntryTooLargeError, before anything is sent, for an entry over the limit."""
        future = self.try_add(payload)
        while future is None:
            await self.wait_for_room()
            future = self.try_add(payload)
        return future

    def try_add(self, payload: bytes) -> asyncio.Future[int] | None:
        """add_async without the wait: None (nothing sent) while the in-flight window is full."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = self._loop.create_future()
        return future if self._push([payload], future, None) else None

    def try_push(self, payload: bytes, listener: AddListener) -> bool:
        """try_add for a caller that wants no future: ``listener`` is told how the add ended,
        in the turn that ends it (a future's done callback would wait a turn, one per entry).
        False (nothing sent) while the in-flight window is full."""
        return self._push([payload], None, listener)

    @property
    def groups_adds(self) -> bool:
        """Whether consecutive adds may go as one group (``try_push_group``): every entry
        has the same write set, the whole ensemble (write quorum = ensemble size)."""
        return self._quorum.write_quorum == self._quorum.ensemble_size

    def room(self) -> tuple[int, int]:
        """(adds, bytes) the in-flight window takes before it is full (an add that goes over
        the bytes is still taken while the window is below them)."""
        cfg = self.client.config
        return (
            cfg.max_pending_adds - self._pending_entries,
            cfg.max_pending_bytes - self._pending_bytes,
        )

    def try_push_group(self, payloads: list[bytes], listener: AddListener) -> bool:
        """``try_push`` for consecutive adds sent and acknowledged together (only while
        ``groups_adds``): ``listener`` is told once, with the first entry's id, when all of
        them are acknowledged (or with the error that ended them all). False (nothing sent)
        while the window has no room for the group; the caller takes what ``room`` allows."""
        if len(payloads) > 1 and not self.groups_adds:
            raise ValueError(f"ledger {self.ledger_id} stripes its entries: no groups")
        return self._push(payloads, None, listener)

    async def wait_for_room(self) -> None:
        """Until the in-flight window has room for another add (or the handle failed)."""
        self._room.clear()
        await self._room.wait()

    def _push(
        self,
        payloads: list[bytes],
        future: asyncio.Future[int] | None,
        listener: AddListener | None,
    ) -> bool:
        """Encode ``payloads`` as the next entries and send them as one pending add."""
        self._check_writable()
        largest = max(map(len, payloads))
        if HEADER_SIZE + largest > self.max_entry_size:
            raise EntryTooLargeError(self.ledger_id, HEADER_SIZE + largest, self.max_entry_size)
        cfg = self.client.config
        if (
            self._pending_entries + len(payloads) > cfg.max_pending_adds
            or self._pending_bytes >= cfg.max_pending_bytes
        ):
            return False
        first = self._last_add_pushed + 1
        lac, length = self.last_add_confirmed, self._pushed_length
        entries = []
        for entry_id, payload in enumerate(payloads, first):
            length += len(payload)
            entries.append(encode_entry(self.ledger_id, entry_id, lac, length, payload))
        self._last_add_pushed = first + len(entries) - 1
        self._pushed_length = length
        op = _PendingAdd(first, entries, AckSet(self._quorum), future, length, listener)
        self._pending.append(op)
        self._pending_entries += op.count
        self._pending_bytes += op.size
        if self._changing is None:
            for position in self._quorum.write_set(first):  # a group's: the whole ensemble
                self._send(op, position)
        # else: sent to the new ensemble once the change is in the metadata
        return True

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if not self.writable or self._closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed for writing")

    def _send(self, op: _PendingAdd, position: int) -> None:
        address = self._ensemble[position]
        op.sent[position] = address
        op.sent_at = time.monotonic()
        answer = functools.partial(self._add_done, op, position, address)
        key = self.metadata.master_key
        try:
            bookie = self.client.bookie(address)
            if op.count == 1:
                bookie.add_entry(self.ledger_id, op.entry_id, op.entries[0], answer, master_key=key)
            else:
                add_entries(bookie, self.ledger_id, op.entry_id, op.entries, answer, master_key=key)
        except BookieError as e:
            asyncio.get_running_loop().call_soon(self._bookie_failed, position, address, e)

    def _add_done(
        self, op: _PendingAdd, position: int, address: str, error: BookieError | None
    ) -> None:
        if self._ensemble[position] != address:
            return  # that bookie was replaced; its answers no longer count
        if error is None:
            if op.sent.get(position) == address and not op.done:
                op.acks.ack(position)
                if op.acks.complete:
                    self._complete_in_order()
            return
        if isinstance(error, BookieUnavailableError):
            self._bookie_failed(position, address, error)
        elif error.status in (pb.FENCED, pb.NO_SUCH_LEDGER):
            self._fail_handle(LedgerFencedError(f"ledger {self.ledger_id} was fenced ({error})"))
        elif error.status == pb.TOO_LARGE:
            self._refused_as_too_large(op, error)
        elif error.status == pb.UNAUTHORIZED:
            # Not a failing bookie: it holds this ledger id under another key (BookKeeper's
            # UnauthorizedAccess is unrecoverable for the handle too).
            self._fail_handle(
                LedgerUnauthorizedError(
                    f"ledger {self.ledger_id}: bookie {address} refused the add: {error}"
                )
            )
        else:
            self._bookie_failed(position, address, error)

    def _refused_as_too_large(self, op: _PendingAdd, error: BookieError) -> None:
        """A bookie's limit is lower than this handle knew: the caller's error, not the
        bookie's. Fail that add, take back the later unacknowledged ones (the ledger cannot
        hold them past a hole), and go on with a lower limit."""
        largest = max(map(len, op.entries))
        self.max_entry_size = min(self.max_entry_size, largest - 1)
        if op.done and op.acks.complete:
            log.warning(
                "ledger %d: entry %d was acknowledged by an ack quorum but refused by %s",
                self.ledger_id,
                op.entry_id,
                error,
            )
            return
        if op.done:
            return  # already taken back (another bookie of its write set refused it too)
        retracted: list[_PendingAdd] = []
        while self._pending and self._pending[-1].entry_id >= op.entry_id:
            retracted.append(self._pending.pop())
        for taken in retracted:
            taken.done = True
            self._pending_entries -= taken.count
            self._pending_bytes -= taken.size
        self._last_add_pushed = op.entry_id - 1
        self._pushed_length = op.length - (op.size - HEADER_SIZE * op.count)
        log.warning(
            "ledger %d: entry %d refused as too large (%s); %d later adds taken back",
            self.ledger_id,
            op.entry_id,
            error,
            len(retracted) - 1,
        )
        for taken in reversed(retracted):
            if taken is op and op.count == 1:
                self._settle(
                    taken,
                    EntryTooLargeError(self.ledger_id, op.size, self.max_entry_size, str(error)),
                )
            elif taken is op:  # a group: which of its entries was too large is not known
                self._settle(
                    taken,
                    LedgerError(
                        f"ledger {self.ledger_id}: adds not stored: a bookie refused one of the "
                        f"{op.count} entries from {op.entry_id} as too large ({error}); send "
                        "them again"
                    ),
                )
            else:
                self._settle(
                    taken,
                    LedgerError(
                        f"ledger {self.ledger_id}: add not stored: entry {op.entry_id} before "
                        "it was refused as too large; send it again"
                    ),
                )
        self._wake_window()

    def _complete_in_order(self) -> None:
        if self._changing is not None:
            # No add completes during an ensemble change (BookKeeper's rule too). The change
            # starts at the first unacknowledged entry, and that entry must reach the
            # replacement: completed on an ack of the replaced bookie, it would be left on
            # fewer bookies than the metadata names. The change completes what it can.
            return
        released = False
        while self._pending and self._pending[0].acks.complete:
            op = self._pending.popleft()
            op.done = True
            self._pending_entries -= op.count
            self._pending_bytes -= op.size
            self.last_add_confirmed = op.entry_id + op.count - 1
            self.length = op.length
            released = True
            self._settle(op)
        if released:
            self._wake_window()

    def _settle(self, op: _PendingAdd, error: BaseException | None = None) -> None:
        """End an add: its future, or its listener at once."""
        if op.settled:
            return
        op.settled = True
        future = op.future
        if future is not None:
            if error is None:
                future.set_result(op.entry_id)
            else:
                future.set_exception(error)
        if op.listener is not None:
            try:
                op.listener(op.entry_id if error is None else -1, error)
            except Exception:
                log.exception("ledger %d: add listener failed", self.ledger_id)
        if not self._pending and self._drained is not None:
            self._drained.set()

    def _wake_window(self) -> None:
        if not self._room.is_set():
            cfg = self.client.config
            if (
                self._pending_entries < cfg.max_pending_adds
                and self._pending_bytes < cfg.max_pending_bytes
            ):
                self._room.set()

    def _fail_handle(self, error: LedgerError) -> None:
        """Fail every pending add; the handle takes no more adds."""
        if self._error is not None:
            return
        self._error = error
        log.warning(
            "ledger %d: %s; failing %d pending adds", self.ledger_id, error, len(self._pending)
        )
        while self._pending:
            op = self._pending.popleft()
            op.done = True
            self._settle(op, error)
        self._pending_entries = self._pending_bytes = 0
        self._room.set()  # waiters wake up and see the error

    # -- ensemble change ----------------------------------------------------------------------

    def _bookie_failed(self, position: int, address: str, error: BaseException) -> None:
        if self._error is not None or self._closed or self._ensemble[position] != address:
            return
        if position not in self._failed_positions:
            log.warning(
                "ledger %d: bookie %s (position %d) failed: %s",
                self.ledger_id,
                address,
                position,
                error,
            )
        self._failed_positions.add(position)
        if self._changing is None:
            self._changing = asyncio.get_running_loop().create_task(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        try:
            while self._failed_positions and self._error is None:
                failed = sorted(self._failed_positions)
                try:
                    bookies = await self.client.registered_bookies()
                    change = plan_change(
                        self._ensemble,
                        self.last_add_confirmed + 1,
                        failed,
                        bookies,
                        self.client.placement,
                    )
                except NotEnoughBookiesError as e:
                    self._fail_handle(
                        LedgerError(f"ledger {self.ledger_id}: cannot replace failed bookies: {e}")
                    )
                    return
                try:
                    self.metadata, self._version = await commit_change(
                        self.client.store,
                        self.ledger_id,
                        self.metadata,
                        self._version,
                        change,
                        read_metadata=functools.partial(self.client.read_metadata, self.ledger_id),
                        on_conflict=self._still_open,
                    )
                except LedgerFencedError as e:
                    self._fail_handle(e)
                    return
                self._ensemble = list(change.new)
                self.max_entry_size = min(
                    self.max_entry_size, self.client.entry_size_limit(change.new, bookies)
                )
                self._failed_positions.difference_update(failed)
                self._resend_pending()
        except Exception as e:  # the metadata store failed: nothing more can be written safely
            self._fail_handle(LedgerError(f"ledger {self.ledger_id}: ensemble change failed: {e}"))
        finally:
            self._changing = None
        if self._error is None:
            self._complete_in_order()

    def _still_open(self, metadata: LedgerMetadata) -> None:
        """A concurrent metadata change is fine while the ledger is open (e.g. the replication
        worker repaired an older fragment); anything else means recovery took the ledger."""
        if metadata.state is not LedgerState.OPEN:
            raise LedgerFencedError(
                f"ledger {self.ledger_id} is {metadata.state.name} (taken over by recovery)"
            )

    def _resend_pending(self) -> None:
        for op in list(self._pending):
            for position in self._quorum.write_set(op.entry_id):
                if op.sent.get(position) != self._ensemble[position]:
                    op.acks.forget(position)
                    self._send(op, position)

    async def _watch_timeouts(self) -> None:
        timeout = self.client.config.add_timeout_s
        while not self._closed and self._error is None:
            await asyncio.sleep(min(timeout / 4, 0.5))
            now = time.monotonic()
            for op in list(self._pending):
                if now - op.sent_at < timeout:
                    break
                for position in self._quorum.write_set(op.entry_id):
                    address = op.sent.get(position)
                    if (
                        address is not None
                        and position not in op.acks.acked
                        and address == self._ensemble[position]
                    ):
                        self._bookie_failed(
                            position,
                            address,
                            TimeoutError(f"no answer to an add in {timeout:.1f} s"),
                        )

    # -- close --------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for pending adds, then record CLOSED with the last entry and length."""
        if self._closed:
            return
        if not self.writable:
            self._closed = True
            return
        while self._pending:  # every add settles: acknowledged, or failed with the handle
            self._drained = asyncio.Event()
            await self._drained.wait()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._error is not None:
            return  # recovery owns the ledger's end now
        metadata = self.metadata
        while True:
            closed = replace(
                metadata,
                state=LedgerState.CLOSED,
                last_entry_id=self.last_add_confirmed,
                length=self.length,
            )
            try:
                self._version = await self.client.store.put(
                    ledger_key(self.ledger_id), closed.to_bytes(), self._version
                )
            except BadVersionError:
                metadata, self._version = await self.client.read_metadata(self.ledger_id)
                if metadata.state is LedgerState.OPEN:
                    continue
                if metadata.is_closed and metadata.last_entry_id == self.last_add_confirmed:
                    self.metadata = metadata
                    return
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} was {metadata.state.name} by someone else "
                    f"(last entry {metadata.last_entry_id}, ours {self.last_add_confirmed})"
                ) from None
            self.metadata = closed
            return

    # -- reads --------------------------------------------------------------------------------

    @property
    def readable_last_entry(self) -> int:
        """The highest entry a reader may read now: lastEntryId when closed, else the LAC."""
        return self.metadata.last_entry_id if self.metadata.is_closed else self.last_add_confirmed

    def _check_readable(self, first: int, last: int) -> None:
        if first < 0 or last > self.readable_last_entry:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id}: range {first}..{last} is outside 0..{self.readable_last_entry}"
            )

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        if entry_id < 0 or entry_id > self.readable_last_entry:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {entry_id} is beyond the readable end {self.readable_last_entry}"
            )
        return LedgerEntry.from_entry(await self._read_replicas(entry_id))

    async def read(self, first: int, last: int, *, concurrency: int = 64) -> list[LedgerEntry]:
        """Entries ``first`` .. ``last`` inclusive, in order."""
        if last < first:
            return []
        self._check_readable(first, last)
        gate = asyncio.Semaphore(concurrency)

        async def one(entry_id: int) -> LedgerEntry:
            async with gate:
                return LedgerEntry.from_entry(await self._read_replicas(entry_id))

        return list(await asyncio.gather(*(one(e) for e in range(first, last + 1))))

    async def read_batch(
        self, first: int, last: int, *, concurrency: int = 64
    ) -> list[LedgerEntry]:
        """Entries ``first`` .. ``last`` inclusive, in order, as :meth:`read` gives them, by
        range reads where the ledger allows (BookKeeper's batch read: each bookie of a
        fragment stores every entry of it when the ensemble size is the write quorum): one
        request per run of entries of a fragment instead of one per entry. A run no replica
        serves as a range (bookies without range reads, errors) is read entry by entry, as
        :meth:`read` reads, which also says why an entry cannot be read."""
        if last < first:
            return []
        self._check_readable(first, last)
        if not self.groups_adds:
            return await self.read(first, last, concurrency=concurrency)
        entries: list[LedgerEntry] = []
        entry_id = first
        while entry_id <= last:
            view = self._read_view
            fragment = view.fragment_for(entry_id)
            end = last
            for later in view.fragments:
                if later.first_entry_id > entry_id:
                    end = min(end, later.first_entry_id - 1)
                    break
            bookies = self._write_set_of(fragment, entry_id)
            if not any(self.client.has_range_read(b) for b in bookies):
                entries += await self.read(entry_id, end, concurrency=concurrency)
                entry_id = end + 1
                continue
            try:
                raw = await self.client.read_range_from_replicas(
                    self.ledger_id, entry_id, end, bookies
                )
            except ReadError:
                raw = [await self._read_replicas(entry_id)]  # moved replicas, or why not
            entries += map(LedgerEntry.from_entry, raw)
            entry_id += len(raw)
        return entries

    async def _read_replicas(self, entry_id: int) -> bytes:
        bookies = self._write_set_of(self._read_view.fragment_for(entry_id), entry_id)
        try:
            return await self.client.read_from_replicas(self.ledger_id, entry_id, bookies)
        except ReadError:
            # The replication worker may have moved this fragment off a lost bookie since this
            # handle read the metadata: read it again and, if the copies moved, read those.
            stored, _ = await self.client.read_metadata(self.ledger_id)
            moved = self._write_set_of(stored.fragment_for(entry_id), entry_id)
            if moved == bookies:
                raise
            self._read_view = stored
            log.info(
                "ledger %d entry %d: replicas moved from %s to %s; reading there",
                self.ledger_id,
                entry_id,
                bookies,
                moved,
            )
            return await self.client.read_from_replicas(self.ledger_id, entry_id, moved)

    def _write_set_of(self, fragment: Fragment, entry_id: int) -> list[str]:
        return [fragment.bookies[p] for p in self._quorum.write_set(entry_id)]

    @property
    def _read_view(self) -> LedgerMetadata:
        """The metadata reads go by: this handle's, or a newer one read after replicas moved
        (fragments this handle does not write to)."""
        view = self._read_metadata
        if view is None or len(view.fragments) < len(self.metadata.fragments):
            return self.metadata
        return view

    @_read_view.setter
    def _read_view(self, metadata: LedgerMetadata) -> None:
        self._read_metadata = metadata

    async def refresh_lac(self) -> int:
        """Ask the last ensemble for the LAC (open ledgers); returns the readable end."""
        if self.metadata.is_closed:
            return self.readable_last_entry
        lac = await self.client.read_lac(self.ledger_id, self.metadata.last_fragment.bookies)
        self.last_add_confirmed = max(self.last_add_confirmed, lac)
        return self.last_add_confirmed

    async def wait_for_lac(self, previous: int, timeout_s: float) -> int:
        """Long poll until the LAC passes ``previous`` or the timeout ends; returns the LAC."""
        if self.metadata.is_closed:
            return self.readable_last_entry
        lac = await self.client.wait_for_lac(
            self.ledger_id, self.metadata.last_fragment.bookies, previous, timeout_s
        )
        self.last_add_confirmed = max(self.last_add_confirmed, lac)
        return self.last_add_confirmed
