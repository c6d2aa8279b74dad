"""The persistent index and ledger table of a bookie, in one SQLite file in the ledger dir.

- ``entries``: (ledger id, entry id) -> (entry log id, offset, length).
- ``ledgers``: fenced / deleted flags and the master key. Fencing is written here before the
  fence is answered, so a fenced ledger stays fenced across restarts; the master key of a
  ledger's first add is written here before that add is answered.
- ``log_usage``: bytes each ledger holds in each entry log, which GC uses to find logs that
  hold only deleted data (remove) or little live data (compact).
- ``meta``: the checkpoint mark (first journal file that replay must read).

Writes happen on one thread (the storage's flush thread); readers use their own connections.

A damaged file (not a database, or failing SQLite's ``quick_check`` when opened) raises
IndexDamagedError; :func:`rebuild_index` makes a new index from the entry logs, which hold each
entry's ledger id and entry id (BookKeeper's index rebuild).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from magnetar.bookie.entry_logger import MAGIC as ENTRY_LOG_MAGIC
from magnetar.bookie.entry_logger import EntryLogger, Location, LocationRun, run_bytes

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger_id INTEGER NOT NULL, entry_id INTEGER NOT NULL,
    log_id INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL,
    PRIMARY KEY (ledger_id, entry_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id INTEGER PRIMARY KEY, fenced INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0, master_key BLOB);
CREATE TABLE IF NOT EXISTS log_usage (
    log_id INTEGER NOT NULL, ledger_id INTEGER NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (log_id, ledger_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


#: A run of consecutive entries: entry ``?2 + i`` has length ``lengths[i]`` (``?5``, JSON) and
#: starts at ``?4`` plus the records before it (each its length and 4 bytes).
_INSERT_CONSECUTIVE = (
    "INSERT OR REPLACE INTO entries "
    "SELECT ?1, ?2 + key, ?3, ?4 + SUM(value + 4) OVER (ORDER BY key ROWS UNBOUNDED PRECEDING) "
    "- value - 4, value FROM json_each(?5)"
)
#: A run of entries with any ids: ``?4`` is a JSON array of [entry id, length] pairs.
_INSERT_LISTED = (
    "INSERT OR REPLACE INTO entries "
    "SELECT ?1, json_extract(value, '$[0]'), ?2, "
    "?3 + SUM(json_extract(value, '$[1]') + 4) OVER (ORDER BY key ROWS UNBOUNDED PRECEDING) "
    "- json_extract(value, '$[1]') - 4, json_extract(value, '$[1]') FROM json_each(?4)"
)


class IndexDamagedError(OSError):
    """The index file cannot be used: not a database, or its pages fail SQLite's check."""

    def __init__(self, path: Path, cause: object) -> None:
        self.path = path
        text = str(cause)
        super().__init__(
            text if text.startswith(f"index {path}") else f"index {path} is damaged ({text})"
        )


class LedgerIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._writer = self._connect()
            problems = [row[0] for row in self._writer.execute("PRAGMA quick_check(5)")]
            if problems != ["ok"]:
                self._writer.close()
                raise IndexDamagedError(path, "; ".join(map(str, problems)))
            self._writer.executescript(_SCHEMA)
            columns = {row[1] for row in self._writer.execute("PRAGMA table_info(ledgers)")}
            if "master_key" not in columns:  # an index written before master keys existed
                self._writer.execute("ALTER TABLE ledgers ADD COLUMN master_key BLOB")
        except sqlite3.DatabaseError as e:
            raise IndexDamagedError(path, e) from None
        # Fence and delete flags are written on their own connection: they must not join (or
        # wait for the thread of) a flush transaction, only for SQLite's write lock.
        self._flags = self._connect()
        # Callers run on any pool thread: one writer of flags at a time, so a failed master-key
        # transaction cannot roll back a fence written meanwhile on the same connection.
        self._flags_lock = threading.Lock()
        self._local = threading.local()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    def close(self) -> None:
        self._writer.close()
        self._flags.close()

    # -- reads (any thread) -------------------------------------------------------------

    def lookup(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        row = (
            self._reader()
            .execute(
                "SELECT log_id, offset, length FROM entries WHERE ledger_id=? AND entry_id=?",
                (ledger_id, entry_id),
            )
            .fetchone()
        )
        return row

    def lookup_range(
        self, ledger_id: int, first: int, count: int
    ) -> list[tuple[int, int, int, int]]:
        """(entry id, log id, offset, length) of the stored entries ``first`` ..
        ``first + count - 1`` of a ledger, in entry order (absent ones left out)."""
        return (
            self._reader()
            .execute(
                "SELECT entry_id, log_id, offset, length FROM entries"
                " WHERE ledger_id=? AND entry_id>=? AND entry_id<? ORDER BY entry_id",
                (ledger_id, first, first + count),
            )
            .fetchall()
        )

    def last_entry_id(self, ledger_id: int) -> int:
        row = (
            self._reader()
            .execute("SELECT max(entry_id) FROM entries WHERE ledger_id=?", (ledger_id,))
            .fetchone()
        )
        return -1 if row[0] is None else row[0]

    def ledger_flags(self) -> tuple[set[int], set[int]]:
        fenced, deleted = set(), set()
        for ledger_id, is_fenced, is_deleted in self._writer.execute(
            "SELECT ledger_id, fenced, deleted FROM ledgers"
        ):
            if is_deleted:
                deleted.add(ledger_id)
            elif is_fenced:
                fenced.add(ledger_id)
        return fenced, deleted

    def master_keys(self) -> dict[int, bytes]:
        """The master key of every ledger that has one recorded (deleted ones excluded)."""
        return {
            ledger_id: bytes(key)
            for ledger_id, key in self._writer.execute(
                "SELECT ledger_id, master_key FROM ledgers "
                "WHERE master_key IS NOT NULL AND deleted = 0"
            )
        }

    def ledger_ids(self) -> set[int]:
        """Ledgers with a row (fence, deletion, master key) or with entries in the index."""
        rows = self._reader().execute(
            "SELECT ledger_id FROM ledgers UNION SELECT DISTINCT ledger_id FROM entries"
        )
        return {row[0] for row in rows}

    def entry_count(self) -> int:
        """Entries located in the entry logs (flushed; the memtable's are not counted yet)."""
        return self._reader().execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    def checkpoint_mark(self) -> int:
        mark = self._meta("journal_mark")
        return 0 if mark is None else mark

    def journal_started(self) -> int | None:
        """The journal file the bookie opened at its last start (None: never recorded). Every
        journal file from the checkpoint mark up to it, or up to the mark when that is larger,
        existed when the bookie last ran."""
        return self._meta("journal_started")

    def set_journal_started(self, file_id: int) -> None:
        with self._flags_lock:
            self._flags.execute(
                "INSERT INTO meta VALUES ('journal_started', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (file_id,),
            )

    def _meta(self, key: str) -> int | None:
        row = self._writer.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def log_usage(self) -> dict[int, dict[int, int]]:
        usage: dict[int, dict[int, int]] = defaultdict(dict)
        for log_id, ledger_id, size in self._writer.execute(
            "SELECT log_id, ledger_id, bytes FROM log_usage"
        ):
            usage[log_id][ledger_id] = size
        return dict(usage)

    # -- writes (flush thread; flags from any one thread) ----------------------------------------------------------

    def set_fenced(self, ledger_id: int) -> None:
        with self._flags_lock:
            self._flags.execute(
                "INSERT INTO ledgers(ledger_id, fenced) VALUES (?, 1) "
                "ON CONFLICT(ledger_id) DO UPDATE SET fenced=1",
                (ledger_id,),
            )

    def set_master_keys(self, keys: dict[int, bytes]) -> None:
        """Record the master keys of ledgers' first adds (one transaction, one fsync)."""
        with self._flags_lock:
            self._flags.execute("BEGIN")
            try:
                self._flags.executemany(
                    "INSERT INTO ledgers(ledger_id, master_key) VALUES (?, ?) "
                    "ON CONFLICT(ledger_id) DO UPDATE SET master_key=excluded.master_key",
                    list(keys.items()),
                )
                self._flags.execute("COMMIT")
            except BaseException:
                self._flags.execute("ROLLBACK")
                raise

    def set_deleted(self, ledger_id: int) -> None:
        with self._flags_lock:
            self._flags.execute(
                "INSERT INTO ledgers(ledger_id, deleted) VALUES (?, 1) "
                "ON CONFLICT(ledger_id) DO UPDATE SET deleted=1",
                (ledger_id,),
            )

    def commit_flush(self, runs: Iterable[LocationRun], journal_mark: int | None) -> None:
        """Record where flushed entries landed and, atomically with it, the new checkpoint mark.

        One statement per run of entries (not one per entry, as ``executemany`` would make:
        each SQLite step lets go of the GIL and takes it back, which against a busy event loop
        thread costs a thread switch per entry). SQLite reads a run's lengths from a JSON
        array and works out each entry's offset itself, in C, without the GIL."""
        usage: dict[tuple[int, int], int] = defaultdict(int)
        self._writer.execute("BEGIN")
        try:
            for run in runs:
                ledger_id, ids, log_id, offset, lengths = run
                if isinstance(ids, range):
                    rows = (ledger_id, ids.start, log_id, offset, json.dumps(lengths))
                    self._writer.execute(_INSERT_CONSECUTIVE, rows)
                else:
                    rows = (
                        ledger_id,
                        log_id,
                        offset,
                        json.dumps(list(zip(ids, lengths, strict=True))),
                    )
                    self._writer.execute(_INSERT_LISTED, rows)
                usage[(log_id, ledger_id)] += run_bytes(run)
            self._writer.executemany(  # a row per log and ledger: a handful
                "INSERT INTO log_usage VALUES (?, ?, ?) "
                "ON CONFLICT(log_id, ledger_id) DO UPDATE SET bytes = bytes + excluded.bytes",
                [(log_id, ledger_id, size) for (log_id, ledger_id), size in usage.items()],
            )
            if journal_mark is not None:
                self._writer.execute(
                    "INSERT INTO meta VALUES ('journal_mark', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (journal_mark,),
                )
            self._writer.execute("COMMIT")
        except BaseException:
            self._writer.execute("ROLLBACK")
            raise

    def forget_log(self, log_id: int) -> None:
        """Drop the usage rows of a removed log (its live entries were moved or deleted)."""
        self._writer.execute("DELETE FROM log_usage WHERE log_id=?", (log_id,))

    def drop_deleted_entries(self, deleted: Iterable[int]) -> None:
        self._writer.execute("BEGIN")
        for ledger_id in deleted:
            self._writer.execute("DELETE FROM entries WHERE ledger_id=?", (ledger_id,))
            self._writer.execute("DELETE FROM log_usage WHERE ledger_id=?", (ledger_id,))
        self._writer.execute("COMMIT")

    def live_entries_in_log(
        self, log_id: int, ledgers: Iterable[int]
    ) -> list[tuple[int, int, int, int]]:
        """(ledger id, entry id, offset, length) of the entries whose live copy is in this log,
        looked up per ledger (the primary key's prefix) rather than by scanning the log file."""
        rows = []
        for ledger_id in ledgers:
            rows.extend(
                (ledger_id, entry_id, offset, length)
                for entry_id, offset, length in self._writer.execute(
                    "SELECT entry_id, offset, length FROM entries WHERE ledger_id=? AND log_id=?",
                    (ledger_id, log_id),
                )
            )
        return rows


@dataclass(slots=True)
class RebuildReport:
    entries: int = 0
    ledgers: int = 0
    logs: int = 0
    unreadable_bytes: dict[int, int] = field(default_factory=dict)  # log id -> bytes not scanned
    kept_as: Path | None = None


def rebuild_index(
    ledger_dir: Path,
    entry_log_dir: Path,
    fence: Iterable[int] = (),
    journal_files: Iterable[int] = (),
) -> RebuildReport:
    """Replace ``ledger_dir/index.db`` by one rebuilt from the entry logs; the old file (and its
    WAL) is kept as ``index.db.damaged``.

    What the entry logs cannot tell is set on the safe side: every ledger found (and every id
    in ``fence``, e.g. ledgers seen in the journal) is marked fenced, so no old writer can add
    to a ledger a recovery may have fenced; the journal mark is 0, so the next start replays
    every journal file still present (``journal_files``: their ids; the mark becomes the
    first). Logs are read oldest first, so the copy a compaction moved to a newer log wins.
    """
    path = ledger_dir / "index.db"
    report = RebuildReport()
    if path.exists():
        report.kept_as = path.with_name("index.db.damaged")
        for suffix in ("", "-wal", "-shm"):
            old = path.with_name(path.name + suffix)
            if old.exists():
                os.replace(old, report.kept_as.with_name(report.kept_as.name + suffix))
    logger = EntryLogger(entry_log_dir, max_bytes=1 << 62)
    index = LedgerIndex(path)
    ledgers: set[int] = set(fence)
    try:
        for log_id in logger.log_ids():
            rows: list[Location] = []
            end = len(ENTRY_LOG_MAGIC)
            for ledger_id, entry_id, offset, entry in logger.scan(log_id):
                rows.append((ledger_id, entry_id, log_id, offset, len(entry)))
                ledgers.add(ledger_id)
                end = offset + len(entry)
            size = (entry_log_dir / f"{log_id:08x}.log").stat().st_size
            if size > end:  # a length field or header is damaged: scanning stopped there
                report.unreadable_bytes[log_id] = size - end
            index.commit_flush(runs_of(rows), None)
            report.entries += len(rows)
            report.logs += 1
        for ledger_id in sorted(ledgers):
            index.set_fenced(ledger_id)
        report.ledgers = len(ledgers)
        present = sorted(journal_files)
        if present:
            index.commit_flush([], present[0])
            index.set_journal_started(present[-1])
    finally:
        index.close()
        logger.close()
    return report


def runs_of(locations: list[Location]) -> list[LocationRun]:
    """Locations grouped into runs for ``commit_flush``: a run goes on while the entries are
    one ledger's and back to back in one log."""
    runs: list[LocationRun] = []
    end = -1
    for ledger_id, entry_id, log_id, offset, length in locations:
        if runs and runs[-1][0] == ledger_id and runs[-1][2] == log_id and offset == end + 4:
            runs[-1][1].append(entry_id)  # type: ignore[attr-defined]
            runs[-1][4].append(length)
        else:
            runs.append((ledger_id, [entry_id], log_id, offset, [length]))
        end = offset + length
    return runs
