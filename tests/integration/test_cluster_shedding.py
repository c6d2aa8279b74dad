"""The load manager moving load by itself, with broker processes: one etcd, one bookie, three
brokers whose leader sheds every second (threshold 10 % above the average, no bundle moved
twice).

- a fourth broker joins while producers and consumers run on twelve bundles: shedding hands
  bundles to it, every topic keeps working and the application sees no error;
- a bundle holding more topics than ``load_balancer_namespace_bundle_max_topics`` is split by
  the leader, and the admin bundles list shows the halves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from tests.support.cluster import (
    ConsumerThread,
    MagnetarCluster,
    PacedProducer,
    assert_no_traceback,
    cluster_fixture,
    wait_delivered,
    wait_for_each,
)
from tests.support.standalone import QUIET

SPREAD = "shedding/spread"
SPREAD_BUNDLES = 12
HOT = "shedding/hot"
MAX_TOPICS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    yield from cluster_fixture(
        tmp_path_factory.mktemp("shedding"),
        bookies=1,
        brokers=3,
        broker_settings={
            "ensemble_size": 1,
            "write_quorum": 1,
            "ack_quorum": 1,
            "load_balancer_shedding_interval_seconds": 1,
            "load_balancer_broker_threshold_shedder_percentage": 10,
            "load_balancer_shedding_grace_period_seconds": 3600,
            "load_balancer_auto_bundle_split_enabled": True,
            "load_balancer_namespace_bundle_max_topics": MAX_TOPICS,
        },
    )


def one_topic_per_bundle(namespace: str, bundles: list[BundleRange]) -> list[str]:
    """A topic name for each bundle (the first ``t{i}`` whose hash falls in it)."""
    found: dict[BundleRange, str] = {}
    i = 0
    while len(found) < len(bundles):
        topic = f"persistent://{namespace}/t{i}"
        bundle = next(b for b in bundles if b.contains(topic_hash(topic)))
        found.setdefault(bundle, topic)
        i += 1
    return [found[b] for b in bundles]


def test_a_new_broker_receives_bundles_by_shedding_without_client_errors(
    cluster: MagnetarCluster,
) -> None:
    cluster.create_namespace("shedding", "placeholder")  # the tenant
    cluster.admin_json(
        "PUT", f"/admin/v2/namespaces/{SPREAD}", {"bundles": {"numBundles": SPREAD_BUNDLES}}
    )
    listed = cluster.admin_json("GET", f"/admin/v2/namespaces/{SPREAD}/bundles")
    bundles = [
        BundleRange.parse(f"{lo}_{hi}")
        for lo, hi in zip(listed["boundaries"], listed["boundaries"][1:], strict=False)
    ]
    assert len(bundles) == SPREAD_BUNDLES
    topics = one_topic_per_bundle(SPREAD, bundles)
    client = pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)
    consumers = [
        ConsumerThread(client, t, "spread", pulsar.ConsumerType.Shared).start() for t in topics
    ]
    producers = [
        PacedProducer(client, t, tag=f"b{i}", interval=0.05).start() for i, t in enumerate(topics)
    ]
    newcomer = None
    try:
        wait_for_each(producers, 10)
        # Every bundle owned (the three brokers may be shedding among themselves already, and a
        # bundle has no owner while it moves).
        cluster.wait_for(
            lambda: sum(1 for n, _ in cluster.ownership() if n == SPREAD) == SPREAD_BUNDLES,
            what=f"all {SPREAD_BUNDLES} bundles of {SPREAD} owned",
            timeout=30,
        )
        newcomer = cluster.add_broker()
        joined = time.monotonic()
        cluster.wait_for(
            lambda: (
                sum(
                    1
                    for (n, _), o in cluster.ownership().items()
                    if n == SPREAD and o == newcomer.broker_id
                )
                >= 2
            ),
            what="shedding to hand the new broker at least two bundles",
            timeout=60,
        )
        moved_after = time.monotonic() - joined
        wait_for_each(producers, 10)  # each topic still takes sends after the moves
        for producer in producers:
            producer.stop()
        missing = set()
        for producer, consumer in zip(producers, consumers, strict=True):
            missing |= wait_delivered([consumer], set(producer.receipted))
    finally:
        for consumer in consumers:
            consumer.close()
        for producer in producers:
            producer.close()
        client.close()

    after = {k: v for k, v in cluster.ownership().items() if k[0] == SPREAD}
    counts = {
        b.broker_id: sum(1 for o in after.values() if o == b.broker_id) for b in cluster.brokers
    }
    print(
        f"fourth broker received bundles {moved_after:.1f}s after joining; "
        f"bundles per broker {counts}"
    )
    for producer in producers:
        assert producer.errors == [], producer.errors[:10]
        assert producer.raised == [], producer.raised[:10]
        assert len(producer.receipted) == len(producer.sent)
    for consumer in consumers:
        assert consumer.errors == [], consumer.errors[:10]
    assert not missing, f"{len(missing)} receipted messages never delivered"
    assert newcomer is not None and counts[newcomer.broker_id] >= 2
    for broker in cluster.brokers:
        assert_no_traceback(broker)


def test_the_leader_splits_a_bundle_with_too_many_topics(cluster: MagnetarCluster) -> None:
    cluster.admin_json("PUT", f"/admin/v2/namespaces/{HOT}", {"bundles": {"numBundles": 1}})
    topics = [f"persistent://{HOT}/topic-{i}" for i in range(MAX_TOPICS + 2)]
    client = pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)
    try:
        producers = {t: client.create_producer(t, batching_enabled=False) for t in topics}
        for producer in producers.values():
            producer.send(b"before")
        listed = cluster.wait_for(
            lambda: (
                found
                if (found := cluster.admin_json("GET", f"/admin/v2/namespaces/{HOT}/bundles"))[
                    "numBundles"
                ]
                > 1
                else None
            ),
            what="the leader to split the hot bundle",
            timeout=60,
        )
        # Every topic is served after the split: its two messages read back in order.
        for topic in topics:
            producers[topic].send(b"after")  # the producer followed its topic's move
            reader = client.create_reader(topic, pulsar.MessageId.earliest)
            got = [reader.read_next(10_000).data() for _ in range(2)]
            reader.close()
            assert got == [b"before", b"after"], (topic, got)
    finally:
        client.close()
    print("bundles after the split:", listed["boundaries"])
    assert listed["boundaries"][0] == "0x00000000" and listed["boundaries"][-1] == "0xffffffff"
    for broker in cluster.brokers:
        assert_no_traceback(broker)
