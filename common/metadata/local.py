"""``local://`` metadata store: one SQLite file owned by one process (standalone mode).

- Durability: WAL with ``synchronous=FULL``, so a write that returned survives a crash.
- Versions: a store-wide revision counter bumped by every write (like etcd's revision), kept
  in the file so it never goes backwards across restarts.
- Ownership: an exclusive ``flock`` on ``<path>.lock``; a second process (or a second open in
  this one) is refused (:class:`MetadataStoreInUseError`) instead of silently sharing a file
  whose watches are in-process only. ``open(path, read_only=True)`` takes no lock: it reads the
  file as its owner writes it (SQLite readers beside a WAL writer), for inspection tools
  (``magnetar bk`` on a running standalone); its writes raise :class:`ReadOnlyStoreError`, its
  watches see nothing, and it leaves the owner's ephemeral keys alone.
- Session: the process itself. Ephemeral keys are deleted at ``close()`` and, for a process
  that crashed before closing, when the next owner opens the file.
- Threads: every SQLite call runs on one worker thread, never on the event loop; watchers are
  notified from that thread in commit order via ``call_soon_threadsafe``.
- Group commit: writes that arrive while the worker is busy wait in a queue and then go to
  SQLite together, in one transaction (each in its own savepoint, so a failed compare-and-set
  fails only itself) and one fsync. Each write still returns only after that commit.
- Multi-key transactions are one savepoint like any other write: every condition is checked
  and every operation applied inside it, all at one revision (as etcd does), or none.
- Damage: a file SQLite cannot read (not a database, malformed pages found by ``quick_check``
  at open or by any later statement) raises MetadataDamagedError naming the file, never a bare
  ``sqlite3.DatabaseError``. The file is left as it was, for the operator to restore.
- A damaged write-ahead log is damage too, though SQLite does not see it: its recovery replays
  the log up to the first bad frame and drops the rest in silence, committed transactions
  included. Before SQLite opens the file, ``<path>-wal`` is read (``sqlite_wal.scan_wal``): a
  valid commit frame after a bad one refuses the open with MetadataDamagedError naming the log,
  where it is damaged, what would be lost and the way forward (restore, or cut the log at the
  damage to accept the loss). A torn tail (bad or partial frames at the end, no valid commit
  after them: a crash in the middle of a write) is accepted with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from magnetar.common.filelock import LockedError, acquire_lock
from magnetar.common.metadata.election import StoreLeaderElection
from magnetar.common.metadata.sqlite_wal import WalScan, WalState, scan_wal
from magnetar.common.metadata.store import (
    NOT_EXISTS,
    BadVersionError,
    Delete,
    EventType,
    Expect,
    LeaderElection,
    MetadataDamagedError,
    MetadataError,
    MetadataStore,
    NoSuchKeyError,
    Operation,
    Put,
    StoreClosedError,
    Versioned,
    WatchEvent,
    check_transaction,
    condition_failure,
)
from magnetar.common.metadata.watch import WatchStream

log = logging.getLogger(__name__)

T = TypeVar("T")


class MetadataStoreInUseError(MetadataError):
    """Another process (or another open here) owns the file."""


class ReadOnlyStoreError(MetadataError):
    """A write to a store opened read-only."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY,
    value BLOB NOT NULL,
    version INTEGER NOT NULL,
    ephemeral INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS revision (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO revision (id, value) VALUES (0, 0);
"""


class LocalMetadataStore(MetadataStore):
    """Metadata store in a local SQLite file; open it with :meth:`open`."""

    def __init__(
        self,
        path: Path,
        executor: ThreadPoolExecutor,
        db: _Database,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.path = path
        self._executor = executor
        self._db = db
        self._loop = loop
        self._closed = False
        #: Writes waiting for the next group commit: (method, args, future); under the lock.
        self._writes: list[tuple[Callable[..., object], tuple[object, ...], asyncio.Future]] = []
        self._writes_lock = threading.Lock()
        self._group_queued = False
        # Weak: a watch dropped without aclose() must not keep receiving events forever.
        self._watches: weakref.WeakSet[_LocalWatch] = weakref.WeakSet()

    @classmethod
    async def open(cls, path: str | Path, *, read_only: bool = False) -> LocalMetadataStore:
        path = Path(path)
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-metadata")
        opener = _Database.open_read_only if read_only else _Database.open
        try:
            db = await loop.run_in_executor(executor, opener, path)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        store = cls(path, executor, db, loop)
        db.on_commit = store._publish
        log.info("local metadata store %s opened%s", path, " read-only" if read_only else "")
        return store

    @property
    def read_only(self) -> bool:
        return self._db.read_only

    # -- reads ---------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned | None:
        return await self._run(self._db.get, _bytes(key))

    async def scan(self, prefix: str) -> dict[str, Versioned]:
        rows = await self._run(self._db.scan, prefix.encode(), False)
        return {key: versioned for key, versioned in rows}

    async def children(self, path: str) -> list[str]:
        parent = path.rstrip("/") + "/"
        rows = await self._run(self._db.scan, parent.encode(), True)
        names = {key[len(parent) :].split("/", 1)[0] for key, _ in rows}
        names.discard("")
        return sorted(names)

    # -- writes --------------------------------------------------------------------------

    async def put(
        self,
        key: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
    ) -> int:
        _check_expected_version(expected_version, allow_not_exists=True)
        return await self._write(self._db.put, key, bytes(value), expected_version, ephemeral)  # type: ignore[return-value]

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        _check_expected_version(expected_version, allow_not_exists=False)
        await self._write(self._db.delete, key, expected_version)

    async def transaction(
        self, conditions: Sequence[Expect], operations: Sequence[Operation]
    ) -> int:
        check_transaction(conditions, operations)
        return await self._write(self._db.transaction, list(conditions), list(operations))  # type: ignore[return-value]

    # -- watches, sessions, elections ----------------------------------------------------

    def watch(self, key: str, *, prefix: bool = False) -> WatchStream:
        self._check_open()
        return _LocalWatch(self, key, prefix)

    def add_session_listener(self, callback: Callable[[], None]) -> None:
        # The session is this process: it cannot be lost while the process lives, so the
        # listener is never called.
        del callback

    @property
    def session_lost(self) -> bool:
        return self._closed

    def election(self, name: str) -> LeaderElection:
        return StoreLeaderElection(self, name)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._loop.run_in_executor(self._executor, self._db.close)
        finally:
            self._executor.shutdown(wait=False)
            for watch in list(self._watches):
                watch.end()
        log.info("local metadata store %s closed", self.path)

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the local metadata store {self.path} is closed")

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        self._check_open()
        try:
            return await self._loop.run_in_executor(self._executor, functools.partial(fn, *args))
        except sqlite3.DatabaseError as e:
            raise _damage_error(self.path, e) from e

    async def _write(self, fn: Callable[..., object], *args: object) -> object:
        self._check_open()
        if self._db.read_only:
            raise ReadOnlyStoreError(
                f"the local metadata store {self.path} is open read-only (its owner is running): "
                "nothing can be changed through this open"
            )
        future: asyncio.Future[object] = self._loop.create_future()
        with self._writes_lock:
            self._writes.append((fn, args, future))
            queue_group = not self._group_queued
            self._group_queued = True
        if queue_group:
            self._executor.submit(self._commit_group)
        return await future

    def _commit_group(self) -> None:
        """On the SQLite thread: every write queued so far, in one transaction."""
        with self._writes_lock:
            writes, self._writes = self._writes, []
            self._group_queued = False
        results = [
            (value, _damage_error(self.path, error) if _is_damage(error) else error)
            for value, error in self._db.run_group([(fn, args) for fn, args, _ in writes])
        ]
        self._loop.call_soon_threadsafe(self._settle, [f for _, _, f in writes], results)

    @staticmethod
    def _settle(
        futures: list[asyncio.Future[object]], results: list[tuple[object, BaseException | None]]
    ) -> None:
        for future, (value, error) in zip(futures, results, strict=True):
            if future.done():
                continue
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    def _publish(self, events: list[WatchEvent]) -> None:
        """Called on the SQLite thread after a commit; hands the events to the loop in order."""
        self._loop.call_soon_threadsafe(self._dispatch, events)

    def _dispatch(self, events: list[WatchEvent]) -> None:
        for event in events:
            for watch in list(self._watches):
                if watch.matches(event.key):
                    watch.deliver(event)


class _LocalWatch(WatchStream):
    def __init__(self, store: LocalMetadataStore, key: str, prefix: bool) -> None:
        super().__init__(key, prefix)
        self._store = store
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

    async def _register(self) -> None:
        self._store._check_open()
        self._store._watches.add(self)

    async def _receive(self) -> WatchEvent | None:
        return await self._queue.get()

    async def _unregister(self) -> None:
        self._store._watches.discard(self)

    def deliver(self, event: WatchEvent) -> None:
        self._queue.put_nowait(event)

    def end(self) -> None:
        self._queue.put_nowait(None)


class _Database:
    """The SQLite side; every method runs on the store's single worker thread."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock_fd: int | None) -> None:
        self.path = path
        self._conn = conn
        self._lock_fd = lock_fd  # None: opened read-only, no lock held
        self.on_commit: Callable[[list[WatchEvent]], None] = lambda events: None
        #: Events of the group being committed (``run_group``), None outside one.
        self._group_events: list[WatchEvent] | None = None

    @classmethod
    def open(cls, path: Path) -> _Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock(path)
        conn: sqlite3.Connection | None = None
        try:
            # Before SQLite's recovery reads (and then rewrites) the log.
            _check_wal(path)
            # isolation_level=None: we issue BEGIN IMMEDIATE/COMMIT ourselves.
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            _check_integrity(path, conn)
            conn.executescript(_SCHEMA)
            db = cls(path, conn, lock_fd)
            stale = db._delete_ephemeral()
        except sqlite3.DatabaseError as e:
            if conn is not None:
                conn.close()
            os.close(lock_fd)
            raise _damage_error(path, e) from e
        except BaseException:
            if conn is not None:
                conn.close()
            os.close(lock_fd)
            raise
        if stale:
            log.info(
                "deleted %d ephemeral key(s) left in %s by a process that did not close it",
                stale,
                path,
            )
        return db

    @classmethod
    def open_read_only(cls, path: Path) -> _Database:
        """Read a file another process owns: no lock, no schema, no clean-up, no writes."""
        if not path.exists():
            raise MetadataError(f"metadata store {path} does not exist")
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
            conn.execute("SELECT 1 FROM kv LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            raise _damage_error(path, e) from e
        return cls(path, conn, None)

    @property
    def read_only(self) -> bool:
        return self._lock_fd is None

    @property
    def revision(self) -> int:
        return self._conn.execute("SELECT value FROM revision WHERE id = 0").fetchone()[0]

    def get(self, key: bytes) -> Versioned | None:
        row = self._conn.execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
        return Versioned(row[0], row[1]) if row is not None else None

    def scan(self, prefix: bytes, keys_only: bool) -> list[tuple[str, Versioned]]:
        columns = "key, x'', version" if keys_only else "key, value, version"
        end = _prefix_end(prefix)
        if end is None:
            sql, args = f"SELECT {columns} FROM kv WHERE key >= ?", (prefix,)
        else:
            sql, args = f"SELECT {columns} FROM kv WHERE key >= ? AND key < ?", (prefix, end)
        return [(k.decode(), Versioned(v, ver)) for k, v, ver in self._conn.execute(sql, args)]

    def put(self, key: str, value: bytes, expected: int | None, ephemeral: bool) -> int:
        k = _bytes(key)
        with self._transaction() as events:
            _check_current(key, expected, self.get(k))
            revision = self._next_revision()
            self._conn.execute(
                "INSERT INTO kv (key, value, version, ephemeral) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "version = excluded.version, ephemeral = excluded.ephemeral",
                (k, value, revision, int(ephemeral)),
            )
            events.append(WatchEvent(EventType.PUT, key, value, revision))
        return revision

    def delete(self, key: str, expected: int | None) -> None:
        k = _bytes(key)
        with self._transaction() as events:
            current = self.get(k)
            if expected is not None:
                if current is None:
                    raise NoSuchKeyError(f"cannot delete {key} at version {expected}: no such key")
                _check_current(key, expected, current)
            if current is None:
                return
            revision = self._next_revision()
            self._conn.execute("DELETE FROM kv WHERE key = ?", (k,))
            events.append(WatchEvent(EventType.DELETE, key, None, revision))

    def transaction(self, conditions: list[Expect], operations: list[Operation]) -> int:
        with self._transaction() as events:
            for condition in conditions:
                failure = condition_failure(condition, self.get(_bytes(condition.key)))
                if failure is not None:
                    raise failure
            # One revision for the whole transaction, as etcd gives one to each of its txns.
            revision: int | None = None
            for operation in operations:
                k = _bytes(operation.key)
                if isinstance(operation, Put):
                    revision = revision or self._next_revision()
                    self._conn.execute(
                        "INSERT INTO kv (key, value, version, ephemeral) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                        "version = excluded.version, ephemeral = excluded.ephemeral",
                        (k, bytes(operation.value), revision, int(operation.ephemeral)),
                    )
                    events.append(
                        WatchEvent(EventType.PUT, operation.key, bytes(operation.value), revision)
                    )
                elif isinstance(operation, Delete):
                    if self._conn.execute("DELETE FROM kv WHERE key = ?", (k,)).rowcount == 0:
                        continue  # deleting a missing key changes nothing (etcd: no event)
                    revision = revision or self._next_revision()
                    events.append(WatchEvent(EventType.DELETE, operation.key, None, revision))
        return revision if revision is not None else self.revision

    def close(self) -> None:
        if self._lock_fd is None:  # read-only: the owner's ephemeral keys are not ours
            self._conn.close()
            return
        try:
            self._delete_ephemeral()
            self._conn.close()
        finally:
            # Closing the descriptor releases the flock.
            os.close(self._lock_fd)

    def _delete_ephemeral(self) -> int:
        with self._transaction() as events:
            keys = [row[0] for row in self._conn.execute("SELECT key FROM kv WHERE ephemeral = 1")]
            for k in keys:
                revision = self._next_revision()
                self._conn.execute("DELETE FROM kv WHERE key = ?", (k,))
                events.append(WatchEvent(EventType.DELETE, k.decode(), None, revision))
        return len(keys)

    def _next_revision(self) -> int:
        self._conn.execute("UPDATE revision SET value = value + 1 WHERE id = 0")
        return self.revision

    def run_group(
        self, calls: list[tuple[Callable[..., object], tuple[object, ...]]]
    ) -> list[tuple[object, BaseException | None]]:
        """Run write ``calls`` in one transaction, each in a savepoint: (result, error) each.
        If the commit itself fails, every call fails with that error."""
        results: list[tuple[object, BaseException | None]] = []
        self._group_events = []
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            for fn, args in calls:
                try:
                    results.append((fn(*args), None))
                except Exception as e:
                    results.append((None, e))
            self._conn.execute("COMMIT")
        except Exception as e:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._group_events = None
            return [(None, e)] * len(calls)
        events, self._group_events = self._group_events, None
        if events:
            self.on_commit(events)
        return results

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[list[WatchEvent]]:
        """One write transaction; its events are published only if it commits. Inside a
        group (``run_group``) it is a savepoint of the group's transaction."""
        events: list[WatchEvent] = []
        if self._group_events is not None:
            self._conn.execute("SAVEPOINT write")
            try:
                yield events
            except BaseException:
                self._conn.execute("ROLLBACK TO write")
                self._conn.execute("RELEASE write")
                raise
            self._conn.execute("RELEASE write")
            self._group_events.extend(events)
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield events
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        if events:
            self.on_commit(events)


def _check_integrity(path: Path, conn: sqlite3.Connection) -> None:
    """Refuse a file whose pages SQLite finds malformed (cheap: the metadata file is small)."""
    problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        raise MetadataDamagedError(_damage_message(path, "; ".join(problems)))


def _check_wal(path: Path) -> None:
    """Refuse a write-ahead log whose damage SQLite would silently cut committed transactions
    from; warn about a torn tail, which it cuts as designed (see the module docstring)."""
    wal = path.with_name(path.name + "-wal")
    try:
        data = wal.read_bytes()
    except FileNotFoundError:
        return
    if not data:
        return
    scan = scan_wal(data, _page_size_of(path))
    if scan.state is WalState.DAMAGED:
        raise MetadataDamagedError(_wal_damage_message(path, wal, scan))
    if scan.state is WalState.TORN_TAIL or (scan.state is WalState.EMPTY and scan.size):
        where = (
            scan.damage_offset if scan.damage_offset is not None else scan.size - scan.partial_tail
        )
        log.warning(
            "local metadata store %s: the write-ahead log %s ends in a torn write at offset %d "
            "(%s; %d bytes, no valid commit after it): SQLite replays the %d transactions "
            "before it and drops the rest, the transaction being written when the process "
            "stopped (had it not crashed, the bytes were damaged and that last transaction "
            "was lost)",
            path,
            wal,
            where,
            scan.damage_reason or "an incomplete frame",
            scan.size - where,
            scan.replayed_commits,
        )


def _page_size_of(path: Path) -> int | None:
    """The database file's page size (header bytes 16-17; 1 means 65536), if readable."""
    try:
        with open(path, "rb") as f:
            header = f.read(18)
    except OSError:
        return None
    if len(header) < 18:
        return None
    size = int.from_bytes(header[16:18], "big")
    return 65536 if size == 1 else size


def _wal_damage_message(path: Path, wal: Path, scan: WalScan) -> str:
    offset = scan.damage_offset or 0
    if scan.header_valid:
        what = f"{scan.damage_reason} at offset {offset}"
        kept = f"as it was after the {scan.replayed_commits} logged transactions before the damage"
    else:
        what = f"its {scan.damage_reason}"
        kept = f"as {path.name} alone holds it (its last checkpoint)"
    lost = max(scan.commits_after_damage, len(scan.later_commits))
    return (
        f"the local metadata store {path} has a damaged write-ahead log {wal}: {what}, and "
        f"valid commit records of {len(scan.later_commits)} transactions follow it (the "
        f"first at offset {scan.later_commits[0]}). SQLite would replay the log only up to the "
        f"damage and silently drop at least {lost} committed transactions (ledgers created, "
        "topics' ledger lists, cursor positions), so the store will not start; its files were "
        f"left as they were. Way forward: stop this node and restore {path.name} together with "
        f"{wal.name} from a backup (delete a stale {path.name}-shm next to them); or accept "
        f"the loss: keep a copy and cut the log at the damage, `cp {wal} {wal}.damaged && "
        f"truncate -s {offset} {wal}`, and start again: the store opens {kept}, and at least "
        f"{lost} committed transactions are lost for good. Ledgers they created keep their "
        "entries on the bookies: the bookies' garbage collectors report them instead of "
        "deleting them, and `magnetar bk listunreferenced` lists those whose metadata survived"
    )


def _is_damage(error: BaseException | None) -> bool:
    return isinstance(error, sqlite3.DatabaseError) and getattr(
        error, "sqlite_errorname", ""
    ).startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def _damage_error(path: Path, error: sqlite3.DatabaseError) -> MetadataError:
    if not _is_damage(error):
        return MetadataError(f"local metadata store {path}: SQLite failed: {error}")
    return MetadataDamagedError(_damage_message(path, str(error)))


def _damage_message(path: Path, detail: str) -> str:
    return (
        f"the local metadata store {path} is damaged ({detail}); it was left untouched. "
        f"Stop this node and restore {path.name} from a backup (delete any stale "
        f"{path.name}-wal and {path.name}-shm next to it first); starting on an empty file "
        "instead would lose every topic, ledger and cursor it recorded"
    )


def _lock(path: Path) -> int:
    """Take the exclusive ownership lock of ``path`` or explain who holds it."""
    try:
        return acquire_lock(path.with_name(path.name + ".lock"), f"metadata store {path}")
    except LockedError as e:
        raise MetadataStoreInUseError(e.strerror) from None


def _check_expected_version(expected: int | None, *, allow_not_exists: bool) -> None:
    if expected is None or expected > 0 or (allow_not_exists and expected == NOT_EXISTS):
        return
    allowed = "positive, NOT_EXISTS or None" if allow_not_exists else "positive or None"
    raise ValueError(f"expected_version must be {allowed}, not {expected}")


def _check_current(key: str, expected: int | None, current: Versioned | None) -> None:
    if expected is None:
        return
    if expected == NOT_EXISTS:
        if current is not None:
            raise BadVersionError(
                f"{key}: expected to not exist but it is at version {current.version}"
            )
        return
    if current is None:
        raise BadVersionError(f"{key}: expected at version {expected} but it does not exist")
    if current.version != expected:
        raise BadVersionError(
            f"{key}: expected at version {expected} but it is at version {current.version}"
        )


def _bytes(key: str) -> bytes:
    if not key:
        raise ValueError("metadata keys must be non-empty")
    return key.encode()


def _prefix_end(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``prefix`` (None: none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
