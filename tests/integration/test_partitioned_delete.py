"""Deleting a partitioned topic deletes its partitions' data, with real processes.

``DELETE .../{topic}/partitions`` (``admin.delete_partitioned_topic``) marks the record deleted,
deletes every partition where it is served (managed ledger, ledgers, cursors), and removes the
record last. Shown here:

- a standalone: four partitions with exact message counts and a subscription; 412 while a
  producer is connected (nothing changes), 204 with ``force=true``; afterwards no partition is
  listed, none is stored, none of their ledgers is in the metadata store or (after GC) on the
  bookie, the closed producer is refused when it comes back, and the broker logged no error;
- a standalone killed with SIGKILL in the middle of a delete: after the restart the topic is
  still marked, what is left of it takes no producer, and a second DELETE finishes the job;
- a cluster of two brokers whose partitions are spread over both: the 412 counts the clients of
  a partition on the other broker, and the forced delete reaches every owner.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from magnetar.broker.model.keys import MANAGED_LEDGERS_PATH, decode_name
from magnetar.broker.namespace.records import PARTITIONED_PATH
from magnetar.common.ledger.bookie_client import (
    BookieClient,
    BookieError,
    BookieUnavailableError,
)
from magnetar.common.ledger.metadata import LEDGERS_PATH, LedgerMetadata
from magnetar.common.metadata.local import LocalMetadataStore
from magnetar.common.proto import bookie_pb2 as pb
from tests.support.cluster import MagnetarCluster, assert_no_traceback, cluster_fixture
from tests.support.polling import wait_until
from tests.support.standalone import QUIET, StandaloneProcess, client

NAMESPACE = "public/default"
#: Messages produced to partition i: exact, and different for each partition.
COUNTS = [3, 5, 8, 13]


# -- helpers ---------------------------------------------------------------------------------


def admin(base_url: str, method: str, path: str, body: str | None = None) -> tuple[int, Any]:
    """(status, JSON body or text) of one admin call; 307 redirects followed by urllib."""
    request = urllib.request.Request(
        base_url + path, method=method, data=body.encode() if body is not None else None
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, raw = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    return wait_until(condition, what, timeout, interval=0.05)


def partition_names(topic: str, count: int) -> list[str]:
    return [f"persistent://{NAMESPACE}/{topic}-partition-{i}" for i in range(count)]


def listed(
    base_url: str, topic: str, namespace: str = NAMESPACE, domain: str = "persistent"
) -> list[str]:
    """Everything of ``topic`` in the namespace's topic list and its partitioned list."""
    status, topics = admin(base_url, "GET", f"/{domain}/{namespace}")
    assert status == 200, topics
    status, partitioned = admin(base_url, "GET", f"/{domain}/{namespace}/partitioned")
    assert status == 200, partitioned
    mine = f"{domain}://{namespace}/{topic}"
    return [t for t in [*topics, *partitioned] if t == mine or t.startswith(mine + "-partition-")]


def stored_state(
    store_scan: dict[str, bytes], topic: str, namespace: str = NAMESPACE
) -> dict[str, list[str]]:
    """What the metadata store still holds of ``topic``: its partitioned record, its
    partitions' managed ledgers and cursors, and the ledgers made for them."""
    ml_prefix = f"{namespace}/persistent/{topic}-partition-"
    found: dict[str, list[str]] = {"record": [], "managed_ledgers": [], "ledgers": []}
    for key, value in store_scan.items():
        if key == f"{PARTITIONED_PATH}/{namespace}/persistent/{topic}":
            found["record"].append(key)
        elif key.startswith(MANAGED_LEDGERS_PATH + "/"):
            segment = key.removeprefix(MANAGED_LEDGERS_PATH + "/").split("/", 1)[0]
            if decode_name(segment).startswith(ml_prefix):
                found["managed_ledgers"].append(key)  # the ledger list and its cursors
        elif key.startswith(LEDGERS_PATH + "/"):
            owner = LedgerMetadata.from_bytes(value).custom_metadata.get("managed-ledger", b"")
            if owner.decode().startswith(ml_prefix):
                found["ledgers"].append(key)
    return found


