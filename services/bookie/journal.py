"""The journal: the bookie's write-ahead log.

Every add is appended here and made durable (fsync) before it is acknowledged. Adds that arrive
while a write is in progress form the next *group* and share one fsync (group commit); a group
closes when it holds ``max_group_bytes`` or its oldest record has waited ``max_group_wait``.

File layout: ``<id as 16 hex digits>.jnl`` starting with an 8-byte magic, then records of
``[u32 body length][u32 CRC32C of body][body]``. The body is a one-byte record type and its data.

Damage rule (replay): a bad record (short, or failing its CRC) after which no valid record
follows, in the *newest* file, is a torn tail: it is cut off. A crash mid-write leaves one of a
group this bookie never acknowledged, but a disk that lost a written tail leaves one too, so the
warning says only what is known: the bytes are not a whole record, which entries their (unverified)
headers name, and whether a later entry's LAC shows any of those had been acknowledged to their
writer (:func:`read_torn_tail`, :func:`acknowledged_in_tail`, :func:`torn_tail_message`). A bad
record followed by valid ones, or a bad record in any older file, is
damage to acknowledged data: replay raises JournalDamageError naming the file and offset, and
the bookie refuses to start until the directory is restored or ``magnetar bk journalrepair``
drops the damaged bytes (:func:`repair_journal_file`). "Valid records follow" is decided by
scanning forward, byte by byte, for a header whose length fits and whose CRC holds.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import crc32c

from magnetar.bookie.fsutil import fsync_dir
from magnetar.common.ledger.entry import HEADER_SIZE, EntryFormatError, decode_header
from magnetar.common.tasks import wait_set

log = logging.getLogger(__name__)

MAGIC = b"MGJNL\x00\x00\x01"
_RECORD = struct.Struct(">II")
_MAX_RECORD = 1 << 30


class RecordType(enum.IntEnum):
    ADD = 1  # data: a formatted entry
    FENCE = 2  # data: ledger id, int64
    ADD_BATCH = 3  # data: u32 count, count x u32 entry sizes, then the entries back to back
    MASTER_KEY = 4  # data: ledger id, int64, then the key a ledger's first add here brought


class JournalError(OSError):
    """The journal could not write or sync; the adds of that group are not durable."""


_KIND_BYTES = {kind: bytes((kind,)) for kind in RecordType}
_KIND_CRC = {kind: crc32c.crc32c(_KIND_BYTES[kind]) for kind in RecordType}


def encode_record(kind: RecordType, data: bytes) -> bytes:
    crc = crc32c.crc32c(data, _KIND_CRC[kind])
    return b"".join((_RECORD.pack(len(data) + 1, crc), _KIND_BYTES[kind], data))


_COUNT = struct.Struct(">I")


def encode_add_batch(entries: list[bytes]) -> bytes:
    """One record for a batch of adds: a handful of C-level calls instead of one record (with
    its own header and CRC) per entry. A batch torn by a crash mid-write loses only adds this
    bookie had not acknowledged, because acknowledgements follow the fsync of the whole group."""
    sizes = struct.pack(f">{len(entries)}I", *map(len, entries))
    return encode_record(
        RecordType.ADD_BATCH, b"".join((_COUNT.pack(len(entries)), sizes, *entries))
    )


_LEDGER_ID = struct.Struct(">q")


def encode_master_key(ledger_id: int, key: bytes) -> bytes:
    """The record that makes a ledger's master key durable with the first add that brings it
    (in the same group, so in the same fsync), as BookKeeper journals its ledger keys."""
    return encode_record(RecordType.MASTER_KEY, _LEDGER_ID.pack(ledger_id) + key)


def decode_master_key(data: bytes) -> tuple[int, bytes]:
    """(ledger id, key) of a MASTER_KEY record's data; ValueError if it is too short."""
    if len(data) < _LEDGER_ID.size:
        raise ValueError("master key record shorter than its ledger id")
    return _LEDGER_ID.unpack_from(data, 0)[0], bytes(data[_LEDGER_ID.size :])


