"""The cluster as a user meets it: three ``magnetar broker`` processes, three bookie processes and
one etcd, the official Pulsar client given only one broker's URL.

- every broker registers and exactly one is the load manager's leader;
- 32 topics in four namespaces each round-trip through the one URL (lookups redirect to the
  owners) and their bundles are spread over all three brokers;
- a producer and a consumer keep working, without a single error seen by the application,
  while their bundle is unloaded again and again by the admin API; the pause is printed.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.cluster import (
    BrokerProcess,
    ConsumerThread,
    MagnetarCluster,
    PacedProducer,
    assert_no_traceback,
    cluster_fixture,
    wait_delivered,
)
from tests.support.raw_client import RawConnection, send_frame
from tests.support.standalone import QUIET

Type = pb.BaseCommand.Type

TENANT = "cluster-it"
NAMESPACES = [f"{TENANT}/ns{i}" for i in range(4)]
TOPICS_PER_NAMESPACE = 8
MESSAGES_PER_TOPIC = 20
UNLOADS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    yield from cluster_fixture(tmp_path_factory.mktemp("cluster"), bookies=3, brokers=3)


@pytest.fixture(scope="module")
def entry(cluster: MagnetarCluster) -> BrokerProcess:
    """The one broker the clients are given: not the leader, so lookups of unowned bundles
    must be redirected to the leader and on to the chosen broker."""
    leader = cluster.leader()
    return next(b for b in cluster.brokers if b.broker_id != leader)


def client_for(broker: BrokerProcess) -> pulsar.Client:
    return pulsar.Client(broker.url, operation_timeout_seconds=30, logger=QUIET)


def test_every_broker_registers_and_exactly_one_leads(cluster: MagnetarCluster) -> None:
    ids = {b.broker_id for b in cluster.brokers}
    registered = cluster.registered()
    assert set(registered) == ids, registered
    for broker_id, document in registered.items():
        assert document["info"]["serviceUrl"] == cluster.broker(broker_id).url, document

    leader = cluster.leader()
    assert leader in ids, f"leader {leader!r} is not one of the brokers {ids}"
    # Every broker, asked through the admin API, names the same brokers and the same leader.
    for broker in cluster.brokers:
        status, raw = broker.http("GET", "/admin/v2/brokers/standalone")
        assert status == 200, (broker.broker_id, status, raw)
        assert sorted(ids) == sorted(json.loads(raw)), raw
        status, raw = broker.http("GET", "/admin/v2/brokers/leaderBroker")
        assert status == 200, (broker.broker_id, status, raw)
        assert json.loads(raw)["brokerId"] == leader, raw
    print(f"brokers {sorted(ids)}; leader {leader}")


def test_topics_round_trip_through_one_broker_url_and_bundles_spread(
    cluster: MagnetarCluster, entry: BrokerProcess
) -> None:
    for namespace in NAMESPACES:
        cluster.create_namespace(*namespace.split("/"))
    topics = [
        f"persistent://{namespace}/topic-{i}"
        for namespace in NAMESPACES
        for i in range(TOPICS_PER_NAMESPACE)
    ]
    client = client_for(entry)
    started = time.monotonic()
    try:
        consumers = {t: client.subscribe(t, "round-trip") for t in topics}
        producers = {t: client.create_producer(t, batching_enabled=False) for t in topics}
        for topic, producer in producers.items():
            for n in range(MESSAGES_PER_TOPIC):
                producer.send(f"{topic}#{n}".encode())
        for topic, consumer in consumers.items():
            got = []
            for _ in range(MESSAGES_PER_TOPIC):
                message = consumer.receive(timeout_millis=10_000)
                got.append(message.data().decode())
                consumer.acknowledge(message)
            assert got == [f"{topic}#{n}" for n in range(MESSAGES_PER_TOPIC)], (topic, got)
        print(
            f"{len(topics)} topics x {MESSAGES_PER_TOPIC} messages round-tripped through "
            f"{entry.broker_id} in {time.monotonic() - started:.1f}s"
        )
        for p in producers.values():
            p.close()
        for c in consumers.values():
            c.close()
    finally:
        client.close()

    ownership = cluster.ownership()
    ids = {b.broker_id for b in cluster.brokers}
    owners_of_topics = {t: cluster.owner_of_topic(t) for t in topics}
    assert all(o in ids for o in owners_of_topics.values()), owners_of_topics
    ours = {k: v for k, v in ownership.items() if k[0] in NAMESPACES}
    per_broker = {b: sorted(f"{ns}/{r}" for (ns, r), o in ours.items() if o == b) for b in ids}
    print("bundles per broker:", {b: len(v) for b, v in per_broker.items()})
    assert len(set(ours.values())) == 3, f"bundles not spread over all three brokers: {per_broker}"

    # The admin API tells the same: each namespace has its four bundles, and the HTTP lookup
    # on the entry broker answers each topic's owner.
    for namespace in NAMESPACES:
        bundles = cluster.admin_json("GET", f"/admin/v2/namespaces/{namespace}/bundles")
        assert bundles["numBundles"] == 4, bundles
    for topic in topics[:: TOPICS_PER_NAMESPACE // 2]:
        answer = cluster.http_lookup(topic, entry)
        owner = cluster.broker(owners_of_topics[topic])
        assert answer["brokerUrl"] == owner.url, (topic, answer, owner.broker_id)
        assert answer["httpUrl"] == owner.http_url, (topic, answer)
    for broker in cluster.brokers:
        assert_no_traceback(broker)


def test_producer_and_consumer_work_across_bundle_unloads(
    cluster: MagnetarCluster, entry: BrokerProcess
) -> None:
    namespace = f"{TENANT}/unload"
    cluster.create_namespace(*namespace.split("/"))
    topic = f"persistent://{namespace}/steady"
    client = client_for(entry)
    consumer = ConsumerThread(client, topic, "steady", pulsar.ConsumerType.Exclusive).start()
    producer = PacedProducer(client, topic, interval=0.01).start()
    pauses = []
    moves = []
    try:
        producer.wait_for(50)
        for _ in range(UNLOADS):
            owner = cluster.owner_of_topic(topic)
            assert owner is not None
            bundle = _bundle_of(cluster, namespace, topic)
            before = len(producer.receipted)
            unloaded_at = time.monotonic()
            cluster.unload_bundle(namespace, bundle)
            producer.wait_for(20)
            first = min(t for t in producer.receipted.values() if t > unloaded_at)
            pauses.append(first - unloaded_at)
            moves.append((owner, cluster.owner_of_topic(topic)))
            assert len(producer.receipted) > before
        producer.stop()
        missing = wait_delivered([consumer], set(producer.receipted))
    finally:
        consumer.close()
        producer.close()
        client.close()

    print(
        f"{UNLOADS} unloads: pause (unload -> next receipt) p50 "
        f"{statistics.median(pauses) * 1000:.0f} ms, max {max(pauses) * 1000:.0f} ms; "
        f"moves {moves}; {len(producer.receipted)} messages"
    )
    assert producer.errors == [], producer.errors[:10]
    assert producer.raised == [], producer.raised[:10]
    assert consumer.errors == [], consumer.errors[:10]
    assert len(producer.receipted) == len(producer.sent)
    assert not missing, f"{len(missing)} receipted messages never delivered: {sorted(missing)[:10]}"
    # Exclusive subscription: in order, each message at least once.
    payloads = [d.payload for d in consumer.deliveries]
    first_seen = list(dict.fromkeys(payloads))
    assert first_seen == sorted(first_seen), "delivery order broken across unloads"
    for broker in cluster.brokers:
        assert_no_traceback(broker)


@pytest.mark.parametrize("protocol_version", [codec.SERVER_PROTOCOL_VERSION, 19])
def test_unload_to_a_named_broker_tells_clients_its_url(
    cluster: MagnetarCluster, protocol_version: int
) -> None:
    """``?destinationBroker=``: the owner hands the bundle over; its producers and consumers
    are closed with the receiver's URL (clients of protocol version 20 and later read it and
    reconnect there without a lookup; older ones get a plain close), and the receiver owns
    the bundle once it is looked up again."""
    namespace = f"{TENANT}/handover"
    cluster.create_namespace(*namespace.split("/"))
    topic = f"persistent://{namespace}/v{protocol_version}"
    owner_url = cluster.http_lookup(topic)["brokerUrl"]
    owner = next(b for b in cluster.brokers if b.url == owner_url)
    receiver = next(b for b in cluster.brokers if b is not owner)
    bundle = _bundle_of(cluster, namespace, topic)
    with RawConnection(owner) as conn:  # type: ignore[arg-type]
        conn.connect(protocol_version)
        conn.command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
        conn.expect(Type.PRODUCER_SUCCESS)
        conn.command(
            pb.CommandSubscribe(
                topic=topic,
                subscription="s",
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=2,
                request_id=2,
            )
        )
        conn.expect(Type.SUCCESS)
        cluster.admin_json(
            "PUT",
            f"/admin/v2/namespaces/{namespace}/{bundle}/unload"
            f"?destinationBroker={receiver.broker_id}",
        )
        closes = {}
        while len(closes) < 2:
            frame = conn.next_frame()
            closes[frame.type] = frame.body
        # A send the client wrote before it read the close is ignored (the client sends it
        # again to the receiver), not answered with an error that drops the connection.
        conn.send(send_frame(1, 0, b"late"))
        conn.command(pb.CommandPing())
        conn.expect(Type.PONG)
    closed_producer = closes[Type.CLOSE_PRODUCER]
    closed_consumer = closes[Type.CLOSE_CONSUMER]
    assert (closed_producer.producer_id, closed_consumer.consumer_id) == (1, 2)
    if protocol_version >= 20:
        assert closed_producer.assignedBrokerServiceUrl == receiver.url
        assert closed_consumer.assignedBrokerServiceUrl == receiver.url
    else:
        assert not closed_producer.HasField("assignedBrokerServiceUrl")
        assert not closed_consumer.HasField("assignedBrokerServiceUrl")
    # Looked up through the third broker (neither the old owner nor the receiver).
    third = next(b for b in cluster.brokers if b not in (owner, receiver))
    assert cluster.http_lookup(topic, third)["brokerUrl"] == receiver.url
    assert cluster.owner_of_topic(topic) == receiver.broker_id


def test_unload_to_an_unknown_broker_is_refused(cluster: MagnetarCluster) -> None:
    namespace = f"{TENANT}/handover"
    cluster.create_namespace(*namespace.split("/"))
    topic = f"persistent://{namespace}/refused"
    owner_url = cluster.http_lookup(topic)["brokerUrl"]
    bundle = _bundle_of(cluster, namespace, topic)
    path = f"/admin/v2/namespaces/{namespace}/{bundle}/unload?destinationBroker=nobody:1"
    status, body = cluster.admin("PUT", path)
    assert status == 404, (status, body)
    assert "nobody:1" in str(body)
    assert cluster.http_lookup(topic)["brokerUrl"] == owner_url  # nothing moved


def test_subscribe_on_a_broker_that_does_not_serve_the_topic(cluster: MagnetarCluster) -> None:
    """SUBSCRIBE or PRODUCER reaching a broker that does not own the topic (the client's lookup
    raced a move): ServiceNotReady in Pulsar's words, never naming an unload in progress (the
    official clients keep the connection for such a message), and a connection left with no
    producer or consumer is closed so the client looks the topic up again."""
    namespace = f"{TENANT}/elsewhere"
    cluster.create_namespace(*namespace.split("/"))
    topic = f"persistent://{namespace}/t"
    other_topic = f"persistent://{namespace}/owned-here"
    owner_url = cluster.http_lookup(topic)["brokerUrl"]
    stranger = next(b for b in cluster.brokers if b.url != owner_url)
    subscribe = pb.CommandSubscribe(
        topic=topic, subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1
    )

    with RawConnection(stranger) as conn:  # type: ignore[arg-type]
        conn.connect()
        subscribe.request_id = 1
        conn.command(subscribe)
        error = conn.expect(Type.ERROR).body
        assert error.error == pb.ServiceNotReady, error
        assert "not served by this instance" in error.message, error
        assert "is being unloaded" not in error.message, error
        assert conn.closed_by_peer(), "an idle connection stays open after the refusal"

    # With a producer on the connection, it stays open for that producer: a topic of another
    # bundle, handed to the stranger if another broker took it.
    topic_bundle = _bundle_of(cluster, namespace, topic)
    stranger_topic = next(
        candidate
        for candidate in (f"{other_topic}-{i}" for i in range(64))
        if cluster.http_lookup(candidate)  # assigns its bundle an owner
        and _bundle_of(cluster, namespace, candidate) != topic_bundle
    )
    if cluster.owner_of_topic(stranger_topic) != stranger.broker_id:
        stranger_bundle = _bundle_of(cluster, namespace, stranger_topic)
        cluster.admin_json(
            "PUT",
            f"/admin/v2/namespaces/{namespace}/{stranger_bundle}"
            f"/unload?destinationBroker={stranger.broker_id}",
        )
        cluster.wait_for(
            lambda: cluster.http_lookup(stranger_topic)["brokerUrl"] == stranger.url,
            what=f"{stranger_topic} served by {stranger.broker_id}",
        )
    with RawConnection(stranger) as conn:  # type: ignore[arg-type]
        conn.connect()
        conn.command(pb.CommandProducer(topic=stranger_topic, producer_id=1, request_id=1))
        conn.expect(Type.PRODUCER_SUCCESS)
        subscribe.request_id = 2
        conn.command(subscribe)
        assert conn.expect(Type.ERROR).body.error == pb.ServiceNotReady
        conn.command(pb.CommandPing())
        conn.expect(Type.PONG)
    assert_no_traceback(stranger)


def test_readers_created_while_bundles_move_are_created(
    cluster: MagnetarCluster, entry: BrokerProcess
) -> None:
    """Readers created (official client, one client each, as the Spark source does) again and
    again while their topics' bundles are unloaded: every one is created and reads. Seen before:
    a SUBSCRIBE refused by the old owner left the client believing it was connected, and the
    reader failed after the whole 30 s operation timeout."""
    namespace = f"{TENANT}/readers"
    cluster.create_namespace(*namespace.split("/"))
    topics = [f"persistent://{namespace}/r{i}" for i in range(4)]
    client = client_for(entry)
    producers = [PacedProducer(client, topic, interval=0.02).start() for topic in topics]
    stop = threading.Event()
    failures: list[str] = []
    created = [0] * len(topics)

    def churn(i: int) -> None:
        while not stop.is_set():
            reader_client = client_for(entry)
            try:
                reader = reader_client.create_reader(topics[i], pulsar.MessageId.earliest)
                read = 0
                while read < 20 and reader.has_message_available():
                    reader.read_next(10_000)
                    read += 1
                reader.close()
                created[i] += 1
            except Exception as e:  # every failure is the finding
                failures.append(f"{topics[i]}: {type(e).__name__}: {e}")
            finally:
                reader_client.close()

    threads = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(len(topics))]
    try:
        for producer in producers:
            producer.wait_for(20)
        for thread in threads:
            thread.start()
        for _ in range(UNLOADS):
            for bundle in sorted({_bundle_of(cluster, namespace, t) for t in topics}):
                cluster.unload_bundle(namespace, bundle)
            time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        for producer in producers:
            producer.close()
        client.close()
    print(f"readers created per topic across {UNLOADS} rounds of unloads: {created}")
    # A reader asking has_message_available() just as the broker closes it for the move may be
    # told ConsumerNotFound (as with Pulsar); nothing may time out.
    timeouts = [f for f in failures if "Timeout" in f or "TimeOut" in f]
    assert not timeouts, timeouts
    assert all(created), created
    for broker in cluster.brokers:
        assert_no_traceback(broker)


def _bundle_of(cluster: MagnetarCluster, namespace: str, topic: str) -> str:
    """The bundle (range text) of ``namespace`` holding ``topic`` that has an owner now."""
    h = topic_hash(topic)
    for ns, bundle in cluster.ownership():
        if ns == namespace and BundleRange.parse(bundle).contains(h):
            return bundle
    raise AssertionError(f"no owned bundle of {namespace} holds {topic}")


# -- ownership edges ---------------------------------------------------------------------

CONCURRENT_NAMESPACE = "ownership/concurrent"
CLIENTS = 8
FIRST_BUNDLE = BundleRange.parse("0x00000000_0x40000000")


def topics_in_first_bundle(count: int) -> list[str]:
    found = []
    i = 0
    while len(found) < count:
        topic = f"persistent://{CONCURRENT_NAMESPACE}/t{i}"
        if FIRST_BUNDLE.contains(topic_hash(topic)):
            found.append(topic)
        i += 1
    return found


def test_concurrent_first_lookups_of_one_bundle_claim_it_once(cluster: MagnetarCluster) -> None:
    cluster.create_namespace(*CONCURRENT_NAMESPACE.split("/"))
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
    namespace = "ownership/deleted-key"
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


def test_namespace_created_with_its_own_bundle_count(cluster: MagnetarCluster) -> None:
    cluster.admin_json("PUT", "/admin/v2/tenants/sized")
    status, _ = cluster.admin(
        "PUT", "/admin/v2/namespaces/sized/eight", {"bundles": {"numBundles": 8}}
    )
    assert status == 204
    bundles = cluster.admin_json("GET", "/admin/v2/namespaces/sized/eight/bundles")
    assert bundles["numBundles"] == 8
    assert bundles["boundaries"][:2] == ["0x00000000", "0x20000000"]
    status, body = cluster.admin(
        "PUT", "/admin/v2/namespaces/sized/none", {"bundles": {"numBundles": 0}}
    )
    assert status == 412 and "numBundles" in body["reason"]
