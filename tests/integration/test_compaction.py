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


#: Keys 0..9 set, 0..4 updated, 5 and 6 deleted, three messages without a key.
FIRST_ROUND: list[tuple[str | None, bytes]] = [
    *((f"k{i}", f"v1-{i}".encode()) for i in range(10)),
    (None, b"no-key-1"),
    *((f"k{i}", f"v2-{i}".encode()) for i in range(5)),
    ("k5", b""),
    (None, b"no-key-2"),
    ("k6", b""),
    ("k9", b"v2-9"),
    (None, b"no-key-3"),
]
#: Then: k0 updated again, k1 deleted, k5 set again, k10 new, one without a key.
SECOND_ROUND: list[tuple[str | None, bytes]] = [
    ("k0", b"v3-0"),
    ("k1", b""),
    ("k5", b"v3-5"),
    ("k10", b"v1-10"),
    (None, b"no-key-4"),
]


def expected(items: list[tuple[str | None, bytes]]) -> dict[str, bytes]:
    view: dict[str, bytes] = {}
    for key, value in items:
        if key is None:
            continue
        if value:
            view[key] = value
        else:
            view.pop(key, None)
    return view


@pytest.mark.parametrize(
    ("batched", "compression"),
    [
        (False, pulsar.CompressionType.NONE),
        (True, pulsar.CompressionType.NONE),
        (True, pulsar.CompressionType.ZLib),
    ],
    ids=["unbatched", "batched", "batched-zlib"],
)
def test_compacted_view_before_and_after_more_messages(
    node: StandaloneProcess, batched: bool, compression: pulsar.CompressionType
) -> None:
    """Readers of the compacted view get each key's latest value once (deleted keys and
    messages without a key left out) up to the horizon, then every message after it; a
    plain reader gets every message; a seek to the earliest goes back into the compacted
    ledger; the last message id leads ``has_message_available`` across the seam."""
    topic = f"keyed-{'batched' if batched else 'plain'}-{compression.name}-{uuid.uuid4().hex[:8]}"
    c = client(node)
    try:
        producer = c.create_producer(
            topic,
            batching_enabled=batched,
            compression_type=compression,
            batching_max_messages=7,
            batching_max_publish_delay_ms=50,
        )
        publish(producer, FIRST_ROUND)
        assert compact(node, topic) == {"status": "SUCCESS", "lastError": ""}
        first_view = expected(FIRST_ROUND)

        reader = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        got = read_all(reader)
        assert {m.partition_key(): m.data() for m in got} == first_view
        assert len(got) == len(first_view) == 8
        plain = c.create_reader(topic, pulsar.MessageId.earliest)
        assert [m.data() for m in read_all(plain)] == [v for _, v in FIRST_ROUND]

        publish(producer, SECOND_ROUND)
        after = read_all(reader)  # the same reader goes on past the horizon: every message
        assert [(m.partition_key() or None, m.data()) for m in after] == SECOND_ROUND
        fresh = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        fresh_got = read_all(fresh)
        assert len(fresh_got) == len(first_view) + len(SECOND_ROUND)
        assert as_map(fresh_got) == expected(FIRST_ROUND + SECOND_ROUND)

        reader.seek(pulsar.MessageId.earliest)
        wait_for(reader.has_message_available, "the reader back at the earliest")
        again = read_all(reader)
        assert len(again) == len(first_view) + len(SECOND_ROUND)
        assert as_map(again) == expected(FIRST_ROUND + SECOND_ROUND)

        assert compact(node, topic)["status"] == "SUCCESS"
        final = expected(FIRST_ROUND + SECOND_ROUND)
        third = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        third_got = read_all(third)
        assert {m.partition_key(): m.data() for m in third_got} == final
        assert len(third_got) == len(final) == 9
        assert len(read_all(plain)) == len(SECOND_ROUND)
        for r in (reader, plain, fresh, third):
            r.close()
        producer.close()
    finally:
        c.close()
    status, internal = admin(node, "GET", f"/persistent/public/default/{topic}/internalStats")
    assert status == 200
    ledger = internal["compactedLedger"]
    assert ledger["ledgerId"] >= 0 and ledger["entries"] >= 1 and ledger["size"] > 0
    assert "__compaction" in internal["cursors"]
    stats = admin(node, "GET", f"/persistent/public/default/{topic}/stats")[1]
    assert stats["storageSize"] == internal["totalSize"] + ledger["size"]