def decode_add_batch(data: bytes) -> list[bytes]:
    """The entries of an ADD_BATCH record's data; ValueError if it does not add up."""
    if len(data) < _COUNT.size:
        raise ValueError("batch record shorter than its count")
    (count,) = _COUNT.unpack_from(data, 0)
    start = _COUNT.size + 4 * count
    if start > len(data):
        raise ValueError(f"batch record of {len(data)} bytes cannot hold {count} sizes")
    sizes = struct.unpack_from(f">{count}I", data, _COUNT.size)
    if start + sum(sizes) != len(data):
        raise ValueError("batch record sizes do not add up to its length")
    entries = []
    for size in sizes:
        entries.append(data[start : start + size])
        start += size
    return entries


def file_name(file_id: int) -> str:
    return f"{file_id:016x}.jnl"


def list_journal_files(directory: Path) -> list[int]:
    ids = []
    for p in directory.glob("*.jnl"):
        try:
            ids.append(int(p.stem, 16))
        except ValueError:
            log.warning("ignoring unexpected file %s in the journal directory", p)
    return sorted(ids)


@dataclass(slots=True)
class _Pending:
    data: bytes | None  # None marks a roll request
    future: asyncio.Future[int]
    enqueued: float


class Journal:
    """Append-only, group-committed write-ahead log in one directory."""

    def __init__(
        self,
        directory: Path,
        *,
        sync: bool = True,
        max_group_wait: float = 0.001,
        max_group_bytes: int = 512 * 1024,
        max_file_bytes: int = 256 * 1024 * 1024,
        on_sync: Callable[[float, int, int], None] | None = None,
        on_error: Callable[[OSError], None] | None = None,
    ) -> None:
        self.directory = directory
        self.sync = sync
        self.max_group_wait = max_group_wait
        self.max_group_bytes = max_group_bytes
        self.max_file_bytes = max_file_bytes
        self._on_sync = on_sync  # (seconds, records, bytes) after every group
        self._on_error = on_error
        self._queue: list[_Pending] = []
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="journal")
        self._fd = -1
        self.file_id = -1
        self._file_size = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def queued_records(self) -> int:
        """Records waiting for the next group write (BookKeeper's JOURNAL_QUEUE_SIZE)."""
        return len(self._queue)

    async def start(self, file_id: int) -> None:
        """Start writing into a new file ``file_id``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._open_file, file_id)
        self._task = asyncio.create_task(self._run(), name="journal-writer")

    def append(self, data: bytes) -> asyncio.Future[int]:
        """Queue encoded records; the future resolves (to the file id) once they are durable."""
        if self._closed:
            raise JournalError("journal is closed")
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(data, fut, time.monotonic()))
        self._queued_bytes += len(data)
        self._wakeup.set()
        return fut

    def roll(self) -> asyncio.Future[int]:
        """Start a new file after everything queued so far is durable; resolves to its id.

        Every record appended before this call is in a file with a smaller id, which is what a
        checkpoint needs to know which files it may delete.
        """
        if self._closed:
            raise JournalError("journal is closed")
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(None, fut, 0.0))
        self._wakeup.set()
        return fut

    def remove_files_before(self, file_id: int) -> int:
        removed = 0
        for fid in list_journal_files(self.directory):
            if fid < file_id:
                (self.directory / file_name(fid)).unlink(missing_ok=True)
                removed += 1
        return removed

    async def close(self) -> None:
        if self._task is not None and not self._task.done() and not self._closed:
            # An empty append completes after everything queued before it: drain, then stop.
            try:
                await self.append(b"")
            except JournalError:
                pass
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        left, self._queue = self._queue, []
        for p in left:
            if not p.future.done():
                p.future.set_exception(
                    JournalError("journal closed before this record was written")
                )
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_file)
        self._executor.shutdown(wait=True)

    # -- writer task ---------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self.max_group_wait > 0 and self._queue[0].data is not None:
                deadline = self._queue[0].enqueued + self.max_group_wait
                while self._queued_bytes < self.max_group_bytes and not self._closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wakeup.clear()
                    if not await wait_set(self._wakeup, remaining):
                        break
            group, self._queue = self._queue, []
            self._queued_bytes = 0
            await self._write_group(loop, group)

    async def _write_group(self, loop: asyncio.AbstractEventLoop, group: list[_Pending]) -> None:
        # Records between roll markers go to one file; a marker switches files.
        start = 0
        for i, item in enumerate([*group, None]):
            if item is not None and item.data is not None:
                continue
            chunk = group[start:i]
            start = i + 1
            if chunk:
                await self._write_chunk(loop, chunk)
            if item is not None:
                try:
                    new_id = await loop.run_in_executor(self._executor, self._roll_file)
                except OSError as e:
                    self._fail([item], e)
                else:
                    if not item.future.done():
                        item.future.set_result(new_id)

    async def _write_chunk(self, loop: asyncio.AbstractEventLoop, chunk: list[_Pending]) -> None:
        data = b"".join(p.data for p in chunk if p.data is not None)
        started = time.perf_counter()
        try:
            file_id = await loop.run_in_executor(self._executor, self._write_sync, data)
        except OSError as e:
            self._fail(chunk, e)
            return
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - started, len(chunk), len(data))
        for p in chunk:
            if not p.future.done():
                p.future.set_result(file_id)

    def _fail(self, items: list[_Pending], error: OSError) -> None:
        log.error(
            "journal %s: write failed (%s); failing %d pending adds",
            self.directory,
            error,
            len(items),
        )
        wrapped = JournalError(error.errno, f"journal write failed: {error.strerror or error}")
        for p in items:
            if not p.future.done():
                p.future.set_exception(wrapped)
        if self._on_error is not None:
            self._on_error(error)

    # -- blocking file work, on the journal thread ------------------------------------------

    def _open_file(self, file_id: int) -> None:
        path = self.directory / file_name(file_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        os.write(fd, MAGIC)
        os.fsync(fd)
        fsync_dir(self.directory)
        self._fd, self.file_id, self._file_size = fd, file_id, len(MAGIC)

    def _close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _roll_file(self) -> int:
        self._close_file()
        self._open_file(self.file_id + 1)
        return self.file_id

    def _write_sync(self, data: bytes) -> int:
        if self._file_size >= self.max_file_bytes:
            self._roll_file()
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self.sync:
                os.fdatasync(self._fd)
        except OSError:
            # Cut back to the last whole group so the file never holds a half-written record
            # ahead of later, acknowledged ones.
            try:
                os.ftruncate(self._fd, self._file_size)
            except OSError:
                pass
            raise
        self._file_size += len(data)
        return self.file_id


@dataclass(slots=True, frozen=True)
class ReplayedRecord:
    file_id: int
    kind: RecordType
    data: bytes


# -- scanning a file's bytes (pure: no I/O) -----------------------------------------------------


@dataclass(slots=True, frozen=True)
class ScannedRecord:
    offset: int
    kind: RecordType
    data: bytes


@dataclass(slots=True, frozen=True)
class DamagedRange:
    """Bytes ``[offset, end)`` that hold no valid record. ``resumed`` says whether a valid
    record starts at ``end`` (damage inside the file) or ``end`` is the end of the file (a
    torn tail, if the file is the newest). ``records`` is how many records the range held, when
    the length fields inside it still chain exactly from ``offset`` to ``end``; else None."""

    offset: int
    end: int
    resumed: bool
    records: int | None

    @property
    def length(self) -> int:
        return self.end - self.offset


@dataclass(slots=True, frozen=True)
class JournalScan:
    """A journal file's bytes, parsed: its valid records and the ranges between them that
    hold none. ``bad_magic`` says the 8-byte file header itself was damaged; ``torn_header``
    that the file is a prefix of it (its creation was torn: it holds no record, wherever it is)."""

    size: int
    records: list[ScannedRecord]
    damaged: list[DamagedRange]
    bad_magic: bool = False
    torn_header: bool = False

    @property
    def torn_tail(self) -> DamagedRange | None:
        """The damaged range at the end of the file, if no valid record follows it."""
        if self.damaged and not self.damaged[-1].resumed:
            return self.damaged[-1]
        return None


def _record_at(data: bytes | memoryview, pos: int) -> tuple[RecordType, int] | None:
    """(kind, end offset) of the valid record starting at ``pos``, or None."""
    if pos + _RECORD.size > len(data):
        return None
    size, crc = _RECORD.unpack_from(data, pos)
    body_start = pos + _RECORD.size
    if size == 0 or size > _MAX_RECORD or body_start + size > len(data):
        return None
    try:
        kind = RecordType(data[body_start])
    except ValueError:
        return None
    if crc32c.crc32c(data[body_start : body_start + size]) != crc:
        return None
    return kind, body_start + size


def _next_valid_record(data: bytes | memoryview, start: int) -> int | None:
    """Offset of the first valid record at or after ``start``, or None."""
    for pos in range(start, len(data) - _RECORD.size):
        if _record_at(data, pos) is not None:
            return pos
    return None


def _chained_records(data: bytes | memoryview, start: int, end: int) -> int | None:
    """How many records lie in ``[start, end)`` if their length fields chain exactly to
    ``end`` (the damage is inside bodies, the headers are intact); None if they do not."""
    count, pos = 0, start
    while pos < end:
        if pos + _RECORD.size > end:
            return None
        (size,) = struct.unpack_from(">I", data, pos)
        if size == 0:
            return None
        pos += _RECORD.size + size
        count += 1
    return count if pos == end else None


def scan_journal_bytes(data: bytes) -> JournalScan:
    """Parse a journal file's content: every valid record, and every damaged range with what
    follows it. Never raises; deciding what the damage means is the caller's job."""
    if len(data) < len(MAGIC) and MAGIC.startswith(data):
        return JournalScan(len(data), [], [], torn_header=True)
    view = memoryview(data)
    records: list[ScannedRecord] = []
    damaged: list[DamagedRange] = []
    bad_magic = not data.startswith(MAGIC)
    pos = len(MAGIC)
    if bad_magic:
        resume = _next_valid_record(view, 0)
        end = len(data) if resume is None else resume
        damaged.append(DamagedRange(0, end, resume is not None, None))
        pos = end
    while pos < len(data):
        found = _record_at(view, pos)
        if found is not None:
            kind, end = found
            records.append(ScannedRecord(pos, kind, bytes(view[pos + _RECORD.size + 1 : end])))
            pos = end
            continue
        resume = _next_valid_record(view, pos + 1)
        end = len(data) if resume is None else resume
        damaged.append(DamagedRange(pos, end, resume is not None, _chained_records(view, pos, end)))
        pos = end
    return JournalScan(len(data), records, damaged, bad_magic)


