"""Key_Shared subscriptions with the official pulsar-client against a real standalone."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pulsar
import pytest

from magnetar.broker.topics.dispatchers.key_hash import key_hash
from tests.support.raw_client import drain
from tests.support.standalone import StandaloneProcess, client


class Receiver(threading.Thread):
    """Receives and acks on one consumer; every receipt goes into one shared, ordered log."""

    def __init__(self, name: str, consumer: pulsar.Consumer, log: list, lock: threading.Lock):
        super().__init__(daemon=True)
        self.name, self.consumer, self.log, self.lock = name, consumer, log, lock
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                message = self.consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            key, seq = message.data().decode().split(":")
            with self.lock:
                # Recorded before the ack: a key's next owner cannot get it before this line.
                self.log.append((self.name, key, int(seq), message.redelivery_count()))
            time.sleep(0.001)  # keep a few messages unacknowledged at any time
            self.consumer.acknowledge(message)


def wait_for(log: list, lock: threading.Lock, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with lock:
            if len(log) >= count:
                return
        time.sleep(0.05)
    with lock:
        raise AssertionError(f"received {len(log)} of {count} messages in {timeout} s")


def check_keys_and_order(log: list, keys: list[str], per_key: int) -> dict[str, list[str]]:
    """Every message once; per key, receipts in order and on one consumer at a time.

    Returns, per key, the consumers that held it in turn."""
    by_key: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, key, seq, _ in log:
        by_key[key].append((name, seq))
    holders: dict[str, list[str]] = {}
    for key in keys:
        receipts = by_key[key]
        assert [seq for _, seq in receipts] == list(range(per_key)), f"key {key} out of order"
        turns = [receipts[0][0]]
        for name, _ in receipts[1:]:
            if name != turns[-1]:
                turns.append(name)
        # A key changes hands only by moving to another consumer for good, never back and forth.
        assert len(turns) == len(set(turns)), f"key {key} went back and forth: {turns}"
        holders[key] = turns
    return holders


def test_key_shared_auto_split_keeps_keys_on_one_consumer_in_order_when_one_joins(
    standalone: StandaloneProcess,
) -> None:
    keys = [f"k{i}" for i in range(40)]
    per_key = 60
    c = client(standalone)
    log: list = []
    lock = threading.Lock()
    receivers: list[Receiver] = []
    try:

        def join(name: str) -> None:
            consumer = c.subscribe(
                "keyed",
                "workers",
                consumer_type=pulsar.ConsumerType.KeyShared,
                consumer_name=name,
                receiver_queue_size=50,
                initial_position=pulsar.InitialPosition.Earliest,
            )
            receivers.append(Receiver(name, consumer, log, lock))
            receivers[-1].start()

        join("a")
        join("b")
        producer = c.create_producer(
            "keyed",
            batching_enabled=True,
            batching_type=pulsar.BatchingType.KeyBased,
            batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
        )
        half = per_key // 2
        for seq in range(half):
            for key in keys:
                producer.send_async(f"{key}:{seq}".encode(), None, partition_key=key)
        producer.flush()
        join("c")  # mid-stream: some keys move to it, only once drained on their old owner
        for seq in range(half, per_key):
            for key in keys:
                producer.send_async(f"{key}:{seq}".encode(), None, partition_key=key)
        producer.flush()
        wait_for(log, lock, len(keys) * per_key)
        time.sleep(0.5)  # anything extra (a duplicate) would show up now
    finally:
        for receiver in receivers:
            receiver.stopping.set()
        for receiver in receivers:
            receiver.join(5)
        c.close()

    assert len(log) == len(keys) * per_key
    holders = check_keys_and_order(log, keys, per_key)
    names = {name for name, *_ in log}
    assert names == {"a", "b", "c"}, f"consumers that got messages: {names}"
    # Some keys end on the consumer that joined; none comes back from it.
    assert any(turns[-1] == "c" for turns in holders.values())
    assert all("c" not in turns[:-1] for turns in holders.values())


def test_key_shared_sticky_ranges_route_by_the_key_hash_and_overlaps_are_refused(
    standalone: StandaloneProcess,
) -> None:
    c = client(standalone)
    try:

        def sticky(name: str, ranges: list[tuple[int, int]]) -> pulsar.Consumer:
            return c.subscribe(
                "sticky",
                "ranges",
                consumer_type=pulsar.ConsumerType.KeyShared,
                consumer_name=name,
                key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                    key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=ranges
                ),
            )

        low = sticky("low", [(0, 32767)])
        high = sticky("high", [(32768, 65535)])
        with pytest.raises(pulsar.ConsumerBusy):
            sticky("overlapping", [(30000, 40000)])
        with pytest.raises(pulsar.ConsumerBusy):
            c.subscribe(
                "sticky",
                "ranges",
                consumer_type=pulsar.ConsumerType.KeyShared,
                consumer_name="auto",
            )

        producer = c.create_producer("sticky", batching_enabled=False)
        keys = [f"user-{i}" for i in range(50)]
        for key in keys:
            producer.send(key.encode(), partition_key=key)
        got: dict[str, str] = {}
        for name, consumer in (("low", low), ("high", high)):
            while True:
                try:
                    message = consumer.receive(timeout_millis=1000)
                except pulsar.Timeout:
                    break
                got[message.data().decode()] = name
                consumer.acknowledge(message)
        assert sorted(got) == sorted(keys)
        for key in keys:
            expected = "low" if key_hash(key.encode()) <= 32767 else "high"
            assert got[key] == expected, f"{key} hash {key_hash(key.encode())} went to {got[key]}"
        assert set(got.values()) == {"low", "high"}
    finally:
        c.close()


def test_key_shared_unacked_messages_of_a_closed_consumer_go_to_the_others_in_key_order(
    standalone: StandaloneProcess,
) -> None:
    keys = [f"k{i}" for i in range(20)]
    c = client(standalone)
    try:
        subscribe = dict(
            consumer_type=pulsar.ConsumerType.KeyShared,
            receiver_queue_size=10,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        first = c.subscribe("handover", "s", consumer_name="first", **subscribe)
        second = c.subscribe("handover", "s", consumer_name="second", **subscribe)
        producer = c.create_producer("handover", batching_enabled=False)
        for seq in range(10):
            for key in keys:
                producer.send(f"{key}:{seq}".encode(), partition_key=key)

        # "first" takes a few messages and leaves without acking them.
        unacked = [first.receive(timeout_millis=10_000) for _ in range(5)]
        first_keys = {m.data().decode().split(":")[0] for m in unacked}
        first.close()

        seen: dict[str, list[int]] = defaultdict(list)
        redelivered = 0
        # All 200 must come (waited for long), then nothing more (a short quiet wait).
        for message in drain(second, quiet_ms=2000, expect=10 * len(keys)):
            key, seq = message.data().decode().split(":")
            seen[key].append(int(seq))
            redelivered += message.redelivery_count() > 0
        assert sorted(seen) == sorted(keys)
        for key in keys:
            assert seen[key] == list(range(10)), f"{key}: {seen[key]}"
        assert redelivered >= 1 and first_keys <= set(seen)
    finally:
        c.close()
