"""Protocol edges with the official pulsar-client (issue 8): errors as Pulsar gives them.

- Messages of a partitioned topic carry their partition in their message id.
- Consumer seek to a message id redelivers from there even with a full receiver queue (the
  "hello-42" case), and reader seek to a timestamp takes effect.
- A refused UNSUBSCRIBE (other consumers attached) leaves the consumer working.
- Subscribing with another subscription type is refused at once with ConsumerBusy, not after
  the client's 10 s of retries.
- ExclusiveWithFencing takes a topic from an Exclusive producer, which gets ProducerFenced and
  stops.
- An empty subscription name is refused.
- Delayed delivery (`deliver_after`, `deliver_at`) holds messages back on shared and key_shared,
  also across a restart, and is ignored on exclusive and failover, as in Pulsar.

One standalone serves the module; its log must hold no traceback and no ERROR line at the end.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import pulsar
import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.raw_client import (
    RawConnection,
    admin,
    assert_log_clean,
    drain,
    module_standalone,
    send_frame,
)
from tests.support.standalone import StandaloneProcess, client

Type = pb.BaseCommand.Type


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("edges") / "standalone")


@pytest.fixture(scope="module")
def pc(node: StandaloneProcess) -> Iterator[pulsar.Client]:
    c = client(node)
    yield c
    c.close()


# --------------------------------------------------------------------------------------------
# Message ids of partitions
# --------------------------------------------------------------------------------------------


def test_partitioned_topic_messages_carry_their_partition(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    partitions = 3
    status, body = admin(
        node, "PUT", "/persistent/public/default/edge-parts/partitions", str(partitions)
    )
    assert status in (200, 204), body
    topic = "persistent://public/default/edge-parts"
    consumer = pc.subscribe(
        topic,
        "s",
        initial_position=pulsar.InitialPosition.Earliest,
        consumer_type=pulsar.ConsumerType.Shared,
    )
    producer = pc.create_producer(
        topic,
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )
    receipts = [producer.send(f"p{i}".encode(), partition_key=f"k{i}") for i in range(30)]
    assert {r.partition() for r in receipts} == set(range(partitions))

    got = drain(consumer)
    assert sorted(m.data() for m in got) == sorted(f"p{i}".encode() for i in range(30))
    for msg in got:
        suffix = msg.topic_name().rsplit("-partition-", 1)[1]
        assert msg.message_id().partition() == int(suffix), (
            f"{msg.topic_name()}: id {msg.message_id()} has partition "
            f"{msg.message_id().partition()}"
        )
    assert {m.message_id().partition() for m in got} == set(range(partitions))


# --------------------------------------------------------------------------------------------
# Seek
# --------------------------------------------------------------------------------------------


def test_seek_to_a_message_id_redelivers_from_there(pc: pulsar.Client) -> None:
    topic = "edge-seek-hello"
    producer = pc.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"hello-{i}".encode()) for i in range(100)]
    inclusive = pc.subscribe(
        topic,
        "inclusive",
        initial_position=pulsar.InitialPosition.Earliest,
        start_message_id_inclusive=True,
    )
    exclusive = pc.subscribe(topic, "exclusive", initial_position=pulsar.InitialPosition.Earliest)
    for consumer in (inclusive, exclusive):
        for i in range(61):  # the rest of the topic already sits in the receiver queue
            msg = consumer.receive(timeout_millis=10_000)
            assert msg.data() == f"hello-{i}".encode()
            consumer.acknowledge(msg)
        consumer.seek(ids[42])

    assert [m.data() for m in drain(inclusive)] == [f"hello-{i}".encode() for i in range(42, 100)]
    # The broker resets to hello-42; a consumer without an inclusive start skips that one.
    assert [m.data() for m in drain(exclusive)] == [f"hello-{i}".encode() for i in range(43, 100)]


def test_reader_seek_to_a_timestamp(pc: pulsar.Client) -> None:
    topic = "edge-seek-time"
    producer = pc.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"early-{i}".encode())
    time.sleep(0.1)
    middle = int(time.time() * 1000)
    time.sleep(0.1)
    for i in range(5):
        producer.send(f"late-{i}".encode())

    reader = pc.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(10_000).data() == b"early-0"
    reader.seek(middle)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(10_000).data())
    assert got == [f"late-{i}".encode() for i in range(5)]

    reader.seek(0)  # back to the start
    assert reader.read_next(10_000).data() == b"early-0"
    reader.close()


# --------------------------------------------------------------------------------------------
# Subscriptions
# --------------------------------------------------------------------------------------------


def test_refused_unsubscribe_keeps_the_consumer_working(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "edge-unsubscribe"
    first = pc.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
    )
    second = pc.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
    )
    with pytest.raises(pulsar.PulsarException):
        first.unsubscribe()  # another consumer is attached

    producer = pc.create_producer(topic, batching_enabled=False)
    for i in range(40):
        producer.send(f"u{i}".encode())
    got_first: list[bytes] = []
    got_second: list[bytes] = []
    deadline = time.monotonic() + 30  # until all forty came (a slow machine may pause)
    while len(got_first) + len(got_second) < 40 and time.monotonic() < deadline:
        got_first += [m.data() for m in drain(first, quiet_ms=500)]
        got_second += [m.data() for m in drain(second, quiet_ms=500)]
    assert got_first, "the consumer whose unsubscribe was refused receives nothing"
    assert sorted(got_first + got_second) == sorted(f"u{i}".encode() for i in range(40))

    second.close()
    first.unsubscribe()  # alone now: allowed
    status, body = admin(node, "GET", f"/persistent/public/default/{topic}/subscriptions")
    assert status == 200 and json.loads(body) == [], body


def test_another_subscription_type_is_refused_quickly(pc: pulsar.Client) -> None:
    topic = "edge-type-mismatch"
    holder = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    for other in (
        pulsar.ConsumerType.Shared,
        pulsar.ConsumerType.Failover,
        pulsar.ConsumerType.KeyShared,
    ):
        started = time.monotonic()
        with pytest.raises(pulsar.ConsumerBusy):
            pc.subscribe(topic, "s", consumer_type=other)
        assert time.monotonic() - started < 5, f"{other}: refused only after client retries"
    holder.close()


def test_empty_subscription_name_is_refused(node: StandaloneProcess, pc: pulsar.Client) -> None:
    with pytest.raises(pulsar.PulsarException):
        pc.subscribe("edge-empty-sub", "")

    # The broker itself refuses it too (the client might check before sending).
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(
            pb.CommandSubscribe(
                topic="persistent://public/default/edge-empty-sub",
                subscription="",
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=1,
                request_id=1,
            )
        )
        answer = raw.next_frame()
        assert answer.type == Type.ERROR, f"empty subscription name answered {answer.name}"
        assert answer.body.request_id == 1
        raw.command(pb.CommandPing())
        assert raw.next_frame().type == Type.PONG  # the connection stays
    status, body = admin(node, "GET", "/persistent/public/default/edge-empty-sub/subscriptions")
    # Nothing was created for it: no topic, or a topic without that subscription.
    assert status == 404 or (status == 200 and "" not in json.loads(body)), body


# --------------------------------------------------------------------------------------------
# Producer access modes
# --------------------------------------------------------------------------------------------


def test_exclusive_with_fencing_fences_the_exclusive_producer(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "edge-fencing"
    old = pc.create_producer(
        topic,
        batching_enabled=False,
        access_mode=pulsar.ProducerAccessMode.Exclusive,
        send_timeout_millis=5000,
    )
    old.send(b"old owner")
    new = pc.create_producer(
        topic, batching_enabled=False, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing
    )
    new.send(b"new owner")

    started = time.monotonic()
    with pytest.raises(pulsar.ProducerFenced):
        old.send(b"fenced out")
    with pytest.raises(pulsar.PulsarException):
        old.send(b"still fenced")  # stopped for good, no reconnection
    assert time.monotonic() - started < 5

    time.sleep(1)  # a producer still retrying would show up among the publishers
    status, body = admin(node, "GET", f"/persistent/public/default/{topic}/stats")
    assert status == 200, body
    publishers = json.loads(body)["publishers"]
    assert len(publishers) == 1, publishers  # Pulsar's TopicStats: a list of publishers

    new.send(b"new owner again")
    reader = pc.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(10_000).data())
    assert got == [b"old owner", b"new owner", b"new owner again"]
    reader.close()
    new.close()


# --------------------------------------------------------------------------------------------
# Delayed delivery
# --------------------------------------------------------------------------------------------

DELAY_S = 3


@pytest.mark.parametrize(
    "mode",
    [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared],
    ids=["shared", "key_shared"],
)
def test_deliver_after_and_deliver_at_delay_on_shared_modes(
    pc: pulsar.Client, mode: pulsar.ConsumerType
) -> None:
    topic = f"edge-delayed-{mode.name}"
    consumer = pc.subscribe(topic, "s", consumer_type=mode)
    producer = pc.create_producer(topic, batching_enabled=False)
    producer.send(b"now")
    sent = time.monotonic()
    producer.send(b"after", deliver_after=timedelta(seconds=DELAY_S))
    producer.send(b"at", deliver_at=int((time.time() + DELAY_S) * 1000))

    first = consumer.receive(timeout_millis=10_000)
    assert first.data() == b"now"
    consumer.acknowledge(first)
    # Still held back: wait until half a second before the earliest could be due (however long
    # the sends and the first receive took on a slow machine).
    held_ms = int((sent + DELAY_S - 0.5 - time.monotonic()) * 1000)
    if held_ms > 0:
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=held_ms)

    got = set()
    for _ in range(2):
        msg = consumer.receive(timeout_millis=10_000)
        consumer.acknowledge(msg)
        got.add(msg.data())
    assert got == {b"after", b"at"}
    assert time.monotonic() - sent >= DELAY_S - 0.5


@pytest.mark.parametrize(
    "mode",
    [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover],
    ids=["exclusive", "failover"],
)
def test_deliver_after_is_immediate_on_exclusive_modes(
    pc: pulsar.Client, mode: pulsar.ConsumerType
) -> None:
    topic = f"edge-delayed-{mode.name}"
    consumer = pc.subscribe(topic, "s", consumer_type=mode)
    producer = pc.create_producer(topic, batching_enabled=False)
    sent = time.monotonic()
    producer.send(b"later", deliver_after=timedelta(seconds=30))
    assert consumer.receive(timeout_millis=5_000).data() == b"later"
    assert time.monotonic() - sent < 5


def test_delayed_messages_stay_delayed_across_a_restart(tmp_path: Path) -> None:
    """The delayed index is rebuilt from the cursor: after a restart the message is still
    held back until its time, then delivered once."""
    delay = 8
    own = StandaloneProcess(tmp_path / "standalone").start()
    try:
        with closing(client(own)) as c:
            consumer = c.subscribe(
                "edge-delayed-restart", "s", consumer_type=pulsar.ConsumerType.Shared
            )
            producer = c.create_producer("edge-delayed-restart", batching_enabled=False)
            due = time.monotonic() + delay
            producer.send(b"delayed", deliver_after=timedelta(seconds=delay))
            producer.send(b"plain")
            msg = consumer.receive(timeout_millis=5_000)
            assert msg.data() == b"plain"
            consumer.acknowledge(msg)
            time.sleep(0.5)
        own.stop()
        own.start()

        with closing(client(own)) as c:
            consumer = c.subscribe(
                "edge-delayed-restart", "s", consumer_type=pulsar.ConsumerType.Shared
            )
            early = max(0, due - time.monotonic() - 1)
            if early > 0.5:
                with pytest.raises(pulsar.Timeout):
                    consumer.receive(timeout_millis=int(early * 1000))
            msg = consumer.receive(timeout_millis=15_000)
            assert msg.data() == b"delayed"
            assert time.monotonic() >= due - 1
            consumer.acknowledge(msg)
            with pytest.raises(pulsar.Timeout):
                consumer.receive(timeout_millis=1_500)
    finally:
        own.stop()
    assert_log_clean(own)


def test_subscription_type_changes_once_no_consumer_is_attached(node: StandaloneProcess) -> None:
    """Pulsar (PersistentSubscription.addConsumer) builds a new dispatcher of the requested type
    when no consumer is connected; only a connected one makes a mismatch ConsumerBusy."""
    c = client(node)
    try:
        producer = c.create_producer("pending-type-change", batching_enabled=False)
        first = c.subscribe("pending-type-change", "s", consumer_type=pulsar.ConsumerType.Exclusive)
        producer.send(b"one")
        first.close()
        shared = c.subscribe("pending-type-change", "s", consumer_type=pulsar.ConsumerType.Shared)
        assert shared.receive(timeout_millis=10_000).data() == b"one"
        # and, with the shared consumer attached, exclusive is now the mismatch
        with pytest.raises(pulsar.ConsumerBusy):
            c.subscribe("pending-type-change", "s", consumer_type=pulsar.ConsumerType.Exclusive)
    finally:
        c.close()


def test_interleaved_sends_of_two_producers_in_one_write_keep_each_producers_order(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    """The broker serves a read's SENDs a producer at a time (``producer.send_run``): SENDs of
    two producers interleaved in one write, a CLOSE_PRODUCER among them and a SEND after it,
    are stored in each producer's order, every one before the close receipted, the one after
    it refused as Pulsar refuses a SEND for a producer that is gone."""
    count = 300
    topics = {1: "edge-run-a", 2: "edge-run-b"}
    with RawConnection(node) as raw:
        raw.connect()
        names = {}
        for producer_id, topic in topics.items():
            raw.command(
                pb.CommandProducer(
                    topic=f"persistent://public/default/{topic}",
                    producer_id=producer_id,
                    request_id=producer_id,
                )
            )
            names[producer_id] = raw.expect(Type.PRODUCER_SUCCESS).body.producer_name  # type: ignore[attr-defined]
        burst = [
            send_frame(p, i, f"{topics[p]}-{i}".encode(), producer_name=names[p])
            for i in range(count)
            for p in (1, 2)
        ]
        burst.append(codec.encode_command(pb.CommandCloseProducer(producer_id=1, request_id=9)))
        burst.append(send_frame(1, count, b"late", producer_name=names[1]))
        burst += [
            send_frame(2, i, f"edge-run-b-{i}".encode(), producer_name=names[2])
            for i in range(count, count + 5)
        ]
        raw.send(b"".join(burst))
        receipts: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
        answers = []
        while len(receipts[1]) + len(receipts[2]) < 2 * count + 5 or len(answers) < 2:
            frame = raw.next_frame()
            if frame.type == Type.SEND_RECEIPT:
                body = frame.body
                receipts[body.producer_id].append((body.sequence_id, body.message_id.entryId))  # type: ignore[attr-defined]
            else:
                answers.append(frame)
    assert [f.name for f in answers] in (["SUCCESS", "SEND_ERROR"], ["SEND_ERROR", "SUCCESS"])
    refused = next(f.body for f in answers if f.name == "SEND_ERROR")
    assert (refused.producer_id, refused.sequence_id) == (1, count)  # type: ignore[attr-defined]
    for producer_id, expected in ((1, count), (2, count + 5)):
        assert [s for s, _ in receipts[producer_id]] == list(range(expected))
        entry_ids = [e for _, e in receipts[producer_id]]
        assert entry_ids == sorted(entry_ids) and len(set(entry_ids)) == expected
    for producer_id, expected in ((1, count), (2, count + 5)):
        topic = topics[producer_id]
        reader = pc.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=5000).data().decode())
        reader.close()
        assert got == [f"{topic}-{i}" for i in range(expected)]


def test_standalone_log_is_clean(node: StandaloneProcess) -> None:
    """Runs last: the module's standalone logged no traceback and no ERROR line."""
    assert_log_clean(node)


