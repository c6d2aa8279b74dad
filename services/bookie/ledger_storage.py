"""Ledger storage: the journal, memtable, entry logs and index of one bookie, put together.

Write path: check the add, put the entry in the memtable, append it to the journal; the add is
acknowledged once its journal group is fsynced. Read path: memtable -> the memtable being
flushed -> read cache -> index + entry log. A checkpoint swaps the memtable, rolls the journal,
writes the old memtable to the entry log, commits its index rows together with the new journal
mark, and deletes the journal files before the mark. On start, the journal is replayed from the
mark.

Master keys (BookKeeper's): the first add of a ledger records the key it carries, in the index,
before that add is acknowledged; later adds (recovery adds included) with another key are
refused with UNAUTHORIZED, so a reused ledger id can never append to, or serve, old data.

A bookie re-registered empty after losing its disks (``wiped_below``, from its cookie) answers
WIPED instead of "no such ledger/entry" for ledgers older than its re-registration: it cannot
know whether it held them, and recovery must not count its answer as a proof of absence.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from magnetar.bookie import journal as jnl
from magnetar.bookie.bookkeeper_stats import StorageGauges
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.entry_logger import EntryLogger, EntryLogMissingError, log_name, run_bytes
from magnetar.bookie.index import IndexDamagedError, LedgerIndex
from magnetar.bookie.memtable import Memtable
from magnetar.bookie.metrics import BookieMetrics
from magnetar.common.filelock import acquire_lock
from magnetar.common.ledger.entry import (
    DigestMismatchError,
    EntryFormatError,
    check_entry,
    decode_header,
    entry_ids,
    verify_entry,
)
from magnetar.common.proto import bookie_pb2 as pb
from magnetar.common.tasks import wait_set

#: Status names by number, for metric labels (the protobuf enum wrapper is slow to ask).
STATUS_NAMES = {value: name for name, value in pb.Status.items()}

log = logging.getLogger(__name__)


class StorageError(Exception):
    """An operation failed with a bookie protocol status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AddOpLike(Protocol):
    ledger_id: int
    entry_id: int
    entry: bytes
    recovery: bool
    master_key: bytes


@dataclass(slots=True)
class AddRun:
    """Consecutive entries of one ledger from one writer, added together (``add_runs``)."""

    ledger_id: int
    first_entry_id: int
    entries: list[bytes]
    master_key: bytes
    recovery: bool = False


@dataclass(slots=True)
class LedgerState:
    """What the bookie knows of one ledger. ``loaded`` says whether the index was consulted for
    entries older than this process (lazily, on the first request that needs it)."""

    fenced: bool = False
    lac: int = -1
    last_entry_id: int = -1
    loaded: bool = False
    # Created only while a long poll waits: most ledgers never have one.
    lac_changed: asyncio.Event | None = None

    def advance_lac(self, lac: int) -> None:
        if lac > self.lac:
            self.lac = lac
            self.wake()

    def wake(self) -> None:
        if self.lac_changed is not None:
            self.lac_changed.set()
            self.lac_changed = None

    def lac_change(self) -> asyncio.Event:
        if self.lac_changed is None:
            self.lac_changed = asyncio.Event()
        return self.lac_changed


@dataclass(slots=True)
class GcResult:
    removed_logs: int = 0
    compacted_logs: int = 0
    freed_bytes: int = 0


