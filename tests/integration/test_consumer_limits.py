"""Consumer limits, consumer ids, dispatch after read failures, deduplication of failed adds
and TableView, against real standalones (issue 8), counted exactly.

- Shared and key_shared stop sending to a consumer at its bound of unacknowledged messages
  and go on when it acknowledges; exclusive and failover are not bounded (as in Pulsar).
- A shared subscription stops reading at its own bound even for a consumer with permits and
  room under its consumer bound, and goes on when acknowledgements bring it below.
- A second SUBSCRIBE with a consumer id already in use on the connection is refused with
  ConsumerBusy unless it asks for the same topic and subscription again (then SUCCESS); the
  first consumer keeps receiving, and the refused one leaves nothing behind.
- A read the bookie cannot serve is logged with the subscription and retried with backoff;
  delivery resumes by itself once the entries are readable again, with no wake-up from the
  client.
- With deduplication on, a send whose add failed is stored when sent again with the same
  sequence id; only then is a resend a duplicate.
- TableView sees the latest value of every key, written before and after it was created, also
  on a topic of thousands of messages (the fresh reader's GET_LAST_MESSAGE_ID).

One standalone serves the module (the read-failure test runs its own); its log must hold no
traceback and no ERROR line at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pulsar
import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.polling import wait_until
from tests.support.raw_client import (
    EXPECTED_MS,
    RawConnection,
    admin,
    assert_log_clean,
    drain,
    module_standalone,
    send_frame,
)
from tests.support.standalone import StandaloneProcess, client

Type = pb.BaseCommand.Type

PER_CONSUMER = 10
PER_SUBSCRIPTION = 15
#: Above the bookie's largest entry (5 MiB + 10 KiB), so a message can pass the broker's size
#: check and still fail to be added to the ledger.
MAX_MESSAGE_SIZE = 8 * 1024 * 1024
QUIET_MS = 1000


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(
        tmp_path_factory.mktemp("consumer-limits") / "standalone",
        extra=[
            "--max-unacked-messages-per-consumer", str(PER_CONSUMER),
            "--max-unacked-messages-per-subscription", str(PER_SUBSCRIPTION),
            "--max-message-size", str(MAX_MESSAGE_SIZE),
        ],
    )  # fmt: skip


@pytest.fixture(scope="module")
def pc(node: StandaloneProcess) -> Iterator[pulsar.Client]:
    c = client(node)
    yield c
    c.close()


def unique_topic(name: str) -> str:
    return f"persistent://public/default/{name}-{time.time_ns()}"


def payload(i: int) -> bytes:
    return b"m-%03d" % i


def produce(pc: pulsar.Client, topic: str, count: int) -> None:
    """``count`` unbatched messages, each with its own key, every send confirmed."""
    producer = pc.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send(payload(i), partition_key=f"k{i}")
    producer.close()


def received_until_quiet(consumer: pulsar.Consumer, expect: int = 0) -> list[pulsar.Message]:
    """What the consumer receives, unacknowledged: the ``expect`` messages that must come
    (however slowly a loaded machine sends them), then more until nothing arrives for a while."""
    return drain(consumer, QUIET_MS, expect, acknowledge=False)


def data(messages: list[pulsar.Message]) -> list[bytes]:
    return [m.data() for m in messages]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    wait_until(condition, what, timeout)


# --------------------------------------------------------------------------------------------
# Unacknowledged-message bounds
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared], ids=str
)
def test_shared_modes_stop_at_the_consumer_bound_until_acks(
    pc: pulsar.Client, mode: pulsar.ConsumerType
) -> None:
    topic = unique_topic("bound")
    consumer = pc.subscribe(
        topic, "s", consumer_type=mode, initial_position=pulsar.InitialPosition.Earliest
    )
    produce(pc, topic, 30)

    held = received_until_quiet(consumer, PER_CONSUMER)
    assert data(held) == [payload(i) for i in range(PER_CONSUMER)]

    for message in held[:4]:
        consumer.acknowledge(message)
    more = received_until_quiet(consumer, 4)
    assert data(more) == [payload(i) for i in range(PER_CONSUMER, PER_CONSUMER + 4)]

    # Acknowledging as it goes, the consumer gets the rest, each message once.
    for message in held[4:] + more:
        consumer.acknowledge(message)
    rest = drain(consumer, QUIET_MS, 30 - PER_CONSUMER - 4)
    assert data(rest) == [payload(i) for i in range(PER_CONSUMER + 4, 30)]
    consumer.close()


@pytest.mark.parametrize(
    "mode", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover], ids=str
)
def test_exclusive_modes_are_not_bounded(pc: pulsar.Client, mode: pulsar.ConsumerType) -> None:
    topic = unique_topic("unbounded")
    consumer = pc.subscribe(
        topic, "s", consumer_type=mode, initial_position=pulsar.InitialPosition.Earliest
    )
    produce(pc, topic, 3 * PER_SUBSCRIPTION)
    held = received_until_quiet(consumer, 3 * PER_SUBSCRIPTION)  # nothing acknowledged
    assert data(held) == [payload(i) for i in range(3 * PER_SUBSCRIPTION)]
    consumer.close()


class RawConsumer:
    """A shared consumer on its own raw connection, so the test decides its permits exactly."""

    def __init__(self, node: StandaloneProcess, topic: str, subscription: str) -> None:
        self.raw = RawConnection(node)
        self.raw.connect()
        self.request_id = 1
        self.raw.command(
            pb.CommandSubscribe(
                topic=topic,
                subscription=subscription,
                subType=pb.CommandSubscribe.Shared,
                consumer_id=1,
                request_id=self.request_id,
                initialPosition=pb.CommandSubscribe.Earliest,
            )
        )
        self.raw.expect(Type.SUCCESS)

    def flow(self, permits: int) -> None:
        self.raw.command(pb.CommandFlow(consumer_id=1, messagePermits=permits))

    def messages(self, expect: int = 0) -> list[tuple[pb.MessageIdData, bytes]]:
        """(id, payload) of the ``expect`` MESSAGEs that must come, then of every other one
        until the broker goes quiet."""
        got = []
        while True:
            try:
                wait = EXPECTED_MS if len(got) < expect else QUIET_MS
                frame = self.raw.next_frame(timeout=wait / 1000)
            except TimeoutError:
                return got
            assert frame.type == Type.MESSAGE, frame.name
            got.append((frame.body.message_id, frame.payload))

    def acknowledge(self, ids: list[pb.MessageIdData]) -> None:
        self.request_id += 1
        self.raw.command(
            pb.CommandAck(
                consumer_id=1,
                ack_type=pb.CommandAck.Individual,
                message_id=ids,
                request_id=self.request_id,
            )
        )
        assert self.raw.expect(Type.ACK_RESPONSE).body.request_id == self.request_id

    def close(self) -> None:
        self.raw.close()


def test_shared_subscription_stops_at_its_bound_until_acks(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = unique_topic("sub-bound")
    produce(pc, topic, 40)
    first = RawConsumer(node, topic, "s")
    second = RawConsumer(node, topic, "s")
    try:
        first.flow(1000)
        assert [p for _, p in first.messages(PER_CONSUMER)] == [
            payload(i) for i in range(PER_CONSUMER)
        ]

        second.flow(5)  # the subscription reaches its bound: 10 + 5
        got = second.messages(5)
        assert [p for _, p in got] == [payload(i) for i in range(10, 15)]

        # Permits and room under its own bound, but the subscription is full.
        second.flow(5)
        assert second.messages() == []

        second.acknowledge([message_id for message_id, _ in got])
        assert [p for _, p in second.messages(5)] == [payload(i) for i in range(15, 20)]

        second.flow(5)  # full again
        assert second.messages() == []
        assert first.messages() == []
    finally:
        first.close()
        second.close()


# --------------------------------------------------------------------------------------------
# Consumer ids
# --------------------------------------------------------------------------------------------


def test_consumer_id_in_use_is_refused_except_for_the_same_subscription(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = unique_topic("ids")
    other_topic = unique_topic("ids-other")

    def subscribe(raw: RawConnection, request_id: int, topic: str, subscription: str) -> None:
        raw.command(
            pb.CommandSubscribe(
                topic=topic,
                subscription=subscription,
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=1,
                request_id=request_id,
                initialPosition=pb.CommandSubscribe.Earliest,
            )
        )

    with RawConnection(node) as raw:
        raw.connect()
        subscribe(raw, 1, topic, "s")
        assert raw.expect(Type.SUCCESS).body.request_id == 1

        for request_id, (t, s) in enumerate([(other_topic, "s"), (topic, "other")], start=2):
            subscribe(raw, request_id, t, s)
            error = raw.expect(Type.ERROR).body
            assert (error.request_id, error.error) == (request_id, pb.ConsumerBusy), error

        subscribe(raw, 4, topic, "s")  # the same subscription asked again
        assert raw.expect(Type.SUCCESS).body.request_id == 4

        raw.command(pb.CommandFlow(consumer_id=1, messagePermits=100))
        produce(pc, topic, 3)
        got = [raw.expect(Type.MESSAGE) for _ in range(3)]
        assert [f.body.consumer_id for f in got] == [1, 1, 1]
        assert [f.payload for f in got] == [payload(i) for i in range(3)]

        # The refused SUBSCRIBEs left no consumer behind: both exclusive subscriptions are free.
        for t, s in [(other_topic, "s"), (topic, "other")]:
            pc.subscribe(t, s, consumer_type=pulsar.ConsumerType.Exclusive).close()


# --------------------------------------------------------------------------------------------
# Dispatch after read failures
# --------------------------------------------------------------------------------------------


def test_dispatch_retries_a_failed_read_and_resumes_by_itself(tmp_path: Path) -> None:
    topic = "persistent://public/default/read-failure"
    count = 50
    node = StandaloneProcess(tmp_path / "node").start()
    try:
        with closing(client(node)) as c:
            produce(c, topic, count)
        node.stop()  # the final checkpoint writes every entry into the entry logs

        # Cut the entry log short in place: the bookie's reads of it fail (a short read) until
        # its bytes are written back into the same file.
        logs = (node.data_dir / "bookie" / "ledgers" / "current").glob("*.log")
        (entry_log,) = [p for p in logs if payload(0) in p.read_bytes()]
        saved = entry_log.read_bytes()
        with open(entry_log, "r+b") as f:
            f.truncate(8)  # its header (magic) only

        node.start()
        with closing(client(node)) as c:
            consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            failed = f"subscription {topic}/s: dispatch failed, retrying in"

            def retried() -> bool:
                try:
                    message = consumer.receive(timeout_millis=100)
                except pulsar.Timeout:
                    return node.log_tail(100_000).count(failed) >= 3
                raise AssertionError(f"received {message.data()!r} from an unreadable entry log")

            wait_for(retried, "three logged attempts at the failed read")
            delays = [
                float(line.split(failed)[1].split()[0])
                for line in node.log_tail(100_000).splitlines()
                if failed in line
            ]
            assert delays[0] < delays[1] < delays[2], delays  # backing off

            with open(entry_log, "r+b") as f:
                f.write(saved)
            # No FLOW, ack or new entry from here: the retry alone must deliver.
            got = [consumer.receive(timeout_millis=10_000) for _ in range(count)]
            assert data(got) == [payload(i) for i in range(count)]
            assert received_until_quiet(consumer) == []
    finally:
        node.stop()
        print(node.log_tail())
    assert_log_clean(node)


# --------------------------------------------------------------------------------------------
# Deduplication
# --------------------------------------------------------------------------------------------


def signed(value: int) -> int:
    """A message id's uint64 field as the Java long it stands for."""
    return value - 2**64 if value >= 2**63 else value


