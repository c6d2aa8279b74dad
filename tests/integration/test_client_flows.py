"""Plain flows with the official pulsar-client, counted exactly (issue 8, consumer path).

- A backlog of 2,000 messages produced after subscribing drains completely in every
  subscription mode, batched and not: exactly 2,000, no duplicates, in order where the mode
  promises order (the "backlog stall" stopped at the 1,000-message receiver queue).
- With the client's default producer queue, sends may be refused by the client itself
  (ProducerQueueIsFull); exactly the sends whose callback got `Result.Ok` are stored.
- A reader looping on `has_message_available()` reads every message, and one standing in the
  middle of the last batch still sees messages available.
- After a clean restart on the same data dir nothing acknowledged comes back and nothing
  unacknowledged is lost.

One standalone serves the module (the restart test runs its own); its log must hold no
traceback and no ERROR line when the module is done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pulsar
import pytest

from tests.support.raw_client import assert_log_clean, module_standalone
from tests.support.standalone import StandaloneProcess, client

BACKLOG = 2_000
READER_BACKLOG = 5_000
MODES = {
    "exclusive": pulsar.ConsumerType.Exclusive,
    "failover": pulsar.ConsumerType.Failover,
    "shared": pulsar.ConsumerType.Shared,
    "key_shared": pulsar.ConsumerType.KeyShared,
}
ORDERED = {"exclusive", "failover"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("flows") / "standalone")


@pytest.fixture(scope="module")
def pc(node: StandaloneProcess) -> Iterator[pulsar.Client]:
    c = client(node)
    yield c
    c.close()


def payload(i: int) -> bytes:
    return b"m-%05d" % i


def index(msg: pulsar.Message) -> int:
    return int(msg.data()[2:])


def drain_exactly(consumer: pulsar.Consumer, expected: int, quiet_ms: int = 1500) -> list[int]:
    """Receive (and ack) until `expected` messages arrived, then wait `quiet_ms` for extras.

    Each receive may wait 10 s; a stall shows up as fewer messages than expected.
    """
    got: list[int] = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=10_000 if len(got) < expected else quiet_ms)
        except pulsar.Timeout:
            return got
        consumer.acknowledge(msg)
        got.append(index(msg))


def producer_for(c: pulsar.Client, topic: str, batched: bool, **options: object) -> pulsar.Producer:
    return c.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=100,
        batching_max_publish_delay_ms=10,
        send_timeout_millis=30_000,
        **options,
    )


# --------------------------------------------------------------------------------------------
# Backlog after subscribing, every mode, batched and not
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("mode", list(MODES))
def test_backlog_of_2000_drains_exactly(pc: pulsar.Client, mode: str, batched: bool) -> None:
    topic = f"flow-backlog-{mode}-{int(batched)}"
    consumer = pc.subscribe(topic, "s", consumer_type=MODES[mode])
    producer = producer_for(pc, topic, batched, block_if_queue_full=True)
    receipts: list[pulsar.Result] = []
    lock = threading.Lock()

    def done(result: pulsar.Result, _msg_id: pulsar.MessageId) -> None:
        with lock:
            receipts.append(result)

    for i in range(BACKLOG):
        producer.send_async(payload(i), done)
    producer.flush()
    deadline = time.monotonic() + 30
    while len(receipts) < BACKLOG and time.monotonic() < deadline:
        time.sleep(0.01)
    assert receipts.count(pulsar.Result.Ok) == BACKLOG, set(receipts)

    got = drain_exactly(consumer, BACKLOG)
    assert len(got) == BACKLOG, f"received {len(got)} of {BACKLOG}"
    assert len(set(got)) == BACKLOG, "duplicates"
    assert set(got) == set(range(BACKLOG))
    if mode in ORDERED:
        assert got == list(range(BACKLOG))
    producer.close()
    consumer.close()


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("mode", list(MODES))
def test_default_queue_stores_exactly_the_sends_acknowledged_ok(
    pc: pulsar.Client, mode: str, batched: bool
) -> None:
    topic = f"flow-callbacks-{mode}-{int(batched)}"
    consumer = pc.subscribe(topic, "s", consumer_type=MODES[mode])
    producer = producer_for(pc, topic, batched)  # max_pending_messages=1000, no blocking
    results: dict[int, pulsar.Result] = {}
    lock = threading.Lock()

    def callback_for(i: int) -> Callable[[pulsar.Result, pulsar.MessageId], None]:
        def done(result: pulsar.Result, _msg_id: pulsar.MessageId) -> None:
            with lock:
                results[i] = result

        return done

    for i in range(BACKLOG):
        try:
            producer.send_async(payload(i), callback_for(i))
        except pulsar.ProducerQueueIsFull:
            results[i] = pulsar.Result.ProducerQueueIsFull  # some versions raise instead
    producer.flush()
    deadline = time.monotonic() + 30
    while len(results) < BACKLOG and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(results) == BACKLOG, "a send never completed"
    ok = {i for i, result in results.items() if result == pulsar.Result.Ok}
    others = {result for result in results.values() if result != pulsar.Result.Ok}
    assert others <= {pulsar.Result.ProducerQueueIsFull}, others

    got = drain_exactly(consumer, len(ok))
    assert len(got) == len(ok), f"received {len(got)}, {len(ok)} sends were Ok"
    assert set(got) == ok
    assert len(set(got)) == len(got), "duplicates"
    if mode in ORDERED:
        assert got == sorted(ok)
    producer.close()
    consumer.close()


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_reader_loop_on_has_message_available_reads_everything(
    pc: pulsar.Client, batched: bool
) -> None:
    topic = f"flow-reader-{int(batched)}"
    producer = pc.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=100,  # 50 full batches of 100
        batching_max_publish_delay_ms=1000,
        block_if_queue_full=True,
    )
    for i in range(READER_BACKLOG):
        producer.send_async(payload(i), None)
    producer.flush()
    producer.close()

    reader = pc.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(index(reader.read_next(10_000)))
    assert got == list(range(READER_BACKLOG))
    reader.close()

    # Standing inside the last batch (5 of its 100 messages unread), more is available.
    middle = pc.create_reader(topic, pulsar.MessageId.earliest)
    for i in range(READER_BACKLOG - 5):
        assert index(middle.read_next(10_000)) == i
    for i in range(READER_BACKLOG - 5, READER_BACKLOG):
        assert middle.has_message_available(), f"nothing available before message {i}"
        msg = middle.read_next(10_000)
        assert index(msg) == i
        if batched:
            assert msg.message_id().batch_index() == i % 100
    assert not middle.has_message_available()
    middle.close()


# --------------------------------------------------------------------------------------------
# Restart
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_restart_redelivers_exactly_the_unacknowledged(tmp_path: Path, batched: bool) -> None:
    total = 1_000
    topic = "flow-restart"
    own = StandaloneProcess(tmp_path / "standalone").start()
    try:
        with closing(client(own)) as c:
            consumer = c.subscribe(
                topic,
                "s",
                initial_position=pulsar.InitialPosition.Earliest,
                batch_index_ack_enabled=True,  # acks of single messages inside a batch stick
            )
            producer = c.create_producer(
                topic,
                batching_enabled=batched,
                batching_max_messages=10,
                batching_max_publish_delay_ms=10,
                block_if_queue_full=True,
            )
            for i in range(total):
                producer.send_async(payload(i), None)
            producer.flush()

            # Ack the first 200 (a cumulative prefix) and, above it, two of every three up to 700:
            # holes inside the acknowledged range and inside batches.
            acked: set[int] = set()
            for _ in range(700):
                msg = consumer.receive(timeout_millis=10_000)
                i = index(msg)
                if i < 200 or i % 3:
                    consumer.acknowledge(msg)
                    acked.add(i)
            time.sleep(1)  # the client groups acks for 100 ms

        own.stop()
        own.start()

        with closing(client(own)) as c:
            consumer = c.subscribe(topic, "s", batch_index_ack_enabled=True)
            expected = set(range(total)) - acked
            got = drain_exactly(consumer, len(expected))
        came_back = sorted(set(got) & acked)
        assert not came_back, f"acknowledged came back: {came_back[:20]}\n{cursor_lines(own)}"
        assert set(got) == expected, f"lost: {sorted(expected - set(got))[:20]}"
        assert len(got) == len(expected), "duplicates"
        assert got == sorted(got)
    finally:
        own.stop()
    assert_log_clean(own)


def cursor_lines(node: StandaloneProcess) -> str:
    """What the broker logged about cursors and acks (says where acknowledgements went)."""
    lines = node.log_tail(200_000).splitlines()
    return "\n".join(line for line in lines if "cursor" in line or " ack" in line)


def test_standalone_log_is_clean(node: StandaloneProcess) -> None:
    """Runs last: the module's standalone logged no traceback and no ERROR line."""
    assert_log_clean(node)