def test_durable_read_compacted_consumer_and_refusals(node: StandaloneProcess) -> None:
    """A durable exclusive consumer reading compacted gets the compacted view and then new
    messages; read_compacted on a shared subscription is refused (Pulsar's NotAllowed); a
    second PUT while one runs is 409; status of an unknown topic is 404."""
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    c = client(node)
    try:
        producer = c.create_producer(topic, batching_enabled=False)
        publish(producer, FIRST_ROUND)
        path = f"/persistent/public/default/{topic}/compaction"
        assert admin(node, "GET", path)[1] == {"status": "NOT_RUN", "lastError": ""}
        assert compact(node, topic)["status"] == "SUCCESS"
        consumer = c.subscribe(
            topic,
            "durable",
            is_read_compacted=True,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        got = []
        for _ in range(8):
            message = consumer.receive(TM)
            consumer.acknowledge(message)
            got.append(message)
        assert {m.partition_key(): m.data() for m in got} == expected(FIRST_ROUND)
        producer.send(b"late", partition_key="k0")
        late = consumer.receive(TM)
        assert (late.partition_key(), late.data()) == ("k0", b"late")
        with pytest.raises(pulsar.Timeout):
            consumer.receive(500)
        with pytest.raises(pulsar.PulsarException):
            c.subscribe(
                topic, "shared", consumer_type=pulsar.ConsumerType.Shared, is_read_compacted=True
            )
        consumer.close()
        producer.close()
    finally:
        c.close()
    missing = admin(node, "GET", "/persistent/public/default/no-such-topic-xyz/compaction")
    assert missing[0] == 404


def test_table_view_follows_updates_live(node: StandaloneProcess) -> None:
    """The official client's TableView (its ``table_view_test.py`` flows) on a compacted topic:
    it starts from the compacted view, then follows updates and deletions as they come."""
    topic = f"table-{uuid.uuid4().hex[:8]}"
    c = client(node)
    try:
        producer = c.create_producer(topic, batching_enabled=False)
        publish(producer, FIRST_ROUND)
        assert compact(node, topic)["status"] == "SUCCESS"
        view = c.create_table_view(topic)
        wait_for(lambda: len(view) == 8, "the table view's first 8 keys")
        assert {f"k{i}": view.get(f"k{i}") for i in (0, 4, 7, 9)} == {
            "k0": b"v2-0",
            "k4": b"v2-4",
            "k7": b"v1-7",
            "k9": b"v2-9",
        }
        assert view.get("k5") is None and view.get("k6") is None
        seen: dict[str, bytes] = {}

        def listener(key: str, value: bytes) -> None:
            if value:
                seen[key] = value
            else:
                seen.pop(key, None)

        view.for_each_and_listen(listener)
        assert seen == expected(FIRST_ROUND)
        publish(producer, SECOND_ROUND)
        final = expected(FIRST_ROUND + SECOND_ROUND)
        wait_for(lambda: seen == final, "the listener's map after the second round")
        wait_for(lambda: view.get("k0") == b"v3-0" and view.get("k1") is None, "updates")
        assert len(view) == len(final)
        view.close()
        producer.close()
    finally:
        c.close()


def test_partitioned_topic_compaction_and_table_view(node: StandaloneProcess) -> None:
    """PUT .../compaction on a partitioned topic compacts every partition; a TableView and a
    compacted reader per partition see each key's latest value."""
    topic = f"parted-{uuid.uuid4().hex[:8]}"
    assert admin(node, "PUT", f"/persistent/public/default/{topic}/partitions", 3)[0] == 204
    c = client(node)
    try:
        producer = c.create_producer(topic, batching_enabled=False)
        items = [(f"key-{i % 12}", f"round{i // 12}-{i % 12}".encode()) for i in range(36)]
        items += [("key-3", b""), ("key-8", b"")]
        publish(producer, items)
        path = f"/persistent/public/default/{topic}/compaction"
        assert admin(node, "PUT", path)[0] == 204
        assert admin(node, "GET", path)[0] == 404  # as Pulsar: per partition only

        def partitions_done() -> bool:
            return all(
                admin(node, "GET", f"/persistent/public/default/{topic}-partition-{i}/compaction")[
                    1
                ]["status"]
                == "SUCCESS"
                for i in range(3)
            )

        wait_for(partitions_done, "every partition compacted")
        compacted: list[pulsar.Message] = []
        for i in range(3):
            reader = c.create_reader(
                f"{topic}-partition-{i}", pulsar.MessageId.earliest, is_read_compacted=True
            )
            compacted += read_all(reader)
            reader.close()
        assert {m.partition_key(): m.data() for m in compacted} == expected(items)
        assert len(compacted) == 10
        view = c.create_table_view(topic)
        wait_for(lambda: len(view) == 10, "the partitioned table view")
        producer.send(b"new", partition_key="key-3")
        wait_for(lambda: view.get("key-3") == b"new", "an update on the partitioned view")
        view.close()
        producer.close()
    finally:
        c.close()


def test_threshold_policy_starts_compaction(node: StandaloneProcess) -> None:
    """The topic's compactionThreshold (bytes) over the namespace's: once the compaction
    backlog passes it, the monitor compacts without an admin call."""
    topic = f"threshold-{uuid.uuid4().hex[:8]}"
    c = client(node)
    try:
        producer = c.create_producer(topic, batching_enabled=False)
        producer.send(b"a" * 100, partition_key="k")
        base = f"/persistent/public/default/{topic}"
        assert admin(node, "POST", f"{base}/compactionThreshold", -1)[0] == 400
        assert admin(node, "POST", f"{base}/compactionThreshold", 2000)[0] == 204
        assert admin(node, "GET", f"{base}/compactionThreshold") == (200, 2000)
        time.sleep(2.5)  # monitor rounds: under the threshold, nothing runs
        assert admin(node, "GET", f"{base}/compaction")[1]["status"] == "NOT_RUN"
        for i in range(30):
            producer.send(b"b" * 100, partition_key=f"k{i % 3}")
        wait_for(
            lambda: admin(node, "GET", f"{base}/compaction")[1]["status"] == "SUCCESS",
            "the threshold's compaction",
        )
        reader = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert sorted(m.partition_key() for m in read_all(reader)) == ["k", "k0", "k1", "k2"]
        reader.close()
        producer.close()
    finally:
        c.close()
    ns = "/namespaces/public/default/compactionThreshold"
    assert admin(node, "PUT", ns, 1 << 20)[0] == 204
    assert admin(node, "GET", ns) == (200, 1 << 20)
    assert admin(node, "DELETE", ns)[0] == 204


def test_table_view_get(node: StandaloneProcess) -> None:
    """The official client's ``table_view_test.py::test_get``, with its asserts."""
    c = client(node)
    try:
        topic = f"table_view_test_get-{time.time()}"
        table_view = c.create_table_view(topic)
        assert len(table_view) == 0
        producer = c.create_producer(topic)
        producer.send(b"value-0", partition_key="key-0")
        producer.send(b"\xba\xd0\xba\xd0", partition_key="key-1")  # not UTF-8
        wait_for(lambda: len(table_view) == 2, "two keys")
        assert table_view.get("key-0") == b"value-0"
        assert table_view.get("key-1") == b"\xba\xd0\xba\xd0"
        producer.send(b"value-1", partition_key="key-0")
        wait_for(lambda: table_view.get("key-0") == b"value-1", "the update")
        producer.close()
        table_view.close()
    finally:
        c.close()


def test_table_view_for_each(node: StandaloneProcess) -> None:
    """The official client's ``table_view_test.py::test_for_each``, with its asserts (on bytes
    values: the installed client hands the listener bytes)."""
    c = client(node)
    try:
        topic = f"table_view_test_for_each-{time.time()}"
        table_view = c.create_table_view(topic)
        producer = c.create_producer(topic)
        producer.send(b"value-0", partition_key="key-0")
        producer.send(b"value-1", partition_key="key-1")
        wait_for(lambda: len(table_view) == 2, "two keys")
        d: dict[str, bytes] = {}
        table_view.for_each(lambda key, value: d.__setitem__(key, value))
        assert d == {"key-0": b"value-0", "key-1": b"value-1"}

        def listener(key: str, value: bytes) -> None:
            if len(value) == 0:
                d.pop(key)
            else:
                d[key] = value

        d.clear()
        table_view.for_each_and_listen(listener)
        assert d == {"key-0": b"value-0", "key-1": b"value-1"}
        producer.send(b"value-0-new", partition_key="key-0")
        producer.send(b"", partition_key="key-1")
        producer.send(b"value-2", partition_key="key-2")
        wait_for(lambda: d == {"key-0": b"value-0-new", "key-2": b"value-2"}, "latest values")
        producer.close()
        table_view.close()
    finally:
        c.close()
