"""Journal damage rules on plain bytes: a torn tail of the newest file is cut, anything else is
refused with the file and offset; repair drops exactly the damaged bytes and keeps the rest."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.bookie import journal as jnl
from magnetar.bookie.journal import MAGIC, RecordType


def records(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [
        jnl.encode_record(RecordType.ADD, rng.randbytes(rng.randint(20, 400))) for _ in range(n)
    ]


def write_file(directory: Path, file_id: int, content: bytes) -> Path:
    path = directory / jnl.file_name(file_id)
    path.write_bytes(content)
    return path


def test_clean_file_scans_without_damage() -> None:
    recs = records(10)
    scan = jnl.scan_journal_bytes(MAGIC + b"".join(recs))
    assert len(scan.records) == 10
    assert scan.damaged == []
    assert scan.torn_tail is None


def test_overwrite_in_the_middle_is_inner_damage_with_what_follows() -> None:
    recs = records(20)
    content = bytearray(MAGIC + b"".join(recs))
    offset = len(MAGIC) + sum(map(len, recs[:7])) + 5  # inside record 7
    content[offset : offset + 64] = random.Random(3).randbytes(64)
    scan = jnl.scan_journal_bytes(bytes(content))
    [damage] = scan.damaged
    assert damage.resumed and scan.torn_tail is None
    assert damage.offset == len(MAGIC) + sum(map(len, recs[:7]))
    # Every record untouched by the 64 bytes is still found, the later ones included.
    touched = {
        i
        for i in range(20)
        if len(MAGIC) + sum(map(len, recs[:i])) < offset + 64
        and len(MAGIC) + sum(map(len, recs[: i + 1])) > offset
    }
    assert len(scan.records) == 20 - len(touched)
    assert damage.end == len(MAGIC) + sum(map(len, recs[: max(touched) + 1]))
    assert jnl.damage_reason(scan, damage, newest=True) is not None


@given(cut=st.integers(min_value=1, max_value=200), seed=st.integers(0, 1000))
@settings(max_examples=40)
def test_torn_tail_is_cut_only_in_the_newest_file(cut: int, seed: int) -> None:
    recs = records(5, seed)
    whole = MAGIC + b"".join(recs)
    torn = whole[: len(whole) - min(cut, len(recs[-1]) - 1)]
    scan = jnl.scan_journal_bytes(torn)
    tail = scan.torn_tail
    assert tail is not None and tail.end == len(torn)
    assert tail.offset == len(whole) - len(recs[-1])
    assert len(scan.records) == 4
    assert jnl.damage_reason(scan, tail, newest=True) is None
    assert "not the newest" in (jnl.damage_reason(scan, tail, newest=False) or "")


def test_replay_refuses_inner_damage_naming_file_offset_and_the_way_forward(
    tmp_path: Path,
) -> None:
    current = tmp_path / "current"
    current.mkdir()
    recs = records(30)
    content = bytearray(MAGIC + b"".join(recs))
    at = len(content) // 2
    content[at : at + 64] = os.urandom(64)
    path = write_file(current, 4, bytes(content))
    with pytest.raises(jnl.JournalDamageError) as err:
        list(jnl.replay(current, 0))
    message = str(err.value)
    assert str(path) in message
    assert f"offset {err.value.offset}" in message
    assert err.value.offset <= at
    assert "restore" in message and f"journalrepair --journal-dir {tmp_path}" in message
    assert path.read_bytes() == bytes(content), "a refused file must be left as it was"


def test_replay_refuses_a_torn_tail_in_an_older_file(tmp_path: Path) -> None:
    recs = records(4)
    write_file(tmp_path, 1, MAGIC + b"".join(recs)[:-3])
    write_file(tmp_path, 2, MAGIC + records(2, seed=9)[0])
    with pytest.raises(jnl.JournalDamageError, match="not the newest"):
        list(jnl.replay(tmp_path, 0))


def test_repair_drops_the_damage_and_keeps_every_valid_record(tmp_path: Path) -> None:
    recs = records(40)
    content = bytearray(MAGIC + b"".join(recs))
    # Inside the body of record 13 only: its length field still says where record 14 starts.
    at = len(MAGIC) + sum(map(len, recs[:13])) + 12
    content[at : at + 4] = bytes(b ^ 0xFF for b in content[at : at + 4])
    older = write_file(tmp_path, 1, bytes(content))
    newest = write_file(tmp_path, 2, MAGIC + b"".join(records(3, seed=5))[:-7])
    before = jnl.scan_journal_bytes(bytes(content))

    planned = jnl.repair_journal(tmp_path, dry_run=True)
    assert older.read_bytes() == bytes(content), "a dry run changes nothing"
    dropped = jnl.repair_journal(tmp_path)
    assert dropped == planned
    assert [(d.path, d.torn_tail) for d in dropped] == [(older, False), (newest, True)]
    assert dropped[0].offset == before.damaged[0].offset
    assert dropped[0].length == before.damaged[0].length
    assert (dropped[0].length, dropped[0].records) == (len(recs[13]), 1)

    # The old content is kept aside; the repaired file replays in full.
    assert (tmp_path / (older.name + ".damaged")).read_bytes() == bytes(content)
    got = [r.data for r in jnl.replay(tmp_path, 0)]
    assert got[: len(before.records)] == [r.data for r in before.records]
    assert len(before.records) == 39
    assert len(got) == 39 + 2
    assert jnl.repair_journal(tmp_path) == [], "a repaired journal has nothing left to drop"


def test_a_torn_file_header_is_no_damage_wherever_it_is(tmp_path: Path) -> None:
    write_file(tmp_path, 1, MAGIC[:5])
    write_file(tmp_path, 2, MAGIC + jnl.encode_record(RecordType.ADD, b"two"))
    assert [r.data for r in jnl.replay(tmp_path, 0)] == [b"two"]
    assert jnl.repair_journal(tmp_path) == []