def test_deduplication_stores_the_resend_of_a_failed_add(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    namespace = f"public/dedup-{time.time_ns()}"
    assert admin(node, "PUT", f"/namespaces/{namespace}")[0] == 204
    assert admin(node, "POST", f"/namespaces/{namespace}/deduplication", "true")[0] == 204
    topic = f"persistent://{namespace}/payments"
    consumer = pc.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)

    with RawConnection(node) as raw:
        raw.connect()
        raw.command(
            pb.CommandProducer(topic=topic, producer_id=1, request_id=1, producer_name="bank")
        )
        assert raw.expect(Type.PRODUCER_SUCCESS).body.last_sequence_id == -1

        def send(sequence_id: int, body: bytes) -> codec.Frame:
            raw.send(send_frame(1, sequence_id, body, producer_name="bank"))
            return raw.next_frame(timeout=30)

        def stored_at(frame: codec.Frame) -> tuple[int, int]:
            assert frame.type == Type.SEND_RECEIPT, (frame.name, frame.body)
            message_id = frame.body.message_id
            return signed(message_id.ledgerId), signed(message_id.entryId)

        first = stored_at(send(0, b"first"))
        assert first[1] >= 0
        assert stored_at(send(0, b"first again")) == (-1, -1)  # deduplication is on

        too_large = send(1, b"x" * (6 * 1024 * 1024))  # passes the broker, not the bookie
        assert too_large.type == Type.SEND_ERROR, too_large.name
        assert too_large.body.sequence_id == 1

        second = stored_at(send(1, b"second"))  # the failed add did not count
        assert second[0] >= first[0] and second > first
        assert stored_at(send(1, b"second again")) == (-1, -1)  # now it did

    got = received_until_quiet(consumer, 2)
    assert data(got) == [b"first", b"second"]
    for message in got:
        consumer.acknowledge(message)
    consumer.close()