def test_acks_sent_just_before_a_reset_are_kept(node: StandaloneProcess, pc: pulsar.Client) -> None:
    """A client acks everything and its connection is reset before the broker handled all of
    it (the broker handles frames a slice at a time, and the answer to the first acks finds
    the reset): every ack it sent still counts, as everything a broker read before a channel
    closed does in Pulsar."""
    topic, count = "edge-acks-before-reset", 300
    producer = pc.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    producer.close()
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(
            pb.CommandSubscribe(
                topic=f"persistent://public/default/{topic}",
                subscription="s",
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=1,
                request_id=1,
                initialPosition=pb.CommandSubscribe.Earliest,
            )
        )
        raw.expect(Type.SUCCESS)
        raw.command(pb.CommandFlow(consumer_id=1, messagePermits=count))
        ids = [raw.expect(Type.MESSAGE).body.message_id for _ in range(count)]  # type: ignore[attr-defined]
        acks = b"".join(
            codec.encode_command(
                pb.CommandAck(
                    consumer_id=1,
                    ack_type=pb.CommandAck.Individual,
                    message_id=[message_id],
                    request_id=100 + i,  # each asks for an answer: the broker writes early
                )
            )
            for i, message_id in enumerate(ids)
        )
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.sock.sendall(acks)  # then closed with a reset
    deadline = time.monotonic() + 10
    while True:  # the broker notices the reset, and frees the exclusive subscription, soon
        try:
            consumer = pc.subscribe(topic, "s")
            break
        except pulsar.ConsumerBusy:
            assert time.monotonic() < deadline, "the reset connection's consumer stayed"
            time.sleep(0.1)
    back = [m.data() for m in drain(consumer, quiet_ms=1500)]
    consumer.close()
    assert back == [], f"{len(back)} of {count} acknowledged messages came back"