# -- what a torn tail held (pure: no I/O) --------------------------------------------------------

_ENTRY_IDS = struct.Struct(">qqq")  # ledger id, entry id, lac: the head of an entry's header


@dataclass(slots=True, frozen=True)
class EntryIds:
    ledger_id: int
    entry_id: int
    lac: int  # last add confirmed when the writer sent this entry


@dataclass(slots=True, frozen=True)
class TornTail:
    """What the bytes of a torn tail still say, read as far as their record and entry headers
    go. No CRC vouches for any of it: the bytes failed theirs or were cut short. ``unread``:
    some record or entry in them has no readable header (so it may have held more entries)."""

    length: int
    entries: tuple[EntryIds, ...]
    fenced: tuple[int, ...]  # ledgers whose fence record is in the bytes
    unread: bool


@dataclass(slots=True, frozen=True)
class AcknowledgedLoss:
    """Entries of one ledger in cut bytes that a later entry's LAC shows were acknowledged to
    their writer (by an ack quorum, not necessarily by this bookie) and that no record kept."""

    ledger_id: int
    entry_ids: tuple[int, ...]
    lac: int  # the highest LAC of the ledger that any entry carries


def _sane(ids: EntryIds) -> bool:
    return ids.ledger_id >= 0 and ids.entry_id >= 0 and ids.lac >= -1


