"""ManagedLedger: a topic's log as a sequence of ledgers, one of them open for writes.

Its record (``ledger_info.py``) lives at ``/magnetar/managed-ledgers/<encoded name>``
(``model/keys.py``); the cursors live under that key.

Ownership rules (why this is safe to move between brokers):

* The metadata is changed only by compare-and-set on its version. A CAS that fails means
  another broker changed it: this instance is fenced and takes no more adds.
* ``open`` recovers the last ledger (``open_ledger(id, recovery=True)``): recovery fences the
  bookies, so the previous owner's pending and later adds on that ledger fail with
  LedgerFencedError, and the recovered end includes every entry that owner had acknowledged.
* A new ledger is written only after the metadata listing it was CAS-ed, so a fenced owner never
  acknowledges an entry in a ledger that the new owner does not know about.

Termination (Pulsar's ``asyncTerminate``): adds are refused from the call on, those queued
before are stored, the ledger being written is closed and the last entry's position is stored
in the record (``terminated_at``). A terminated managed ledger opens with no ledger to write to
and refuses every add, on any owner, for good.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import logging
import time
from collections.abc import Callable
from typing import Literal

from magnetar.broker.ledger import retention
from magnetar.broker.ledger.compacted_ledger import (
    CompactedLedger,
    CompactionRecord,
    referenced_ledgers,
)
from magnetar.broker.ledger.cursor import ManagedCursor, delete_stored_cursor
from magnetar.broker.ledger.entry_reader import EntryReader
from magnetar.broker.ledger.errors import (
    EntryTooLargeForLedgerError,
    ManagedLedgerClosedError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    ManagedLedgerTerminatedError,
    UnreadableEntryError,
)
from magnetar.broker.ledger.ledger_info import ManagedLedgerConfig, roll_backoff
from magnetar.broker.ledger.ml_stats import ManagedLedgerStats
from magnetar.broker.ledger.positions import LedgerPositions
from magnetar.broker.model.keys import decode_name, managed_ledger_key
from magnetar.broker.model.position import Position, position_of
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.entry import HEADER_SIZE
from magnetar.common.ledger.errors import (
    EntryTooLargeError,
    LedgerError,
    LedgerFencedError,
    NoSuchLedgerError,
)
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.managed_ledger_list import LedgerInfo, ManagedLedgerRecord
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore
from magnetar.common.tasks import wait_set

log = logging.getLogger(__name__)

#: Told that an add is done (its future, done), see ``add_entry_async``.
StoredListener = Callable[["asyncio.Future[Position]"], None]
#: An add waiting for the writer: its data, its future, when it was called (monotonic), who is
#: told once it is stored.
_QueuedAdd = tuple[bytes, "asyncio.Future[Position]", float, "StoredListener | None"]

#: The writer yields to the event loop after this many adds in a row.
YIELD_EVERY = 64
#: At most this many queued adds go to the ledger as one group (when its write quorum is its
#: ensemble): sent, journaled and acknowledged together. The writer yields after each group.
GROUP_ADDS = YIELD_EVERY
#: Passes of read-recover-claim when opening, against a previous owner still rolling over.
OPEN_ATTEMPTS = 5


class _State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class ManagedLedger(LedgerPositions):
    """A topic's log. Create with ``await ManagedLedger.open(...)``; one owner at a time."""

    def __init__(
        self,
        name: str,
        client: LedgerClient,
        store: MetadataStore,
        config: ManagedLedgerConfig,
    ) -> None:
        self.name = name
        self.client = client
        self.store = store
        self.config = config
        self.key = managed_ledger_key(name)
        self.properties: dict[str, str] = {}
        #: Where it was terminated (its last entry for good); None: it takes adds.
        self.terminated_at: Position | None = None
        self._terminating = False
        self._last_add: asyncio.Future[Position] | None = None  # the last add taken
        self._ledgers: list[LedgerInfo] = []
        self._version = NOT_EXISTS
        self._current: LedgerHandle | None = None
        self._current_failed = False  # a non-fence add error: replace the ledger before more adds
        self._confirmed_in_current = False  # an add to the current ledger was acknowledged
        self._failed_rolls = 0  # rollovers in a row whose ledger took no entry
        self._pushed_entries = 0  # adds sent to the current ledger (acked or not)
        self._pushed_bytes = 0
        #: Counters for metrics (adds, reads, cache, latencies), shared with the reader.
        self.stats = ManagedLedgerStats()
        self.reader = EntryReader(name, client, config.cache_bytes, self.stats)
        self._cache = self.reader.cache
        #: Adds waiting for the writer: data, its future, when it was called (monotonic), who
        #: is told once it is stored.
        self._queue: collections.deque[_QueuedAdd] = collections.deque()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first add
        #: Set and dropped after each completed add; made only when a tailer waits.
        self._added: asyncio.Event | None = None
        self._error: ManagedLedgerError | None = None
        self._state = _State.OPEN
        self._meta_lock = asyncio.Lock()  # one metadata CAS at a time from this instance
        self._writer: asyncio.Task[None] | None = None
        self.cursors: dict[str, ManagedCursor] = {}
        #: The compacted ledger the properties record (``read_compacted`` readers read it).
        self.compacted: CompactedLedger | None = None
        #: Entries found with no intact copy on any bookie -> why (cleared once read again).
        self.unreadable = self.reader.unreadable
        self.epoch = 0
        #: Called (synchronously) after every acknowledged add: one call where a done callback
        #: on each add's future would cost a turn of the event loop per message.
        self.on_added: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"ManagedLedger({self.name!r}, ledgers={[i.ledger_id for i in self._ledgers]})"

    # -- open ----------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        name: str,
        ledger_client: LedgerClient,
        store: MetadataStore,
        config: ManagedLedgerConfig | None = None,
    ) -> ManagedLedger:
        """Load (or create) the managed ledger, recover its last ledger (fencing any previous
        owner), and start a new ledger for writes. Raises ManagedLedgerFencedError if another
        broker changed the metadata meanwhile."""
        ml = cls(name, ledger_client, store, config or ManagedLedgerConfig())
        await ml._initialize()
        return ml

    async def _initialize(self) -> None:
        # A previous owner still writing may roll over to a new ledger (and CAS the list) between
        # the read and the claim; the claim then fails and the list is read again.
        for attempt in range(OPEN_ATTEMPTS):
            if await self._recover_and_claim():
                break
            log.info(
                "managed ledger %s: its ledger list changed while opening (attempt %d); "
                "reading it again",
                self.name,
                attempt + 1,
            )
        else:
            raise ManagedLedgerFencedError(
                f"managed ledger {self.name}: another broker kept changing its metadata while "
                f"this one opened it ({OPEN_ATTEMPTS} attempts); it has another owner now"
            )
        # The metadata version this instance's ownership started at: later owners have higher
        # ones, which lets a cursor tell a stale owner's write from a newer owner's.
        self.epoch = self._version
        for segment in await self.store.children(f"{self.key}/cursors"):
            cursor = await ManagedCursor.load(self, decode_name(segment))
            if cursor is not None:
                self.cursors[cursor.name] = cursor
        await self._open_compacted()
        self._writer = asyncio.create_task(self._write_loop(), name=f"ml-{self.name}-writer")
        log.info("managed ledger %s opened: ledgers %s", self.name, self.ledger_ids)

    async def _recover_and_claim(self) -> bool:
        """Claim the ledger list, recover (fence) its open ledgers, add a new ledger for writes
        and CAS the list; False (nothing claimed) when the list changed since it was read.

        The claim is a rewrite of the list as read: it bumps its version, so a previous owner
        still writing can no longer roll over (its CAS fails and fences it). Recovery then
        fences the one ledger it can still append to. Without the claim, an owner rolling over
        quickly keeps moving past the ledger being recovered and the final CAS never wins."""
        found = await self.store.get(self.key)
        self._version = NOT_EXISTS
        if found is not None:
            record = ManagedLedgerRecord.from_bytes(self.name, found.value)
            try:
                self._version = await self.store.put(self.key, found.value, found.version)
            except BadVersionError:
                return False
            self._ledgers, self.properties = record.ledgers, record.properties
            if record.terminated_at is not None:
                self.terminated_at = Position(*record.terminated_at)
        recovered: list[LedgerInfo] = []
        for info in self._ledgers:
            if info.closed:
                recovered.append(info)
                continue
            closed = await self.reader.recover(info)
            if closed is not None:
                recovered.append(closed)
        empty = [i.ledger_id for i in recovered if i.entries == 0]
        self._ledgers = [i for i in recovered if i.entries > 0]
        handle = None
        if self.terminated_at is None:  # a terminated one takes no adds: no ledger to write
            handle = await self._create_ledger()
            self._ledgers.append(LedgerInfo(handle.ledger_id, ctime_ms=handle.metadata.ctime_ms))
        try:
            self._version = await self.store.put(self.key, self._metadata_doc(), self._version)
        except BadVersionError:
            if handle is not None:
                await self._delete_ledgers([handle.ledger_id])
            return False
        self._current = handle
        await self._delete_ledgers(empty)
        return True

    async def _open_compacted(self) -> None:
        record = CompactionRecord.of(self.properties)
        if record is None:
            return
        try:
            self.compacted = await CompactedLedger.open(self.client, record)
        except LedgerError as e:  # readers of the compacted view read the whole topic
            log.error(
                "managed ledger %s: its compacted ledger %d cannot be opened (%s); "
                "read_compacted readers read every message until the next compaction",
                self.name,
                record.ledger_id,
                e,
            )

    async def install_compacted(self, view: CompactedLedger) -> None:
        """Record ``view`` as the compacted ledger (its id and horizon in one CAS of the
        properties, which also clears the pending mark), then delete the one it replaces."""
        await self.update_properties(view.record.properties())
        old, self.compacted = self.compacted, view
        if old is not None and old.ledger_id != view.ledger_id:
            await old.close()
            await self._delete_ledgers([old.ledger_id])

    async def _create_ledger(self) -> LedgerHandle:
        cfg = self.config
        return await self.client.create_ledger(
            cfg.ensemble_size,
            cfg.write_quorum,
            cfg.ack_quorum,
            custom_metadata={"managed-ledger": self.name.encode(), "application": b"magnetar"},
        )

    def _metadata_doc(self) -> bytes:
        terminated = self.terminated_at
        return ManagedLedgerRecord(
            self.name,
            self._ledgers,
            self.properties,
            None if terminated is None else (terminated.ledger_id, terminated.entry_id),
        ).to_bytes()

    async def _write_metadata(self) -> None:
        """CAS the ledger list; a conflict means another owner: fence this instance."""
        try:
            self._version = await self.store.put(self.key, self._metadata_doc(), self._version)
        except BadVersionError:
            raise self._fence(f"metadata of {self.key} changed under us") from None

    async def _delete_ledgers(self, ledger_ids: list[int]) -> None:
        await self.reader.delete(ledger_ids)

    @property
    def is_fenced(self) -> bool:
        return isinstance(self._error, ManagedLedgerFencedError)

    async def set_property(self, key: str, value: str) -> None:
        """Store a property in the metadata (CAS, like every metadata change)."""
        await self.update_properties({key: value})

    async def update_properties(self, changes: dict[str, str | None]) -> None:
        """Set properties (a None value removes one) in one metadata write; on a fenced write
        the properties are as they were."""
        async with self._meta_lock:
            if self._error is not None:
                raise self._error
            before = dict(self.properties)
            for key, value in changes.items():
                if value is None:
                    self.properties.pop(key, None)
                else:
                    self.properties[key] = value
            try:
                await self._write_metadata()
            except ManagedLedgerFencedError:
                self.properties.clear()
                self.properties.update(before)
                raise

    def _fence(self, why: str) -> ManagedLedgerFencedError:
        if not isinstance(self._error, ManagedLedgerFencedError):
            self._error = ManagedLedgerFencedError(
                f"managed ledger {self.name} is fenced ({why}): another broker owns it now"
            )
            log.warning("%s", self._error)
            self._fail_queued(self._error)
            self._notify_added()  # tailers stop waiting
        return self._error

    # -- adds ----------------------------------------------------------------------------------

    async def add_entry(self, data: bytes) -> Position:
        return await self.add_entry_async(data)

    def add_entry_async(
        self, data: bytes, on_stored: StoredListener | None = None
    ) -> asyncio.Future[Position]:
        """Queue one entry; the future gives its position once acknowledged. Futures complete in
        the order of the calls, across rollovers. ``on_stored`` is called with the future once
        it is done: for a stored entry in the turn the ledger acknowledged it (a done callback
        would wait a turn of the event loop, one per entry), otherwise as a done callback."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Position] = self._loop.create_future()
        if self._takes_adds():
            # Told by the writer itself once the add ended (``_group_done``, ``_failed``): no
            # done callback to add and take off again.
            self._queue.append((data, future, time.monotonic(), on_stored))
            self._last_add = future
            self._wake.set()
            return future
        if on_stored is not None:
            future.add_done_callback(on_stored)  # refused: told as a done callback
        if self._error is not None:
            future.set_exception(self._error)
        elif self._terminating or self.terminated_at is not None:
            refusal = ManagedLedgerTerminatedError(f"managed ledger {self.name} is terminated")
            before = self._last_add
            if before is not None and not before.done():
                # Told after the adds before it (they complete in order): a client that closes
                # its connection on a send error must have their receipts first.
                before.add_done_callback(
                    lambda _: None if future.done() else future.set_exception(refusal)
                )
            else:
                future.set_exception(refusal)
        else:
            future.set_exception(ManagedLedgerClosedError(f"managed ledger {self.name} is closed"))
        return future

    def add_run_async(
        self, run: list[tuple[bytes, StoredListener | None]]
    ) -> asyncio.Future[Position]:
        """``add_entry_async`` of each ``(data, on_stored)`` of ``run`` (not empty), in order, in
        one call: the state checked, the clock read and the writer woken once. The last
        add's future."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if not self._takes_adds():
            for data, on_stored in run:
                future = self.add_entry_async(data, on_stored)
            return future
        create = self._loop.create_future
        append = self._queue.append
        now = time.monotonic()
        for data, on_stored in run:
            future = create()
            append((data, future, now, on_stored))
        self._last_add = future
        self._wake.set()
        return future

    def _takes_adds(self) -> bool:
        return (
            self._error is None
            and not self._terminating
            and self.terminated_at is None
            and self._state is _State.OPEN
        )

    def _failed(
        self,
        future: asyncio.Future[Position],
        on_stored: StoredListener | None,
        error: BaseException,
    ) -> None:
        """A queued add failed: its future, then its listener as a done callback would be
        (after this turn: the failure may be found deep in the writer or a completion)."""
        if not future.done():
            future.set_exception(error)
            if on_stored is not None:
                asyncio.get_running_loop().call_soon(on_stored, future)

    async def terminate(self) -> Position:
        """Take no more adds, ever (Pulsar's terminate): the adds queued before are stored,
        the ledger being written is closed, and the last entry's position is stored in the
        record, so every later owner refuses adds too. Returns that position; calling it again
        returns it again."""
        if self.terminated_at is not None:
            return self.terminated_at
        if self._error is not None:
            raise self._error
        if self._state is not _State.OPEN:
            raise ManagedLedgerClosedError(f"managed ledger {self.name} is closed")
        self._terminating = True
        if self._queue:  # adds complete in order: the last one queued is enough to wait for
            await asyncio.gather(self._queue[-1][1], return_exceptions=True)
        async with self._meta_lock:
            if self.terminated_at is not None:
                return self.terminated_at
            if self._error is not None:
                raise self._error
            old, info = self._current, None
            if old is not None:
                info = await self._finish_current()
            # Before an empty last ledger leaves the list: (that ledger, -1) for an empty topic.
            last = self.last_confirmed_position
            if old is not None and info is not None:
                self._ledgers = self._ledgers[:-1] + ([info] if info.entries > 0 else [])
                self._current = None
            self.terminated_at = last
            try:
                await self._write_metadata()
            except ManagedLedgerFencedError:
                self.terminated_at = None
                raise
            if old is not None and info is not None and info.entries == 0:
                await self._delete_ledgers([old.ledger_id])
        self._notify_added()  # tailers stop waiting: nothing more will come
        log.info("managed ledger %s terminated at %s", self.name, last)
        return last

    def _fail_queued(self, error: BaseException) -> None:
        while self._queue:
            _, future, _, on_stored = self._queue.popleft()
            self.stats.adds_failed += 1
            self._failed(future, on_stored, error)

    async def _write_loop(self) -> None:
        """The single writer: adds go out in call order; a rollover holds the queue meanwhile."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if self._error is not None:
                    self._fail_queued(self._error)
                    break
                head = self._queue[0]
                data, future, _, on_stored = head
                try:
                    if self._should_roll():
                        await self._wait_before_roll()
                        await self._roll()
                    assert self._current is not None
                    if len(self._queue) > 1 and self._current.groups_adds:
                        pushed = self._push_group(self._current)
                        if pushed is not None:
                            if not pushed:  # the window is full
                                await self._current.wait_for_room()
                            else:
                                # Let the bookies start on what was pushed: a burst is journaled
                                # in pieces, so its first receipts do not wait for its last entry.
                                await asyncio.sleep(0)
                            continue
                    # Called as each add completes, in that turn: the entry is in the cache
                    # before a dispatcher sees the new LAC, and the receipt waits no extra turn.
                    listener = functools.partial(
                        self._group_done,
                        self._current.ledger_id,
                        [head],  # a group of one
                        [data],
                        time.monotonic(),
                    )
                    while not self._current.try_push(data, listener):  # the window is full
                        await self._current.wait_for_room()
                except LedgerFencedError as e:
                    self._fence(str(e))
                    continue
                except EntryTooLargeError as e:  # the caller's error: the ledger is fine
                    if self._queue and self._queue[0][1] is future:
                        self._queue.popleft()
                    self.stats.adds_failed += 1
                    self._failed(
                        future,
                        on_stored,
                        EntryTooLargeForLedgerError(f"managed ledger {self.name}: {e}"),
                    )
                    continue
                except Exception as e:  # a failed rollover or handle: this add fails, next retries
                    if self._queue and self._queue[0][1] is future:
                        self._queue.popleft()
                    self.stats.adds_failed += 1
                    if isinstance(e, LedgerError):
                        self._current_failed = True
                    self._failed(
                        future,
                        on_stored,
                        e
                        if isinstance(e, ManagedLedgerError)
                        else ManagedLedgerError(f"managed ledger {self.name}: add failed: {e}"),
                    )
                    continue
                self._queue.popleft()
                self._pushed_entries += 1
                self._pushed_bytes += len(data)
                if self._pushed_entries % YIELD_EVERY == 0:
                    # Let the bookies start on what was pushed: a burst is journaled in
                    # pieces, so its first receipts do not wait for its last entry.
                    await asyncio.sleep(0)
            if self._state is not _State.OPEN and not self._queue:
                return

    def _push_group(self, handle: LedgerHandle) -> bool | None:
        """Push the adds at the head of the queue that may go as one group (at most
        GROUP_ADDS, as many as the window takes, none past where the ledger rolls over, none
        over the entry size limit): True once pushed, False when the window has no room,
        None when fewer than two would go (the head goes alone)."""
        room_adds, room_bytes = handle.room()
        limit = min(room_adds, GROUP_ADDS)
        largest = handle.max_entry_size - HEADER_SIZE
        entries, size = self._pushed_entries, self._pushed_bytes
        full = self.config.full
        age_s = time.time() - handle.metadata.ctime_ms / 1000
        group: list[_QueuedAdd] = []
        for item in self._queue:
            length = len(item[0])
            if len(group) >= limit or length > largest or room_bytes <= 0:
                break
            if group and full(entries, size, age_s):
                break  # the ledger rolls over before this one (the writer checked the first)
            group.append(item)
            entries += 1
            size += length
            room_bytes -= length
        if len(group) < 2:
            return None if room_adds > 0 else False
        datas = [item[0] for item in group]
        listener = functools.partial(
            self._group_done, handle.ledger_id, group, datas, time.monotonic()
        )
        if not handle.try_push_group(datas, listener):
            return False
        popleft = self._queue.popleft
        for _ in group:
            popleft()
        self._pushed_entries = entries
        self._pushed_bytes = size
        return True

    def _group_done(
        self,
        ledger_id: int,
        group: list[_QueuedAdd],
        datas: list[bytes],
        pushed_at: float,
        first_entry_id: int,
        error: BaseException | None,
    ) -> None:
        """The adds of a group (pushed together, or one alone) acknowledged, in their order:
        each in the cache, its future and listener told; or all failed with ``error``."""
        stats = self.stats
        if error is not None:
            failure = self._add_failure(error)
            for _, future, _, on_stored in group:
                stats.adds_failed += 1
                self._failed(future, on_stored, failure)
            return
        now = time.monotonic()
        stats.ledger_add_latency.add_latency(now - pushed_at, len(group))
        current = self._current
        if current is not None and ledger_id == current.ledger_id:
            self._confirmed_in_current = True
        sizes = list(map(len, datas))
        positions = [
            position_of((ledger_id, entry_id))
            for entry_id in range(first_entry_id, first_entry_id + len(group))
        ]
        size = sum(sizes)
        self._cache.put_all(positions, datas, size)
        # Adds queued together (a run) waited as long: their latency is counted once per run.
        since, times = group[0][2], 0
        for position, (_, future, queued_at, on_stored) in zip(positions, group, strict=True):
            if queued_at != since:
                stats.add_latency.add_latency(now - since, times)
                since, times = queued_at, 0
            times += 1
            if not future.done():
                future.set_result(position)
                if on_stored is not None:
                    on_stored(future)
        stats.add_latency.add_latency(now - since, times)
        stats.entry_size.add_all(sizes)
        stats.adds_succeeded += len(group)
        stats.add_bytes += size
        self._notify_added()
        if self.on_added is not None:
            self.on_added()

    def _add_failure(self, error: BaseException) -> ManagedLedgerError:
        """What the callers of a failed add are told (and what it does to the managed ledger:
        fenced, or its current ledger to be replaced)."""
        if isinstance(error, LedgerFencedError):
            return self._fence(str(error))
        if isinstance(error, EntryTooLargeError):
            return EntryTooLargeForLedgerError(f"managed ledger {self.name}: {error}")
        self._current_failed = True
        return ManagedLedgerError(f"managed ledger {self.name}: add failed: {error}")

    def _notify_added(self) -> None:
        added, self._added = self._added, None
        if added is not None:
            added.set()

    async def _wait_before_roll(self) -> None:
        """After rollovers that gave ledgers nobody could write to, wait before the next one
        (``roll_backoff``): failing bookies must not turn every add into a
        new empty ledger."""
        if not self._current_failed or self._confirmed_in_current:
            self._failed_rolls = 0
            return
        self._failed_rolls += 1
        if self._failed_rolls > 1:
            delay = roll_backoff(self._failed_rolls)
            log.warning(
                "managed ledger %s: ledger %s took no entry; next ledger in %.1f s",
                self.name,
                self._current.ledger_id if self._current is not None else "?",
                delay,
            )
            await asyncio.sleep(delay)

    def _should_roll(self) -> bool:
        if self._current is None or self._current_failed or self._current.is_closed:
            return True  # also after a rollover that closed the ledger but failed later
        age_s = time.time() - self._current.metadata.ctime_ms / 1000
        return self.config.full(self._pushed_entries, self._pushed_bytes, age_s)

    async def _roll(self) -> None:
        """Close the current ledger, create the next, CAS both into the metadata. Adds wait in
        the queue meanwhile, so they land in the new ledger in order."""
        started = time.monotonic()
        async with self._meta_lock:
            old = self._current
            assert old is not None
            info = await self._finish_current()
            if self._error is not None:
                raise self._error
            new = await self._create_ledger()
            ledgers = list(self._ledgers)
            self._ledgers = self._ledgers[:-1]
            if info.entries > 0:
                self._ledgers.append(info)
            self._ledgers.append(LedgerInfo(new.ledger_id, ctime_ms=new.metadata.ctime_ms))
            try:
                await self._write_metadata()
            except ManagedLedgerFencedError:
                self._ledgers = ledgers
                await self._delete_ledgers([new.ledger_id])
                raise
            self._current = new
            self._current_failed = False
            self._confirmed_in_current = False
            self._pushed_entries = self._pushed_bytes = 0
            self.stats.ledger_switch_latency.add_latency(time.monotonic() - started)
            if info.entries == 0:
                await self._delete_ledgers([old.ledger_id])
            log.info(
                "managed ledger %s: rolled over from ledger %d (%d entries) to %d",
                self.name,
                old.ledger_id,
                info.entries,
                new.ledger_id,
            )

    async def _finish_current(self) -> LedgerInfo:
        """Close the write handle; the closed ledger's info (not yet in the metadata)."""
        handle = self._current
        assert handle is not None
        try:
            await handle.close()
        except LedgerFencedError as e:
            raise self._fence(str(e)) from None
        if self._error is not None:
            raise self._error
        if handle.metadata.is_closed:
            self.reader.keep(handle)
            return self._ledgers[-1].closed_as(handle.metadata)
        # The handle failed (not fenced): recovery decides which of its adds are in it.
        closed = await self.reader.recover(self._ledgers[-1])
        if closed is None:  # a failed add's ledger: the write loop replaces it
            raise NoSuchLedgerError(f"ledger {handle.ledger_id} is gone")
        return closed

    # -- reads ---------------------------------------------------------------------------------

    async def read_entries(self, start: Position, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` entries from ``start`` (or the first existing one after it),
        across ledgers, up to the last acknowledged entry."""
        result: list[tuple[Position, bytes]] = []
        position = self.first_at_or_after(start)
        while position is not None and len(result) < max_entries:
            # Fresh each time: adds confirmed while a read awaited the bookies extend the ledger.
            count = next(
                (self._readable(i) for i in self._ledgers if i.ledger_id == position.ledger_id), 0
            )
            last = min(count - 1, position.entry_id + max_entries - len(result) - 1)
            try:
                result.extend(
                    await self.reader.read_range(
                        position.ledger_id, position.entry_id, last, self._current
                    )
                )
            except UnreadableEntryError:
                if result:
                    return result  # what comes before it; the next read stops at it
                raise
            position = self.first_at_or_after(Position(position.ledger_id, last + 1))
        return result

    async def wait_for_entries_after(self, position: Position, timeout: float) -> bool:
        """Wait until an entry after ``position`` is acknowledged; False on timeout or when the
        managed ledger is closed or fenced."""
        following = Position(position.ledger_id, position.entry_id + 1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            added = self._added
            if added is None:
                added = self._added = asyncio.Event()
            if self.first_at_or_after(following) is not None:
                return True
            remaining = deadline - loop.time()
            if (
                remaining <= 0
                or self._error is not None
                or self._state is not _State.OPEN
                or self.terminated_at is not None
            ):
                return False
            if not await wait_set(added, remaining):
                return self.first_at_or_after(following) is not None

    # -- cursors -------------------------------------------------------------------------------

    async def open_cursor(
        self, name: str, initial: Literal["earliest", "latest"] = "latest"
    ) -> ManagedCursor:
        """The durable cursor ``name``: loaded if it exists, else created at ``initial``."""
        cursor = self.cursors.get(name)
        if cursor is not None:
            return cursor
        cursor = await ManagedCursor.load(self, name)
        if cursor is None:
            if initial == "earliest":
                first = self.first_position
                mark_delete = Position(first.ledger_id, first.entry_id - 1)
            else:
                mark_delete = self.last_confirmed_position
            cursor = await ManagedCursor.create(self, name, mark_delete)
        self.cursors[name] = cursor
        return cursor

    async def delete_cursor(self, name: str) -> None:
        cursor = self.cursors.pop(name, None)
        if cursor is not None:
            await cursor.remove()
        else:
            await delete_stored_cursor(self, name)

    # -- trimming ------------------------------------------------------------------------------

    def _closed_before(self, before: Position) -> list[LedgerInfo]:
        current = self._current.ledger_id if self._current is not None else None
        if current is None and self.terminated_at is not None and self._ledgers:
            # A terminated ledger's last ledger stays, as the current one would: positions
            # (the last message id, where cursors end) are read from it.
            current = self._ledgers[-1].ledger_id
        return retention.closed_before(self._ledgers, current, before)

    async def trim(self, before: Position) -> list[int]:
        """Delete the ledgers whose every entry is before ``before`` (never the current one);
        returns their ids."""
        async with self._meta_lock:
            if self._error is not None:
                raise self._error
            doomed = [i.ledger_id for i in self._closed_before(before)]
            return await self._drop_ledgers(doomed)

    async def trim_retained(self, retention_minutes: int, retention_mb: int) -> list[int]:
        """Apply a retention policy, as Pulsar does: oldest first, a ledger every durable cursor
        has consumed (every ledger, without cursors) is deleted while it is older than
        ``retention_minutes`` or the rest of the topic is over ``retention_mb``; -1 is no limit
        for either. The ledger being written is never deleted. Returns the deleted ids."""
        if retention_minutes < 0 and retention_mb < 0:
            return []
        async with self._meta_lock:
            if self._error is not None:
                raise self._error
            slowest = self.slowest_mark_delete()
            consumed_before = (
                Position(slowest.ledger_id, slowest.entry_id + 1)
                if slowest is not None
                else self.next_position(self.last_confirmed_position)
            )
            doomed = retention.past_retention(
                self._ledgers,
                {i.ledger_id for i in self._closed_before(consumed_before)},
                self.total_size,
                retention_minutes,
                retention_mb,
                time.time() * 1000,
            )
            return await self._drop_ledgers(doomed)

    async def _drop_ledgers(self, doomed: list[int]) -> list[int]:
        """Remove ``doomed`` from the ledger list (CAS) and delete them; under the meta lock."""
        if not doomed:
            return []
        kept = self._ledgers
        self._ledgers = [i for i in self._ledgers if i.ledger_id not in doomed]
        try:
            await self._write_metadata()
        except ManagedLedgerFencedError:
            self._ledgers = kept
            raise
        await self._delete_ledgers(doomed)
        log.info("managed ledger %s: trimmed ledgers %s", self.name, doomed)
        return doomed

    def last_position_closed_before(self, cutoff_ms: float) -> Position | None:
        return retention.last_position_closed_before(self._ledgers, cutoff_ms)

    def slowest_mark_delete(self) -> Position | None:
        if not self.cursors:
            return None
        return min(c.mark_delete_position for c in self.cursors.values())

    # -- close / delete ------------------------------------------------------------------------

    async def close(self) -> None:
        """Finish queued adds, persist the cursors, close the current ledger in the metadata."""
        if self._state is not _State.OPEN:
            return
        self._state = _State.CLOSING
        self._wake.set()
        if self._writer is not None:
            # gather, not await: a writer that was cancelled (the loop is shutting down) must
            # not stop the close.
            await asyncio.gather(self._writer, return_exceptions=True)
        for cursor in list(self.cursors.values()):
            await cursor.close()
        async with self._meta_lock:
            if self._error is None and self._current is not None:
                try:
                    info = await self._finish_current()
                    old = self._current
                    self._ledgers = self._ledgers[:-1] + ([info] if info.entries > 0 else [])
                    self._current = None
                    await self._write_metadata()
                    if info.entries == 0:
                        await self._delete_ledgers([old.ledger_id])
                except ManagedLedgerError as e:
                    log.warning("managed ledger %s: close: %s", self.name, e)
            self._current = None
        await self.reader.close()
        if self.compacted is not None:
            await self.compacted.close()
        self._state = _State.CLOSED
        self._notify_added()
        log.info("managed ledger %s closed", self.name)

    async def abandon(self) -> None:
        """Stop writing and persisting without closing anything, as a broker that died would
        (tests: what the next owner finds is what a crash leaves)."""
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        for cursor in self.cursors.values():
            await cursor.abandon()

    async def delete(self) -> None:
        """Delete every ledger, every cursor and the metadata."""
        if isinstance(self._error, ManagedLedgerFencedError):
            raise self._error  # the ledgers belong to the new owner now
        await self.close()
        if isinstance(self._error, ManagedLedgerFencedError):
            raise self._error
        for cursor in list(self.cursors.values()):
            await cursor.remove()  # its record and its cursor ledgers
        await self._delete_ledgers(self.ledger_ids + referenced_ledgers(self.properties))
        self._ledgers = []
        for key in await self.store.scan(f"{self.key}/"):
            await self.store.delete(key)
        await self.store.delete(self.key)
        self.cursors.clear()
        log.info("managed ledger %s deleted", self.name)

    @classmethod
    async def delete_stored(cls, name: str, client: LedgerClient, store: MetadataStore) -> bool:
        """Delete a managed ledger that is open nowhere from its stored record alone (Pulsar's
        ManagedLedgerFactory.asyncDelete of a ledger that is not open): cursors, ledgers, and
        the record last, so an interrupted delete is finished by the next. Nothing is opened,
        so no ledger is created on the way. The caller makes sure nobody opens it meanwhile.
        False if there was no record."""
        ml = cls(name, client, store, ManagedLedgerConfig())
        found = await store.get(ml.key)
        if found is None:
            return False
        record = ManagedLedgerRecord.from_bytes(name, found.value)
        ml._ledgers = record.ledgers
        for segment in await store.children(f"{ml.key}/cursors"):
            await delete_stored_cursor(ml, decode_name(segment))
        await ml._delete_ledgers(ml.ledger_ids + referenced_ledgers(record.properties))
        for key in await store.scan(f"{ml.key}/"):
            await store.delete(key)
        await store.delete(ml.key)
        log.info("managed ledger %s deleted (it was not open)", name)
        return True
