"""Topic compaction and TableView against a real standalone, with the official client: keyed
messages with updates and deletions (batched and not), compaction by the admin API and by the
``compactionThreshold`` policy, readers and consumers of the compacted view before and after
more messages arrive, seeks and ``has_message_available`` across the horizon, TableView on a
plain and on a partitioned topic. The official client's own compaction test
(``test_publish_compact_and_consume`` of its ``tests/pulsar_test.py``) is reproduced with its
asserts."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

from tests.support.raw_client import module_standalone
from tests.support.standalone import StandaloneProcess, client

TM = 10_000


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(
        tmp_path_factory.mktemp("compaction") / "data",
        ["--broker-service-compaction-monitor-interval-in-seconds", "1"],
    )


def admin(node: StandaloneProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(node.admin_url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def compact(node: StandaloneProcess, topic: str) -> dict[str, Any]:
    """Start a compaction and wait for its end; the final status."""
    path = f"/persistent/public/default/{topic}/compaction"
    status, _ = admin(node, "PUT", path)
    assert status == 204
    found: dict[str, Any] = {}

    def done() -> bool:
        nonlocal found
        found = admin(node, "GET", path)[1]
        return found["status"] != "RUNNING"

    wait_for(done, f"compaction of {topic}")
    return found


def read_all(reader: pulsar.Reader) -> list[pulsar.Message]:
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(TM))
    return got


def as_map(messages: list[pulsar.Message]) -> dict[str, bytes]:
    view: dict[str, bytes] = {}
    for m in messages:
        if not m.partition_key():
            continue
        if m.data():
            view[m.partition_key()] = m.data()
        else:
            view.pop(m.partition_key(), None)
    return view


def publish(producer: pulsar.Producer, items: list[tuple[str | None, bytes]]) -> None:
    for key, value in items:
        if key is None:
            producer.send_async(value, None)
        else:
            producer.send_async(value, None, partition_key=key)
    producer.flush()


def test_publish_compact_and_consume(node: StandaloneProcess) -> None:
    """The official client's test, with its asserts (its 1 s wait kept out: the compacted
    ledger is recorded before the status says SUCCESS)."""
    c = client(node)
    try:
        topic = f"compaction_{uuid.uuid4()}"
        producer = c.create_producer(
            topic, producer_name="my-producer-name", batching_enabled=False
        )
        assert producer.last_sequence_id() == -1
        consumer = c.subscribe(topic, "my-sub1", is_read_compacted=True)
        consumer.close()
        consumer2 = c.subscribe(topic, "my-sub2", is_read_compacted=False)
        producer.send(b"hello-0", partition_key="key0")
        producer.send(b"hello-1", partition_key="key0")
        producer.close()
        assert compact(node, topic) == {"status": "SUCCESS", "lastError": ""}

        consumer1 = c.subscribe(topic, "my-sub1", is_read_compacted=True)
        msg0 = consumer1.receive(TM)
        assert msg0.data() == b"hello-1"
        consumer1.acknowledge(msg0)
        consumer1.close()

        reader1 = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert reader1.read_next(TM).data() == b"hello-1"
        reader1.close()

        assert consumer2.receive(TM).data() == b"hello-0"
        assert consumer2.receive(TM).data() == b"hello-1"
        consumer2.close()

        reader2 = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=False)
        assert reader2.read_next(TM).data() == b"hello-0"
        assert reader2.read_next(TM).data() == b"hello-1"
        reader2.close()
    finally:
        c.close()
