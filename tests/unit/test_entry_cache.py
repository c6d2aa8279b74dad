"""The managed ledger's entry cache: a stored group goes in at once (``put_all``), as its entries
one by one (``put``) would: the oldest evicted first once over the budget, an entry larger than
the whole budget never kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.ledger.entry_cache import EntryCache
from magnetar.broker.model.position import Position

_GROUPS = st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=6), max_size=12)


@given(_GROUPS, st.integers(1, 150))
def test_a_group_goes_in_as_its_entries_one_by_one(groups: list[list[int]], budget: int) -> None:
    at_once, one_by_one = EntryCache(budget), EntryCache(budget)
    entry_id = 0
    for sizes in groups:
        positions = [Position(1, entry_id + i) for i in range(len(sizes))]
        datas = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
        entry_id += len(sizes)
        at_once.put_all(positions, datas, sum(sizes))
        for position, data in zip(positions, datas, strict=True):
            one_by_one.put(position, data)
        assert list(at_once.entries.items()) == list(one_by_one.entries.items())
        assert (at_once.size, at_once.inserted, at_once.evicted) == (
            one_by_one.size,
            one_by_one.inserted,
            one_by_one.evicted,
        )
        assert at_once.size <= budget
        assert at_once.size == sum(map(len, at_once.entries.values()))
