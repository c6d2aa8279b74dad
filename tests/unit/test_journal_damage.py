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
from magnetar.common.ledger.entry import HEADER_SIZE, encode_entry


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


# -- what a torn tail held, and what its warning may claim ---------------------------------------


def entry(ledger: int, entry_id: int, lac: int, size: int = 100) -> bytes:
    return encode_entry(ledger, entry_id, lac, entry_id * size, bytes(size))


def ids(ledger: int, entry_id: int, lac: int) -> jnl.EntryIds:
    return jnl.EntryIds(ledger, entry_id, lac)


def test_a_cut_add_names_its_entry_when_the_header_survived() -> None:
    record = jnl.encode_record(RecordType.ADD, entry(7, 10, 9))
    torn = jnl.read_torn_tail(record[:-30])
    assert torn == jnl.TornTail(len(record) - 30, (ids(7, 10, 9),), (), unread=False)


def test_a_cut_inside_the_entry_header_names_nothing() -> None:
    record = jnl.encode_record(RecordType.ADD, entry(7, 10, 9))
    torn = jnl.read_torn_tail(record[:20])
    assert (torn.entries, torn.unread) == ((), True)
    message = jnl.torn_tail_message(Path("j/0001.jnl"), 64, torn, [])
    assert message.startswith(
        "20 trailing bytes of journal file j/0001.jnl (from offset 64) are not a whole record; cut."
    )
    assert "nothing shows which adds they held or whether any had been acknowledged" in message


def test_zeros_left_by_a_disk_name_nothing() -> None:
    torn = jnl.read_torn_tail(bytes(4096))
    assert (torn.entries, torn.fenced, torn.unread) == ((), (), True)


def test_a_cut_batch_names_the_entries_whose_headers_are_whole() -> None:
    entries = [entry(3, i, i - 1) for i in range(10, 15)]
    record = jnl.encode_add_batch(entries)
    header = 8 + 1 + 4 + 4 * len(entries)
    cut = header + 2 * len(entries[0]) + HEADER_SIZE  # entries 10 and 11 whole, 12's header
    torn = jnl.read_torn_tail(record[:cut])
    assert torn.entries == (ids(3, 10, 9), ids(3, 11, 10), ids(3, 12, 11))
    assert torn.unread  # 13 and 14 were in the record too, unnamed


def test_whole_records_failing_their_crc_are_read_on_to_the_cut_one() -> None:
    first = bytearray(jnl.encode_record(RecordType.FENCE, (5).to_bytes(8, "big")))
    first[4] ^= 0xFF  # its CRC no longer holds: the scan would count it damaged too
    second = jnl.encode_record(RecordType.ADD, entry(5, 0, -1))
    torn = jnl.read_torn_tail(bytes(first) + second[:-1])
    assert (torn.fenced, torn.entries, torn.unread) == ((5,), (ids(5, 0, -1),), False)


def test_headers_that_make_no_sense_are_not_reported() -> None:
    torn = jnl.read_torn_tail(jnl.encode_record(RecordType.ADD, entry(-4, 2, 1))[:-1])
    assert (torn.entries, torn.unread) == ((), True)


@given(data=st.binary(max_size=600))
@settings(max_examples=200)
def test_reading_a_torn_tail_never_raises(data: bytes) -> None:
    torn = jnl.read_torn_tail(data)
    assert torn.length == len(data)


@given(sizes=st.lists(st.integers(0, 120), min_size=1, max_size=6), data=st.data())
@settings(max_examples=100)
def test_a_torn_batch_names_exactly_the_entries_whose_header_it_holds(
    sizes: list[int], data: st.DataObject
) -> None:
    entries = [entry(9, i, i - 1, size) for i, size in enumerate(sizes)]
    record = jnl.encode_add_batch(entries)
    cut = data.draw(st.integers(1, len(record) - 1), label="bytes kept")
    torn = jnl.read_torn_tail(record[:cut])
    start = 8 + 1 + 4 + 4 * len(entries)
    whole = []
    for i, e in enumerate(entries):
        if start + HEADER_SIZE <= cut:
            whole.append(ids(9, i, i - 1))
        start += len(e)
    assert list(torn.entries) == whole
    assert torn.unread == (len(whole) < len(entries))


