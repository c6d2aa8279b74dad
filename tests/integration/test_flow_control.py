"""Flow control seen from the wire (raw frames against a real standalone): a consumer is never
sent more than its permits plus one entry, whatever the batch sizes, and a consumer that stops
reading its socket does not make the broker buffer the backlog."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from tests.support.raw_client import RawConnection, module_standalone, rss_mb
from tests.support.standalone import StandaloneProcess, client

Type = pb.BaseCommand.Type
BATCH = 100


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("flow") / "standalone")


def produce_batches(node: StandaloneProcess, topic: str, batches: int, size: int = 16) -> None:
    c = client(node)
    try:
        producer = c.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=BATCH,
            batching_max_publish_delay_ms=1000,
            block_if_queue_full=True,
        )
        for i in range(batches * BATCH):
            producer.send_async(b"x" * size + str(i).encode(), None)
        producer.flush()
    finally:
        c.close()


def subscribe(raw: RawConnection, topic: str, consumer_id: int = 1) -> None:
    raw.connect()
    raw.command(
        pb.CommandSubscribe(
            topic=topic,
            subscription="s",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=consumer_id,
            request_id=1,
            initialPosition=pb.CommandSubscribe.Earliest,
        )
    )
    raw.expect(Type.SUCCESS)


def messages_received(raw: RawConnection, quiet_s: float = 1.5) -> int:
    """Messages (batch sizes summed) in the MESSAGE frames until the broker goes quiet."""
    total = 0
    while True:
        try:
            frame = raw.next_frame(timeout=quiet_s)
        except TimeoutError:
            return total
        assert frame.type == Type.MESSAGE, frame.name
        metadata = frame.metadata
        total += metadata.num_messages_in_batch if metadata.HasField("num_messages_in_batch") else 1


def test_permits_count_messages_not_entries(node: StandaloneProcess) -> None:
    topic = f"persistent://public/default/permits-{time.time_ns()}"
    produce_batches(node, topic, batches=50)  # 5,000 messages in 50 entries
    with RawConnection(node) as raw:
        subscribe(raw, topic)
        raw.command(pb.CommandFlow(consumer_id=1, messagePermits=250))
        got = messages_received(raw)
        assert 250 <= got <= 250 + BATCH, got
        raw.command(pb.CommandFlow(consumer_id=1, messagePermits=1000))
        more = messages_received(raw)
        assert got + more <= 1250 + BATCH, more
        assert got + more >= 1250


def test_a_consumer_that_stops_reading_is_not_buffered_for(node: StandaloneProcess) -> None:
    topic = f"persistent://public/default/slow-{time.time_ns()}"
    produce_batches(node, topic, batches=250, size=2048)  # 25,000 messages of 2 KB: ~50 MB
    assert node.process is not None
    before = rss_mb(node.process.pid)
    with RawConnection(node) as raw:
        subscribe(raw, topic)
        raw.command(pb.CommandFlow(consumer_id=1, messagePermits=1_000_000))
        time.sleep(4)  # never read: the socket buffers fill, then the broker must stop
        grown = rss_mb(node.process.pid) - before
        assert grown < 30, f"the broker buffered {grown:.0f} MB for a consumer that reads nothing"
        got = messages_received(raw, quiet_s=3)  # reading again: delivery resumes to the end
        assert got == 25_000
    c = client(node)
    try:
        consumer = c.subscribe(topic, "other", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=5000) is not None  # the broker serves others
    finally:
        c.close()
