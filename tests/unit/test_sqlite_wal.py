"""The WAL scan of the embedded metadata store (common/metadata/sqlite_wal.py) on real logs:
SQLite writes them (checkpoints off, the ``-wal`` file copied before the connection closes),
the tests damage them, and SQLite's own recovery of the same bytes is the referee for what it
replays. The rule under test: a torn tail is never called damage, and a valid commit after a
damaged frame always is."""

from __future__ import annotations

import random
import sqlite3
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magnetar.common.metadata.sqlite_wal import (
    FRAME_HEADER,
    HEADER,
    MAGIC_BE,
    WalState,
    scan_wal,
    wal_checksum,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class RealWal:
    """A database whose table ``t`` was created and checkpointed, then ``transactions``
    commits (rows tagged 1..n) left in the log ``wal``."""

    db: bytes
    wal: bytes
    page_size: int
    transactions: int

    @property
    def frame_size(self) -> int:
        return FRAME_HEADER.size + self.page_size

    @property
    def frames(self) -> int:
        return (len(self.wal) - HEADER.size) // self.frame_size

    def offset(self, frame: int) -> int:
        return HEADER.size + frame * self.frame_size

    def commit_frames(self) -> list[int]:
        return [
            k
            for k in range(self.frames)
            if FRAME_HEADER.unpack_from(self.wal, self.offset(k))[1] != 0
        ]


def make_wal(row_sizes: list[list[int]], page_size: int, seed: int) -> RealWal:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.db"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute(f"PRAGMA page_size={page_size}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")
            conn.execute("CREATE TABLE t (txn INTEGER NOT NULL, v BLOB NOT NULL)")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            for txn, sizes in enumerate(row_sizes, 1):
                conn.execute("BEGIN")
                for size in sizes:
                    conn.execute("INSERT INTO t VALUES (?, ?)", (txn, rng.randbytes(size)))
                conn.execute("COMMIT")
            db, wal = path.read_bytes(), Path(f"{path}-wal").read_bytes()
        finally:
            conn.close()
    return RealWal(db, wal, page_size, len(row_sizes))


def sqlite_replays(db: bytes, wal: bytes) -> int:
    """How many of the logged transactions SQLite's recovery applies to these bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.db"
        path.write_bytes(db)
        Path(f"{path}-wal").write_bytes(wal)
        conn = sqlite3.connect(path)
        try:
            return conn.execute("SELECT coalesce(max(txn), 0) FROM t").fetchone()[0]
        finally:
            conn.close()


def _frame_of(w: RealWal, offset: int) -> int:
    return -1 if offset < HEADER.size else (offset - HEADER.size) // w.frame_size


def garble(data: bytes, start: int, end: int, seed: int) -> bytes:
    """``data`` with every byte in [start, end) changed (XOR with a nonzero byte)."""
    rng = random.Random(seed)
    out = bytearray(data)
    for i in range(start, end):
        out[i] ^= rng.randrange(1, 256)
    return bytes(out)


transactions = st.lists(
    st.lists(st.integers(1, 6000), min_size=1, max_size=4), min_size=1, max_size=12
)
page_sizes = st.sampled_from([512, 1024, 4096])


@st.composite
def real_wals(draw: st.DrawFn, min_transactions: int = 1) -> RealWal:
    rows = draw(transactions.filter(lambda t: len(t) >= min_transactions))
    return make_wal(rows, draw(page_sizes), draw(st.integers(0, 2**32)))


@SETTINGS
@given(real_wals())
def test_an_intact_log_is_read_as_sqlite_reads_it(w: RealWal) -> None:
    scan = scan_wal(w.wal)
    assert scan.state is WalState.INTACT
    assert scan.valid_frames == w.frames and scan.partial_tail == 0
    assert scan.replayed_commits == w.transactions == len(w.commit_frames())
    assert sqlite_replays(w.db, w.wal) == w.transactions


@SETTINGS
@given(real_wals(), st.data())
def test_a_log_cut_anywhere_is_a_torn_tail_never_damage(w: RealWal, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(w.wal) - 1))
    scan = scan_wal(w.wal[:cut])
    assert scan.state in (WalState.EMPTY, WalState.INTACT, WalState.TORN_TAIL)
    assert not scan.damaged
    assert scan.replayed_commits == sqlite_replays(w.db, w.wal[:cut])


@SETTINGS
@given(real_wals(), st.data())
def test_damage_inside_the_last_frame_is_a_torn_tail(w: RealWal, data: st.DataObject) -> None:
    last = w.offset(w.frames - 1)
    start = data.draw(st.integers(last, len(w.wal) - 1))
    end = data.draw(st.integers(start + 1, len(w.wal)))
    damaged = garble(w.wal, start, end, data.draw(st.integers(0, 2**32)))
    scan = scan_wal(damaged)
    assert scan.state is WalState.TORN_TAIL
    assert scan.damage_offset == last and scan.later_commits == ()
    assert scan.replayed_commits == sqlite_replays(w.db, damaged) == w.transactions - 1


@SETTINGS
@given(real_wals(min_transactions=3), st.data())
def test_a_valid_commit_after_damage_is_always_found(w: RealWal, data: st.DataObject) -> None:
    """Damage anywhere but the header, with a commit frame past it whose frame and the frame
    before it are untouched: refused, and SQLite would indeed lose committed transactions."""
    commits = w.commit_frames()
    start = data.draw(st.integers(HEADER.size, w.offset(commits[-1] - 1) - 1))
    end = data.draw(st.integers(start + 1, w.offset(commits[-1] - 1)))
    damaged = garble(w.wal, start, end, data.draw(st.integers(0, 2**32)))
    scan = scan_wal(damaged)
    assert scan.state is WalState.DAMAGED, scan
    first_bad = (start - HEADER.size) // w.frame_size
    assert scan.damage_offset == w.offset(first_bad)
    assert w.offset(commits[-1]) in scan.later_commits
    replayed = sqlite_replays(w.db, damaged)
    assert scan.replayed_commits == replayed < w.transactions
    assert scan.commits_after_damage >= len(scan.later_commits) >= 1


@SETTINGS
@given(real_wals(min_transactions=2), st.data())
def test_a_damaged_header_with_commits_behind_it_is_found(w: RealWal, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, HEADER.size - 1))
    end = data.draw(st.integers(start + 1, HEADER.size))
    damaged = garble(w.wal, start, end, data.draw(st.integers(0, 2**32)))
    scan = scan_wal(damaged, page_size_hint=w.page_size)
    assert not scan.header_valid
    assert sqlite_replays(w.db, damaged) == 0  # SQLite ignores the whole log
    if any(k >= 1 for k in w.commit_frames()):
        assert scan.state is WalState.DAMAGED


@SETTINGS
@given(real_wals(), st.data())
def test_any_damage_sqlite_and_the_scan_agree_on_what_is_replayed(
    w: RealWal, data: st.DataObject
) -> None:
    damaged = w.wal
    touched: set[int] = set()  # frame indexes, -1 for the header
    for _ in range(data.draw(st.integers(1, 3))):
        start = data.draw(st.integers(0, len(damaged) - 1))
        end = data.draw(st.integers(start + 1, min(len(damaged), start + 3 * w.frame_size)))
        damaged = garble(damaged, start, end, data.draw(st.integers(0, 2**32)))
        touched |= {_frame_of(w, i) for i in (start, end - 1)}
        touched |= set(range(_frame_of(w, start), _frame_of(w, end - 1)))
    if data.draw(st.booleans()):
        damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    scan = scan_wal(damaged, page_size_hint=w.page_size)
    assert scan.replayed_commits == sqlite_replays(w.db, damaged)
    # Every commit SQLite drops whose frame and the frame before it are whole and untouched
    # is seen: then the log is called damaged.
    first_bad = scan.valid_frames if scan.header_valid else 0
    seen = [
        c
        for c in w.commit_frames()
        if c > first_bad and w.offset(c + 1) <= len(damaged) and not touched & {c - 1, c}
    ]
    if scan.damage_offset is not None and seen:
        assert scan.state is WalState.DAMAGED, (scan, seen, touched)


def test_the_older_generation_left_behind_a_restarted_log_is_not_damage() -> None:
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.db"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")
            conn.execute("CREATE TABLE t (txn INTEGER NOT NULL, v BLOB NOT NULL)")
            for txn in range(1, 21):
                conn.execute("INSERT INTO t VALUES (?, ?)", (txn, rng.randbytes(3000)))
            busy, logged, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            assert busy == 0 and logged == done
            for txn in range(21, 24):  # restarts the log at its start: the rest stays behind
                conn.execute("INSERT INTO t VALUES (?, ?)", (txn, b"x"))
            wal = Path(f"{path}-wal").read_bytes()
        finally:
            conn.close()
    scan = scan_wal(wal)
    assert scan.stale_tail and scan.state is WalState.INTACT
    assert scan.replayed_commits == 3 and scan.damage_offset is not None
    # Damage to the new generation with its commits behind it is still found.
    assert scan_wal(garble(wal, HEADER.size + 30, HEADER.size + 40, 1)).damaged


def reencode_big_endian(wal: bytes, page_size: int) -> bytes:
    """The same log as SQLite on a big-endian machine writes it: magic 0x377f0683 and every
    checksum over big-endian words."""
    out = bytearray(wal)
    struct.pack_into(">I", out, 0, MAGIC_BE)
    s = wal_checksum(bytes(out[:24]), 0, 0, True)
    struct.pack_into(">II", out, 24, *s)
    frame_size = FRAME_HEADER.size + page_size
    for offset in range(HEADER.size, len(out) - frame_size + 1, frame_size):
        s = wal_checksum(bytes(out[offset : offset + 8]), *s, True)
        s = wal_checksum(bytes(out[offset + 24 : offset + frame_size]), *s, True)
        struct.pack_into(">II", out, offset + 16, *s)
    return bytes(out)


@settings(max_examples=20, deadline=None)
@given(real_wals(min_transactions=2))
def test_big_endian_checksums_as_sqlite_reads_them(w: RealWal) -> None:
    wal = reencode_big_endian(w.wal, w.page_size)
    assert sqlite_replays(w.db, wal) == w.transactions  # SQLite accepts our big-endian sums
    assert scan_wal(wal).state is WalState.INTACT
    commits = w.commit_frames()
    damaged = garble(wal, w.offset(0) + 30, w.offset(0) + 31, 0)
    if commits[-1] >= 2:
        assert scan_wal(damaged).damaged


def test_short_and_empty_files() -> None:
    assert scan_wal(b"").state is WalState.EMPTY
    short = scan_wal(b"\x37\x7f\x06\x82")
    assert short.state is WalState.EMPTY and not short.damaged
    assert scan_wal(bytes(5000), page_size_hint=4096).state is WalState.EMPTY
