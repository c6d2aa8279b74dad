"""SQLite's write-ahead log (``<db>-wal``), read without SQLite: which transactions SQLite will
replay from it, and whether committed transactions lie past a damaged frame. Pure: the file's
bytes in, a :class:`WalScan` out (no I/O), so every case is a unit test.

File format (https://www.sqlite.org/fileformat2.html#walformat): a 32-byte header (magic,
format version, page size, checkpoint sequence, salt-1, salt-2, checksum-1, checksum-2), then
frames at fixed offsets ``32 + k * (24 + page size)``: a 24-byte frame header (page number,
database size in pages after a commit or 0, salt-1, salt-2, checksum-1, checksum-2) and the
page. The checksum is cumulative: two 32-bit sums over 32-bit words (in the byte order the
magic names), Fibonacci-weighted, seeded with the previous frame's checksum (the header's for
the first frame), over the first 8 bytes of the frame header and the page.

What SQLite does with it (its recovery, at the first open after a crash): a frame is *valid*
when its salts equal the header's, its page number is not 0 and its checksum holds; SQLite
reads frames from the first one up to the first that is not valid and applies them up to the
last commit frame among them. Everything from the first invalid frame on is dropped in
silence, committed transactions included. A header SQLite rejects (short, bad magic, version,
page size or checksum) makes it ignore the whole file. After a complete checkpoint SQLite
restarts the log from its start with new salts (salt-1 incremented, the checkpoint sequence
too) and leaves the older generation's frames behind the new ones: a first invalid frame with
the salt-1 of an earlier generation is that normal leftover, not damage.

Damage rule (the bookie's journal rule, ``services/bookie/journal.py``, applied to frames): an
invalid frame after which no valid *commit* frame follows is a torn tail, the normal residue of
a crash in the middle of a transaction; SQLite's dropping it loses nothing that was committed.
A valid commit frame after an invalid frame is a transaction that committed after the damaged
frame was written, which SQLite would drop: the log is damaged (:attr:`WalScan.damaged`).

"Valid after the damage" cannot be decided by continuing the checksum chain across the damage.
A frame past it is taken as valid when its salts equal the header's and its checksum holds
when seeded with the checksum *stored* in the frame before it (the writer stored the running
sums there, so any intact pair of frames checks out). That is two independent 64-bit checks:
a frame of an older log generation (the salts change at every restart of the log) or garbage
does not pass. Only commit frames count, because non-commit frames past an invalid one occur
without damage: a transaction whose pages spilled before its commit rewrites earlier frames in
place (their checksums are fixed only at the commit), and a crash before that commit leaves
valid-looking frames of that uncommitted transaction behind. Known limit: damage to the header
of the frame right before the last commit frame hides that commit (its seed is gone); at most
that one transaction is then taken for a torn tail.

With a header SQLite rejects, the frames are checked pairwise the same way, with the salts of
the frame before instead of the header's, in either byte order, at the page size the header
gives or else ``page_size_hint`` (the database file's): valid commit frames there are
transactions SQLite would ignore with the whole file.
"""

from __future__ import annotations

import enum
import struct
import sys
from array import array
from dataclasses import dataclass

HEADER = struct.Struct(">8I")
FRAME_HEADER = struct.Struct(">6I")
#: Magic numbers: checksums over little-endian / big-endian words.
MAGIC_LE = 0x377F0682
MAGIC_BE = 0x377F0683
VERSION = 3007000
_MASK = 0xFFFFFFFF