def ledger_ids_of(store_scan: dict[str, bytes], topic: str, namespace: str = NAMESPACE) -> set[int]:
    """Ids of the ledgers the store lists for ``topic``'s partitions (data and cursors)."""
    ledgers = stored_state(store_scan, topic, namespace)["ledgers"]
    return {int(key.rsplit("/", 1)[1]) for key in ledgers}


def scan_local_store(data_dir: Path) -> dict[str, bytes]:
    """Every key of a stopped standalone's metadata store."""

    async def read() -> dict[str, bytes]:
        store = await LocalMetadataStore.open(data_dir / "meta.db")
        try:
            return {k: v.value for k, v in (await store.scan("/")).items()}
        finally:
            await store.close()

    return asyncio.run(read())


def bookie_gc(http_url: str) -> None:
    request = urllib.request.Request(f"{http_url}/api/v1/bookie/gc", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def ledgers_on_bookie(address: str, ledger_ids: set[int]) -> dict[int, str]:
    """The ledgers of ``ledger_ids`` the bookie at ``address`` still answers for (its answer to
    a read of entry 0, for each that is not NO_SUCH_LEDGER)."""

    async def ask() -> dict[int, str]:
        present = {}
        async with BookieClient(address) as bookie:
            for ledger_id in sorted(ledger_ids):
                for _ in range(100):  # a bookie just started may refuse for a moment
                    try:
                        await bookie.read(ledger_id, 0)
                        present[ledger_id] = "OK"
                    except BookieUnavailableError:
                        await asyncio.sleep(0.1)
                        continue
                    except BookieError as e:
                        if e.status != pb.NO_SUCH_LEDGER:
                            present[ledger_id] = pb.Status.Name(e.status)
                    break
                else:
                    raise AssertionError(f"bookie {address} stayed unavailable")
        return present

    return asyncio.run(ask())


def assert_clean_log(text: str, where: str) -> None:
    bad = [line for line in text.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not bad, f"{where} logged errors:\n" + "\n".join(bad[:20])


def refused(c: pulsar.Client, topic: str) -> bool:
    """Whether a producer on ``topic`` is refused (it must be: TopicNotFound)."""
    try:
        producer = c.create_producer(topic, send_timeout_millis=5000)
    except pulsar.TopicNotFound:
        return True
    producer.close()
    return False


# -- a standalone ----------------------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[StandaloneProcess]:
    # Two entries a ledger: a partition written to has several ledgers to delete.
    node = StandaloneProcess(tmp_path / "standalone", ["--max-entries-per-ledger", "2"]).start()
    try:
        yield node
    finally:
        node.stop()
        print(node.log_tail())


def produce(c: pulsar.Client, topic: str, counts: list[int]) -> None:
    """``counts[i]`` messages to partition i, each acknowledged by the broker."""
    for partition, count in zip(partition_names(topic, len(counts)), counts, strict=True):
        producer = c.create_producer(partition, batching_enabled=False)
        for n in range(count):
            producer.send(f"{partition}:{n}".encode())
        producer.close()


def entries(node: StandaloneProcess, topic: str, partitions: int) -> list[int]:
    counts = []
    for partition in partition_names(topic, partitions):
        status, stats = admin(node.admin_url, "GET", f"/{partition.replace('://', '/')}/stats")
        assert status == 200, stats
        counts.append(stats["entries"])
    return counts


def test_delete_removes_every_partition_and_its_data(node: StandaloneProcess) -> None:
    topic = "orders"
    base = f"/persistent/{NAMESPACE}/{topic}"
    assert admin(node.admin_url, "PUT", f"{base}/partitions", str(len(COUNTS)))[0] == 204
    c = client(node)
    try:
        produce(c, topic, COUNTS)
        consumer = c.subscribe(
            f"persistent://{NAMESPACE}/{topic}",
            "audit",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        got = []
        for _ in range(sum(COUNTS)):
            message = consumer.receive(timeout_millis=10_000)
            got.append(message.data())
            consumer.acknowledge(message)
        assert len(set(got)) == sum(COUNTS)
        consumer.close()
        assert entries(node, topic, len(COUNTS)) == COUNTS
        ledgers = {
            ledger["ledgerId"]
            for partition in partition_names(topic, len(COUNTS))
            for ledger in admin(
                node.admin_url, "GET", f"/{partition.replace('://', '/')}/internalStats"
            )[1]["ledgers"]
        }
        assert ledgers
        assert set(listed(node.admin_url, topic)) == {
            f"persistent://{NAMESPACE}/{topic}",
            *partition_names(topic, len(COUNTS)),
        }

        # A producer on partition 2: refused with 412, and nothing changes.
        producer = c.create_producer(
            partition_names(topic, len(COUNTS))[2], batching_enabled=False, send_timeout_millis=3000
        )
        status, body = admin(node.admin_url, "DELETE", f"{base}/partitions")
        assert status == 412, body
        assert "force=true" in body["reason"], body
        assert admin(node.admin_url, "GET", f"{base}/partitions") == (200, {"partitions": 4})
        assert entries(node, topic, len(COUNTS)) == COUNTS
        producer.send(b"still writable")
        counts = [*COUNTS[:2], COUNTS[2] + 1, *COUNTS[3:]]
        assert entries(node, topic, len(COUNTS)) == counts

        assert admin(node.admin_url, "DELETE", f"{base}/partitions?force=true")[0] == 204
        assert listed(node.admin_url, topic) == []
        assert admin(node.admin_url, "GET", f"{base}/partitions") == (200, {"partitions": 0})
        # The closed producer comes back: refused, so nothing is created again.
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after the delete")
        for partition in partition_names(topic, len(COUNTS)):
            assert refused(c, partition), partition
        assert listed(node.admin_url, topic) == []
        assert admin(node.admin_url, "DELETE", f"{base}/partitions")[0] == 404
    finally:
        c.close()

    bookie_gc(f"http://127.0.0.1:{node.bookie_http_port}")
    assert ledgers_on_bookie(f"127.0.0.1:{node.bookie_port}", ledgers) == {}
    node.stop()
    left = stored_state(scan_local_store(node.data_dir), topic)
    assert left == {"record": [], "managed_ledgers": [], "ledgers": []}, left
    assert_clean_log(node.log_tail(10**9), "the standalone")


def test_a_non_persistent_partitioned_topic_is_deleted_the_same_way(
    node: StandaloneProcess,
) -> None:
    base = f"/non-persistent/{NAMESPACE}/fleeting"
    names = [f"non-persistent://{NAMESPACE}/fleeting-partition-{i}" for i in range(3)]
    assert admin(node.admin_url, "PUT", f"{base}/partitions", "3")[0] == 204
    c = client(node)
    try:
        consumer = c.subscribe(names, "watch")
        producers = [c.create_producer(n, batching_enabled=False) for n in names]
        for producer in producers:
            producer.send(b"live")
        assert sorted(consumer.receive(timeout_millis=10_000).data() for _ in names) == [
            b"live"
        ] * len(names)
        status, body = admin(node.admin_url, "DELETE", f"{base}/partitions")
        assert status == 412, body
        assert admin(node.admin_url, "GET", f"{base}/partitions") == (200, {"partitions": 3})
        assert admin(node.admin_url, "DELETE", f"{base}/partitions?force=true")[0] == 204
        assert listed(node.admin_url, "fleeting", domain="non-persistent") == []
        for name in names:
            assert refused(c, name), name
        assert listed(node.admin_url, "fleeting", domain="non-persistent") == []
    finally:
        c.close()
    assert_clean_log(node.log_tail(10**9), "the standalone")


#: Enough partitions that a delete takes a while, so the kill lands in its middle.
CRASH_PARTITIONS = 300
#: Where the broker is killed: the first log line matching (after the DELETE was sent).
KILL_POINTS = {
    # The record is marked; no partition is deleted yet.
    "marked": r"partitioned topic \S+: marked deleted",
    # Inside a partition's delete (partition 0 has many ledgers): one ledger is gone.
    "ledger": r"magnetar\.bookie\.ledger_storage: ledger \d+ deleted",
    # Between two partitions: the first is gone.
    "partition": r"topic persistent://\S+-partition-\d+ deleted",
}


@pytest.mark.parametrize("kill_at", sorted(KILL_POINTS))
def test_a_delete_killed_midway_is_finished_by_the_next(
    node: StandaloneProcess, kill_at: str
) -> None:
    topic = "crashy"
    base = f"/persistent/{NAMESPACE}/{topic}"
    names = partition_names(topic, CRASH_PARTITIONS)
    assert admin(node.admin_url, "PUT", f"{base}/partitions", str(CRASH_PARTITIONS))[0] == 204
    c = client(node)
    try:
        produce(c, topic, [40] + [1] * (CRASH_PARTITIONS - 1))
        c.subscribe(names[:4], "keep").close()  # cursors too, on a few
    finally:
        c.close()
    # Restarted, so the delete loads each partition before deleting it (slower: a wider window).
    node.stop()
    before = scan_local_store(node.data_dir)
    ledgers = ledger_ids_of(before, topic)
    assert len(stored_state(before, topic)["managed_ledgers"]) >= CRASH_PARTITIONS
    node.start()

    answer: list[object] = []

    def delete() -> None:
        try:
            answer.append(admin(node.admin_url, "DELETE", f"{base}/partitions"))
        except OSError:
            pass  # killed before it answered

    request = threading.Thread(target=delete, daemon=True)
    with node.log_path.open(errors="replace") as log:
        log.seek(0, 2)  # from here on: this run's delete
        request.start()
        first = re.compile(KILL_POINTS[kill_at])
        seen = ""
        deadline = time.monotonic() + 60
        while not first.search(seen):
            assert time.monotonic() < deadline, f"the broker never logged {first.pattern!r}"
            seen = seen[-500:] + log.read()
            time.sleep(0.001)
        node.kill()
    request.join(30)
    print(f"the DELETE answered {answer} before the kill" if answer else "killed mid-delete")

    node.start()
    status, record = admin(node.admin_url, "GET", f"{base}/partitions")
    assert status == 200, record
    left = listed(node.admin_url, topic)
    print(f"after the restart: record {record}, {len(left)} listed")
    c = client(node)
    try:
        if record != {"partitions": 0}:  # the usual case: interrupted
            assert record == {"partitions": CRASH_PARTITIONS, "deleted": True}, record
            assert f"persistent://{NAMESPACE}/{topic}" in left
            stored = [t for t in left if t != f"persistent://{NAMESPACE}/{topic}"]
            assert len(stored) <= CRASH_PARTITIONS
            # Neither what is left nor what is gone takes a producer, nor does the topic.
            for partition in {*stored[:3], names[0], names[-1]}:
                assert refused(c, partition), partition
            with pytest.raises(pulsar.TopicNotFound):
                c.create_producer(f"persistent://{NAMESPACE}/{topic}")
            assert admin(node.admin_url, "POST", f"{base}/partitions", "400")[0] == 409
            assert admin(node.admin_url, "PUT", f"{base}/partitions", "2")[0] == 409
            assert admin(node.admin_url, "PUT", f"{base}-partition-0")[0] == 409
            assert admin(node.admin_url, "DELETE", f"{base}/partitions")[0] == 204
        assert listed(node.admin_url, topic) == []
        for partition in (names[0], names[-1]):
            assert refused(c, partition), partition
    finally:
        c.close()

    bookie_gc(f"http://127.0.0.1:{node.bookie_http_port}")
    assert ledgers_on_bookie(f"127.0.0.1:{node.bookie_port}", ledgers) == {}
    node.stop()
    left_in_store = stored_state(scan_local_store(node.data_dir), topic)
    assert left_in_store == {"record": [], "managed_ledgers": [], "ledgers": []}, left_in_store
    assert_clean_log(node.log_tail(10**9), "the standalone")


# -- a cluster -------------------------------------------------------------------------------

CLUSTER_NAMESPACE = "spread/ns"
CLUSTER_PARTITIONS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    yield from cluster_fixture(
        tmp_path_factory.mktemp("partitioned-delete"),
        bookies=2,
        brokers=2,
        bookie_settings={"gc_interval_s": 0},  # GC when the test asks
    )


def test_delete_reaches_partitions_on_every_broker(cluster: MagnetarCluster) -> None:
    tenant = CLUSTER_NAMESPACE.split("/")[0]
    assert cluster.admin("PUT", f"/admin/v2/tenants/{tenant}", {})[0] in (204, 409)
    status, body = cluster.admin(
        "PUT", f"/admin/v2/namespaces/{CLUSTER_NAMESPACE}", {"bundles": {"numBundles": 8}}
    )
    assert status == 204, body
    topic = "spread"
    base = f"/admin/v2/persistent/{CLUSTER_NAMESPACE}/{topic}"
    names = [
        f"persistent://{CLUSTER_NAMESPACE}/{topic}-partition-{i}" for i in range(CLUSTER_PARTITIONS)
    ]
    entry, other = cluster.brokers
    assert entry.http("PUT", f"{base}/partitions", CLUSTER_PARTITIONS)[0] == 204

    c = pulsar.Client(entry.url, operation_timeout_seconds=30, logger=QUIET)
    try:
        for name in names:
            producer = c.create_producer(name, batching_enabled=False)
            producer.send(name.encode())
            producer.close()
        owners = {name: cluster.owner_of_topic(name) for name in names}
        if len(set(owners.values())) < 2:  # placement put them all on one: move one over
            moved = names[0]
            target = next(b.broker_id for b in cluster.brokers if b.broker_id != owners[moved])
            bundle = next(
                b
                for ns, b in cluster.ownership()
                if ns == CLUSTER_NAMESPACE and BundleRange.parse(b).contains(topic_hash(moved))
            )
            cluster.admin_json(
                "PUT",
                f"/admin/v2/namespaces/{CLUSTER_NAMESPACE}/{bundle}/unload"
                f"?destinationBroker={target}",
            )
            producer = c.create_producer(moved, batching_enabled=False)
            producer.send(b"moved")
            producer.close()
            owners = {name: cluster.owner_of_topic(name) for name in names}
        assert len(set(owners.values())) == 2, owners
        ledgers = ledger_ids_of(cluster.scan("/magnetar/"), topic, CLUSTER_NAMESPACE)
        assert ledgers

        # A producer on a partition the broker asked is not serving: still counted (412).
        remote = next(n for n in names if owners[n] == other.broker_id)
        producer = c.create_producer(remote, batching_enabled=False, send_timeout_millis=3000)
        status, body = entry.http("DELETE", f"{base}/partitions")
        assert status == 412, body
        assert json.loads(body)["reason"].count(remote.rsplit("/", 1)[1]) == 1, body
        assert json.loads(entry.http("GET", f"{base}/partitions")[1]) == {
            "partitions": CLUSTER_PARTITIONS
        }
        producer.send(b"still writable")

        status, body = entry.http("DELETE", f"{base}/partitions?force=true")
        assert status == 204, body
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after the delete")
        for name in names:
            assert refused(c, name), name
    finally:
        c.close()
    for broker in cluster.brokers:
        assert listed(f"{broker.http_url}/admin/v2", topic, CLUSTER_NAMESPACE) == []
    left = stored_state(cluster.scan("/magnetar/"), topic, CLUSTER_NAMESPACE)
    assert left == {"record": [], "managed_ledgers": [], "ledgers": []}, left
    for bookie in cluster.bookies:
        status, _ = bookie.http("POST", "/api/v1/bookie/gc")
        assert status == 200
        assert ledgers_on_bookie(bookie.address, ledgers) == {}
    for broker in cluster.brokers:
        assert_no_traceback(broker)
        assert_clean_log(broker.log_text(), broker.broker_id)
