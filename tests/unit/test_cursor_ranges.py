"""AckRanges (the cursor's ack-hole bookkeeping) against a plain set of positions."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.ledger.ack_ranges import AckRanges
from magnetar.broker.model.position import Position

positions = st.builds(Position, st.integers(0, 3), st.integers(0, 40))
operations = st.lists(st.tuples(st.sampled_from(["add", "remove_through"]), positions), max_size=80)


def check_invariants(ranges: AckRanges) -> None:
    triples = ranges.ranges()
    assert triples == sorted(triples)
    for _, first, last in triples:
        assert first <= last
    for (l1, _, last1), (l2, first2, _) in itertools.pairwise(triples):
        # Disjoint and not adjacent within a ledger: adjacent ranges must have been merged.
        assert l1 < l2 or first2 > last1 + 1


@given(operations)
def test_matches_a_set_of_positions(ops: list[tuple[str, Position]]) -> None:
    ranges = AckRanges()
    model: set[Position] = set()
    for op, position in ops:
        if op == "add":
            assert ranges.add(position) == (position not in model)
            model.add(position)
        else:
            ranges.remove_through(position)
            model = {p for p in model if p > position}
        check_invariants(ranges)
        assert set(ranges) == model
        assert len(ranges) == len(model)
    for ledger_id in range(4):
        for entry_id in range(41):
            p = Position(ledger_id, entry_id)
            assert (p in ranges) == (p in model)
            found = ranges.range_of(p)
            if p in model:
                assert found is not None and found[0] == ledger_id
                assert found[1] <= entry_id <= found[2]
            else:
                assert found is None


@given(st.lists(positions, max_size=60))
def test_json_round_trip(added: list[Position]) -> None:
    ranges = AckRanges()
    for p in added:
        ranges.add(p)
    again = AckRanges.from_json(ranges.to_json())
    assert again.ranges() == ranges.ranges()
    assert set(again) == set(added)


def test_consecutive_entries_form_one_range_per_ledger() -> None:
    ranges = AckRanges()
    for entry_id in [5, 3, 4, 7, 6]:
        ranges.add(Position(1, entry_id))
    ranges.add(Position(2, 0))
    assert ranges.ranges() == [(1, 3, 7), (2, 0, 0)]
    ranges.remove_through(Position(1, 4))
    assert ranges.ranges() == [(1, 5, 7), (2, 0, 0)]


@given(st.lists(positions, max_size=60), positions)
def test_count_and_from_sorted_agree(added: list[Position], cut: Position) -> None:
    ranges = AckRanges()
    for p in added:
        ranges.add(p)
    ranges.remove_through(cut)
    assert len(ranges) == len(set(ranges))
    again = AckRanges.from_sorted(ranges.ranges())
    assert again.ranges() == ranges.ranges() and len(again) == len(ranges)


@given(st.lists(positions, max_size=40), st.lists(st.lists(positions, max_size=30), max_size=6))
def test_add_all_is_adding_each(first: list[Position], groups: list[list[Position]]) -> None:
    """A grouped ACK applied as runs gives the ranges adding its positions one by one gives."""
    one_by_one = AckRanges()
    grouped = AckRanges()
    for p in first:
        one_by_one.add(p)
        grouped.add(p)
    for group in groups:
        before = set(one_by_one)
        for p in group:
            one_by_one.add(p)
        assert grouped.add_all(group) == bool(set(group) - before)
        check_invariants(grouped)
        assert grouped.ranges() == one_by_one.ranges()
        assert len(grouped) == len(one_by_one)


@given(st.lists(positions, max_size=60), st.lists(positions, max_size=60))
def test_without_drops_exactly_the_positions_held(
    added: list[Position], read: list[Position]
) -> None:
    """``without`` (the cursor's filter of what it read) keeps an entry exactly when its
    position is not in a range, for any sorted run of entries (gaps, several ledgers)."""
    ranges = AckRanges()
    ranges.add_all(added)
    entries = [(p, f"data {p}") for p in sorted(set(read))]
    assert ranges.without(entries) == [(p, d) for p, d in entries if p not in set(added)]