def entry_ids_of(kind: RecordType, body: bytes | memoryview) -> tuple[list[EntryIds], bool]:
    """Ids of the entries an ADD or ADD_BATCH record's data holds, read as far as ``body``
    goes (it may be cut short), and whether every entry's header was read and made sense."""
    if kind is RecordType.ADD:
        starts = [0]
    elif kind is RecordType.ADD_BATCH:
        if len(body) < _COUNT.size:
            return [], False
        (count,) = _COUNT.unpack_from(body, 0)
        start = _COUNT.size + 4 * count
        if start > len(body):
            return [], False
        starts = []
        for size in struct.unpack_from(f">{count}I", body, _COUNT.size):
            starts.append(start)
            start += size
    else:
        return [], True
    found: list[EntryIds] = []
    for start in starts:
        if start + HEADER_SIZE > len(body):
            return found, False
        ids = EntryIds(*_ENTRY_IDS.unpack_from(body, start))
        if not _sane(ids):
            return found, False
        found.append(ids)
    return found, True


def read_torn_tail(tail: bytes) -> TornTail:
    """Read the record headers of a torn tail's bytes, and the entry headers inside them, as
    far as they go and make sense; stop at the first that does not."""
    view = memoryview(tail)
    entries: list[EntryIds] = []
    fenced: list[int] = []
    pos, unread = 0, False
    while pos < len(view):
        if pos + _RECORD.size + 1 > len(view):
            unread = True
            break
        (size,) = struct.unpack_from(">I", view, pos)
        body_start = pos + _RECORD.size
        try:
            kind = RecordType(view[body_start])
        except ValueError:
            kind = None
        if size == 0 or size > _MAX_RECORD or kind is None:
            unread = True
            break
        body = view[body_start + 1 : body_start + size]
        if kind is RecordType.FENCE and len(body) >= _LEDGER_ID.size:
            fenced.append(_LEDGER_ID.unpack_from(body, 0)[0])
        elif kind in (RecordType.ADD, RecordType.ADD_BATCH):
            found, whole = entry_ids_of(kind, body)
            entries += found
            if not whole:
                unread = True
                break
        pos = body_start + size
    return TornTail(len(tail), tuple(entries), tuple(fenced), unread)


