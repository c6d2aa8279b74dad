"""Namespace policies (auto-creation, TTL, retention) with the official client and admin REST."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pulsar
import pytest

from tests.support.polling import wait_until
from tests.support.standalone import StandaloneProcess, client


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., StandaloneProcess]]:
    nodes: list[StandaloneProcess] = []

    def starter(*extra: str) -> StandaloneProcess:
        node = StandaloneProcess(tmp_path / "standalone", extra=list(extra)).start()
        nodes.append(node)
        return node

    yield starter
    for node in nodes:
        node.stop()
        print(node.log_tail())


def admin(
    node: StandaloneProcess, method: str, path: str, body: object = None
) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(node.admin_url + path, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "null")


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    wait_until(check, timeout=timeout, interval=0.2)


def test_auto_creation_off_refuses_unknown_topics_and_a_namespace_can_turn_it_on(
    start: Callable[..., StandaloneProcess],
) -> None:
    node = start("--no-allow-auto-topic-creation")
    c = client(node)
    try:
        with pytest.raises(pulsar.TopicNotFound):
            c.create_producer("nobody-made-this")
        with pytest.raises(pulsar.TopicNotFound):
            c.subscribe("nobody-made-this", "s")
        # Created through the admin API, it works.
        assert admin(node, "PUT", "/persistent/public/default/made")[0] == 204
        c.create_producer("made").send(b"x")

        # A namespace that auto-creates partitioned topics with 3 partitions.
        assert admin(node, "PUT", "/namespaces/public/auto")[0] == 204
        bad = admin(node, "POST", "/namespaces/public/auto/autoTopicCreation", {"x": 1})
        assert bad[0] == 400 and "allowAutoTopicCreation" in bad[1]["reason"]  # type: ignore[index]
        policy = {
            "allowAutoTopicCreation": True,
            "topicType": "partitioned",
            "defaultNumPartitions": 3,
        }
        assert admin(node, "POST", "/namespaces/public/auto/autoTopicCreation", policy)[0] == 204
        assert admin(node, "GET", "/namespaces/public/auto/autoTopicCreation") == (200, policy)
        producer = c.create_producer("persistent://public/auto/events", batching_enabled=False)
        for i in range(6):
            producer.send(f"e{i}".encode())
        assert admin(node, "GET", "/persistent/public/auto/events/partitions") == (
            200,
            {"partitions": 3},
        )
        # Other namespaces keep the broker's default (off).
        with pytest.raises(pulsar.TopicNotFound):
            c.create_producer("persistent://public/default/still-nobody")
    finally:
        c.close()


def test_message_ttl_expires_old_unacknowledged_messages(
    start: Callable[..., StandaloneProcess],
) -> None:
    node = start("--policy-check-interval-seconds", "1")
    c = client(node)
    try:
        c.subscribe("aging", "slow").close()  # the subscription exists, nobody reads
        producer = c.create_producer("aging", batching_enabled=False)
        for i in range(10):
            producer.send(f"old-{i}".encode())
        stats = admin(node, "GET", "/persistent/public/default/aging/stats")[1]
        assert stats["subscriptions"]["slow"]["msgBacklog"] == 10  # type: ignore[index]
        assert admin(node, "POST", "/namespaces/public/default/messageTTL", "1")[0] == 400
        time.sleep(1.2)  # the messages are now older than one second
        assert admin(node, "POST", "/namespaces/public/default/messageTTL", 1)[0] == 204

        def drained() -> bool:
            stats = admin(node, "GET", "/persistent/public/default/aging/stats")[1]
            return stats["subscriptions"]["slow"]["msgBacklog"] == 0  # type: ignore[index]

        eventually(drained)
        # Without the TTL, new messages stay until consumed.
        assert admin(node, "DELETE", "/namespaces/public/default/messageTTL")[0] == 204
        producer.send(b"fresh")
        consumer = c.subscribe("aging", "slow")
        message = consumer.receive(timeout_millis=10_000)
        assert message.data() == b"fresh"
        consumer.acknowledge(message)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        c.close()


def ledger_ids(node: StandaloneProcess, topic: str) -> list[int]:
    stats = admin(node, "GET", f"/persistent/public/{topic}/internalStats")[1]
    return [ledger["ledgerId"] for ledger in stats["ledgers"]]  # type: ignore[index]


def test_retention_deletes_consumed_ledgers_unless_the_namespace_keeps_them(
    start: Callable[..., StandaloneProcess],
) -> None:
    node = start("--max-entries-per-ledger", "10", "--policy-check-interval-seconds", "1")
    assert admin(node, "PUT", "/namespaces/public/archive")[0] == 204
    keep = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    assert admin(node, "POST", "/namespaces/public/archive/retention", keep)[0] == 204
    c = client(node)
    try:
        for topic in ("default/short", "archive/long"):
            consumer = c.subscribe(f"persistent://public/{topic}", "all")
            producer = c.create_producer(f"persistent://public/{topic}", batching_enabled=False)
            for i in range(45):
                producer.send(f"m{i}".encode())
            for _ in range(45):
                consumer.acknowledge(consumer.receive(timeout_millis=10_000))
            consumer.close()
            producer.close()
        # Default retention (0): every fully consumed ledger goes, the current one stays.
        eventually(lambda: len(ledger_ids(node, "default/short")) == 1)
        # Infinite retention: all five ledgers of 10 entries (the last one open) stay.
        time.sleep(2.5)
        assert len(ledger_ids(node, "archive/long")) >= 5
        # Readers still find every retained message.
        reader = c.create_reader("persistent://public/archive/long", pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(45)] == [
            f"m{i}".encode() for i in range(45)
        ]
    finally:
        c.close()


def test_deduplication_switched_on_and_off_per_namespace(
    start: Callable[..., StandaloneProcess],
) -> None:
    node = start("--policy-check-interval-seconds", "1")
    c = client(node)
    try:
        producer = c.create_producer("ledger", producer_name="bank", batching_enabled=False)
        producer.send(b"a", sequence_id=1)
        producer.send(b"a again", sequence_id=1)  # off by default: stored twice
        assert admin(node, "POST", "/namespaces/public/default/deduplication", "yes")[0] == 400
        assert admin(node, "POST", "/namespaces/public/default/deduplication", True)[0] == 204
        status, document = admin(node, "GET", "/namespaces/public/default")
        assert status == 200 and document["deduplicationEnabled"] is True  # type: ignore[index]

        deadline = time.monotonic() + 20  # applied to the loaded topic within an interval
        while True:
            producer.send(b"probe", sequence_id=1)
            stats = admin(node, "GET", "/persistent/public/default/ledger/internalStats")[1]
            stored = stats["numberOfEntries"]  # type: ignore[index]
            producer.send(b"probe again", sequence_id=1)
            stats = admin(node, "GET", "/persistent/public/default/ledger/internalStats")[1]
            if stats["numberOfEntries"] == stored:  # type: ignore[index]
                break  # the resend was dropped: deduplication is on
            assert time.monotonic() < deadline, "deduplication never took effect"
            time.sleep(0.3)
        producer.send(b"b", sequence_id=2)
        assert admin(node, "DELETE", "/namespaces/public/default/deduplication")[0] == 204
        eventually_stored = time.monotonic() + 20
        while True:
            stats = admin(node, "GET", "/persistent/public/default/ledger/internalStats")[1]
            before = stats["numberOfEntries"]  # type: ignore[index]
            producer.send(b"b again", sequence_id=2)
            stats = admin(node, "GET", "/persistent/public/default/ledger/internalStats")[1]
            if stats["numberOfEntries"] == before + 1:  # type: ignore[index]
                break  # stored again: deduplication is off
            assert time.monotonic() < eventually_stored, "deduplication never went off"
            time.sleep(0.3)
    finally:
        c.close()


def test_message_ttl_expires_whole_ledgers_and_the_open_one(
    start: Callable[..., StandaloneProcess],
) -> None:
    node = start("--max-entries-per-ledger", "5", "--policy-check-interval-seconds", "1")
    c = client(node)
    try:
        c.subscribe("old-ledgers", "slow").close()
        producer = c.create_producer("old-ledgers", batching_enabled=False)
        for i in range(23):  # four closed ledgers of five, three entries in the open one
            producer.send(f"old-{i}".encode())
        time.sleep(1.2)
        assert admin(node, "POST", "/namespaces/public/default/messageTTL", 1)[0] == 204

        def drained() -> bool:
            stats = admin(node, "GET", "/persistent/public/default/old-ledgers/stats")[1]
            return stats["subscriptions"]["slow"]["msgBacklog"] == 0  # type: ignore[index]

        eventually(drained)
    finally:
        c.close()
