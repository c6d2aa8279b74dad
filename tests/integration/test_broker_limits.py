"""Limits and less travelled paths of the broker, with the official pulsar-client and raw frames.

- Message size: the broker advertises its `max_message_size` in CONNECTED, the client refuses a
  larger message with MessageTooBig and carries on; a peer that ignores the limit and sends a
  frame above the broker's frame limit loses its connection, and nobody else does.
- Batch-index acknowledgements: acking some messages of a batch redelivers exactly the others,
  also after a clean restart and after a SIGKILL past the cursor's persistence bound.
- Partitioned topics: one key always lands in one partition, keys and round-robin spread.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.raw_client import drain
from tests.support.standalone import StandaloneProcess, client

SMALL_LIMIT = 64 * 1024  # far below the 5 MiB default, so only the advertised value explains it
Type = pb.BaseCommand.Type


@pytest.fixture
def small_limit(tmp_path: Path) -> Iterator[StandaloneProcess]:
    node = StandaloneProcess(
        tmp_path / "small", extra=["--max-message-size", str(SMALL_LIMIT)]
    ).start()
    try:
        yield node
    finally:
        node.stop()
        print(node.log_tail())


def drain_reader(reader: pulsar.Reader, quiet_ms: int = 1500) -> list[pulsar.Message]:
    got = []
    while True:
        try:
            got.append(reader.read_next(quiet_ms))
        except pulsar.Timeout:
            return got


# --------------------------------------------------------------------------------------------
# Message size
# --------------------------------------------------------------------------------------------


def test_client_refuses_a_message_over_the_advertised_limit_and_carries_on(
    small_limit: StandaloneProcess,
) -> None:
    c = client(small_limit)
    try:
        consumer = c.subscribe("sized", "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer("sized", batching_enabled=False)
        near_limit = b"n" * (SMALL_LIMIT - 512)  # metadata and command fit in the rest
        producer.send(b"before")
        producer.send(near_limit)
        with pytest.raises(pulsar.MessageTooBig):
            producer.send(b"x" * (SMALL_LIMIT + 1))
        producer.send(b"after")  # same producer, same connection

        got = [m.data() for m in drain(consumer, acknowledge=False)]
        assert got == [b"before", near_limit, b"after"]
    finally:
        c.close()


class RawConnection:
    """A hand-driven Pulsar connection that sends whatever frames the test builds."""

    def __init__(self, node: StandaloneProcess) -> None:
        self.sock = socket.create_connection(("127.0.0.1", node.port), timeout=10)
        self.decoder = codec.FrameDecoder(64 * 1024 * 1024)

    def close(self) -> None:
        self.sock.close()

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def expect(self, kind: int) -> codec.Frame:
        """The next frame, which must be of type `kind` (pings are answered and skipped)."""
        while True:
            for frame in self._frames():
                if frame.type == Type.PING:
                    self.send(codec.encode_command(pb.CommandPong()))
                    continue
                assert frame.type == kind, f"expected {codec.command_name(kind)}, got {frame}"
                return frame

    def _frames(self) -> Iterator[codec.Frame]:
        while True:
            frame = self.decoder.next_frame()
            if frame is None:
                data = self.sock.recv(65536)
                assert data, "the broker closed the connection"
                self.decoder.receive_data(data)
                continue
            yield frame

    def closed_by_peer(self, timeout: float = 10) -> bool:
        """True once the broker has closed the connection (EOF or reset) within `timeout`."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass  # anything the broker sent before closing
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        return True


def send_frame(producer_id: int, sequence_id: int, payload: bytes) -> bytes:
    metadata = pb.MessageMetadata(
        producer_name="raw", sequence_id=sequence_id, publish_time=int(time.time() * 1000)
    )
    command = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=1)
    return codec.encode_payload_command(command, metadata, payload)


def test_a_frame_over_the_broker_limit_closes_only_that_connection(
    small_limit: StandaloneProcess,
) -> None:
    topic = "persistent://public/default/raw-sized"
    c = client(small_limit)
    try:
        bystander = c.create_producer(topic, batching_enabled=False)
        bystander.send(b"bystander before")

        raw = RawConnection(small_limit)
        try:
            raw.send(
                codec.encode_command(
                    pb.CommandConnect(
                        client_version="magnetar-limit-test",
                        protocol_version=codec.SERVER_PROTOCOL_VERSION,
                    )
                )
            )
            connected = raw.expect(Type.CONNECTED).body
            assert connected.max_message_size == SMALL_LIMIT

            raw.send(
                codec.encode_command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
            )
            raw.expect(Type.PRODUCER_SUCCESS)
            raw.send(send_frame(1, 0, b"raw within limit"))
            assert raw.expect(Type.SEND_RECEIPT).body.sequence_id == 0

            oversized = send_frame(1, 1, b"x" * (SMALL_LIMIT + codec.FRAME_PADDING + 4096))
            assert len(oversized) > SMALL_LIMIT + codec.FRAME_PADDING
            try:
                raw.send(oversized)
            except (ConnectionResetError, BrokenPipeError):
                pass  # the broker may hang up before it has read everything
            assert raw.closed_by_peer(), "the broker kept a connection that broke its frame limit"
        finally:
            raw.close()

        bystander.send(b"bystander after")  # the official client's connection is untouched
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        got = [m.data() for m in drain_reader(reader)]
        assert got == [b"bystander before", b"raw within limit", b"bystander after"]
    finally:
        c.close()
    assert small_limit.process is not None and small_limit.process.poll() is None