def acknowledged_in_tail(tail: TornTail, recovered: Iterable[EntryIds]) -> list[AcknowledgedLoss]:
    """The entries in a torn tail that some entry's LAC reaches (so their writer had them
    acknowledged) and that no ``recovered`` entry holds: acknowledged, yet lost by the cut.
    Entry LAC rule (BookKeeper): an entry carries the LAC its writer knew when sending it, and
    the LAC only moves past an entry once an ack quorum acknowledged that entry."""
    lac = {e.ledger_id: -1 for e in tail.entries}
    kept: dict[int, set[int]] = {ledger: set() for ledger in lac}
    for e in tail.entries:
        lac[e.ledger_id] = max(lac[e.ledger_id], e.lac)
    for e in recovered:
        if e.ledger_id in lac:
            lac[e.ledger_id] = max(lac[e.ledger_id], e.lac)
            kept[e.ledger_id].add(e.entry_id)
    losses = []
    for ledger in sorted(lac):
        lost = {
            e.entry_id
            for e in tail.entries
            if e.ledger_id == ledger
            and e.entry_id <= lac[ledger]
            and e.entry_id not in kept[ledger]
        }
        if lost:
            losses.append(AcknowledgedLoss(ledger, tuple(sorted(lost)), lac[ledger]))
    return losses


