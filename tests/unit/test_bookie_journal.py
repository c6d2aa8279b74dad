"""The journal record format, replay of torn / corrupt files, and the group-committing writer."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.bookie import journal as jnl
from magnetar.bookie.journal import MAGIC, Journal, JournalError, RecordType

records_st = st.lists(
    st.tuples(st.sampled_from(list(RecordType)), st.binary(max_size=300)),
    max_size=12,
)


def write_file(directory: Path, file_id: int, content: bytes) -> Path:
    path = directory / jnl.file_name(file_id)
    path.write_bytes(content)
    return path


def encoded(records: list[tuple[RecordType, bytes]]) -> bytes:
    return b"".join(jnl.encode_record(kind, data) for kind, data in records)


def replayed(directory: Path, from_file_id: int = 0) -> list[tuple[int, RecordType, bytes]]:
    return [(r.file_id, r.kind, r.data) for r in jnl.replay(directory, from_file_id)]


def test_record_layout() -> None:
    import crc32c

    record = jnl.encode_record(RecordType.ADD, b"abc")
    assert record[:4] == (4).to_bytes(4, "big")
    assert record[4:8] == crc32c.crc32c(b"\x01abc").to_bytes(4, "big")
    assert record[8:] == b"\x01abc"
    assert jnl.file_name(0x1F) == "000000000000001f.jnl"


@given(records=records_st)
@settings(max_examples=60)
def test_replay_returns_every_record_in_order(records: list[tuple[RecordType, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        content = MAGIC + encoded(records)
        path = write_file(directory, 3, content)
        assert replayed(directory) == [(3, kind, data) for kind, data in records]
        assert path.read_bytes() == content  # nothing to cut


@given(
    records=st.lists(
        st.tuples(st.sampled_from(list(RecordType)), st.binary(max_size=40)), min_size=1, max_size=5
    )
)
@settings(max_examples=25, deadline=None)
def test_journal_cut_at_every_offset_of_its_last_record(
    records: list[tuple[RecordType, bytes]],
) -> None:
    whole = MAGIC + encoded(records[:-1])
    last = jnl.encode_record(*records[-1])
    expected = [(0, kind, data) for kind, data in records[:-1]]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for cut in range(1, len(last)):
            path = write_file(directory, 0, whole + last[:cut])
            assert replayed(directory) == expected, f"cut after {cut} of {len(last)} bytes"
            assert path.read_bytes() == whole, f"file not cut back after a {cut}-byte tail"
            # The cut file now replays cleanly, and stays as it is.
            assert replayed(directory) == expected
            assert path.read_bytes() == whole


@given(
    records=records_st,
    garbage=st.binary(min_size=1, max_size=64),
)
@settings(max_examples=80)
def test_garbage_after_the_last_record_is_cut(
    records: list[tuple[RecordType, bytes]], garbage: bytes
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        whole = MAGIC + encoded(records)
        path = write_file(directory, 0, whole + garbage)
        assert replayed(directory) == [(0, kind, data) for kind, data in records]
        assert path.read_bytes() == whole


@given(
    records=st.lists(
        st.tuples(st.sampled_from(list(RecordType)), st.binary(max_size=50)), min_size=2, max_size=6
    ),
    data=st.data(),
)
@settings(max_examples=60)
def test_corrupt_record_is_cut_only_as_the_newest_files_tail(
    records: list[tuple[RecordType, bytes]], data: st.DataObject
) -> None:
    bad = data.draw(st.integers(min_value=0, max_value=len(records) - 1), label="bad record")
    before = MAGIC + encoded(records[:bad])
    target = bytearray(jnl.encode_record(*records[bad]))
    flip = data.draw(st.integers(min_value=0, max_value=len(target) - 1), label="byte")
    target[flip] ^= data.draw(st.integers(min_value=1, max_value=255), label="xor")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        path = write_file(directory, 0, before + bytes(target) + encoded(records[bad + 1 :]))
        if bad == len(records) - 1:  # nothing valid follows: a torn tail, cut
            assert replayed(directory) == [(0, kind, d) for kind, d in records[:bad]]
            assert path.read_bytes() == before
        else:  # valid records follow: damage, refused, file left as it was
            content = path.read_bytes()
            with pytest.raises(jnl.JournalDamageError) as err:
                replayed(directory)
            assert err.value.offset == len(before)
            assert path.read_bytes() == content


def test_unknown_record_type_ends_replay(tmp_path: Path) -> None:
    import crc32c

    body = b"\x09junk"
    bogus = len(body).to_bytes(4, "big") + crc32c.crc32c(body).to_bytes(4, "big") + body
    good = jnl.encode_record(RecordType.ADD, b"ok")
    path = write_file(tmp_path, 0, MAGIC + good + bogus)
    assert replayed(tmp_path) == [(0, RecordType.ADD, b"ok")]
    assert path.read_bytes() == MAGIC + good


def test_replay_spans_files_from_the_mark(tmp_path: Path) -> None:
    write_file(tmp_path, 1, b"NOTMAGIC")  # before the mark: not read
    write_file(tmp_path, 2, MAGIC + jnl.encode_record(RecordType.ADD, b"two"))
    write_file(tmp_path, 0x10, MAGIC + jnl.encode_record(RecordType.FENCE, b"sixteen"))
    write_file(tmp_path, 0x11, MAGIC[:3])  # torn header of the newest file, being created
    (tmp_path / "notes.txt").write_text("not a journal file")
    (tmp_path / "zz.jnl").write_text("name is not hex")
    assert replayed(tmp_path, from_file_id=2) == [
        (2, RecordType.ADD, b"two"),
        (0x10, RecordType.FENCE, b"sixteen"),
    ]
    assert jnl.list_journal_files(tmp_path) == [1, 2, 0x10, 0x11]


def test_bad_magic_is_damage(tmp_path: Path) -> None:
    write_file(tmp_path, 3, b"NOTMAGIC" + jnl.encode_record(RecordType.ADD, b"bad magic"))
    with pytest.raises(jnl.JournalDamageError, match="magic"):
        replayed(tmp_path)


def test_empty_directory_replays_nothing(tmp_path: Path) -> None:
    assert replayed(tmp_path) == []


# -- the writer ------------------------------------------------------------------------------


async def test_appends_are_durable_in_order_and_roll_splits_files(tmp_path: Path) -> None:
    synced: list[tuple[float, int, int]] = []
    journal = Journal(
        tmp_path, sync=True, max_group_wait=0.001, on_sync=lambda *a: synced.append(a)
    )
    await journal.start(5)
    first = [jnl.encode_record(RecordType.ADD, f"a{i}".encode()) for i in range(50)]
    ids = await asyncio.gather(*(journal.append(r) for r in first))
    assert set(ids) == {5}
    new_id = await journal.roll()
    assert new_id == 6
    second = [jnl.encode_record(RecordType.ADD, f"b{i}".encode()) for i in range(10)]
    ids = await asyncio.gather(*(journal.append(r) for r in second))
    assert set(ids) == {6}
    await journal.close()
    assert sum(records for _s, records, _b in synced) >= 60
    got = replayed(tmp_path)
    assert [(fid, d) for fid, _k, d in got] == [(5, f"a{i}".encode()) for i in range(50)] + [
        (6, f"b{i}".encode()) for i in range(10)
    ]
    assert journal.remove_files_before(6) == 1
    assert jnl.list_journal_files(tmp_path) == [6]
    with pytest.raises(JournalError):
        journal.append(b"")


async def test_file_size_limit_starts_new_files(tmp_path: Path) -> None:
    journal = Journal(tmp_path, sync=False, max_group_wait=0, max_file_bytes=200)
    await journal.start(0)
    payloads = [bytes([i]) * 60 for i in range(20)]
    for p in payloads:  # one at a time: each write is its own group
        await journal.append(jnl.encode_record(RecordType.ADD, p))
    await journal.close()
    files = jnl.list_journal_files(tmp_path)
    assert len(files) > 1
    assert [r.data for r in jnl.replay(tmp_path, 0)] == payloads


async def test_close_drains_queued_appends(tmp_path: Path) -> None:
    journal = Journal(tmp_path, sync=False, max_group_wait=0.05)
    await journal.start(0)
    futures = [journal.append(jnl.encode_record(RecordType.ADD, b"x%d" % i)) for i in range(100)]
    await journal.close()
    for f in futures:
        assert f.done()
        assert f.result() == 0
    assert len(list(jnl.replay(tmp_path, 0))) == 100
