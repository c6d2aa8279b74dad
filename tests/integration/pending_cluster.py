"""Pending (a broker defect; not collected: no ``test_`` prefix). Run it by path:

    python -m pytest tests/integration/pending_cluster.py

Concurrent first lookups of topics in one unowned bundle, arriving at the broker the leader
chose: each runs ``OwnershipStore.try_acquire``. The loser of the create-only put reads the key,
finds its own broker id and takes it for a key "a previous session of this broker left", so it
overwrites the key this very session created a moment before. The ownership watch then reports
"our ownership key was overwritten behind our back; no longer serving it" (ERROR) and the bundle
drops out of the owned set until the overwrite's own bookkeeping puts it back. Expected: one
claim per bundle, no ERROR, no "took over ... previous session" warning on a first claim.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.broker.bundles import BundleRange, topic_hash
from tests.support.cluster import MagnetarCluster, cluster_fixture
from tests.support.standalone import QUIET

NAMESPACE = "pending/concurrent"
CLIENTS = 8
FIRST_BUNDLE = BundleRange.parse("0x00000000_0x40000000")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    yield from cluster_fixture(tmp_path_factory.mktemp("pending"), bookies=2, brokers=3)


def topics_in_first_bundle(count: int) -> list[str]:
    found = []
    i = 0
    while len(found) < count:
        topic = f"persistent://{NAMESPACE}/t{i}"
        if FIRST_BUNDLE.contains(topic_hash(topic)):
            found.append(topic)
        i += 1
    return found


def test_concurrent_first_lookups_of_one_bundle_claim_it_once(cluster: MagnetarCluster) -> None:
    cluster.create_namespace(*NAMESPACE.split("/"))
    topics = topics_in_first_bundle(CLIENTS)
    barrier = threading.Barrier(CLIENTS)
    errors: list[str] = []

    def produce(topic: str) -> None:
        client = pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)
        try:
            barrier.wait()
            producer = client.create_producer(topic)
            producer.send(b"x")
            producer.close()
        except Exception as e:
            errors.append(f"{topic}: {e!r}")
        finally:
            client.close()

    threads = [threading.Thread(target=produce, args=(t,)) for t in topics]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    complaints = {
        b.broker_id: b.log_lines("behind our back", "a previous session of this broker")
        for b in cluster.brokers
    }
    assert not any(complaints.values()), complaints


def test_owner_stops_serving_a_bundle_whose_key_was_deleted(cluster: MagnetarCluster) -> None:
    """``OwnershipStore.add_bundle_lost_listener`` exists ("stop serving that bundle") but the
    broker never registers one: after an operator (or an expired lease the broker has not yet
    noticed) deletes a bundle's ownership key, the broker keeps serving the bundle's loaded
    topics while the store says nobody owns it, so another broker may be given it. Expected:
    the owner disconnects the bundle's clients; they look the topic up again and the bundle has
    an owner again (here or elsewhere)."""
    namespace = "pending/deleted-key"
    cluster.create_namespace(*namespace.split("/"))
    topic = f"persistent://{namespace}/t"
    client = pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)
    try:
        producer = client.create_producer(topic)
        producer.send(b"before")
        owner = cluster.owner_of_topic(topic)
        assert owner is not None
        key = next(
            f"/magnetar/ownership/{ns}/{bundle}"
            for (ns, bundle), o in cluster.ownership().items()
            if ns == namespace and BundleRange.parse(bundle).contains(topic_hash(topic))
        )
        cluster.delete(key)
        cluster.wait_for(
            lambda: cluster.broker(owner).log_lines("deleted behind our back"),
            what="the owner noticing its key is gone",
            timeout=10,
        )
        for n in range(20):
            producer.send(f"after-{n}".encode())
        served_by = cluster.owner_of_topic(topic)
        disconnected = cluster.broker(owner).log_lines("unloaded", "disconnect")
    finally:
        client.close()
    assert served_by is not None, (
        f"{owner} kept serving {topic} after its bundle's ownership key was deleted: the store "
        f"shows no owner; owner log lines about unloading: {disconnected}"
    )
