"""The cursor state's encodings (metadata JSON and cursor-ledger binary) and its bounds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.ledger.ack_ranges import AckRanges
from magnetar.broker.ledger.cursor_state import (
    MAX_METADATA_BYTES,
    CursorRecord,
    CursorState,
    CursorStateError,
    bounded,
    decode,
    encode,
    encode_within,
    fits_metadata,
    from_json,
    to_json,
)
from magnetar.broker.model.position import Position

positions = st.builds(Position, st.integers(0, 2**40), st.integers(0, 2**20))
small_positions = st.builds(Position, st.integers(0, 4), st.integers(0, 60))


@st.composite
def states(draw: st.DrawFn) -> CursorState:
    acked = AckRanges()
    for p in draw(st.lists(st.one_of(small_positions, positions), max_size=80)):
        acked.add(p)
    batches = draw(
        st.dictionaries(
            st.one_of(small_positions, positions),
            st.sets(st.integers(0, 5000), min_size=1, max_size=20),
            max_size=10,
        )
    )
    md = draw(st.builds(Position, st.integers(-1, 3), st.integers(-1, 100)))
    return CursorState.of(md, acked, batches)


@given(states())
def test_binary_round_trip(state: CursorState) -> None:
    assert decode(encode(state)) == state


@given(states())
def test_json_round_trip(state: CursorState) -> None:
    assert from_json(json.loads(json.dumps(to_json(state)))) == state


@given(states(), st.integers(0, 40))
def test_keep_ranges_only_drops_acks(state: CursorState, count: int) -> None:
    kept = state.keep_ranges(count)
    assert kept.mark_delete == state.mark_delete
    assert set(kept.acked()) <= set(state.acked())
    assert set(kept.batch_acks) <= set(state.batch_acks)
    assert len(kept.ranges) == min(count, len(state.ranges))


def every_other(count: int, ledger_id: int = 7) -> CursorState:
    acked = AckRanges.from_sorted((ledger_id, e, e) for e in range(1, 2 * count, 2))
    return CursorState.of(Position(ledger_id, -1), acked, {})


def test_fifty_thousand_holes_encode_small_and_exactly() -> None:
    state = every_other(50_000)
    data = encode(state)
    assert len(data) < 64 * 1024  # a few bytes per hole; far below one entry
    again = decode(data)
    assert again == state
    assert len(again.acked()) == 50_000


def test_metadata_bound_by_ranges_and_bytes() -> None:
    assert fits_metadata(every_other(1000), 1000)
    assert not fits_metadata(every_other(1001), 1000)
    # Huge batch-index sets stay out of the store even under the range bound.
    big = CursorState(Position(1, -1), (), ((Position(1, 5), tuple(range(200_000))),))
    assert not fits_metadata(big, 1000)
    cut, dropped = bounded(big, 1000)
    assert dropped and len(json.dumps(to_json(cut))) <= MAX_METADATA_BYTES
    cut, dropped = bounded(every_other(5000), 1000)
    assert dropped and len(cut.ranges) == 1000
    assert cut.ranges == every_other(5000).ranges[:1000]


def test_encode_within_keeps_the_lowest_ranges() -> None:
    state = CursorState.of(
        Position(1, -1),
        AckRanges.from_sorted((1, e, e) for e in range(1, 4000 * 997, 997)),
        {Position(1, 3_000_000): {1, 2}},
    )
    full = encode(state)
    data, written = encode_within(state, len(full) // 2)
    assert len(data) <= len(full) // 2
    assert 0 < len(written.ranges) < len(state.ranges)
    assert written.ranges == state.ranges[: len(written.ranges)]
    assert decode(data) == written
    assert not written.batch_acks  # above the first dropped range
    bare_data, bare = encode_within(state, 10)
    assert bare == CursorState(Position(1, -1)) and decode(bare_data) == bare


def test_above_drops_what_mark_delete_covers() -> None:
    state = CursorState.of(
        Position(1, 0),
        AckRanges.from_sorted([(1, 2, 5), (1, 8, 8), (2, 0, 3)]),
        {Position(1, 7): {0}, Position(2, 9): {1}},
    )
    moved = state.above(Position(1, 3))
    assert moved.ranges == ((1, 4, 5), (1, 8, 8), (2, 0, 3))
    assert moved.batch_acks == ((Position(1, 7), (0,)), (Position(2, 9), (1,)))
    assert state.above(Position(0, 0)) is state


@pytest.mark.parametrize(
    "data",
    [b"", b"MCUR", b"XXXX" + bytes(40), encode(every_other(10))[:-3], b"MCUR\x09" + bytes(40)],
)
def test_damage_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(CursorStateError):
        decode(data)


def test_from_sorted_refuses_unsorted() -> None:
    with pytest.raises(ValueError):
        AckRanges.from_sorted([(1, 5, 6), (1, 7, 8)])  # adjacent: should have been one range
    with pytest.raises(ValueError):
        AckRanges.from_sorted([(2, 0, 0), (1, 0, 0)])
    assert len(AckRanges.from_sorted([(1, 0, 3), (1, 5, 5), (2, 0, 0)])) == 6


@given(states(), st.integers(0, 2**40))
def test_a_record_holding_the_state_reads_back_as_written(state: CursorState, epoch: int) -> None:
    record = CursorRecord.holding("sub", epoch, state)
    assert CursorRecord.from_bytes(record.to_bytes()) == record
    # The format stored before cursor ledgers existed: the state's fields beside name and epoch.
    assert json.loads(record.to_bytes()) == {"name": "sub", "epoch": epoch, **to_json(state)}


@given(positions, st.integers(1, 2**40), st.integers(0, 2**40))
def test_a_record_naming_a_cursor_ledger_reads_back_as_written(
    mark_delete: Position, ledger_id: int, epoch: int
) -> None:
    record = CursorRecord.naming("sub", epoch, mark_delete, ledger_id)
    read = CursorRecord.from_bytes(record.to_bytes())
    assert read == record
    assert read.state is None and read.cursor_ledger == ledger_id


def test_a_record_without_an_epoch_is_from_the_first_owner() -> None:
    old = json.dumps({"name": "sub", "mark_delete": [3, 4], "acked": [], "batch_acks": []})
    assert CursorRecord.from_bytes(old.encode()).epoch == 0
