"""Producer access modes of a topic without sockets: Pulsar's answers from
AbstractTopic.incrementTopicEpochIfNeeded and internalAddProducer."""

from __future__ import annotations

import asyncio

import pytest

from magnetar.broker.topics.producers import ProducerBusyError, ProducerFencedError, ProducerSet
from magnetar.common.proto import pulsar_api_pb2 as pb


def _keep(url: str | None) -> None:
    pass


async def test_shared_producers_share_the_topic() -> None:
    producers = ProducerSet()
    assert await producers.add((1, 1), pb.Shared, _keep, name="a") == 0
    assert await producers.add((1, 2), pb.Shared, _keep, name="b") == 0
    assert len(producers) == 2


async def test_shared_while_exclusive_holds_is_busy() -> None:
    producers = ProducerSet()
    await producers.add((1, 1), pb.Exclusive, _keep, name="owner")
    with pytest.raises(ProducerBusyError, match="existing exclusive producer: owner"):
        await producers.add((1, 2), pb.Shared, _keep, name="other")


async def test_second_exclusive_is_fenced() -> None:
    producers = ProducerSet()
    assert await producers.add((1, 1), pb.Exclusive, _keep, name="owner") == 1
    with pytest.raises(ProducerFencedError, match="existing exclusive producer: owner"):
        await producers.add((2, 1), pb.Exclusive, _keep, name="other")
    assert producers.topic_epoch == 1


async def test_exclusive_while_shared_producers_exist_is_fenced() -> None:
    producers = ProducerSet()
    await producers.add((1, 1), pb.Shared, _keep, name="shared")
    with pytest.raises(ProducerFencedError, match="existing shared producers"):
        await producers.add((2, 1), pb.Exclusive, _keep, name="other")


async def test_exclusive_with_a_stale_epoch_is_fenced() -> None:
    producers = ProducerSet()
    await producers.add((1, 1), pb.Exclusive, _keep, name="first")
    producers.remove((1, 1))
    await producers.add((2, 1), pb.Exclusive, _keep, name="second")
    producers.remove((2, 1))
    with pytest.raises(ProducerFencedError, match="epoch moved on to 2"):
        await producers.add((1, 1), pb.Exclusive, _keep, 1, name="first")
    assert await producers.add((1, 1), pb.Exclusive, _keep, 2, name="first") == 3


async def test_same_name_is_busy_until_the_first_leaves() -> None:
    producers = ProducerSet()
    await producers.add((1, 1), pb.Shared, _keep, name="billing")
    with pytest.raises(ProducerBusyError, match="'billing' is already connected"):
        await producers.add((2, 1), pb.Shared, _keep, name="billing")
    producers.remove((1, 1))
    await producers.add((2, 1), pb.Shared, _keep, name="billing")


async def test_exclusive_with_fencing_closes_the_others_and_frees_their_names() -> None:
    producers = ProducerSet()
    fenced: list[str] = []
    await producers.add((1, 1), pb.Shared, lambda url: fenced.append("a"), name="a")
    await producers.add((1, 2), pb.Shared, lambda url: fenced.append("b"), name="b")
    assert await producers.add((2, 1), pb.ExclusiveWithFencing, _keep, name="a") == 1
    assert sorted(fenced) == ["a", "b"] and len(producers) == 1
    with pytest.raises(ProducerFencedError, match="existing exclusive producer: a"):
        await producers.add((3, 1), pb.Exclusive, _keep, name="c")


async def test_a_waiting_exclusive_producer_holds_back_shared_and_exclusive_ones() -> None:
    producers = ProducerSet()
    await producers.add((1, 1), pb.Shared, _keep, name="shared")
    waiter = asyncio.create_task(producers.add((2, 1), pb.WaitForExclusive, _keep, name="w"))
    await asyncio.sleep(0)
    assert not waiter.done()
    with pytest.raises(ProducerBusyError, match="waiting"):
        await producers.add((3, 1), pb.Shared, _keep, name="late")
    with pytest.raises(ProducerFencedError, match="waiting"):
        await producers.add((3, 2), pb.Exclusive, _keep, name="late")
    producers.remove((1, 1))
    assert await asyncio.wait_for(waiter, 5) == 1
    with pytest.raises(ProducerBusyError, match="existing exclusive producer: w"):
        await producers.add((3, 1), pb.Shared, _keep, name="late")


async def test_a_cancelled_wait_holds_nothing_back() -> None:
    producers = ProducerSet()
    await producers.add((1, 1), pb.Shared, _keep, name="shared")
    waiter = asyncio.create_task(producers.add((2, 1), pb.WaitForExclusive, _keep, name="w"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await producers.add((3, 1), pb.Shared, _keep, name="late")


async def test_close_all_fences_everyone_and_frees_the_names() -> None:
    producers = ProducerSet()
    told: list[str | None] = []
    await producers.add((1, 1), pb.Exclusive, told.append, name="owner")
    producers.close_all("pulsar://elsewhere:6650")
    assert told == ["pulsar://elsewhere:6650"] and len(producers) == 0
    await producers.add((2, 1), pb.Exclusive, _keep, name="owner")