def wal_checksum(data: bytes | memoryview, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing from (s0, s1)."""
    words = array("I")
    words.frombytes(data)
    if big_endian != (sys.byteorder == "big"):
        words.byteswap()
    it = iter(words)
    for x0, x1 in zip(it, it, strict=True):
        s0 = (s0 + x0 + s1) & _MASK
        s1 = (s1 + x1 + s0) & _MASK
    return s0, s1


@dataclass(slots=True, frozen=True)
class WalHeader:
    magic: int
    version: int
    page_size: int
    checkpoint_seq: int
    salt1: int
    salt2: int
    checksum1: int
    checksum2: int

    @property
    def big_endian(self) -> bool:
        return self.magic == MAGIC_BE

    def problem(self, header_bytes: bytes) -> str | None:
        """Why SQLite rejects this header (None: it accepts it)."""
        if self.magic not in (MAGIC_LE, MAGIC_BE):
            return f"bad magic {self.magic:#010x}"
        if self.version != VERSION:
            return f"unknown format version {self.version}"
        if not _is_page_size(self.page_size):
            return f"bad page size {self.page_size}"
        if wal_checksum(header_bytes[:24], 0, 0, self.big_endian) != (
            self.checksum1,
            self.checksum2,
        ):
            return "header checksum mismatch"
        return None


@dataclass(slots=True, frozen=True)
class FrameHeader:
    page: int
    commit_size: int  # database size in pages after this commit; 0: not a commit frame
    salt1: int
    salt2: int
    checksum1: int
    checksum2: int

    @property
    def is_commit(self) -> bool:
        return self.commit_size != 0


class WalState(enum.Enum):
    EMPTY = "empty"  # no header SQLite accepts, and no committed frame behind it
    INTACT = "intact"  # every whole frame valid up to the end or an older generation's frames
    TORN_TAIL = "torn tail"  # invalid frames at the end, no valid commit frame after them
    DAMAGED = "damaged"  # a valid commit frame follows an invalid frame (or a bad header)


@dataclass(slots=True, frozen=True)
class WalScan:
    """A WAL file's bytes, judged as SQLite's recovery will read them.

    ``replayed_commits``: the transactions SQLite applies (commit frames of the valid prefix),
    ending at byte ``replayed_end``. ``damage_offset``/``damage_reason``: where and why SQLite
    stops (None if it reads every whole frame). ``later_commits``: offsets of valid commit
    frames past that point (see the module docstring): transactions SQLite would drop.
    ``commits_after_damage`` counts the commit frames past it whose salts match, valid or not:
    at least that many committed transactions would be lost."""

    size: int
    page_size: int
    header_valid: bool
    valid_frames: int
    replayed_commits: int
    replayed_end: int
    damage_offset: int | None
    damage_reason: str | None
    later_commits: tuple[int, ...]
    commits_after_damage: int
    partial_tail: int  # bytes of an incomplete frame at the end
    #: The first invalid frame belongs to an earlier generation of the log (module docstring).
    stale_tail: bool = False

    @property
    def state(self) -> WalState:
        if self.later_commits:
            return WalState.DAMAGED
        if not self.header_valid:
            return WalState.EMPTY
        if self.stale_tail:
            return WalState.INTACT
        if self.damage_offset is not None or self.partial_tail:
            return WalState.TORN_TAIL
        return WalState.INTACT

    @property
    def damaged(self) -> bool:
        return self.state is WalState.DAMAGED


def scan_wal(data: bytes, page_size_hint: int | None = None) -> WalScan:
    """Judge a WAL file's content (see the module docstring). Never raises."""
    view = memoryview(data)
    header = HEADER.unpack_from(data) if len(data) >= HEADER.size else None
    wal_header = WalHeader(*header) if header is not None else None
    problem = (
        "the file is shorter than a log header"
        if wal_header is None
        else wal_header.problem(data[: HEADER.size])
    )
    if wal_header is None or problem is not None:
        return _scan_without_header(view, wal_header, problem or "", page_size_hint)

    page_size, big_endian = wal_header.page_size, wal_header.big_endian
    frame_size = FRAME_HEADER.size + page_size
    frames = (len(data) - HEADER.size) // frame_size
    partial = (len(data) - HEADER.size) % frame_size
    salts = (wal_header.salt1, wal_header.salt2)

    s0, s1 = wal_header.checksum1, wal_header.checksum2
    valid = replayed_commits = 0
    replayed_end = HEADER.size
    damage_reason: str | None = None
    stale = False
    for k in range(frames):
        offset = _frame_offset(k, page_size)
        frame = FrameHeader(*FRAME_HEADER.unpack_from(data, offset))
        damage_reason = _frame_problem(view, offset, frame, salts, (s0, s1), page_size, big_endian)
        if damage_reason is not None:
            generations_back = (wal_header.salt1 - frame.salt1) & _MASK
            stale = 1 <= generations_back <= max(1, wal_header.checkpoint_seq)
            break
        s0, s1 = frame.checksum1, frame.checksum2
        valid += 1
        if frame.is_commit:
            replayed_commits += 1
            replayed_end = offset + frame_size

    if damage_reason is None:
        return WalScan(
            len(data), page_size, True, valid, replayed_commits, replayed_end,
            None, None, (), 0, partial,
        )  # fmt: skip
    later, after = _commits_after(view, valid, frames, page_size, big_endian, salts)
    return WalScan(
        len(data), page_size, True, valid, replayed_commits, replayed_end,
        _frame_offset(valid, page_size), f"frame {valid}: {damage_reason}", later, after, partial,
        stale,
    )  # fmt: skip


def _scan_without_header(
    view: memoryview, header: WalHeader | None, problem: str, page_size_hint: int | None
) -> WalScan:
    """A header SQLite rejects: it ignores the whole file. Committed frames behind it are
    found pairwise (each frame against the one before), in both byte orders."""
    size = len(view)
    page_size = header.page_size if header is not None else 0
    if not _is_page_size(page_size):
        page_size = page_size_hint if page_size_hint and _is_page_size(page_size_hint) else 0
    later: tuple[int, ...] = ()
    after = 0
    if page_size:
        frames = max(0, (size - HEADER.size) // (FRAME_HEADER.size + page_size))
        for big_endian in (False, True):
            found, counted = _commits_after(view, 0, frames, page_size, big_endian, None)
            if len(found) > len(later):
                later, after = found, counted
    return WalScan(
        size, page_size, False, 0, 0, 0, 0 if size else None,
        f"log header: {problem}" if size else None, later, after, 0,
    )  # fmt: skip


def _commits_after(
    view: memoryview,
    first_bad: int,
    frames: int,
    page_size: int,
    big_endian: bool,
    salts: tuple[int, int] | None,
) -> tuple[tuple[int, ...], int]:
    """Offsets of the valid commit frames after frame ``first_bad`` (each checked against the
    checksum stored in the frame before it), and how many frames after it, from
    ``first_bad`` on, carry a commit mark and the log's salts. ``salts`` None: the header is
    unusable, each frame's salts must equal those of the frame before."""
    later: list[int] = []
    marked = 0
    for k in range(first_bad, frames):
        offset = _frame_offset(k, page_size)
        frame = FrameHeader(*FRAME_HEADER.unpack_from(view, offset))
        if k == 0:
            if salts is not None and frame.is_commit and (frame.salt1, frame.salt2) == salts:
                marked += 1
            continue
        before = FrameHeader(
            *FRAME_HEADER.unpack_from(view, offset - FRAME_HEADER.size - page_size)
        )
        expected = salts if salts is not None else (before.salt1, before.salt2)
        if not frame.is_commit or (frame.salt1, frame.salt2) != expected:
            continue
        marked += 1
        if k == first_bad:
            continue  # the invalid frame itself
        seed = (before.checksum1, before.checksum2)
        if _frame_problem(view, offset, frame, expected, seed, page_size, big_endian) is None:
            later.append(offset)
    return tuple(later), marked


def _frame_problem(
    view: memoryview,
    offset: int,
    frame: FrameHeader,
    salts: tuple[int, int],
    seed: tuple[int, int],
    page_size: int,
    big_endian: bool,
) -> str | None:
    """Why the frame at ``offset`` is not valid given the salts and checksum seed (None: it
    is): SQLite's walDecodeFrame."""
    if (frame.salt1, frame.salt2) != salts:
        return "its salts differ from the log header's (not written in this log generation)"
    if frame.page == 0:
        return "page number 0"
    s0, s1 = wal_checksum(view[offset : offset + 8], *seed, big_endian)
    page = offset + FRAME_HEADER.size
    if wal_checksum(view[page : page + page_size], s0, s1, big_endian) != (
        frame.checksum1,
        frame.checksum2,
    ):
        return "checksum mismatch"
    return None


def _frame_offset(k: int, page_size: int) -> int:
    return HEADER.size + k * (FRAME_HEADER.size + page_size)


def _is_page_size(n: int) -> bool:
    return 512 <= n <= 65536 and n & (n - 1) == 0
