"""Batch ack sets (bit i set while message i is unacknowledged) in both directions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.topics.consumer import acked_from_bit_set, unacked_bit_set


@st.composite
def batches(draw: st.DrawFn) -> tuple[int, frozenset[int]]:
    size = draw(st.integers(min_value=1, max_value=300))
    acked = draw(st.frozensets(st.integers(min_value=0, max_value=size - 1)))
    return size, acked


@given(batches())
def test_round_trip(batch: tuple[int, frozenset[int]]) -> None:
    size, acked = batch
    words = unacked_bit_set(size, acked)
    assert len(words) == (size + 63) // 64
    assert all(-(2**63) <= w < 2**63 for w in words)  # fits protobuf int64
    assert acked_from_bit_set(words, size) == sorted(acked)


def test_known_value_matches_pulsar_convention() -> None:
    # Ten messages, 0, 2 and 4 acknowledged: 1, 3 and 5..9 remain (0b1111101010 = 1002).
    assert unacked_bit_set(10, frozenset({0, 2, 4})) == [1002]
    assert unacked_bit_set(64, frozenset()) == [-1]  # all 64 bits set
