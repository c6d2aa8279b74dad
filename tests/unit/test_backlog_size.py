"""A topic's backlog for its quotas and stats (``topics/backlog.py``): behind the slowest
durable cursor, a geo-replicator's as much as a subscription's, at the average entry size."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.topics.backlog import estimated_backlog_size


def test_a_replicator_behind_every_subscription_sets_the_backlog() -> None:
    # 1000 entries of 100 bytes; subscriptions 10 and 0 behind, the replicator to a cluster
    # that is down 600 behind: 60,000 bytes, over a 1000-byte quota though both subscriptions
    # are under it.
    subscriptions, replicators = [10, 0], [600]
    assert estimated_backlog_size(subscriptions + replicators, 100_000, 1000) == 60_000
    assert estimated_backlog_size(subscriptions, 100_000, 1000) == 1_000


def test_nothing_stored_or_no_cursor_is_no_backlog() -> None:
    assert estimated_backlog_size([], 100_000, 1000) == 0
    assert estimated_backlog_size([5], 0, 0) == 0


@given(
    st.lists(st.integers(0, 10_000), max_size=6),
    st.integers(0, 10_000),
    st.integers(1, 10**9),
    st.integers(1, 10_000),
)
def test_another_cursor_never_lowers_it(backlogs: list[int], more: int, size: int, n: int) -> None:
    before = estimated_backlog_size(backlogs, size, n)
    assert estimated_backlog_size([*backlogs, more], size, n) >= before
    assert estimated_backlog_size([*backlogs, more], size, n) == estimated_backlog_size(
        [max([*backlogs, more])], size, n
    )