# --------------------------------------------------------------------------------------------
# Batch-index acknowledgements
# --------------------------------------------------------------------------------------------


def publish_one_batch(c: pulsar.Client, topic: str, count: int) -> None:
    producer = c.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=count,
        batching_max_publish_delay_ms=50,
    )
    results: list[pulsar.Result] = []
    ids: list[pulsar.MessageId] = []
    done = threading.Event()

    def sent(result: pulsar.Result, message_id: pulsar.MessageId) -> None:
        results.append(result)  # asserted below: an assert in the client's thread is lost
        ids.append(message_id)
        if len(ids) == count:
            done.set()

    for i in range(count):
        producer.send_async(f"item-{i}".encode(), sent)
    producer.flush()
    assert done.wait(10)
    assert results == [pulsar.Result.Ok] * count
    # Precondition: the client really made one batch entry of `count` messages.
    assert len({(m.ledger_id(), m.entry_id()) for m in ids}) == 1
    assert sorted(m.batch_index() for m in ids) == list(range(count))
    producer.close()


@pytest.mark.parametrize("restart", ["none", "stop", "kill"])
def test_batch_index_acks_redeliver_exactly_the_unacked_messages(
    tmp_path: Path, restart: str
) -> None:
    """Pulsar's rule: an ACK's `ack_set` lists the batch indexes still *un*acknowledged (the C++
    client sends no `batch_size`), and a redelivered batch carries the same bit set in its
    CommandMessage so the client skips the acknowledged indexes. The restart is on the same
    ports: the embedded bookie's id is its address, recorded in every ledger's ensemble."""
    node = StandaloneProcess(tmp_path / "batch-acks").start()
    try:
        c = client(node)
        publish_one_batch(c, "batched-acks", 10)
        consumer = c.subscribe(
            "batched-acks",
            "workers",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            batch_index_ack_enabled=True,
        )
        messages = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
        assert [m.message_id().batch_index() for m in messages] == list(range(10))
        for m in messages:
            if m.message_id().batch_index() in (0, 2, 4):
                consumer.acknowledge(m)
        consumer.close()  # flushes the client's grouped acks
        c.close()

        if restart == "stop":
            node.stop()
            node.start()
        elif restart == "kill":
            time.sleep(2.5)  # cursor state is persisted at most every second (cursor.py)
            node.kill()
            node.start()

        c = client(node)
        try:
            consumer = c.subscribe(
                "batched-acks",
                "workers",
                consumer_type=pulsar.ConsumerType.Shared,
                batch_index_ack_enabled=True,
            )
            got = [m.data() for m in drain(consumer, expect=7, acknowledge=False)]
            assert got == [f"item-{i}".encode() for i in (1, 3, 5, 6, 7, 8, 9)], (
                "only the unacknowledged messages of the batch may come back"
            )
        finally:
            c.close()
    finally:
        node.stop()
        print(node.log_tail())


# --------------------------------------------------------------------------------------------
# Partitioned topics
# --------------------------------------------------------------------------------------------


def create_partitioned(node: StandaloneProcess, topic: str, partitions: int) -> None:
    request = urllib.request.Request(
        f"{node.admin_url}/persistent/public/default/{topic}/partitions",
        method="PUT",
        data=str(partitions).encode(),
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


def partition_topic(topic: str, partition: int) -> str:
    return f"persistent://public/default/{topic}-partition-{partition}"


def test_key_routing_keeps_a_key_in_one_partition_and_round_robin_spreads(
    standalone: StandaloneProcess,
) -> None:
    create_partitioned(standalone, "routed", 4)
    c = client(standalone)
    try:
        consumer = c.subscribe("routed", "all", initial_position=pulsar.InitialPosition.Earliest)
        keyed = c.create_producer("routed", batching_enabled=False)
        keys = [f"user-{k}" for k in range(8)]
        sent_to: dict[bytes, int] = {}
        for n in range(5):
            for key in keys:
                data = f"{key}/{n}".encode()
                sent_to[data] = keyed.send(data, partition_key=key).partition()

        spread = c.create_producer(
            "routed",
            batching_enabled=False,
            message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        )
        for n in range(8):
            data = f"unkeyed/{n}".encode()
            sent_to[data] = spread.send(data).partition()

        received: dict[bytes, str] = {}
        for message in drain(consumer, acknowledge=False):
            assert message.data() not in received, f"{message.data()!r} delivered twice"
            received[message.data()] = message.topic_name()
            consumer.acknowledge(message)
        assert set(received) == set(sent_to)
        # Each message was stored in, and delivered from, the partition the client chose.
        for data, partition in sent_to.items():
            assert received[data] == partition_topic("routed", partition), data

        by_key: dict[str, set[str]] = {}
        for data, topic_name in received.items():
            by_key.setdefault(data.decode().split("/")[0], set()).add(topic_name)
        for key in keys:
            assert len(by_key[key]) == 1, f"{key} landed in {sorted(by_key[key])}"
        assert len(set().union(*(by_key[key] for key in keys))) > 1, "all keys in one partition"
        assert by_key["unkeyed"] == {partition_topic("routed", p) for p in range(4)}
    finally:
        c.close()
