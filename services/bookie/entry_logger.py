"""Entry logs: large append-only files holding the entries of many ledgers, interleaved.

File layout: ``<id as 8 hex digits>.log`` starting with an 8-byte magic, then records of
``[u32 length][formatted entry]``. The entry carries its own ledger id, entry id and digest, so a
log can be scanned without the index (compaction does that). The index stores (log id, offset
of the entry, length) so a read is a single ``pread``.

All methods block; the bookie calls them from worker threads.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from pathlib import Path

from magnetar.bookie.fsutil import fsync_dir
from magnetar.common.ledger.entry import HEADER_SIZE, decode_header

log = logging.getLogger(__name__)

MAGIC = b"MGELOG\x00\x01"
_LEN = struct.Struct(">I")
_RECORD_OVERHEAD = _LEN.size  # bytes a record adds to its entry
_WRITE_BYTES = 1 << 20


class EntryLogMissingError(OSError):
    """The entry log was removed (by GC) between the index lookup and the read."""


#: Where an entry landed: (ledger id, entry id, log id, offset, length).
Location = tuple[int, int, int, int, int]

#: Entries of one ledger written back to back in one log: (ledger id, their entry ids, log id,
#: offset of the first one, their lengths). Entry ``ids[i]`` is at
#: ``offset + sum(lengths[:i]) + 4 * i`` (a record is the entry's 4-byte length, then the
#: entry). A flush hands the index one per run instead of one row per entry.
LocationRun = tuple[int, Sequence[int], int, int, list[int]]

#: Entries of one ledger to write back to back: (ledger id, their entry ids, the entries).
EntryRun = tuple[int, Sequence[int], Sequence[bytes]]


def run_bytes(run: LocationRun) -> int:
    """The bytes a run of entries takes in its log: the entries and their length fields."""
    lengths = run[4]
    return sum(lengths) + _RECORD_OVERHEAD * len(lengths)


def log_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


class _ReadHandle:
    """A read-only fd shared by readers; closed only once the last reader lets go."""

    __slots__ = ("fd", "refs", "retired")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.refs = 0
        self.retired = False


class EntryLogger:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._write_fd = -1
        self.current_log_id = -1
        self._current_size = 0
        self._handles: dict[int, _ReadHandle] = {}
        self._lock = threading.Lock()

    def log_ids(self) -> list[int]:
        ids = []
        for p in self.directory.glob("*.log"):
            try:
                ids.append(int(p.stem, 16))
            except ValueError:
                log.warning("ignoring unexpected file %s in the ledger directory", p)
        return sorted(ids)

    def total_bytes(self) -> int:
        total = 0
        for log_id in self.log_ids():
            try:
                total += (self.directory / log_name(log_id)).stat().st_size
            except FileNotFoundError:
                pass
        return total

    def open(self) -> None:
        """Start a fresh log after the highest existing one (a log cut short by a crash is
        never appended to again; entries past its last indexed one are simply unreferenced)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        ids = self.log_ids()
        self._start_log((ids[-1] + 1) if ids else 0)

    def _start_log(self, log_id: int) -> None:
        if self._write_fd >= 0:
            os.fsync(self._write_fd)
            os.close(self._write_fd)
        path = self.directory / log_name(log_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, MAGIC)
        self._write_fd, self.current_log_id, self._current_size = fd, log_id, len(MAGIC)
        fsync_dir(self.directory)

    def append(self, runs: Iterable[EntryRun]) -> list[LocationRun]:
        """Write runs of entries, fsync, and return where they landed. A run is cut where a
        log fills; records are written about a megabyte at a time across runs (one join of a
        whole memtable would cost a second copy of it in memory for no gain). An entry goes to
        the current log if it fits or the log holds none yet; else a new log is started."""
        placed: list[LocationRun] = []
        pending: list[bytes] = []  # records to write after the log's current end
        pending_bytes = 0
        for ledger_id, ids, entries in runs:
            lengths = list(map(len, entries))
            ends = list(accumulate(map(_RECORD_OVERHEAD.__add__, lengths)))  # record ends
            start, base = 0, 0  # base: the bytes of the records before ``start``
            while start < len(entries):
                used = self._current_size + pending_bytes
                fit = bisect_right(ends, base + self.max_bytes - used, start)
                if fit == start and used > len(MAGIC):
                    self._pwrite(pending)
                    pending, pending_bytes = [], 0
                    self._start_log(self.current_log_id + 1)
                    continue
                write_room = base + _WRITE_BYTES - pending_bytes
                stop = max(min(fit, bisect_right(ends, write_room, start)), start + 1)
                records: list[bytes] = [b""] * (2 * (stop - start))
                records[0::2] = map(_LEN.pack, lengths[start:stop])
                records[1::2] = entries[start:stop]
                pending += records
                pending_bytes += ends[stop - 1] - base
                placed.append(
                    (ledger_id, ids[start:stop], self.current_log_id, used + _LEN.size,
                     lengths[start:stop])
                )  # fmt: skip
                start, base = stop, ends[stop - 1]
                if pending_bytes >= _WRITE_BYTES:
                    self._pwrite(pending)
                    pending, pending_bytes = [], 0
        if placed:
            self._pwrite(pending)
            os.fsync(self._write_fd)
        return placed

    def _pwrite(self, records: list[bytes]) -> None:
        view = memoryview(b"".join(records))
        while view:
            n = os.pwrite(self._write_fd, view, self._current_size)
            view = view[n:]
            self._current_size += n

    def read(self, log_id: int, offset: int, length: int) -> bytes:
        handle = self._acquire(log_id)
        try:
            data = os.pread(handle.fd, length, offset)
        finally:
            self._release(log_id, handle)
        if len(data) != length:
            raise EOFError(f"entry log {log_name(log_id)}: short read at offset {offset}")
        return data

    def _acquire(self, log_id: int) -> _ReadHandle:
        with self._lock:
            handle = self._handles.get(log_id)
            if handle is None:
                try:
                    fd = os.open(self.directory / log_name(log_id), os.O_RDONLY)
                except FileNotFoundError:
                    raise EntryLogMissingError(f"entry log {log_name(log_id)} is gone") from None
                handle = self._handles[log_id] = _ReadHandle(fd)
            handle.refs += 1
            return handle

    def _release(self, log_id: int, handle: _ReadHandle) -> None:
        with self._lock:
            handle.refs -= 1
            if handle.retired and handle.refs == 0:
                os.close(handle.fd)

    def scan(self, log_id: int) -> Iterator[tuple[int, int, int, bytes]]:
        """(ledger id, entry id, offset, entry) for every whole record of a log."""
        with open(self.directory / log_name(log_id), "rb") as f:
            data = f.read()
        pos = len(MAGIC)
        while pos + _LEN.size <= len(data):
            (size,) = _LEN.unpack_from(data, pos)
            start = pos + _LEN.size
            if size < HEADER_SIZE or start + size > len(data):
                break
            entry = data[start : start + size]
            header = decode_header(entry)
            yield header.ledger_id, header.entry_id, start, entry
            pos = start + size

    def remove(self, log_id: int) -> int:
        """Delete a log file (never the current one); return the bytes freed."""
        if log_id == self.current_log_id:
            raise ValueError("the current entry log cannot be removed")
        path = self.directory / log_name(log_id)
        with self._lock:
            handle = self._handles.pop(log_id, None)
            if handle is not None:
                handle.retired = True
                if handle.refs == 0:
                    os.close(handle.fd)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def roll(self) -> None:
        """Start a new current log (so GC may reclaim the old one)."""
        if self._current_size > len(MAGIC):
            self._start_log(self.current_log_id + 1)

    def close(self) -> None:
        if self._write_fd >= 0:
            os.fsync(self._write_fd)
            os.close(self._write_fd)
            self._write_fd = -1
        with self._lock:
            for handle in self._handles.values():
                handle.retired = True
                if handle.refs == 0:
                    os.close(handle.fd)
            self._handles.clear()
