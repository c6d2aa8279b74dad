"""Shared dispatch order: the best priority level with permits first, round robin within it."""

from __future__ import annotations

from types import SimpleNamespace

from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.shared import SharedDispatcher


def consumer(name: str, priority: int, permits: int) -> Consumer:
    connection = SimpleNamespace(writable=True)  # only its writability is looked at
    return Consumer(0, name, connection=connection, priority=priority, permits=permits)  # type: ignore[arg-type]


def picks(dispatcher: SharedDispatcher, n: int) -> list[str]:
    chosen = []
    for _ in range(n):
        c = dispatcher._next_consumer()
        assert c is not None
        c.permits -= 1
        chosen.append(c.name)
    return chosen


def test_lower_levels_only_get_what_the_best_level_cannot_take() -> None:
    dispatcher = SharedDispatcher(SimpleNamespace(cursor=None))  # type: ignore[arg-type]
    dispatcher.consumers = [consumer("backup", 1, 10), consumer("a", 0, 2), consumer("b", 0, 2)]
    first = picks(dispatcher, 4)
    assert sorted(first) == ["a", "a", "b", "b"]  # round robin on level 0 while it has permits
    assert picks(dispatcher, 3) == ["backup"] * 3  # then level 1
    dispatcher.consumers[1].permits = 1
    assert picks(dispatcher, 1) == ["a"]  # level 0 is back as soon as it has a permit


def test_nobody_with_permits_means_nobody() -> None:
    dispatcher = SharedDispatcher(SimpleNamespace(cursor=None))  # type: ignore[arg-type]
    dispatcher.consumers = [consumer("a", 0, 0), consumer("b", 3, 0)]
    assert dispatcher._next_consumer() is None
