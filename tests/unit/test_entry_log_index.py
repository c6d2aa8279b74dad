"""The entry log and the index together: where a flush writes runs of entries and how the
index finds each again (one statement per run, the offsets worked out by SQLite)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.bookie.entry_logger import EntryLogger
from magnetar.bookie.index import LedgerIndex, rebuild_index
from magnetar.common.ledger.entry import encode_entry

# A run: (ledger id, first entry id, gaps between its ids (0: consecutive), payload sizes).
_runs = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 2**40),
        st.booleans(),
        st.lists(st.integers(0, 700), min_size=1, max_size=40),
    ),
    min_size=1,
    max_size=6,
)


def _entries(
    runs: list[tuple[int, int, bool, list[int]]],
) -> list[tuple[int, list[int], list[bytes]]]:
    out = []
    for ledger, first, gaps, sizes in runs:
        ledger_id = 2**62 + ledger if ledger == 3 else ledger + 1
        ids = [first + (3 * i if gaps else i) for i in range(len(sizes))]
        entries = [
            encode_entry(ledger_id, entry_id, -1, size, bytes([entry_id % 251]) * size)
            for entry_id, size in zip(ids, sizes, strict=True)
        ]
        out.append((ledger_id, range(ids[0], ids[-1] + 1) if not gaps else ids, entries))
    return out


@settings(max_examples=60, deadline=None)
@given(_runs, st.sampled_from([600, 4000, 1 << 30]))
def test_every_entry_of_a_flush_is_found_where_it_was_written(
    runs: list[tuple[int, int, bool, list[int]]], max_bytes: int
) -> None:
    """Runs cut where a log fills (a 600-byte log holds a few entries) and into writes,
    with consecutive and with listed ids; a later copy of an entry wins, as it does when a
    flush writes an entry again."""
    with tempfile.TemporaryDirectory() as tmp:
        logger = EntryLogger(Path(tmp) / "logs", max_bytes)
        logger.open()
        index = LedgerIndex(Path(tmp) / "index.db")
        try:
            written = _entries(runs)
            placed = logger.append(written)
            index.commit_flush(placed, 7)
            latest = {}
            for ledger_id, ids, entries in written:
                for entry_id, entry in zip(ids, entries, strict=True):
                    latest[(ledger_id, entry_id)] = entry
            for (ledger_id, entry_id), entry in latest.items():
                found = index.lookup(ledger_id, entry_id)
                assert found is not None, (ledger_id, entry_id)
                log_id, offset, length = found
                assert length == len(entry)
                assert logger.read(log_id, offset, length) == entry
            assert index.checkpoint_mark() == 7
            total = sum(len(e) + 4 for _l, _i, entries in written for e in entries)
            usage = index.log_usage()
            assert sum(sum(by_ledger.values()) for by_ledger in usage.values()) == total
            assert sum(len(run[4]) for run in placed) == sum(len(r[2]) for r in written)
            per_log: dict[int, int] = {}
            for run in placed:
                per_log[run[2]] = per_log.get(run[2], 0) + len(run[4])
            for log_id, count in per_log.items():  # full logs were left for new ones
                size = (Path(tmp) / "logs" / f"{log_id:08x}.log").stat().st_size
                assert size <= max_bytes or count == 1

            # A rebuild from the logs alone (scanned records grouped into runs) agrees.
            (Path(tmp) / "rebuilt").mkdir()
            report = rebuild_index(Path(tmp) / "rebuilt", Path(tmp) / "logs")
            assert report.entries == sum(len(run[4]) for run in placed)
            rebuilt = LedgerIndex(Path(tmp) / "rebuilt" / "index.db")
            try:
                for key in latest:
                    assert rebuilt.lookup(*key) == index.lookup(*key)
            finally:
                rebuilt.close()
        finally:
            index.close()
            logger.close()


def test_a_run_too_large_for_one_write_is_written_in_pieces(tmp_path: Path) -> None:
    logger = EntryLogger(tmp_path / "logs", 1 << 30)
    logger.open()
    index = LedgerIndex(tmp_path / "index.db")
    try:
        entries = [encode_entry(5, i, -1, 0, bytes([i % 251]) * 3000) for i in range(1000)]
        placed = logger.append([(5, range(1000), entries)])
        assert len(placed) > 2  # three megabytes, about a megabyte per write
        assert [i for run in placed for i in run[1]] == list(range(1000))
        index.commit_flush(placed, None)
        for i in (0, 349, 350, 999):
            log_id, offset, length = index.lookup(5, i)  # type: ignore[misc]
            assert logger.read(log_id, offset, length) == entries[i]
    finally:
        index.close()
        logger.close()
