"""Broker faults in a live cluster: three ``magnetar broker`` processes with a 4 s session TTL,
three bookie processes and one etcd, the official Pulsar client throughout.

- kill -9 of a broker owning bundles while a producer (async sends with callbacks) and
  consumers of all four subscription modes run: once its lease expires every bundle it owned
  has a live owner, every receipted message is delivered to every subscription, key_shared
  keeps per-key order;
- SIGSTOP of a topic's owner past its lease: the topic moves and traffic goes on elsewhere;
  after SIGCONT the old owner appended nothing (every message after the move is readable in
  order, no receipted message is lost), it logged that it lost its session, and no Traceback;
- kill -9 of the load manager's leader: another broker leads within seconds and an unowned
  bundle (a topic of a fresh namespace) is still assigned.

Each test brings the cluster back to three running brokers for the next.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from tests.support.cluster import (
    BrokerProcess,
    ConsumerThread,
    MagnetarCluster,
    PacedProducer,
    assert_no_traceback,
    cluster_fixture,
    first_delivery_order_violations,
    wait_delivered,
)
from tests.support.raw_client import read_until
from tests.support.standalone import QUIET

TENANT = "faults"
SESSION_TTL_S = 4
#: A lease expires within TTL after the last keepalive; then lookups must find a new owner.
REOWN_TIMEOUT_S = 30.0
LEADER_TIMEOUT_S = 15.0
MODES = {
    "exclusive": (pulsar.ConsumerType.Exclusive, 1),
    "shared": (pulsar.ConsumerType.Shared, 2),
    "failover": (pulsar.ConsumerType.Failover, 2),
    "key-shared": (pulsar.ConsumerType.KeyShared, 2),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    yield from cluster_fixture(
        tmp_path_factory.mktemp("cluster-faults"),
        bookies=3,
        brokers=3,
        broker_settings={"broker_session_ttl_seconds": SESSION_TTL_S},
    )


def client_for(broker: BrokerProcess) -> pulsar.Client:
    return pulsar.Client(broker.url, operation_timeout_seconds=30, logger=QUIET)


def restore(cluster: MagnetarCluster, broker: BrokerProcess) -> None:
    """Start ``broker`` again (its old lease has expired) and wait until it is registered."""
    broker.start()
    cluster.wait_for(
        lambda: broker.broker_id in cluster.registered(),
        what=f"{broker.broker_id} registered again",
    )


def topics_with_owners(
    cluster: MagnetarCluster, client: pulsar.Client, namespace: str, count: int
) -> dict[str, str]:
    """Create ``count`` topics of ``namespace`` (a producer each, closed again) so their
    bundles get owners; topic -> owner."""
    owners = {}
    for i in range(count):
        topic = f"persistent://{namespace}/t{i}"
        client.create_producer(topic).close()
        owner = cluster.owner_of_topic(topic)
        assert owner is not None, topic
        owners[topic] = owner
    return owners


def test_kill_9_of_a_bundle_owner_under_traffic_of_all_four_modes(
    cluster: MagnetarCluster,
) -> None:
    namespace = f"{TENANT}/kill"
    cluster.create_namespace(*namespace.split("/"))
    leader = cluster.leader()
    entry = next(b for b in cluster.brokers if b.broker_id != leader)
    client = client_for(entry)
    owners = topics_with_owners(cluster, client, namespace, 8)
    # The victim: neither the leader (leader loss is its own test) nor the broker whose URL the
    # client was given (it would have no broker left to look topics up through); it must own a
    # bundle of ours: if placement gave it none, one is handed to it. The mode topic is one of
    # its topics, every other topic gets traffic too.
    victim = next(b for b in cluster.brokers if b.broker_id not in (leader, entry.broker_id))
    victim_id = victim.broker_id
    if victim_id not in owners.values():
        topic = next(iter(owners))
        bundle = next(
            r for (ns, r), o in cluster.ownership().items()
            if ns == namespace and o == owners[topic]
            and BundleRange.parse(r).contains(topic_hash(topic))
        )  # fmt: skip
        cluster.admin_json(
            "PUT",
            f"/admin/v2/namespaces/{namespace}/{bundle}/unload?destinationBroker={victim_id}",
        )
        owners = topics_with_owners(cluster, client, namespace, 8)
    assert victim_id in owners.values(), owners
    main_topic = next(t for t, o in owners.items() if o == victim_id)
    victim_bundles = {k for k, o in cluster.ownership().items() if o == victim_id}

    consumers: dict[str, list[ConsumerThread]] = {}
    for sub, (mode, n) in MODES.items():
        consumers[sub] = [
            ConsumerThread(client, main_topic, sub, mode, name=f"{sub}-{i}").start()
            for i in range(n)
        ]
    side = {t: ConsumerThread(client, t, "side", pulsar.ConsumerType.Exclusive).start()
            for t in owners if t != main_topic}  # fmt: skip
    producers = [PacedProducer(client, main_topic, tag="main", interval=0.005).start()]
    producers += [PacedProducer(client, t, tag="side", interval=0.02).start() for t in side]
    try:
        producers[0].wait_for(200)
        killed_at = time.monotonic()
        victim.kill()
        # After the lease: each bundle the victim had is owned by a live broker.
        live = {b.broker_id for b in cluster.running_brokers()}
        cluster.wait_for(
            lambda: all(cluster.ownership().get(k) in live for k in victim_bundles),
            what=f"the bundles of {victim_id} owned again: {sorted(victim_bundles)}",
            timeout=REOWN_TIMEOUT_S,
        )
        reowned_after = time.monotonic() - killed_at
        producers[0].wait_for(200, timeout=REOWN_TIMEOUT_S)
        for p in producers[1:]:
            p.wait_for(5, timeout=REOWN_TIMEOUT_S)
        for p in producers:
            p.stop()
        main_receipted = set(producers[0].receipted)
        missing = {sub: wait_delivered(group, main_receipted) for sub, group in consumers.items()}
        side_missing = {
            t: wait_delivered([c], set(p.receipted))
            for (t, c), p in zip(side.items(), producers[1:], strict=True)
        }
    finally:
        for group in [*consumers.values(), [*side.values()]]:
            for c in group:
                c.close()
        for p in producers:
            p.close()
        client.close()
        victim.restart()  # the module's next tests need three brokers again

    duplicates = {
        sub: sum(len(c.deliveries) for c in group) - len({p for c in group for p in c.payloads()})
        for sub, group in consumers.items()
    }
    failed = [e for p in producers for e in p.errors]
    print(
        f"killed {victim_id} (owned {len(victim_bundles)} bundles); owned again after "
        f"{reowned_after:.1f}s; main topic {len(producers[0].receipted)} receipted, "
        f"{len(failed)} failed sends; redelivered per subscription {duplicates}"
    )
    for sub, lost in missing.items():
        assert not lost, (
            f"{sub}: {len(lost)} receipted messages never delivered: {sorted(lost)[:10]}"
        )
    for topic, lost in side_missing.items():
        assert not lost, f"{topic}: {len(lost)} receipted messages lost: {sorted(lost)[:10]}"
    violations = first_delivery_order_violations(
        [d for c in consumers["key-shared"] for d in c.deliveries]
    )
    assert not violations, f"key_shared per-key order broken: {violations[:10]}"
    for broker in cluster.running_brokers():
        assert_no_traceback(broker)
    restore(cluster, victim)


def test_paused_owner_past_its_lease_appends_nothing_after_the_move(
    cluster: MagnetarCluster,
) -> None:
    namespace = f"{TENANT}/pause"
    cluster.create_namespace(*namespace.split("/"))
    # A send whose entry reached the bookies but whose receipt never left the paused broker is
    # sent again by the client; only deduplication keeps the recovered copy from being doubled.
    cluster.admin_json("POST", f"/admin/v2/namespaces/{namespace}/deduplication", True)
    leader = cluster.leader()
    others = [b for b in cluster.brokers if b.broker_id != leader]
    entry = others[0]
    client = client_for(entry)
    owners = topics_with_owners(cluster, client, namespace, 8)
    topic = next(
        (t for t, o in owners.items() if o not in (leader, entry.broker_id)),
        None,
    ) or next(t for t, o in owners.items() if o != leader)
    paused = cluster.broker(owners[topic])
    if paused is entry:  # the clients' entry broker must stay up for the new clients
        entry = cluster.broker(leader)
        client.close()
        client = client_for(entry)

    old_producer = PacedProducer(client, topic, tag="before", interval=0.01).start()
    old_producer.wait_for(50)
    paused.pause()
    paused_at = time.monotonic()
    try:
        # Past its lease the bundle is free: a new client's lookup gives it to a live broker,
        # which fences the topic's ledger and serves it.
        time.sleep(SESSION_TTL_S + 1)
        new_client = client_for(entry)
        after = PacedProducer(new_client, topic, tag="after", interval=0.01).start()
        after.wait_for(100, timeout=REOWN_TIMEOUT_S)
        new_owner = cluster.owner_of_topic(topic)
        moved_after = time.monotonic() - paused_at
    finally:
        paused.resume()
    try:
        after.wait_for(50, timeout=REOWN_TIMEOUT_S)
        # The old owner must notice, stop serving, and let the old producer move too.
        cluster.wait_for(
            lambda: paused.log_lines("metadata session lost", "fenced"),
            what=f"{paused.broker_id} logging that it lost its session or was fenced",
            timeout=20,
        )
        old_producer.wait_for(20, timeout=REOWN_TIMEOUT_S)
        after.stop()
        old_producer.stop()
        reader = new_client.create_reader(topic, pulsar.MessageId.earliest)
        # Until every receipted message was read, then until 3 s pass without one.
        must = {m.encode() for m in (*old_producer.receipted, *after.receipted)}
        stored = [data.decode() for data in read_until(reader.read_next, must, 3000)]
        reader.close()
    finally:
        after.close()
        old_producer.close()
        new_client.close()
        client.close()

    print(
        f"paused {paused.broker_id}; topic moved to {new_owner} within {moved_after:.1f}s; "
        f"{len(stored)} stored; old producer {len(old_producer.receipted)} receipted / "
        f"{len(old_producer.errors)} failed; new producer {len(after.receipted)} receipted; "
        f"the paused broker logged: {paused.log_lines('session lost', 'fenced')[:3]}"
    )
    assert new_owner is not None and new_owner != paused.broker_id, new_owner
    stored_after = [p for p in stored if p.startswith("after-")]
    assert stored_after == sorted(after.receipted), (
        "messages produced on the new owner are not all stored in order: "
        f"{len(stored_after)} stored vs {len(after.receipted)} receipted"
    )
    lost = set(old_producer.receipted) - set(stored)
    assert not lost, f"{len(lost)} receipted messages of the old producer lost: {sorted(lost)[:10]}"
    assert len(stored) == len(set(stored)), "a message is stored twice"
    assert cluster.owner_of_topic(topic) == new_owner, "the resumed broker took the bundle back"
    assert paused.running
    cluster.wait_for(
        lambda: paused.broker_id in cluster.registered(),
        what=f"{paused.broker_id} registered again after SIGCONT",
    )
    for broker in cluster.brokers:
        assert_no_traceback(broker)


def test_leader_killed_another_leads_and_assigns_an_unowned_bundle(
    cluster: MagnetarCluster,
) -> None:
    leader_id = cluster.leader()
    assert leader_id is not None
    leader = cluster.broker(leader_id)
    killed_at = time.monotonic()
    leader.kill()
    new_leader = cluster.wait_for(
        lambda: (lid := cluster.leader()) not in (None, leader_id) and lid,
        what="another broker elected leader",
        timeout=LEADER_TIMEOUT_S,
    )
    elected_after = time.monotonic() - killed_at
    assert new_leader in {b.broker_id for b in cluster.running_brokers()}

    namespace = f"{TENANT}/after-leader"
    cluster.create_namespace(*namespace.split("/"))
    topic = f"persistent://{namespace}/fresh"
    entry = next(b for b in cluster.running_brokers() if b.broker_id != new_leader)
    client = client_for(entry)
    try:
        consumer = client.subscribe(topic, "fresh")
        producer = client.create_producer(topic)
        for n in range(10):
            producer.send(f"fresh-{n}".encode())
        got = [consumer.receive(timeout_millis=10_000).data().decode() for _ in range(10)]
        assigned_after = time.monotonic() - killed_at
    finally:
        client.close()
    print(
        f"killed leader {leader_id}; {new_leader} leads after {elected_after:.1f}s; a fresh "
        f"bundle served by {cluster.owner_of_topic(topic)} {assigned_after:.1f}s after the kill"
    )
    assert got == [f"fresh-{n}" for n in range(10)]
    assert cluster.owner_of_topic(topic) in {b.broker_id for b in cluster.running_brokers()}
    for broker in cluster.running_brokers():
        assert_no_traceback(broker)
    restore(cluster, leader)