def _id_ranges(ids: Iterable[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    spans: list[list[int]] = []
    for i in sorted(set(ids)):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _entries_of_ledger(ledger_id: int, entry_ids: Iterable[int]) -> str:
    ids = set(entry_ids)
    return f"ledger {ledger_id} {'entry' if len(ids) == 1 else 'entries'} {_id_ranges(ids)}"


def torn_tail_message(
    path: Path, offset: int, tail: TornTail, losses: list[AcknowledgedLoss]
) -> str:
    """The replay warning for a torn tail: what is known about the cut bytes, nothing more."""
    said = (
        f"{tail.length} trailing bytes of journal file {path} (from offset {offset}) are not a "
        "whole record; cut."
    )
    if not tail.entries and not tail.fenced:
        return (
            f"{said} No record or entry header in them can be read, so nothing shows which adds "
            "they held or whether any had been acknowledged."
        )
    by_ledger: dict[int, set[int]] = {}
    for e in tail.entries:
        by_ledger.setdefault(e.ledger_id, set()).add(e.entry_id)
    held = [_entries_of_ledger(ledger, ids) for ledger, ids in sorted(by_ledger.items())]
    held += [f"a fence of ledger {ledger}" for ledger in sorted(set(tail.fenced))]
    if tail.unread:
        held.append("bytes whose headers cannot be read")
    said += f" By their headers (no CRC vouches for them) they held {'; '.join(held)}."
    if losses:
        lost = "; ".join(
            f"{_entries_of_ledger(loss.ledger_id, loss.entry_ids)} (an entry carries LAC "
            f"{loss.lac})"
            for loss in losses
        )
        return (
            f"{said} Acknowledged to their writer, yet no journal record keeps them: {lost}. "
            "Unless the ledger storage already held them, this bookie has lost its copy and "
            "answers NO_SUCH_ENTRY for them; the bookies of their ack quorum should still hold "
            "them."
        )
    if not tail.entries:
        return said
    return (
        f"{said} No later entry's LAC in the journal shows any of them had been acknowledged "
        "(which is not proof they were not: a later entry that carried such a LAC may have "
        "been in the lost bytes too, or only in the ledger storage)."
    )


# -- replay -------------------------------------------------------------------------------------


class JournalDamageError(OSError):
    """A journal file is damaged where acknowledged adds live; the bookie must not start."""

    def __init__(self, path: Path, damage: DamagedRange, reason: str, journal_dir: Path) -> None:
        self.path = path
        self.offset = damage.offset
        self.length = damage.length
        super().__init__(
            f"journal file {path} is damaged at offset {damage.offset} ({damage.length} bytes "
            f"hold no valid record): {reason}. This is not a torn write, so cutting it would "
            "silently lose acknowledged adds; the bookie will not start. Way forward: restore "
            f"the journal directory {journal_dir} from a backup, or run "
            f"`magnetar bk journalrepair --journal-dir {journal_dir}` to drop the damaged bytes "
            "and keep every valid record (entries in the dropped bytes are lost on this bookie; "
            "ledgers written with write quorum > 1 still hold them on other bookies)"
        )


def damage_reason(scan: JournalScan, damage: DamagedRange, newest: bool) -> str | None:
    """Why this damaged range must not be cut (None: it is a torn tail that may be)."""
    if damage.offset == 0 and scan.bad_magic:
        return "the file header (magic) is damaged"
    if damage.resumed:
        return f"valid records follow it from offset {damage.end}"
    if not newest:
        return "a bad record in a journal file that is not the newest one"
    return None


def _replayed_entry_ids(
    directory: Path, earlier: list[int], newest: JournalScan
) -> Iterator[EntryIds]:
    """Ids of every entry replay kept: the older files are read again (only on a torn tail,
    and only for its message: one that cannot be read now is left out)."""
    for fid in earlier:
        try:
            scan = scan_journal_bytes((directory / file_name(fid)).read_bytes())
        except OSError as e:
            log.warning("journal file %s: not read again for the torn tail's LACs: %s", fid, e)
            continue
        for record in scan.records:
            yield from entry_ids_of(record.kind, record.data)[0]
    for record in newest.records:
        yield from entry_ids_of(record.kind, record.data)[0]


def replay(directory: Path, from_file_id: int) -> Iterator[ReplayedRecord]:
    """Yield every complete record of the files with id >= ``from_file_id``, in order.

    A torn tail of the newest file is cut off, with a warning that says which entries the cut
    bytes name and whether a LAC shows any of them had been acknowledged (an error, then): a
    crash mid-write tears only a group this bookie had not acknowledged, but a disk that lost a
    written tail may take acknowledged adds with it. Any other damage raises
    JournalDamageError before a record of that file is yielded. ``directory`` is the journal's
    ``current`` folder; the message names its parent, the configured journal directory.
    """
    ids = [fid for fid in list_journal_files(directory) if fid >= from_file_id]
    for fid in ids:
        path = directory / file_name(fid)
        with open(path, "rb") as f:
            data = f.read()
        scan = scan_journal_bytes(data)
        newest = fid == ids[-1]
        for damage in scan.damaged:
            reason = damage_reason(scan, damage, newest)
            if reason is not None:
                raise JournalDamageError(path, damage, reason, directory.parent)
        if scan.torn_header:
            log.warning("journal file %s: header torn, ignoring the empty file", path)
            continue
        for record in scan.records:
            yield ReplayedRecord(fid, record.kind, record.data)
        tail = scan.torn_tail
        if tail is not None:
            torn = read_torn_tail(data[tail.offset :])
            losses = (
                acknowledged_in_tail(torn, _replayed_entry_ids(directory, ids[:-1], scan))
                if torn.entries
                else []
            )
            (log.error if losses else log.warning)(
                "%s", torn_tail_message(path, tail.offset, torn, losses)
            )
            with open(path, "r+b") as f:
                f.truncate(tail.offset)
                os.fsync(f.fileno())


# -- repair (offline: ``magnetar bk journalrepair``) ---------------------------------------------


@dataclass(slots=True, frozen=True)
class DroppedRange:
    path: Path
    offset: int
    length: int
    records: int | None  # records the range held, when its length fields tell; else None
    torn_tail: bool


def repair_journal_file(path: Path, *, dry_run: bool = False) -> list[DroppedRange]:
    """Drop every damaged range of one journal file, keeping every valid record in order.

    The repaired file is written beside the old one and renamed over it (the old content is
    kept as ``<name>.damaged`` for inspection). Returns what was (or, dry, would be) dropped.
    """
    data = path.read_bytes()
    scan = scan_journal_bytes(data)
    if not scan.damaged:
        return []  # intact, or a file whose creation was torn (replay ignores it)
    dropped = [
        DroppedRange(path, d.offset, d.length, d.records, not d.resumed) for d in scan.damaged
    ]
    if dry_run:
        return dropped
    kept = [MAGIC]
    for record in scan.records:
        kept.append(data[record.offset : record.offset + _RECORD.size + 1 + len(record.data)])
    backup = path.with_name(path.name + ".damaged")
    tmp = path.with_name(path.name + ".repair")
    with open(tmp, "wb") as f:
        f.write(b"".join(kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path, backup)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return dropped


def repair_journal(directory: Path, *, dry_run: bool = False) -> list[DroppedRange]:
    """Repair every journal file in ``directory`` (the journal's ``current`` folder)."""
    dropped: list[DroppedRange] = []
    for fid in list_journal_files(directory):
        dropped += repair_journal_file(directory / file_name(fid), dry_run=dry_run)
    return dropped


def ledger_ids_in_journal(directory: Path) -> set[int]:
    """Ids of the ledgers that any valid record of any journal file names (read only)."""
    ids: set[int] = set()
    for fid in list_journal_files(directory):
        for record in scan_journal_bytes((directory / file_name(fid)).read_bytes()).records:
            if record.kind in (RecordType.FENCE, RecordType.MASTER_KEY) and len(record.data) >= 8:
                ids.add(int.from_bytes(record.data[:8], "big", signed=True))
                continue
            try:
                entries = (
                    decode_add_batch(record.data)
                    if record.kind is RecordType.ADD_BATCH
                    else [record.data]
                )
                ids.update(decode_header(entry).ledger_id for entry in entries)
            except (ValueError, EntryFormatError):
                continue
    return ids
