"""The source's offset arithmetic over ledgers, without Spark or a broker (``spark/offsets.py``)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.spark.offsets import (
    EARLIEST,
    EntryPosition,
    LedgerExtent,
    OffsetError,
    advance,
    entries_after,
    entry_at_or_before,
    is_lost,
    last_position,
    normalize,
    parse_starting,
    share_limit,
    split_range,
)

LEDGERS = (LedgerExtent(10, 3), LedgerExtent(12, 0), LedgerExtent(15, 4))
ALL = [EntryPosition(10, e) for e in range(3)] + [EntryPosition(15, e) for e in range(4)]

ledger_lists = st.lists(st.integers(0, 6), min_size=1, max_size=5).map(
    lambda counts: tuple(LedgerExtent(100 + 3 * i, n) for i, n in enumerate(counts))
)


def stored(ledgers: tuple[LedgerExtent, ...]) -> list[EntryPosition]:
    return [EntryPosition(x.ledger, e) for x in ledgers for e in range(x.entries)]


def test_counting_and_advancing_skip_empty_ledgers() -> None:
    assert last_position(LEDGERS) == EntryPosition(15, 3)
    assert entries_after(EARLIEST, LEDGERS) == 7
    assert entries_after(EntryPosition(10, 2), LEDGERS) == 4
    assert advance(EntryPosition(10, 1), 2, LEDGERS) == EntryPosition(15, 0)
    assert advance(EARLIEST, 100, LEDGERS) == EntryPosition(15, 3)
    assert advance(EntryPosition(15, 3), 5, LEDGERS) == EntryPosition(15, 3)


@given(ledger_lists, st.data())
def test_advance_walks_the_stored_entries_in_order(ledgers, data) -> None:
    entries = stored(ledgers)
    start_index = data.draw(st.integers(-1, len(entries) - 1))
    start = EARLIEST if start_index < 0 else entries[start_index]
    count = data.draw(st.integers(0, len(entries) + 2))
    assert entries_after(start, ledgers) == len(entries) - start_index - 1
    end = advance(start, count, ledgers)
    expected_index = min(start_index + count, len(entries) - 1)
    assert end == (start if expected_index == start_index else entries[expected_index])


def test_normalize_moves_past_the_end_of_a_closed_ledger_only() -> None:
    assert normalize(EntryPosition(10, 2), LEDGERS) == EntryPosition(12, -1)
    assert normalize(EntryPosition(10, 1), LEDGERS) == EntryPosition(10, 1)
    assert normalize(EntryPosition(15, 3), LEDGERS) == EntryPosition(15, 3)  # the open ledger
    # Nothing stored between the old and the moved position.
    assert entries_after(EntryPosition(10, 2), LEDGERS) == entries_after(
        EntryPosition(12, -1), LEDGERS
    )


def test_lost_when_the_ledger_is_gone() -> None:
    assert not is_lost(EARLIEST, LEDGERS)
    assert not is_lost(EntryPosition(12, -1), LEDGERS)
    assert is_lost(EntryPosition(9, 5), LEDGERS)  # retention deleted ledger 9
    assert is_lost(EntryPosition(10, 1), (LedgerExtent(20, 1),))  # the topic made again


@given(st.integers(0, 50), st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 30)))
def test_share_limit_uses_the_budget_and_never_more_than_available(limit, available) -> None:
    shares = share_limit(limit, available)
    assert all(0 <= shares[n] <= available[n] for n in available)
    assert sum(shares.values()) == min(limit, sum(available.values()))


@given(ledger_lists, st.data())
def test_split_range_cuts_a_range_into_consecutive_pieces(ledgers, data) -> None:
    entries = stored(ledgers)
    begin_index = data.draw(st.integers(-1, len(entries) - 1))
    stop_index = data.draw(st.integers(begin_index, len(entries) - 1))
    begin = EARLIEST if begin_index < 0 else entries[begin_index]
    stop = EARLIEST if stop_index < 0 else entries[stop_index]
    size = data.draw(st.integers(1, 8))
    pieces = split_range(begin, stop, ledgers, size)
    assert pieces[0][0] == begin and pieces[-1][1] == stop
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))  # no gap
    counts = [entries_after(a, ledgers) - entries_after(b, ledgers) for a, b in pieces]
    assert sum(counts) == stop_index - begin_index  # every entry in exactly one piece
    assert all(0 < n <= size for n in counts) or counts == [0]
    assert len(pieces) == max(1, -(-(stop_index - begin_index) // size))


def test_parse_starting_offsets() -> None:
    names = ["t-partition-0", "t-partition-1"]
    assert parse_starting("latest", names) == dict.fromkeys(names, "latest")
    assert parse_starting('{"t-partition-1": {"ledger": 5, "entry": 2}}', names) == {
        "t-partition-0": "earliest",
        "t-partition-1": EntryPosition(5, 2),
    }
    with pytest.raises(OffsetError):
        parse_starting('{"t-partition-0": 7}', names)
    with pytest.raises(OffsetError):
        parse_starting("yesterday", names)


def test_entry_at_or_before_a_ledger_start_is_the_last_entry_before_it() -> None:
    ledgers = [LedgerExtent(1, 5), LedgerExtent(2, 0), LedgerExtent(3, 0)]
    assert entry_at_or_before(EntryPosition(3, -1), ledgers) == EntryPosition(1, 4)
    assert entry_at_or_before(EntryPosition(1, 2), ledgers) == EntryPosition(1, 2)
    assert entry_at_or_before(EntryPosition(1, -1), ledgers) == EntryPosition(1, -1)