def test_a_later_entrys_lac_shows_which_cut_entries_were_acknowledged() -> None:
    torn = jnl.TornTail(999, (ids(7, 10, 9), ids(7, 11, 10), ids(8, 3, 2)), (), unread=False)
    # Nothing reaches 11 of ledger 7 or 3 of ledger 8; 11 carries LAC 10, so 10 was confirmed.
    assert jnl.acknowledged_in_tail(torn, []) == [jnl.AcknowledgedLoss(7, (10,), 10)]
    # A recovered entry with LAC 12 reaches both; one of another ledger says nothing of 7.
    later = [ids(7, 13, 12), ids(8, 2, 1), ids(9, 50, 49)]
    assert jnl.acknowledged_in_tail(torn, later) == [jnl.AcknowledgedLoss(7, (10, 11), 12)]
    # An entry some record kept is not lost, whatever the LAC.
    assert jnl.acknowledged_in_tail(torn, [*later, ids(7, 10, 9)]) == [
        jnl.AcknowledgedLoss(7, (11,), 12)
    ]


def test_the_message_says_what_is_known_and_no_more() -> None:
    torn = jnl.TornTail(300, (ids(7, 10, 9), ids(7, 11, 10), ids(7, 12, 11)), (), unread=True)
    quiet = jnl.torn_tail_message(Path("j.jnl"), 8, torn, [])
    assert (
        "300 trailing bytes of journal file j.jnl (from offset 8) are not a whole record" in quiet
    )
    assert "they held ledger 7 entries 10-12; bytes whose headers cannot be read." in quiet
    assert "No later entry's LAC in the journal shows any of them had been acknowledged" in quiet
    assert "not proof they were not" in quiet
    assert "unacknowledged" not in quiet

    loud = jnl.torn_tail_message(Path("j.jnl"), 8, torn, [jnl.AcknowledgedLoss(7, (10, 11), 12)])
    assert (
        "Acknowledged to their writer, yet no journal record keeps them: ledger 7 entries " in loud
    )
    assert "10-11 (an entry carries LAC 12)" in loud
    assert "No later entry's LAC" not in loud


def test_replay_warns_about_a_torn_tail_with_what_its_bytes_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kept = [jnl.encode_record(RecordType.ADD, entry(4, i, i - 1)) for i in range(3)]
    cut = jnl.encode_record(RecordType.ADD, entry(4, 3, 2))[:-10]
    path = write_file(tmp_path, 1, MAGIC + b"".join(kept) + cut)
    with caplog.at_level("WARNING", logger=jnl.__name__):
        assert len(list(jnl.replay(tmp_path, 0))) == 3
    [record] = [r for r in caplog.records if "trailing bytes" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert f"{len(cut)} trailing bytes of journal file {path}" in record.getMessage()
    assert "ledger 4 entry 3." in record.getMessage()
    assert "No later entry's LAC" in record.getMessage()
    assert path.stat().st_size == len(MAGIC) + sum(map(len, kept))


def test_replay_errs_when_a_lac_in_an_older_file_shows_cut_entries_were_acknowledged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Entries 5 and 6 reached this bookie late (re-sent after an ensemble change, say): entry 8,
    # written earlier, carries LAC 6, so its writer had both confirmed before the disk lost them.
    write_file(tmp_path, 1, MAGIC + jnl.encode_record(RecordType.ADD, entry(2, 8, 6)))
    batch = jnl.encode_add_batch([entry(2, 5, 4), entry(2, 6, 5), entry(2, 7, 6)])
    write_file(tmp_path, 2, MAGIC + batch[:-50])
    with caplog.at_level("WARNING", logger=jnl.__name__):
        list(jnl.replay(tmp_path, 0))
    [record] = [r for r in caplog.records if "trailing bytes" in r.getMessage()]
    assert record.levelname == "ERROR"
    assert "no journal record keeps them: ledger 2 entries 5-6 (an entry carries LAC 6)" in (
        record.getMessage()
    )