# --------------------------------------------------------------------------------------------
# TableView
# --------------------------------------------------------------------------------------------


def table(view: pulsar.TableView) -> dict[str, bytes]:
    snapshot: dict[str, bytes] = {}
    view.for_each(lambda key, value: snapshot.__setitem__(key, value))
    return snapshot


def test_table_view_sees_the_latest_value_per_key(pc: pulsar.Client) -> None:
    topic = unique_topic("table")
    producer = pc.create_producer(topic, batching_enabled=False)
    for key, value in [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1")]:
        producer.send(value, partition_key=key)

    view = pc.create_table_view(topic)
    # Created only once it has read to the end: what was written before is all there.
    assert table(view) == {"a": b"2", "b": b"1", "c": b"1"}

    for key, value in [("b", b"2"), ("d", b"1"), ("a", b"3")]:
        producer.send(value, partition_key=key)
    expected = {"a": b"3", "b": b"2", "c": b"1", "d": b"1"}
    wait_for(lambda: table(view) == expected, "the table view to see the later messages")
    assert len(view) == 4
    view.close()
    producer.close()


def test_table_view_of_a_topic_with_thousands_of_messages(pc: pulsar.Client) -> None:
    topic = unique_topic("big-table")
    keys, rounds = 250, 20  # 5,000 messages
    # Unbatched: the client's TableView reads what its queue holds by recursion, and 5,000
    # batched messages overflow the stack of the client's thread (pulsar-client 3.x).
    producer = pc.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    for r in range(rounds):
        for k in range(keys):
            producer.send_async(b"round-%d" % r, None, partition_key=f"key-{k}")
    producer.flush()
    producer.close()

    view = pc.create_table_view(topic)
    assert table(view) == {f"key-{k}": b"round-%d" % (rounds - 1) for k in range(keys)}
    view.close()


def test_standalone_log_is_clean(node: StandaloneProcess) -> None:
    """Runs last: the module's standalone logged no traceback and no ERROR line."""
    assert_log_clean(node)
