"""Bad input against a running standalone, in raw Pulsar frames (issue 8).

Each test sends one kind of bad input and checks what the broker answers; afterwards the
broker must be healthy: its process runs, a fresh official client completes a round trip, and
its RSS stayed bounded. Covered: malformed frames (garbage, a huge totalSize, a commandSize
beyond its frame, an unknown command type, a type without its body, a broker-only command),
commands before CONNECT, a second CONNECT, SEND on an unknown producer, batch-index ACKs with an
absurd batch size, a cumulative ACK past the end of the topic, partitioned metadata of a topic
with a huge partition count, GET_SCHEMA, and a peer that never answers PING.

One standalone serves the module (the keep-alive test runs its own with a 1 s interval); its
log must hold no traceback and no ERROR line at the end.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.raw_client import (
    RawConnection,
    admin,
    assert_log_clean,
    module_standalone,
    round_trip,
    rss_mb,
    send_frame,
)
from tests.support.standalone import StandaloneProcess, client

Type = pb.BaseCommand.Type
RSS_LIMIT_MB = 300
U32 = struct.Struct(">I")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("bad-input") / "standalone")


def assert_healthy(node: StandaloneProcess, after: str) -> None:
    """The broker survived `after`: running, serving a fresh client, memory bounded."""
    assert node.process is not None
    assert node.process.poll() is None, f"the standalone exited after {after}:\n{node.log_tail()}"
    started = time.monotonic()
    round_trip(node, f"healthy-{time.monotonic_ns()}")
    assert time.monotonic() - started < 15, f"round trip after {after} took too long"
    rss = rss_mb(node.process.pid)
    assert rss < RSS_LIMIT_MB, f"RSS {rss:.0f} MiB after {after}"


def raw_frame(command_bytes: bytes, *, total: int | None = None, size: int | None = None) -> bytes:
    """A simple frame around arbitrary BaseCommand bytes, sizes overridable."""
    size = len(command_bytes) if size is None else size
    total = 4 + len(command_bytes) if total is None else total
    return U32.pack(total) + U32.pack(size) + command_bytes


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def ping_pong(raw: RawConnection) -> None:
    """The connection is still served: a PING is answered with a PONG."""
    raw.command(pb.CommandPing())
    assert raw.expect(Type.PONG).type == Type.PONG


# --------------------------------------------------------------------------------------------
# Malformed frames: the connection is closed, nobody else notices
# --------------------------------------------------------------------------------------------

MALFORMED = {
    "garbage": b"\xde\xad\xbe\xef" * 64 + bytes(range(256)),
    "huge-total-size": U32.pack(0xFFFFFFF0) + U32.pack(8) + b"\x08\x12",
    "total-size-below-minimum": U32.pack(2) + b"\x00\x00",
    "command-size-beyond-frame": raw_frame(b"\x08\x12\x92\x01\x00", size=1000),
    "command-bytes-not-protobuf": raw_frame(b"\xff\xff\xff\xff\xff\xff\xff"),
    "unknown-command-type": raw_frame(b"\x08" + varint(999)),
    "type-without-body": raw_frame(b"\x08" + varint(Type.PRODUCER)),
    "broker-only-command": codec.encode_command(
        pb.CommandSendReceipt(producer_id=1, sequence_id=1)
    ),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_frame_closes_only_that_connection(node: StandaloneProcess, kind: str) -> None:
    c = client(node)
    try:
        bystander = c.create_producer(f"bystander-{kind}", batching_enabled=False)
        bystander.send(b"before")
        with RawConnection(node) as raw:
            raw.connect()
            try:
                raw.send(MALFORMED[kind])
            except (ConnectionResetError, BrokenPipeError):
                pass  # closed while we were still writing
            assert raw.closed_by_peer(timeout=10), f"{kind}: the broker kept the connection"
        bystander.send(b"after")  # the official client's connection is untouched
    finally:
        c.close()
    assert_healthy(node, kind)


def test_malformed_frame_before_connect(node: StandaloneProcess) -> None:
    with RawConnection(node) as raw:
        raw.send(MALFORMED["garbage"])
        assert raw.closed_by_peer(timeout=10)
    assert_healthy(node, "garbage before CONNECT")


def test_huge_total_size_is_refused_before_buffering(node: StandaloneProcess) -> None:
    """A frame announcing 4 GiB, followed by a steady trickle: no memory grows for it."""
    assert node.process is not None
    before = rss_mb(node.process.pid)
    with RawConnection(node) as raw:
        raw.connect()
        try:
            raw.send(U32.pack(0xFFFFFFFF))
            for _ in range(64):
                raw.send(b"\x00" * 65536)
        except (ConnectionResetError, BrokenPipeError):
            pass
        assert raw.closed_by_peer(timeout=10)
    assert rss_mb(node.process.pid) - before < 50
    assert_healthy(node, "a 4 GiB totalSize")


# --------------------------------------------------------------------------------------------
# Commands in the wrong state
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pb.CommandProducer(topic="persistent://public/default/early", producer_id=1, request_id=1),
        pb.CommandLookupTopic(topic="persistent://public/default/early", request_id=1),
        pb.CommandSubscribe(
            topic="persistent://public/default/early",
            subscription="s",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1,
            request_id=1,
        ),
    ],
    ids=["producer", "lookup", "subscribe"],
)
def test_command_before_connect_closes_the_connection(
    node: StandaloneProcess, body: object
) -> None:
    with RawConnection(node) as raw:
        raw.command(body)
        assert raw.closed_by_peer(timeout=10)
    assert_healthy(node, f"{type(body).__name__} before CONNECT")


def test_ping_before_connect_is_answered(node: StandaloneProcess) -> None:
    with RawConnection(node) as raw:
        ping_pong(raw)  # Pulsar allows PING at any time
        raw.connect()
        ping_pong(raw)
    assert_healthy(node, "PING before CONNECT")


def test_second_connect_closes_the_connection(node: StandaloneProcess) -> None:
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(pb.CommandConnect(client_version="again", protocol_version=19))
        assert raw.closed_by_peer(timeout=10)
    assert_healthy(node, "a second CONNECT")


# --------------------------------------------------------------------------------------------
# Requests with bad ids or values: answered, the connection stays
# --------------------------------------------------------------------------------------------


def test_send_on_unknown_producer_is_answered_with_send_error(node: StandaloneProcess) -> None:
    with RawConnection(node) as raw:
        raw.connect()
        raw.send(send_frame(77, 5, b"nobody made me"))
        error = raw.expect(Type.SEND_ERROR).body
        assert (error.producer_id, error.sequence_id) == (77, 5)
        ping_pong(raw)

        # The connection still serves a real producer.
        topic = "persistent://public/default/bad-unknown-producer"
        raw.command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
        raw.expect(Type.PRODUCER_SUCCESS)
        raw.send(send_frame(1, 0, b"real"))
        assert raw.expect(Type.SEND_RECEIPT).body.sequence_id == 0
    assert_healthy(node, "SEND on an unknown producer")


def test_get_schema_is_answered_with_a_schema_response(node: StandaloneProcess) -> None:
    topic = "persistent://public/default/bad-schema"
    round_trip(node, topic)  # the topic exists
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(pb.CommandGetSchema(request_id=9, topic=topic))
        answer = raw.next_frame()
        assert answer.type == Type.GET_SCHEMA_RESPONSE, f"answered {answer.name}: {answer.body}"
        assert answer.body.request_id == 9
        raw.command(pb.CommandGetSchema(request_id=10, topic="persistent://public/default/nope"))
        answer = raw.next_frame()
        assert answer.type == Type.GET_SCHEMA_RESPONSE, f"answered {answer.name}: {answer.body}"
        assert answer.body.request_id == 10
        ping_pong(raw)
    assert_healthy(node, "GET_SCHEMA")


class RawConsumer:
    """A raw connection with one producer (id 1) and one exclusive consumer (id 1)."""

    def __init__(self, node: StandaloneProcess, topic: str, subscription: str) -> None:
        self.raw = RawConnection(node)
        self.raw.connect()
        self.topic = topic
        self.request_id = 10
        self.sequence_id = 0
        self.raw.command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
        self.raw.expect(Type.PRODUCER_SUCCESS)
        self.raw.command(
            pb.CommandSubscribe(
                topic=topic,
                subscription=subscription,
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=1,
                request_id=2,
                initialPosition=pb.CommandSubscribe.Earliest,
            )
        )
        self.raw.expect(Type.SUCCESS)

    def produce(self, count: int) -> list[pb.MessageIdData]:
        ids = []
        for _ in range(count):
            self.raw.send(send_frame(1, self.sequence_id, b"raw-%d" % self.sequence_id))
            ids.append(self.expect_skipping_messages(Type.SEND_RECEIPT).body.message_id)
            self.sequence_id += 1
        return ids

    def expect_skipping_messages(self, kind: int) -> codec.Frame:
        while True:
            frame = self.raw.next_frame()
            if frame.type == Type.MESSAGE and kind != Type.MESSAGE:
                continue
            assert frame.type == kind, f"expected {codec.command_name(kind)}, got {frame.name}"
            return frame

    def ack(self, ack_type: int, message_id: pb.MessageIdData) -> pb.CommandAckResponse:
        self.request_id += 1
        self.raw.command(
            pb.CommandAck(
                consumer_id=1,
                ack_type=ack_type,
                message_id=[message_id],
                request_id=self.request_id,
            )
        )
        answer = self.expect_skipping_messages(Type.ACK_RESPONSE).body
        assert answer.request_id == self.request_id
        return answer

    def close(self) -> None:
        self.raw.close()


def test_batch_index_ack_with_an_absurd_batch_size(node: StandaloneProcess) -> None:
    """batch_size 2**31-1 with an ack_set must not build a list of that size."""
    assert node.process is not None
    topic = "persistent://public/default/bad-ack-set"
    c = client(node)
    try:  # one real batch of 10 messages, so the ack addresses a batched entry too
        producer = c.create_producer(
            topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=50
        )
        for i in range(10):
            producer.send_async(b"batched-%d" % i, None)
        producer.flush()
    finally:
        c.close()

    rc = RawConsumer(node, topic, "s")
    try:
        rc.raw.command(pb.CommandFlow(consumer_id=1, messagePermits=100))
        batched = rc.expect_skipping_messages(Type.MESSAGE).body.message_id
        unbatched = rc.produce(1)[0]
        before = rss_mb(node.process.pid)
        for target in (batched, unbatched):
            for ack_type in (pb.CommandAck.Individual, pb.CommandAck.Cumulative):
                message_id = pb.MessageIdData()
                message_id.CopyFrom(target)
                message_id.ClearField("ack_set")
                message_id.ack_set.extend([0b1010, -1])
                message_id.batch_size = 2**31 - 1
                started = time.monotonic()
                rc.ack(ack_type, message_id)  # answered at all: the event loop did not freeze
                assert time.monotonic() - started < 5
        ping_pong(rc.raw)
        assert rss_mb(node.process.pid) - before < 100
    finally:
        rc.close()
    assert_healthy(node, "an ACK with batch_size 2**31-1")


def test_cumulative_ack_past_the_end_is_refused(node: StandaloneProcess) -> None:
    topic = "persistent://public/default/bad-ack-past-end"
    rc = RawConsumer(node, topic, "s")
    try:
        ids = rc.produce(3)
        last = ids[-1]
        beyond = pb.MessageIdData(ledgerId=last.ledgerId, entryId=last.entryId + 1_000_000)
        answer = rc.ack(pb.CommandAck.Cumulative, beyond)
        assert answer.HasField("error"), "a cumulative ack past the end of the topic was accepted"
        far_ledger = pb.MessageIdData(ledgerId=last.ledgerId + 1_000, entryId=0)
        answer = rc.ack(pb.CommandAck.Cumulative, far_ledger)
        assert answer.HasField("error"), "a cumulative ack in a future ledger was accepted"
        ping_pong(rc.raw)
    finally:
        rc.close()

    # The subscription was not moved: everything stored and everything new is delivered.
    c = client(node)
    try:
        producer = c.create_producer(topic, batching_enabled=False)
        consumer = c.subscribe(topic, "s")
        producer.send(b"new")
        got = []
        for _ in range(4):
            msg = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(msg)
            got.append(msg.data())
        assert got == [b"raw-0", b"raw-1", b"raw-2", b"new"]
    finally:
        c.close()
    assert_healthy(node, "a cumulative ACK past the end")


def test_cumulative_ack_past_the_end_on_an_official_consumer_subscription(
    node: StandaloneProcess,
) -> None:
    """Same refusal seen from the official client: after a raw bad ack, new messages flow."""
    topic = "persistent://public/default/bad-ack-past-end-2"
    rc = RawConsumer(node, topic, "s")
    try:
        last = rc.produce(1)[0]
        rc.ack(
            pb.CommandAck.Cumulative,
            pb.MessageIdData(ledgerId=last.ledgerId, entryId=last.entryId + 50),
        )
    finally:
        rc.close()
    c = client(node)
    try:
        consumer = c.subscribe(topic, "s")
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(5):
            producer.send(b"after-%d" % i)
        got = [consumer.receive(timeout_millis=10_000).data() for _ in range(6)]
        assert got == [b"raw-0"] + [b"after-%d" % i for i in range(5)]
    finally:
        c.close()


@pytest.mark.parametrize("count", [10**9, 10**13, 2**31, -1, 0])
def test_huge_partition_count(node: StandaloneProcess, count: int) -> None:
    """Refused by the admin API (4xx with a reason) or, if created, answered on the wire."""
    name = f"bad-partitions-{count}".replace("-1", "neg1")
    path = f"/persistent/public/default/{name}/partitions"
    started = time.monotonic()
    status, body = admin(node, "PUT", path, str(count))
    assert time.monotonic() - started < 15
    assert status < 500, f"PUT {count} partitions: {status} {body}"
    if status >= 400:
        assert "reason" in body, body
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(
            pb.CommandPartitionedTopicMetadata(
                topic=f"persistent://public/default/{name}", request_id=3
            )
        )
        answer = raw.expect(Type.PARTITIONED_METADATA_RESPONSE, timeout=15).body
        assert answer.request_id == 3
        if status < 300:
            assert answer.response == answer.Success and answer.partitions == count
        ping_pong(raw)
    status, body = admin(node, "GET", "/persistent/public/default")
    assert status == 200, body
    assert_healthy(node, f"a partitioned topic with {count} partitions")


TOPIC = "persistent://public/default/bad-requests"
REQUESTS = {
    "ack-unknown-consumer": (
        pb.CommandAck(
            consumer_id=99,
            ack_type=pb.CommandAck.Individual,
            message_id=[pb.MessageIdData(ledgerId=0, entryId=0)],
            request_id=6,
        ),
        Type.ACK_RESPONSE,
    ),
    "seek-unknown-consumer": (
        pb.CommandSeek(consumer_id=99, request_id=8, message_publish_time=0),
        Type.ERROR,
    ),
    "last-id-unknown-consumer": (
        pb.CommandGetLastMessageId(consumer_id=99, request_id=9),
        Type.ERROR,
    ),
    "lookup-invalid-topic-name": (
        pb.CommandLookupTopic(topic="bad topic name:::", request_id=10),
        Type.LOOKUP_RESPONSE,
    ),
    "lookup-unknown-listener": (
        pb.CommandLookupTopic(topic=TOPIC, request_id=5, advertised_listener_name="nope"),
        Type.LOOKUP_RESPONSE,
    ),
    "producer-in-missing-namespace": (
        pb.CommandProducer(topic="persistent://nope/nope/x", producer_id=5, request_id=11),
        Type.ERROR,
    ),
    "metadata-invalid-topic-name": (
        pb.CommandPartitionedTopicMetadata(topic="bad topic name:::", request_id=12),
        Type.PARTITIONED_METADATA_RESPONSE,
    ),
}


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_bad_request_is_answered_and_the_connection_stays(
    node: StandaloneProcess, kind: str
) -> None:
    body, answer_type = REQUESTS[kind]
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(body)
        answer = raw.expect(answer_type)
        assert answer.body.request_id == body.request_id
        if answer_type == Type.ACK_RESPONSE:
            assert answer.body.HasField("error")
        if answer_type in (Type.LOOKUP_RESPONSE, Type.PARTITIONED_METADATA_RESPONSE):
            assert answer.body.response == answer.body.Failed
        ping_pong(raw)
    assert_healthy(node, kind)


def test_absurd_flow_and_redeliver_values_leave_the_connection_working(
    node: StandaloneProcess,
) -> None:
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(
            pb.CommandSubscribe(
                topic=TOPIC,
                subscription="absurd",
                subType=pb.CommandSubscribe.Shared,
                consumer_id=1,
                request_id=1,
            )
        )
        raw.expect(Type.SUCCESS)
        raw.command(pb.CommandFlow(consumer_id=1, messagePermits=2**32 - 1))
        raw.command(pb.CommandFlow(consumer_id=99, messagePermits=10))  # unknown consumer
        raw.command(
            pb.CommandRedeliverUnacknowledgedMessages(
                consumer_id=1,
                message_ids=[pb.MessageIdData(ledgerId=2**64 - 1, entryId=2**64 - 1)],
            )
        )
        ping_pong(raw)
        raw.command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=2))
        raw.expect(Type.PRODUCER_SUCCESS)
        raw.send(send_frame(1, 0, b"flows"))
        frames = {raw.next_frame().type, raw.next_frame().type}
        assert frames == {Type.SEND_RECEIPT, Type.MESSAGE}
    assert_healthy(node, "absurd FLOW and REDELIVER values")


# --------------------------------------------------------------------------------------------
# Keep-alive
# --------------------------------------------------------------------------------------------


def test_a_peer_that_never_answers_ping_is_closed(tmp_path: Path) -> None:
    interval, timeout = 1.0, 2.5
    own = StandaloneProcess(
        tmp_path / "standalone",
        extra=[
            "--keep-alive-interval-seconds",
            str(interval),
            "--keep-alive-timeout-seconds",
            str(timeout),
        ],
    ).start()
    try:
        with RawConnection(own, answer_pings=False) as silent:
            silent.connect()
            started = time.monotonic()
            # Bounds wide enough for a loaded machine: what is checked is that a PING comes
            # when idle and that the close waits for the timeout after it, not the timers' grain.
            assert silent.expect(Type.PING, timeout=3 * interval + 5).type == Type.PING
            pinged_after = time.monotonic() - started
            assert silent.closed_by_peer(timeout=2 * timeout + 5), "PING unanswered, still open"
            closed_after = time.monotonic() - started
            # A PING after an idle interval, the close once the timeout passed after it (the
            # PING is read late when this process is slow, so the gap is bounded loosely).
            assert closed_after - pinged_after >= timeout * 0.5, (pinged_after, closed_after)
            assert closed_after - pinged_after <= timeout + 3, (pinged_after, closed_after)
        # The official client answers pings: it keeps working with the short interval.
        c = client(own)
        try:
            producer = c.create_producer("keepalive", batching_enabled=False)
            consumer = c.subscribe("keepalive", "s")
            time.sleep(4 * interval)
            producer.send(b"still here")
            assert consumer.receive(timeout_millis=10_000).data() == b"still here"
        finally:
            c.close()
    finally:
        own.stop()
    assert_log_clean(own)


def test_an_idle_peer_that_answers_pings_is_kept(tmp_path: Path) -> None:
    own = StandaloneProcess(
        tmp_path / "standalone", extra=["--keep-alive-interval-seconds", "1"]
    ).start()
    try:
        with RawConnection(own) as raw:
            raw.connect()
            # Idle except for answering the broker's PINGs, until the second one (at about 4 s;
            # a broker that closed the connection fails the ping_pong below).
            deadline = time.monotonic() + 20
            while raw.pings_seen < 2 and time.monotonic() < deadline:
                try:
                    frame = raw.next_frame(timeout=0.2)
                except TimeoutError:
                    continue
                raise AssertionError(f"unexpected {frame.name} on an idle connection")
            assert raw.pings_seen >= 2
            ping_pong(raw)
    finally:
        own.stop()
    assert_log_clean(own)


def test_standalone_log_is_clean(node: StandaloneProcess) -> None:
    """Runs last: the module's standalone logged no traceback and no ERROR line."""
    assert_log_clean(node)