class _ReadCache:
    """Least-recently-used cache of entries read from entry logs, bounded in bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        """Bytes of the entries held."""
        return self._size

    def get(self, key: tuple[int, int]) -> bytes | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: tuple[int, int], value: bytes) -> None:
        if len(value) > self.capacity:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self._size -= len(old)
        self._items[key] = value
        self._size += len(value)
        while self._size > self.capacity:
            _, evicted = self._items.popitem(last=False)
            self._size -= len(evicted)

    def drop_ledger(self, ledger_id: int) -> None:
        for key in [k for k in self._items if k[0] == ledger_id]:
            self._size -= len(self._items.pop(key))


class LedgerStorage:
    def __init__(self, config: BookieConfig, metrics: BookieMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or BookieMetrics()
        self.journal_dir = Path(config.journal_dir)
        self.ledger_dir = Path(config.ledger_dir)
        self._index: LedgerIndex | None = None
        self._entry_logger = EntryLogger(self.ledger_dir / "current", config.entry_log_max_bytes)
        self._journal = jnl.Journal(
            self.journal_dir / "current",
            sync=config.journal_sync,
            max_group_wait=config.journal_max_group_wait_ms / 1000,
            max_group_bytes=config.journal_max_group_bytes,
            max_file_bytes=config.journal_file_max_bytes,
            on_sync=self._journal_synced,
            on_error=self._journal_failed,
        )
        self._memtable = Memtable()
        self._flushing: Memtable | None = None
        self._flush_done = asyncio.Event()
        self._flush_done.set()
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        # One thread for entry-log and index writes keeps them in order; reads use the default pool.
        self._flush_executor = ThreadPoolExecutor(1, thread_name_prefix="bookie-flush")
        self._read_cache = _ReadCache(config.read_cache_bytes)
        self._ledgers: dict[int, LedgerState] = {}
        self._master_keys: dict[int, bytes] = {}
        #: Master keys a first add brought that only the journal holds so far (a MASTER_KEY
        #: record in the add's own group): the next checkpoint writes them to the index before
        #: it lets those journal files go.
        self._keys_unindexed: dict[int, bytes] = {}
        #: Ledgers with ids below this were created before this bookie was re-registered empty
        #: (0: never wiped); see the module docstring.
        self.wiped_below = 0
        self._deleted: set[int] = set()
        self._deleted_pending_gc: set[int] = set()
        #: time.monotonic() of the last add accepted per ledger (journal replay counts as one):
        #: the orphan GC leaves ledgers alone that were written to recently.
        self._last_add: dict[int, float] = {}
        self._journal_dirty = False
        self._read_only_reason: str | None = None
        self._started = False
        self._locks: list[int] = []
        self._adds_ok = self.metrics.adds.labels("OK")

    # -- life cycle --------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        # One bookie per directory: a second one would interleave journal and entry-log files.
        for directory in dict.fromkeys((self.journal_dir, self.ledger_dir)):
            self._locks.append(acquire_lock(directory / "LOCK", f"bookie directory {directory}"))
        self._refuse_data_without_index()
        try:
            self._index = await loop.run_in_executor(
                self._flush_executor, LedgerIndex, self.ledger_dir / "index.db"
            )
            fenced, deleted = await loop.run_in_executor(
                self._flush_executor, self._index.ledger_flags
            )
            self._master_keys = await loop.run_in_executor(
                self._flush_executor, self._index.master_keys
            )
        except (IndexDamagedError, sqlite3.DatabaseError) as e:
            path = self.ledger_dir / "index.db"
            raise IndexDamagedError(
                path,
                f"{e}; the bookie will not start. Way forward: restore the ledger directory "
                f"{self.ledger_dir} from a backup, or rebuild the index from the entry logs with "
                f"`magnetar bk indexrebuild --ledger-dir {self.ledger_dir} --journal-dir "
                f"{self.journal_dir}` (the damaged file is kept as index.db.damaged; every "
                "ledger it finds is marked fenced, so open ledgers move to new ones)",
            ) from None
        self._deleted = deleted
        self._deleted_pending_gc = set(deleted)
        for ledger_id in fenced:
            self._ledgers[ledger_id] = LedgerState(fenced=True)
        mark = await loop.run_in_executor(self._flush_executor, self._index.checkpoint_mark)
        started = await loop.run_in_executor(self._flush_executor, self._index.journal_started)
        files = jnl.list_journal_files(self._journal.directory)
        self._refuse_missing_journal_files(mark, started, files)
        usage = await loop.run_in_executor(self._flush_executor, self._index.log_usage)
        self._refuse_missing_entry_logs(usage)
        replayed = await loop.run_in_executor(self._flush_executor, self._replay, mark)
        await self._journal.start(max([mark - 1, *files]) + 1)
        await loop.run_in_executor(
            self._flush_executor, self._index.set_journal_started, self._journal.file_id
        )
        await loop.run_in_executor(self._flush_executor, self._entry_logger.open)
        self._journal_dirty = replayed > 0
        self.metrics.memtable_bytes.set(self._memtable.size)
        self.metrics.entry_log_bytes.set(self._entry_logger.total_bytes())
        self._started = True
        log.info(
            "ledger storage ready: journal %s (replayed %d records from file %d), ledgers %s",
            self.journal_dir,
            replayed,
            mark,
            self.ledger_dir,
        )

    def _refuse_data_without_index(self) -> None:
        """Entry logs or journal files with no ``index.db`` next to them: what was written out
        of the journal is known only to the index, so starting would lose it silently."""
        path = self.ledger_dir / "index.db"
        if path.exists():
            return
        logs = self._entry_logger.log_ids()
        journals = jnl.list_journal_files(self._journal.directory)
        if not logs and not journals:
            return  # a new bookie
        raise IndexDamagedError(
            path,
            f"index {path} is missing, but {self._entry_logger.directory} holds {len(logs)} "
            f"entry logs and {self._journal.directory} {len(journals)} journal files: the index "
            "is the only record of where their entries are and of which ledgers are fenced or "
            "deleted; the bookie will not start. Way forward: restore the ledger directory "
            f"{self.ledger_dir} from a backup, or rebuild the index from the entry logs with "
            f"`magnetar bk indexrebuild --ledger-dir {self.ledger_dir} --journal-dir "
            f"{self.journal_dir}` (every ledger it finds is marked fenced)",
        )

    def _refuse_missing_journal_files(
        self, mark: int, started: int | None, files: list[int]
    ) -> None:
        """Every journal file from the checkpoint mark to the one the last start opened must be
        here: they hold every acknowledged add not yet in the entry logs."""
        if started is None:
            return  # a new index: no start recorded, no file expected yet
        last = max(mark, started)
        present = set(files)
        missing = [i for i in range(mark, last + 1) if i not in present]
        if not missing:
            return
        directory = self._journal.directory
        raise jnl.JournalError(
            f"journal files {', '.join(jnl.file_name(i) for i in missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''} are missing from {directory}: the index's "
            f"checkpoint says the adds not yet in the entry logs are in files "
            f"{jnl.file_name(mark)} to {jnl.file_name(last)}; the bookie will not start (it "
            f"would answer as if those adds never happened). Way forward: restore the journal "
            f"directory {self.journal_dir} (with the ledger directory) from a backup; or, if "
            "this bookie's copies are to be given up, wipe both directories and re-register it "
            "with `magnetar bk reregister` so its ledgers are copied back from other bookies"
        )

    def _refuse_missing_entry_logs(self, usage: dict[int, dict[int, int]]) -> None:
        """Entry logs the index still places live entries in must exist."""
        present = set(self._entry_logger.log_ids())
        missing = sorted(
            log_id
            for log_id, ledgers in usage.items()
            if log_id not in present and any(ledgers.values())
        )
        if not missing:
            return
        ledgers = sorted({lid for log_id in missing for lid in usage[log_id]})
        raise IndexDamagedError(
            self.ledger_dir / "index.db",
            f"index {self.ledger_dir / 'index.db'} places entries of {len(ledgers)} ledgers "
            f"({', '.join(map(str, ledgers[:5]))}{' ...' if len(ledgers) > 5 else ''}) in "
            f"entry logs missing from {self._entry_logger.directory}: "
            f"{', '.join(log_name(i) for i in missing[:5])}{' ...' if len(missing) > 5 else ''}; "
            "the bookie will not start (it would answer as if those entries never existed). "
            f"Way forward: restore the ledger directory {self.ledger_dir} from a backup; or give "
            "up this bookie's copies: wipe both directories and re-register it with "
            "`magnetar bk reregister` so its ledgers are copied back from other bookies (a "
            "standalone has no other copy: `magnetar bk indexrebuild` starts it with what the "
            "remaining entry logs hold)",
        )

    def _replay(self, mark: int) -> int:
        count = 0
        for record in jnl.replay(self._journal.directory, mark):
            count += 1
            if record.kind is jnl.RecordType.MASTER_KEY:
                try:
                    ledger_id, key = jnl.decode_master_key(record.data)
                except ValueError:
                    log.error(
                        "journal file %d: master key record %d is malformed; skipped",
                        record.file_id,
                        count,
                    )
                    continue
                if ledger_id not in self._deleted and ledger_id not in self._master_keys:
                    self._master_keys[ledger_id] = self._keys_unindexed[ledger_id] = key
                continue
            if record.kind is jnl.RecordType.ADD:
                entries = [record.data]
            elif record.kind is jnl.RecordType.ADD_BATCH:
                try:
                    entries = jnl.decode_add_batch(record.data)
                except ValueError as e:
                    log.error(
                        "journal file %d: batch record %d is malformed (%s); skipped",
                        record.file_id,
                        count,
                        e,
                    )
                    continue
            else:
                continue
            for entry in entries:
                try:
                    header = decode_header(entry)
                except EntryFormatError:
                    log.error(
                        "journal file %d: record %d holds a non-entry; skipped",
                        record.file_id,
                        count,
                    )
                    continue
                if header.ledger_id in self._deleted:
                    continue
                self._memtable.put(header.ledger_id, header.entry_id, entry)
                self._last_add[header.ledger_id] = time.monotonic()
                state = self._ledgers.setdefault(header.ledger_id, LedgerState())
                state.last_entry_id = max(state.last_entry_id, header.entry_id)
                state.lac = max(state.lac, header.lac)
        return count

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._flush_task is not None:
            await asyncio.gather(self._flush_task, return_exceptions=True)
        try:
            await self.checkpoint()  # needs the journal (to roll it), so before closing it
        except Exception:
            log.exception("final checkpoint failed; the journal still holds every acknowledged add")
        await self._journal.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._flush_executor, self._entry_logger.close)
        if self._index is not None:
            await loop.run_in_executor(self._flush_executor, self._index.close)
        self._flush_executor.shutdown(wait=True)
        self.release_locks()

    def release_locks(self) -> None:
        for fd in self._locks:
            os.close(fd)
        self._locks.clear()

    # -- state -------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self._read_only_reason is not None

    @property
    def read_only_reason(self) -> str | None:
        return self._read_only_reason

    def set_read_only(self, reason: str | None) -> None:
        if reason != self._read_only_reason:
            if reason:
                log.warning("bookie turns read-only: %s", reason)
            else:
                log.info("bookie is writable again")
        self._read_only_reason = reason
        self.metrics.read_only.set(1 if reason else 0)

    @property
    def memtable_bytes(self) -> int:
        return self._memtable.size + (self._flushing.size if self._flushing else 0)

    def entry_log_bytes(self) -> int:
        return self._entry_logger.total_bytes()

    async def storage_gauges(self) -> StorageGauges:
        """BookKeeper's storage gauges, read now (the counts from the index, in a thread)."""
        index = self._index  # None: a scrape came before start() opened it
        loop = asyncio.get_running_loop()
        entries = await loop.run_in_executor(None, index.entry_count) if index else 0
        current = str(self.ledger_dir / "current")
        return StorageGauges(
            writable=self._read_only_reason is None,
            journal_queue_size=self._journal.queued_records,
            ledgers=len(await self.ledger_ids()) if index else 0,
            entries=entries,
            write_cache_bytes=self.memtable_bytes,
            read_cache_bytes=self._read_cache.size,
            ledger_dir=current,
            index_dir=current,
        )

    def _journal_synced(self, seconds: float, records: int, size: int) -> None:
        self.metrics.journal_fsync.observe(seconds)
        self.metrics.bookkeeper.journal_sync.record_latency(seconds)
        self.metrics.journal_group_entries.inc(records)

    def _journal_failed(self, error: OSError) -> None:
        self.set_read_only(f"journal write failed: {error}")

    async def _ledger_state(self, ledger_id: int, *, create: bool = False) -> LedgerState:
        """The state of a ledger this bookie knows, merged with the index on first use."""
        if ledger_id in self._deleted:
            raise StorageError(pb.NO_SUCH_LEDGER, f"ledger {ledger_id} was deleted")
        state = self._ledgers.get(ledger_id)
        if state is not None and state.loaded:
            return state
        assert self._index is not None
        last = await asyncio.get_running_loop().run_in_executor(
            None, self._index.last_entry_id, ledger_id
        )
        if last < 0 and state is None and not create:
            raise StorageError(
                pb.NO_SUCH_LEDGER, f"ledger {ledger_id} is not stored on this bookie"
            )
        state = self._ledgers.setdefault(ledger_id, LedgerState())
        if not state.loaded:
            state.loaded = True
            if last > state.last_entry_id:
                state.last_entry_id = last
                entry = await self._read_stored(ledger_id, last)
                if entry is not None:
                    state.advance_lac(decode_header(entry).lac)
        return state

    # -- adds --------------------------------------------------------------------------

    async def wait_for_capacity(self) -> None:
        """Back-pressure: hold new adds while the memtable is full and a flush is running.

        A read-only bookie refuses adds anyway, so it does not hold them; after a failed flush
        the next attempt waits a little instead of spinning.
        """
        half = self.config.write_cache_bytes // 2
        while self._memtable.size >= half and not self.read_only:
            if self._flushing is None:
                self._start_flush()
                await asyncio.sleep(0)  # let the checkpoint take the memtable
                if self._flushing is None:
                    await asyncio.sleep(0.05)  # it failed or found nothing to do
                continue
            await self._flush_done.wait()

    def add(
        self, ops: Sequence[AddOpLike], *, check_digests: bool = True
    ) -> Awaitable[list[tuple[int, int, str]]]:
        """Accept a batch of adds. Checks and memtable inserts happen now, in order; the
        awaitable completes once every accepted add is durable and gives the failures as
        (op index, status, message). Every op not listed there succeeded.

        ``check_digests`` False: the entries' digests are not computed again (the in-process
        client's adds, encoded in this process a moment ago and never sent over a wire;
        BookKeeper's bookies never check them on add). Readers always check them. Each op is a
        run of one (``add_runs``)."""
        return self.add_runs(
            # op.entry read once: a protobuf bytes field may be copied on every access
            [
                AddRun(op.ledger_id, op.entry_id, [op.entry], op.master_key, op.recovery)
                for op in ops
            ],
            check_digests=check_digests,
        )

    def add_runs(
        self, runs: Sequence[AddRun], *, check_digests: bool = True
    ) -> Awaitable[list[tuple[int, int, str]]]:
        """``add`` of runs of entries, the ops numbered across the runs in order, with the answers
        they would get one by one: each entry's size and header (and digest) are checked on
        their own, the ledger's state and the writer's key once per run, at its first entry that
        passes (so a key is recorded only with an entry that brings it to the journal); a
        refusal there (read-only, deleted, fenced, another key) is every later entry's of the
        run. The in-process client's adds come as runs of a group's entries."""
        started = time.perf_counter()
        failures: list[tuple[int, int, str]] = []
        accepted: list[tuple[int, LedgerState, int]] = []
        records: list[bytes] = []
        size = 0
        put = self._memtable.put
        new_keys: dict[int, bytes] = {}
        check = self._check_entry
        last_add, now = self._last_add, time.monotonic()
        i = -1
        for run in runs:
            ledger_id = run.ledger_id
            state: LedgerState | None = None
            refusal: StorageError | None = None
            last = -1
            for entry_id, entry in enumerate(run.entries, run.first_entry_id):
                i += 1
                try:
                    _, lac = check(ledger_id, entry_id, entry, check_digests)
                    if state is None:
                        if refusal is not None:
                            raise refusal
                        try:
                            taking = self._ledger_taking_adds(ledger_id, run.recovery)
                            self._check_master_key(ledger_id, run.master_key, new_keys)
                        except StorageError as e:
                            refusal = e
                            raise
                        state, last = taking, taking.last_entry_id
                except StorageError as e:
                    failures.append((i, e.status, e.message))
                    continue
                put(ledger_id, entry_id, entry)
                if entry_id > last:
                    last = entry_id
                records.append(entry)
                accepted.append((i, state, lac))
                size += len(entry)
            if state is not None:
                state.last_entry_id = last
                last_add[ledger_id] = now
        memtable = self._memtable
        if memtable.size >= self.config.write_cache_bytes // 2 and self._flushing is None:
            self._start_flush()
        durable = None
        if records:
            batch = jnl.encode_add_batch(records)
            if new_keys:
                # Durable with the adds that bring them: the same group, the same fsync.
                self._keys_unindexed.update(new_keys)
                batch = b"".join(
                    [*(jnl.encode_master_key(i, key) for i, key in new_keys.items()), batch]
                )
            durable = self._journal.append(batch)
            self._journal_dirty = True
        return self._finish_add(durable, failures, accepted, size, started, new_keys)

    def _check_master_key(self, ledger_id: int, key: bytes, new_keys: dict[int, bytes]) -> None:
        """Refuse an add whose key is not the one the ledger's first add recorded here."""
        known = self._master_keys.get(ledger_id)
        if known is None:
            # The first add here: its key becomes the ledger's (in memory now, so the rest of
            # this batch is checked against it; in the journal with the add itself).
            self._master_keys[ledger_id] = new_keys[ledger_id] = key
        elif known != key:
            raise StorageError(
                pb.UNAUTHORIZED,
                f"ledger {ledger_id} is held here under another master key: this add comes "
                "from a writer that is not the ledger's (or the ledger id was reused after "
                "the metadata store was reset); refused",
            )

    def _check_entry(
        self, op_ledger_id: int, op_entry_id: int, entry: bytes, check_digest: bool
    ) -> tuple[int, int]:
        """(entry id, lac) of an added entry whose size and header (and digest) hold."""
        if len(entry) > self.config.max_entry_size:
            raise StorageError(
                pb.TOO_LARGE,
                f"entry of {len(entry)} bytes exceeds max_entry_size {self.config.max_entry_size}",
            )
        try:
            ledger_id, entry_id, lac = check_entry(entry) if check_digest else entry_ids(entry)
        except EntryFormatError as e:
            raise StorageError(pb.BAD_REQUEST, str(e)) from None
        except DigestMismatchError as e:
            raise StorageError(pb.DIGEST_MISMATCH, f"received entry is corrupt: {e}") from None
        if ledger_id != op_ledger_id or entry_id != op_entry_id:
            raise StorageError(
                pb.BAD_REQUEST,
                f"request names ledger {op_ledger_id} entry {op_entry_id} but the entry header "
                f"says ledger {ledger_id} entry {entry_id}",
            )
        if entry_id < 0:
            raise StorageError(pb.BAD_REQUEST, f"entry id {entry_id} is negative")
        return entry_id, lac

    def _ledger_taking_adds(self, ledger_id: int, recovery: bool) -> LedgerState:
        """The ledger's state, if it may take an add now (a recovery add: even fenced)."""
        if self._read_only_reason is not None:
            raise StorageError(pb.READ_ONLY, f"bookie is read-only: {self._read_only_reason}")
        if ledger_id in self._deleted:
            raise StorageError(pb.NO_SUCH_LEDGER, f"ledger {ledger_id} was deleted")
        state = self._ledgers.get(ledger_id)
        if state is None:
            state = self._ledgers[ledger_id] = LedgerState()
        elif state.fenced and not recovery:
            raise StorageError(pb.FENCED, f"ledger {ledger_id} is fenced")
        return state

    async def _finish_add(
        self,
        durable: asyncio.Future[int] | None,
        failures: list[tuple[int, int, str]],
        accepted: list[tuple[int, LedgerState, int]],
        size: int,
        started: float,
        new_keys: dict[int, bytes] | None = None,
    ) -> list[tuple[int, int, str]]:
        m = self.metrics
        if durable is not None:
            try:
                await durable
            except jnl.JournalError as e:
                # Not durable, so not the ledgers' keys: the next first add brings its own.
                for ledger_id, key in (new_keys or {}).items():
                    if self._master_keys.get(ledger_id) == key:
                        del self._master_keys[ledger_id]
                    if self._keys_unindexed.get(ledger_id) == key:
                        del self._keys_unindexed[ledger_id]
                status = pb.DISK_FULL if e.errno == errno.ENOSPC else pb.INTERNAL
                message = f"journal write failed: {e.strerror or e}"
                failures.extend((i, status, message) for i, _state, _lac in accepted)
                failures.sort()
                accepted = []
            else:
                for _i, state, lac in accepted:
                    if lac > state.lac:
                        state.lac = lac
                        if state.lac_changed is not None:
                            state.wake()
                m.add_bytes.inc(size)
                m.add_latency.observe(time.perf_counter() - started)
        elapsed = time.perf_counter() - started
        if accepted:
            self._adds_ok.inc(len(accepted))
            m.bookkeeper.added(elapsed, len(accepted), size)
        if failures:
            m.bookkeeper.added(elapsed, len(failures), 0, success=False)
        for _i, status, _message in failures:
            m.adds.labels(STATUS_NAMES[status]).inc()
        return failures

    # -- reads -------------------------------------------------------------------------

    async def read(self, ledger_id: int, entry_id: int) -> bytes:
        """The formatted entry, digest checked. ``entry_id`` -1 reads the last stored entry."""
        started = time.perf_counter()
        try:
            try:
                entry = await self._read(ledger_id, entry_id)
            except StorageError as e:
                raise self._absence_after_wipe(ledger_id, e) from None
        except StorageError as e:
            self.metrics.reads.labels(STATUS_NAMES[e.status]).inc()
            self.metrics.bookkeeper.read(time.perf_counter() - started, 0, success=False)
            raise
        self.metrics.reads.labels("OK").inc()
        self.metrics.bookkeeper.read(time.perf_counter() - started, len(entry))
        return entry

    async def read_range(
        self, ledger_id: int, first: int, max_count: int, max_bytes: int
    ) -> list[bytes]:
        """A range read (BookKeeper's batch read): entries ``first``, ``first + 1``, ... of a
        ledger, digests checked, at most ``max_count`` of them and ``max_bytes`` in all (the
        first whatever its size). The first entry is read as :meth:`read` reads it (its
        errors are the range's); the range ends early at the first later entry not stored
        here or not intact, for the reader to ask again from there.

        Entries from the entry logs are read in one thread hop per run and not put in the read
        cache: a range read is a scan of history, which would only evict what tailing readers
        need."""
        if first < 0 or max_count < 1:
            raise StorageError(
                pb.BAD_REQUEST, f"range read from entry {first} of {max_count} entries"
            )
        entries = [await self.read(ledger_id, first)]
        size = len(entries[0])
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        entry_id = first + 1
        while len(entries) < max_count and size < max_bytes and ledger_id not in self._deleted:
            entry = self._memtable.get(ledger_id, entry_id)
            if entry is None and self._flushing is not None:
                entry = self._flushing.get(ledger_id, entry_id)
            if entry is None:
                entry = self._read_cache.get((ledger_id, entry_id))
            if entry is not None:
                if size + len(entry) > max_bytes:
                    break
                entries.append(entry)
                size += len(entry)
                entry_id += 1
                continue
            try:
                run = await loop.run_in_executor(
                    None,
                    self._read_run_from_log,
                    ledger_id,
                    entry_id,
                    max_count - len(entries),
                    max_bytes - size,
                )
            except OSError as e:
                log.warning("ledger %d: range read stopped at entry %d: %s", ledger_id, entry_id, e)
                break
            if not run:
                break
            entries.extend(run)
            size += sum(map(len, run))
            entry_id += len(run)
        if len(entries) > 1:
            self.metrics.reads.labels("OK").inc(len(entries) - 1)
            self.metrics.bookkeeper.read(time.perf_counter() - started, size - len(entries[0]))
        return entries

    def _read_run_from_log(
        self, ledger_id: int, first: int, count: int, max_bytes: int
    ) -> list[bytes]:
        """Consecutive entries from ``first`` out of the entry logs, digests checked, up to
        the first one absent, moved by compaction meanwhile, or corrupt (a corrupt copy is
        reported by the single read that asks for it next)."""
        assert self._index is not None
        run: list[bytes] = []
        size = 0
        for entry_id, log_id, offset, length in self._index.lookup_range(ledger_id, first, count):
            if entry_id != first + len(run) or size + length > max_bytes:
                break
            try:
                entry = self._entry_logger.read(log_id, offset, length)
                got_ledger, got_entry, _lac = check_entry(entry)
            except (EntryLogMissingError, EOFError, DigestMismatchError, EntryFormatError):
                break
            if got_ledger != ledger_id or got_entry != entry_id:
                break
            run.append(entry)
            size += length
        return run

    def _absence_after_wipe(self, ledger_id: int, error: StorageError) -> StorageError:
        """A "no such ledger/entry" answer from a bookie re-registered empty after the ledger
        was created proves nothing (the entry may have been on the lost disks): say WIPED."""
        if (
            error.status in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER)
            and ledger_id < self.wiped_below
            and ledger_id not in self._deleted
        ):
            return StorageError(
                pb.WIPED,
                f"ledger {ledger_id} was created before this bookie lost its disks and was "
                f"re-registered empty (ledgers below {self.wiped_below}): it cannot say whether "
                f"it held this entry ({error.message})",
            )
        return error

    async def _read(self, ledger_id: int, entry_id: int) -> bytes:
        if ledger_id in self._deleted:
            raise StorageError(pb.NO_SUCH_LEDGER, f"ledger {ledger_id} was deleted")
        if entry_id == -1:
            state = await self._ledger_state(ledger_id)
            entry_id = state.last_entry_id
            if entry_id < 0:
                raise StorageError(pb.NO_SUCH_ENTRY, f"ledger {ledger_id} has no entries here")
        elif entry_id < -1:
            raise StorageError(pb.BAD_REQUEST, f"entry id {entry_id} is not valid")
        entry = self._memtable.get(ledger_id, entry_id)
        if entry is None and self._flushing is not None:
            entry = self._flushing.get(ledger_id, entry_id)
        if entry is not None:
            return entry
        entry = await self._read_stored(ledger_id, entry_id)
        if entry is not None:
            return entry
        state = self._ledgers.get(ledger_id)
        if state is None or (state.last_entry_id < 0 and not state.fenced):
            await self._ledger_state(ledger_id)  # raises NO_SUCH_LEDGER for an unknown ledger
            state = self._ledgers.get(ledger_id)
            if state is not None and state.last_entry_id < 0 and not state.fenced:
                raise StorageError(
                    pb.NO_SUCH_LEDGER, f"ledger {ledger_id} is not stored on this bookie"
                )
        raise StorageError(pb.NO_SUCH_ENTRY, f"ledger {ledger_id} has no entry {entry_id} here")

    async def _read_stored(self, ledger_id: int, entry_id: int) -> bytes | None:
        """Read through the read cache and the entry logs (never the journal)."""
        key = (ledger_id, entry_id)
        entry = self._read_cache.get(key)
        if entry is not None:
            return entry
        loop = asyncio.get_running_loop()
        try:
            entry = await loop.run_in_executor(None, self._read_from_log, ledger_id, entry_id)
        except DigestMismatchError as e:
            self.metrics.digest_errors.inc()
            log.error("ledger %d entry %d: stored copy is corrupt: %s", ledger_id, entry_id, e)
            raise StorageError(pb.DIGEST_MISMATCH, f"stored entry is corrupt: {e}") from None
        except OSError as e:
            log.error("ledger %d entry %d: cannot read the entry log: %s", ledger_id, entry_id, e)
            raise StorageError(pb.INTERNAL, f"cannot read entry log: {e}") from None
        if entry is not None:
            self._read_cache.put(key, entry)
        return entry

    def _read_from_log(self, ledger_id: int, entry_id: int) -> bytes | None:
        assert self._index is not None
        for _attempt in range(2):
            location = self._index.lookup(ledger_id, entry_id)
            if location is None:
                return None
            log_id, offset, length = location
            try:
                entry = self._entry_logger.read(log_id, offset, length)
            except EntryLogMissingError:
                continue  # compaction moved it between lookup and read; look again
            header = verify_entry(entry)
            if header.ledger_id != ledger_id or header.entry_id != entry_id:
                raise DigestMismatchError(
                    f"index points at ledger {header.ledger_id} entry {header.entry_id} instead"
                )
            return entry
        return None

    async def read_lac(
        self, ledger_id: int, previous: int = -1, wait_s: float = 0.0
    ) -> LedgerState:
        """The ledger's state; with ``wait_s`` > 0, first wait (at most that long) until its LAC
        passes ``previous``."""
        waiting = wait_s > 0 and previous >= -1
        try:
            state = await self._ledger_state(ledger_id, create=waiting)
        except StorageError as e:
            raise self._absence_after_wipe(ledger_id, e) from None
        if waiting and state.lac <= previous:
            deadline = time.monotonic() + wait_s
            while state.lac <= previous:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break  # the caller sees lac <= previous: a timed-out poll
                await wait_set(state.lac_change(), remaining)
                if ledger_id in self._deleted:
                    raise StorageError(pb.NO_SUCH_LEDGER, f"ledger {ledger_id} was deleted")
        return state

    # -- fencing and deletion ----------------------------------------------------------

    async def fence(self, ledger_id: int) -> LedgerState:
        """Refuse further non-recovery adds to the ledger, durably, and report what is here.

        The flag is set in memory before anything is awaited, so no add accepted after this call
        starts can slip in; it is committed to the index before the call returns, so it survives
        a restart.
        """
        if ledger_id in self._deleted:
            raise StorageError(pb.NO_SUCH_LEDGER, f"ledger {ledger_id} was deleted")
        state = self._ledgers.setdefault(ledger_id, LedgerState())
        already = state.fenced
        state.fenced = True
        if not already:
            assert self._index is not None
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, self._index.set_fenced, ledger_id
                )
            except Exception as e:
                state.fenced = False
                raise StorageError(pb.INTERNAL, f"cannot persist the fence: {e}") from None
            log.info("ledger %d fenced", ledger_id)
        return await self._ledger_state(ledger_id, create=True)

    async def delete_ledger(self, ledger_id: int) -> None:
        if ledger_id in self._deleted:
            return
        assert self._index is not None
        # Deleted in memory before anything is awaited: no add is accepted once this starts.
        self._deleted.add(ledger_id)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self._index.set_deleted, ledger_id
            )
        except Exception as e:
            self._deleted.discard(ledger_id)
            raise StorageError(pb.INTERNAL, f"cannot persist the deletion: {e}") from None
        self._deleted_pending_gc.add(ledger_id)
        self._last_add.pop(ledger_id, None)
        self._master_keys.pop(ledger_id, None)
        self._keys_unindexed.pop(ledger_id, None)
        state = self._ledgers.pop(ledger_id, None)
        if state is not None:
            state.wake()
        self._memtable.drop_ledger(ledger_id)
        self._read_cache.drop_ledger(ledger_id)
        log.info("ledger %d deleted; its space is reclaimed by the next GC", ledger_id)

    async def ledger_ids(self) -> set[int]:
        """Every ledger this bookie holds anything of (entries, a fence, a master key), deleted
        ones excluded."""
        assert self._index is not None
        stored = await asyncio.get_running_loop().run_in_executor(None, self._index.ledger_ids)
        held = stored | self._ledgers.keys() | self._master_keys.keys()
        return held - self._deleted

    def idle_seconds(self, ledger_id: int) -> float:
        """Seconds since the last add to the ledger here (infinite if none since start; a
        ledger found in the journal at start counts as added to at start)."""
        last = self._last_add.get(ledger_id)
        return float("inf") if last is None else time.monotonic() - last

    async def delete_if_idle(self, ledger_id: int, min_idle_s: float) -> bool:
        """Delete the ledger unless it got an add in the last ``min_idle_s`` seconds. The
        check and the in-memory deletion happen without an await between them, so no add can
        land in between."""
        if ledger_id in self._deleted or self.idle_seconds(ledger_id) < min_idle_s:
            return False
        await self.delete_ledger(ledger_id)
        return True

    # -- checkpoint --------------------------------------------------------------------

    def _start_flush(self) -> None:
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(self.checkpoint(), name="bookie-checkpoint")

    async def checkpoint(self) -> None:
        """Flush the memtable to the entry log and index, then let old journal files go."""
        async with self._flush_lock:
            await self._checkpoint_locked()

    async def _checkpoint_locked(self) -> None:
        if self._memtable.size == 0 and not self._journal_dirty:
            return
        assert self._index is not None
        loop = asyncio.get_running_loop()
        snapshot, self._memtable = self._memtable, Memtable()
        self._flushing = snapshot
        self._flush_done.clear()
        self._journal_dirty = False
        try:
            mark = await self._journal.roll()
            deleted = frozenset(self._deleted)
            # Every key journaled before the roll: the files that hold them go after this.
            keys = {i: k for i, k in self._keys_unindexed.items() if i not in deleted}

            def flush() -> int:
                placed = self._entry_logger.append(snapshot.runs(skip=deleted))
                if keys:
                    self._index.set_master_keys(keys)
                self._index.commit_flush(placed, mark)
                return sum(len(run[4]) for run in placed)

            flushed = await loop.run_in_executor(self._flush_executor, flush)
            for ledger_id, key in keys.items():
                if self._keys_unindexed.get(ledger_id) == key:
                    del self._keys_unindexed[ledger_id]
        except Exception as e:
            # Nothing is lost: the journal still holds these entries (its mark did not move).
            log.error("checkpoint failed, keeping the memtable and the journal: %s", e)
            for ledger_id, entry_id, entry in snapshot.sorted_entries():
                if (
                    self._memtable.get(ledger_id, entry_id) is None
                    and ledger_id not in self._deleted
                ):
                    self._memtable.put(ledger_id, entry_id, entry)
            self._journal_dirty = True
            if isinstance(e, OSError) and e.errno == 28:
                self.set_read_only(f"ledger disk full: {e}")
            raise
        finally:
            self._flushing = None
            self._flush_done.set()
            self.metrics.memtable_bytes.set(self._memtable.size)
        removed = await loop.run_in_executor(
            self._flush_executor, self._journal.remove_files_before, mark
        )
        self.metrics.checkpoints.inc()
        self.metrics.entry_log_bytes.set(self._entry_logger.total_bytes())
        log.debug(
            "checkpoint: %d entries flushed, journal mark %d, %d journal files removed",
            flushed,
            mark,
            removed,
        )

    # -- garbage collection --------------------------------------------------------------

    async def gc(self) -> GcResult:
        """Reclaim entry-log space of deleted ledgers: remove logs with no live data, compact
        logs whose live fraction is under ``compaction_threshold``."""
        async with self._flush_lock:
            # Flushing first puts everything in entry logs, and rolling lets the current log's
            # garbage be collected too.
            await self._checkpoint_locked()
            loop = asyncio.get_running_loop()
            deleted = set(self._deleted_pending_gc)
            result = await loop.run_in_executor(self._flush_executor, self._gc_sync, deleted)
            self._deleted_pending_gc -= deleted
        self.metrics.gc_freed_bytes.inc(result.freed_bytes)
        self.metrics.entry_log_bytes.set(self._entry_logger.total_bytes())
        if result.removed_logs or result.compacted_logs:
            log.info(
                "gc: removed %d entry logs, compacted %d, freed %d bytes",
                result.removed_logs,
                result.compacted_logs,
                result.freed_bytes,
            )
        return result

    def _gc_sync(self, deleted: set[int]) -> GcResult:
        assert self._index is not None
        index, logger = self._index, self._entry_logger
        result = GcResult()
        if deleted:
            index.drop_deleted_entries(deleted)
        usage = index.log_usage()
        if any(ledger_id in deleted for ledger_id in usage.get(logger.current_log_id, {})) or (
            logger.current_log_id not in usage
        ):
            logger.roll()
        # Only logs older than the current one are candidates: compaction appends to the current
        # log and may roll it, and a log filled during this run is not in the usage snapshot.
        first_new = logger.current_log_id
        for log_id in [i for i in logger.log_ids() if i < first_new]:
            live = sum(usage.get(log_id, {}).values())
            try:
                total = (logger.directory / f"{log_id:08x}.log").stat().st_size
            except FileNotFoundError:
                continue
            if live == 0:
                # Forgotten first: a crash in between leaves an unlisted file (removed next
                # time), never a listed log that is gone (which refuses the start).
                index.forget_log(log_id)
                result.freed_bytes += logger.remove(log_id)
                result.removed_logs += 1
            elif live / max(total, 1) < self.config.compaction_threshold:
                freed = self._compact(log_id, total, usage[log_id].keys())
                if freed:
                    result.freed_bytes += freed
                    result.compacted_logs += 1
        return result

    def _compact(self, log_id: int, total: int, ledgers: Iterable[int]) -> int:
        """Copy the live entries of a log into the current one, repoint the index, remove it.

        Live entries come from the index, and each is verified before it moves. If any cannot be
        read intact the log stays (its good entries are still readable where they are, and the
        bad one keeps answering DIGEST_MISMATCH instead of vanishing).
        """
        assert self._index is not None
        index, logger = self._index, self._entry_logger
        live: list[tuple[int, list[int], list[bytes]]] = []
        for ledger_id, entry_id, offset, length in index.live_entries_in_log(log_id, ledgers):
            try:
                entry = logger.read(log_id, offset, length)
                verify_entry(entry)
            except (OSError, EOFError, EntryFormatError, DigestMismatchError) as e:
                log.error(
                    "gc: entry log %d not compacted: ledger %d entry %d cannot be read intact (%s)",
                    log_id,
                    ledger_id,
                    entry_id,
                    e,
                )
                return 0
            if live and live[-1][0] == ledger_id:
                live[-1][1].append(entry_id)
                live[-1][2].append(entry)
            else:
                live.append((ledger_id, [entry_id], [entry]))
        moved = logger.append(live)
        index.commit_flush(moved, None)
        index.forget_log(log_id)
        freed = logger.remove(log_id)
        return freed - sum(map(run_bytes, moved))
