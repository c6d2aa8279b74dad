"""The memtable against a plain dict model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.bookie.memtable import Memtable

ledgers = st.integers(min_value=0, max_value=4)
entries = st.integers(min_value=0, max_value=30)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), ledgers, entries, st.binary(max_size=20)),
        st.tuples(st.just("drop"), ledgers),
    ),
    max_size=80,
)


@given(ops=ops)
def test_memtable_matches_a_dict(ops: list[tuple]) -> None:
    table = Memtable()
    model: dict[int, dict[int, bytes]] = {}
    for op in ops:
        if op[0] == "put":
            _, ledger_id, entry_id, data = op
            table.put(ledger_id, entry_id, data)
            model.setdefault(ledger_id, {})[entry_id] = data
        else:
            table.drop_ledger(op[1])
            model.pop(op[1], None)
        assert table.size == sum(len(d) for e in model.values() for d in e.values())
    assert len(table) == sum(len(e) for e in model.values())
    for ledger_id in range(5):
        stored = model.get(ledger_id, {})
        assert table.has_ledger(ledger_id) == (ledger_id in model)
        assert table.last_entry_id(ledger_id) == (max(stored) if stored else -1)
        for entry_id in range(31):
            assert table.get(ledger_id, entry_id) == stored.get(entry_id)
    assert list(table.sorted_entries()) == [
        (lid, eid, model[lid][eid]) for lid in sorted(model) for eid in sorted(model[lid])
    ]


def test_overwrite_keeps_size_and_last() -> None:
    table = Memtable()
    table.put(1, 5, b"aaaa")
    table.put(1, 2, b"bb")
    table.put(1, 5, b"c")
    assert table.size == 3
    assert table.last_entry_id(1) == 5
    assert table.get(1, 5) == b"c"
    table.drop_ledger(1)
    table.drop_ledger(1)
    assert table.size == 0
    assert len(table) == 0
    assert table.get(1, 2) is None
