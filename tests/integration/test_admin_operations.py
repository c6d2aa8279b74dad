"""Pulsar's admin REST for operators, against one real standalone with the official client:
TopicStats in Pulsar's shape, the subscription operations (create, skip, skip_all, expire,
reset cursor by time and by id), reading messages without consuming them (peek, examine, by id,
last message id, message id by time), and the namespace-wide ones (topics, clearBacklog,
unsubscribe, delete), topic termination, the backlog quotas' producer policies, publish rates and
subscription expiration policies. Each test asserts status codes, field types and the effect a client sees."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from magnetar.common.ledger.managed_ledger_keys import managed_ledger_key
from magnetar.common.ledger.managed_ledger_list import ManagedLedgerRecord
from magnetar.common.metadata import open_store
from magnetar.common.proto import pulsar_api_pb2 as pb
from tests.support.raw_client import RawConnection, module_standalone
from tests.support.standalone import StandaloneProcess, client


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("admin-ops") / "standalone")


@pytest.fixture(scope="module")
def pc(node: StandaloneProcess) -> Iterator[pulsar.Client]:
    c = client(node)
    try:
        yield c
    finally:
        c.close()


def call(
    node: StandaloneProcess, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(node.admin_url + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def ok(node: StandaloneProcess, method: str, path: str, body: Any = None) -> Any:
    status, _, data = call(node, method, path, body)
    assert status in (200, 204), (method, path, status, data)
    return json.loads(data) if data else None


def backlog(node: StandaloneProcess, topic: str, sub: str) -> int:
    return ok(node, "GET", f"/persistent/public/default/{topic}/stats")["subscriptions"][sub][
        "msgBacklog"
    ]


def settles(node: StandaloneProcess, topic: str, sub: str, expected: int) -> None:
    """The backlog reaches ``expected`` (the client sends acknowledgements in groups)."""
    deadline = time.monotonic() + 10
    while backlog(node, topic, sub) != expected:
        assert time.monotonic() < deadline, (topic, sub, backlog(node, topic, sub), expected)
        time.sleep(0.05)


NUMBER = (int, float)
#: Pulsar's TopicStats, PublisherStats, SubscriptionStats and ConsumerStats fields and types.
TOPIC_STATS = {
    "msgRateIn": NUMBER, "msgThroughputIn": NUMBER, "msgRateOut": NUMBER,
    "msgThroughputOut": NUMBER, "bytesInCounter": int, "msgInCounter": int,
    "bytesOutCounter": int, "msgOutCounter": int, "averageMsgSize": NUMBER,
    "storageSize": int, "backlogSize": int, "publishers": list, "subscriptions": dict,
    "replication": dict, "deduplicationStatus": str, "waitingPublishers": int,
}  # fmt: skip
PUBLISHER_STATS = {
    "accessMode": str, "msgRateIn": NUMBER, "msgThroughputIn": NUMBER,
    "averageMsgSize": NUMBER, "producerId": int, "producerName": str, "connectedSince": str,
    "metadata": dict,
}  # fmt: skip
SUBSCRIPTION_STATS = {
    "msgRateOut": NUMBER, "msgThroughputOut": NUMBER, "bytesOutCounter": int,
    "msgOutCounter": int, "msgRateRedeliver": NUMBER, "msgBacklog": int, "backlogSize": int,
    "unackedMessages": int, "type": str, "msgRateExpired": NUMBER, "consumers": list,
    "isDurable": bool, "isReplicated": bool,
}  # fmt: skip
CONSUMER_STATS = {
    "msgRateOut": NUMBER, "msgThroughputOut": NUMBER, "bytesOutCounter": int,
    "msgOutCounter": int, "consumerName": str, "availablePermits": int, "unackedMessages": int,
    "connectedSince": str, "metadata": dict,
}  # fmt: skip


def conforms(document: dict[str, Any], schema: dict[str, Any]) -> None:
    for field, kind in schema.items():
        assert field in document, f"{field} missing from {sorted(document)}"
        assert isinstance(document[field], kind), (field, document[field])


def produce(pc: pulsar.Client, topic: str, texts: list[str]) -> list[pulsar.MessageId]:
    producer = pc.create_producer(f"persistent://public/default/{topic}", batching_enabled=False)
    ids = [producer.send(t.encode()) for t in texts]
    producer.close()
    return ids


def receive(consumer: pulsar.Consumer, count: int) -> list[str]:
    got = []
    for _ in range(count):
        message = consumer.receive(10_000)
        consumer.acknowledge(message)
        got.append(message.data().decode())
    return got


def test_topic_stats_have_pulsars_shape_and_exact_counts(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "stats-shape"
    consumer = pc.subscribe(f"persistent://public/default/{topic}", "s", consumer_name="c1")
    producer = pc.create_producer(
        f"persistent://public/default/{topic}", producer_name="p1", batching_enabled=False
    )
    for i in range(10):
        producer.send(f"m{i}".encode())
    assert receive(consumer, 10) == [f"m{i}" for i in range(10)]
    stats = ok(node, "GET", f"/persistent/public/default/{topic}/stats")
    conforms(stats, TOPIC_STATS)
    assert stats["msgInCounter"] == 10 and stats["msgOutCounter"] == 10
    assert stats["bytesInCounter"] > 0 and stats["averageMsgSize"] > 0
    assert stats["msgRateIn"] > 0  # over the last interval: the ten were just sent
    [publisher] = stats["publishers"]
    conforms(publisher, PUBLISHER_STATS)
    assert publisher["producerName"] == "p1" and publisher["accessMode"] == "Shared"
    subscription = stats["subscriptions"]["s"]
    conforms(subscription, SUBSCRIPTION_STATS)
    assert subscription["msgOutCounter"] == 10 and subscription["type"] == "Exclusive"
    [consumer_stats] = subscription["consumers"]
    conforms(consumer_stats, CONSUMER_STATS)
    assert consumer_stats["consumerName"] == "c1" and consumer_stats["msgOutCounter"] == 10
    # The first stats of a subscription, consumer or producer rate what it did since the topic
    # loaded, never its whole count over the instant since the stats were asked (millions/s).
    assert subscription["msgRateOut"] <= stats["msgRateOut"] * 1.01 + 0.01
    assert consumer_stats["msgRateOut"] <= subscription["msgRateOut"] * 1.01 + 0.01
    assert publisher["msgRateIn"] <= stats["msgRateIn"] * 1.01 + 0.01
    producer.close()
    consumer.close()
    assert ok(node, "GET", f"/persistent/public/default/{topic}/stats")["publishers"] == []


def test_create_subscription_at_latest_or_earliest(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "created-subs"
    path = f"/persistent/public/default/{topic}/subscription"
    assert call(node, "PUT", f"{path}/late")[0] == 404  # no such topic
    produce(pc, topic, ["a", "b", "c"])
    assert call(node, "PUT", f"{path}/late")[0] == 204
    assert call(node, "PUT", f"{path}/early", {"ledgerId": -1, "entryId": -1})[0] == 204
    status, _, body = call(node, "PUT", f"{path}/late")
    assert status == 409 and "already exists" in json.loads(body)["reason"]
    assert backlog(node, topic, "late") == 0 and backlog(node, topic, "early") == 3
    assert sorted(ok(node, "GET", f"/persistent/public/default/{topic}/subscriptions")) == [
        "early",
        "late",
    ]
    consumer = pc.subscribe(f"persistent://public/default/{topic}", "early")
    assert receive(consumer, 3) == ["a", "b", "c"]
    consumer.close()


def test_skip_and_skip_all(node: StandaloneProcess, pc: pulsar.Client) -> None:
    topic = "skipping"
    base = f"/persistent/public/default/{topic}/subscription/s"
    pc.subscribe(f"persistent://public/default/{topic}", "s").close()
    produce(pc, topic, [f"m{i}" for i in range(10)])
    assert call(node, "POST", f"{base}/skip/5")[0] == 204
    assert backlog(node, topic, "s") == 5  # five fewer
    consumer = pc.subscribe(f"persistent://public/default/{topic}", "s")
    assert receive(consumer, 2) == ["m5", "m6"]
    consumer.close()
    assert call(node, "POST", f"{base}/skip_all")[0] == 204
    assert backlog(node, topic, "s") == 0
    assert (
        call(node, "POST", f"/persistent/public/default/{topic}/subscription/nope/skip/1")[0] == 404
    )
    assert call(node, "POST", f"{base}/skip/x")[0] == 412


def test_expire_messages_one_and_all_subscriptions(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "expiring"
    base = f"/persistent/public/default/{topic}"
    for sub in ("a", "b", "c"):
        pc.subscribe(f"persistent://public/default/{topic}", sub).close()
    produce(pc, topic, ["old1", "old2"])
    time.sleep(3.2)
    produce(pc, topic, ["new"])
    # Expire what is older than 3 s: the first two are, "new" (seconds of margin) is not.
    assert call(node, "POST", f"{base}/subscription/a/expireMessages/3")[0] == 204
    assert backlog(node, topic, "a") == 1  # the two older than three seconds
    assert backlog(node, topic, "b") == 3
    assert call(node, "POST", f"{base}/all_subscription/expireMessages/0")[0] == 204
    assert [backlog(node, topic, s) for s in ("a", "b", "c")] == [0, 0, 0]
    stats = ok(node, "GET", f"{base}/stats")["subscriptions"]["b"]
    assert stats["totalMsgExpired"] == 3 and stats["lastExpireTimestamp"] > 0


def test_reset_cursor_by_time_and_by_message_id(node: StandaloneProcess, pc: pulsar.Client) -> None:
    topic = "resetting"
    base = f"/persistent/public/default/{topic}/subscription/s/resetcursor"
    consumer = pc.subscribe(f"persistent://public/default/{topic}", "s")
    ids = produce(pc, topic, ["a", "b", "c"])
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    produce(pc, topic, ["d", "e"])
    assert receive(consumer, 5) == ["a", "b", "c", "d", "e"]
    settles(node, topic, "s", 0)
    assert call(node, "POST", f"{base}/{middle}")[0] == 204
    assert receive(consumer, 2) == ["d", "e"]  # the connected consumer, from that time on
    settles(node, topic, "s", 0)
    target = {"ledgerId": ids[1].ledger_id(), "entryId": ids[1].entry_id()}
    assert call(node, "POST", base, target)[0] == 204
    assert receive(consumer, 4) == ["b", "c", "d", "e"]
    settles(node, topic, "s", 0)
    assert call(node, "POST", base, {**target, "isExcluded": True})[0] == 204
    assert receive(consumer, 3) == ["c", "d", "e"]
    assert call(node, "POST", base, {"ledgerId": "x"})[0] == 412
    consumer.close()


def test_peek_examine_and_read_by_id_consume_nothing(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "peeking"
    base = f"/persistent/public/default/{topic}"
    pc.subscribe(f"persistent://public/default/{topic}", "s").close()
    producer = pc.create_producer(
        f"persistent://public/default/{topic}", producer_name="peeker", batching_enabled=False
    )
    ids = [producer.send(f"m{i}".encode(), properties={"k": f"v{i}"}) for i in range(3)]
    producer.close()
    status, headers, body = call(node, "GET", f"{base}/subscription/s/position/2")
    assert status == 200 and body == b"m1"
    assert headers["X-Pulsar-Message-ID"] == f"{ids[1].ledger_id()}:{ids[1].entry_id()}"
    assert headers["X-Pulsar-PROPERTY-k"] == "v1" and headers["X-Pulsar-producer-name"] == "peeker"
    assert headers["X-Pulsar-publish-time"].endswith("Z")
    assert call(node, "GET", f"{base}/subscription/s/position/4")[0] == 404
    assert backlog(node, topic, "s") == 3  # peeking moved nothing
    assert (
        call(node, "GET", f"{base}/examinemessage?initialPosition=earliest&messagePosition=1")[2]
        == b"m0"
    )
    assert call(node, "GET", f"{base}/examinemessage")[2] == b"m2"  # latest, first from the end
    assert call(node, "GET", f"{base}/examinemessage?messagePosition=9")[0] == 404
    ledger, entry = ids[2].ledger_id(), ids[2].entry_id()
    assert call(node, "GET", f"{base}/ledger/{ledger}/entry/{entry}")[2] == b"m2"
    assert call(node, "GET", f"{base}/ledger/{ledger}/entry/{entry + 1}")[0] == 404
    last = ok(node, "GET", f"{base}/lastMessageId")
    assert (last["ledgerId"], last["entryId"], last["partitionIndex"]) == (ledger, entry, -1)
    found = ok(node, "GET", f"{base}/messageid/0")
    assert (found["ledgerId"], found["entryId"]) == (ids[0].ledger_id(), ids[0].entry_id())
    future = int(time.time() * 1000) + 60_000
    assert call(node, "GET", f"{base}/messageid/{future}")[0] == 404


def test_non_persistent_topics_have_nothing_to_move(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    consumer = pc.subscribe("non-persistent://public/default/live", "s")
    base = "/non-persistent/public/default/live"
    assert call(node, "POST", f"{base}/subscription/s/skip/1")[0] == 405
    assert call(node, "GET", f"{base}/lastMessageId")[0] == 405
    stats = ok(node, "GET", f"{base}/stats")
    conforms(stats, TOPIC_STATS)
    consumer.close()


def test_namespace_topics_clear_backlog_unsubscribe_and_delete(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    assert call(node, "PUT", "/namespaces/public/ops")[0] == 204
    topics = [f"persistent://public/ops/t{i}" for i in range(2)]
    for name in topics:
        for sub in ("keep", "drop"):
            pc.subscribe(name, sub).close()
        producer = pc.create_producer(name, batching_enabled=False)
        for _ in range(4):
            producer.send(b"x")
        producer.close()
    assert ok(node, "GET", "/namespaces/public/ops/topics") == topics
    assert call(node, "POST", "/namespaces/public/ops/clearBacklog/drop")[0] == 204
    stats = [ok(node, "GET", f"/persistent/public/ops/t{i}/stats") for i in range(2)]
    assert [s["subscriptions"]["drop"]["msgBacklog"] for s in stats] == [0, 0]
    assert [s["subscriptions"]["keep"]["msgBacklog"] for s in stats] == [4, 4]
    bundles = ok(node, "GET", "/namespaces/public/ops/bundles")["boundaries"]
    for low, high in itertools.pairwise(bundles):
        assert call(node, "POST", f"/namespaces/public/ops/{low}_{high}/clearBacklog")[0] == 204
    stats = [ok(node, "GET", f"/persistent/public/ops/t{i}/stats") for i in range(2)]
    assert [s["subscriptions"]["keep"]["msgBacklog"] for s in stats] == [0, 0]
    assert call(node, "POST", "/namespaces/public/ops/unsubscribe/drop")[0] == 204
    for i in range(2):
        assert ok(node, "GET", f"/persistent/public/ops/t{i}/subscriptions") == ["keep"]
    status, _, body = call(node, "DELETE", "/namespaces/public/ops")
    assert status == 409 and json.loads(body)["reason"] == "Cannot delete non empty namespace"
    assert call(node, "DELETE", "/namespaces/public/ops?force=true")[0] == 204
    assert call(node, "GET", "/namespaces/public/ops")[0] == 404
    assert "public/ops" not in ok(node, "GET", "/namespaces/public")
    assert call(node, "DELETE", "/namespaces/public/ops")[0] == 404


def test_cluster_data(node: StandaloneProcess) -> None:
    [cluster] = ok(node, "GET", "/clusters")
    data = ok(node, "GET", f"/clusters/{cluster}")
    assert data["brokerServiceUrl"].endswith(f":{node.port}")
    assert data["serviceUrl"].startswith("http://")
    assert call(node, "GET", "/clusters/elsewhere")[0] == 404


def test_partitioned_stats_add_up_the_partitions(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    base = "/persistent/public/default/spread"
    assert call(node, "GET", f"{base}/partitioned-stats")[0] == 404
    assert call(node, "PUT", f"{base}/partitions", 3)[0] == 204
    consumer = pc.subscribe("persistent://public/default/spread", "all")
    producer = pc.create_producer("persistent://public/default/spread", batching_enabled=False)
    for i in range(30):
        producer.send(f"m{i}".encode(), partition_key=f"k{i}")
    stats = ok(node, "GET", f"{base}/partitioned-stats")
    conforms(stats, TOPIC_STATS)
    assert stats["metadata"] == {"partitions": 3}
    assert sorted(stats["partitions"]) == [
        f"persistent://public/default/spread-partition-{i}" for i in range(3)
    ]
    for partition in stats["partitions"].values():
        conforms(partition, TOPIC_STATS)
    assert stats["msgInCounter"] == 30
    assert sum(p["msgInCounter"] for p in stats["partitions"].values()) == 30
    assert len(stats["publishers"]) == 3  # the producer's one per partition
    assert stats["subscriptions"]["all"]["msgBacklog"] == 30
    assert len(stats["subscriptions"]["all"]["consumers"]) == 3
    # Pulsar's PartitionedTopicStats always has its partitions map: empty without perPartition.
    assert ok(node, "GET", f"{base}/partitioned-stats?perPartition=false")["partitions"] == {}
    internal = ok(node, "GET", f"{base}/partitioned-internalStats")
    assert internal["metadata"] == {"partitions": 3}
    assert sum(p["numberOfEntries"] for p in internal["partitions"].values()) == 30
    assert call(node, "GET", f"{base}-partition-0/partitioned-stats")[0] == 412
    producer.close()
    consumer.close()


def test_broker_and_bookie_routes(node: StandaloneProcess, pc: pulsar.Client) -> None:
    status, _, version = call(node, "GET", "/brokers/version")
    assert status == 200 and version.decode()
    assert ok(node, "GET", "/brokers/configuration") == []
    assert ok(node, "GET", "/brokers/configuration/values") == {}
    runtime = ok(node, "GET", "/brokers/configuration/runtime")
    assert runtime["cluster_name"] and all(isinstance(v, str) for v in runtime.values())
    produce(pc, "reported", ["x"])
    tree = ok(node, "GET", "/broker-stats/topics")
    [bundles] = [tree["public/default"]]
    topics = {t: s for b in bundles.values() for t, s in b.get("persistent", {}).items()}
    assert topics["persistent://public/default/reported"]["msgInCounter"] == 1
    report = ok(node, "GET", "/broker-stats/load-report")
    assert isinstance(report, dict) and report
    [bookie] = ok(node, "GET", "/bookies/all")["bookies"]
    assert bookie["bookieId"].endswith(f":{node.bookie_port}")


def test_bookie_rack_info(node: StandaloneProcess, pc: pulsar.Client) -> None:
    """Pulsar's racks-info routes: stored, answered in Pulsar's shape, and ledgers are still
    made with racks set (placement prefers distinct racks, never fails for want of them)."""
    [bookie] = [b["bookieId"] for b in ok(node, "GET", "/bookies/all")["bookies"]]
    other = "10.9.9.9:3181"  # not registered: information may be set ahead of a bookie
    assert ok(node, "GET", "/bookies/racks-info") == {}
    status, _, body = call(node, "GET", f"/bookies/racks-info/{bookie}")
    assert (status, json.loads(body)) == (404, {"reason": f"Bookie address not found: {bookie}"})
    rack_of = f"/bookies/racks-info/{bookie}"
    assert (
        call(node, "POST", f"{rack_of}?group=default", {"rack": "rack-a", "hostname": "bk"})[0]
        == 204
    )
    assert (
        call(node, "POST", f"/bookies/racks-info/{other}?group=east", {"rack": "/rack-b"})[0] == 204
    )
    assert ok(node, "GET", "/bookies/racks-info") == {
        "default": {bookie: {"rack": "/rack-a", "hostname": "bk"}},
        "east": {other: {"rack": "/rack-b"}},
    }
    assert ok(node, "GET", rack_of) == {"rack": "/rack-a", "hostname": "bk"}
    # Moving a bookie to another group takes it out of the first.
    assert call(node, "POST", f"{rack_of}?group=east", {"rack": "rack-c"})[0] == 204
    assert ok(node, "GET", "/bookies/racks-info") == {
        "east": {bookie: {"rack": "/rack-c"}, other: {"rack": "/rack-b"}}
    }
    # Bad input: Pulsar's 412s.
    status, _, body = call(node, "POST", rack_of, {"rack": "r"})
    assert (status, json.loads(body)["reason"]) == (412, "Bookie 'group' parameters is missing")
    assert call(node, "POST", f"{rack_of}?group=g", {"rack": "region/rack"})[0] == 412
    assert call(node, "POST", f"{rack_of}?group=g", {"hostname": "h"})[0] == 412
    # A new ledger is placed with the racks set.
    produce(pc, "racked", ["one", "two"])
    assert ok(node, "GET", "/persistent/public/default/racked/stats")["msgInCounter"] == 2
    assert call(node, "DELETE", rack_of)[0] == 204
    assert call(node, "DELETE", rack_of)[0] == 404
    assert call(node, "DELETE", f"/bookies/racks-info/{other}")[0] == 204
    assert ok(node, "GET", "/bookies/racks-info") == {}


#: Every field of Pulsar's Policies document and its JSON type (None: null, unset).
OPT_INT, OPT_BOOL, OPT_DICT, OPT_STR = (
    (int, type(None)),
    (bool, type(None)),
    (dict, type(None)),
    (str, type(None)),
)
POLICIES = {
    "auth_policies": dict, "replication_clusters": list, "bundles": dict,
    "backlog_quota_map": dict, "clusterDispatchRate": dict, "topicDispatchRate": dict,
    "subscriptionDispatchRate": dict, "replicatorDispatchRate": dict,
    "clusterSubscribeRate": dict, "persistence": OPT_DICT, "deduplicationEnabled": OPT_BOOL,
    "autoTopicCreationOverride": OPT_DICT, "autoSubscriptionCreationOverride": OPT_DICT,
    "publishMaxMessageRate": dict, "latency_stats_sample_rate": dict,
    "message_ttl_in_seconds": OPT_INT, "subscription_expiration_time_minutes": OPT_INT,
    "retention_policies": OPT_DICT, "deleted": bool, "encryption_required": bool,
    "delayed_delivery_policies": OPT_DICT, "inactive_topic_policies": OPT_DICT,
    "subscription_auth_mode": str, "max_producers_per_topic": OPT_INT,
    "max_consumers_per_topic": OPT_INT, "max_consumers_per_subscription": OPT_INT,
    "max_unacked_messages_per_consumer": OPT_INT,
    "max_unacked_messages_per_subscription": OPT_INT, "max_subscriptions_per_topic": OPT_INT,
    "compaction_threshold": OPT_INT, "offload_threshold": int,
    "offload_deletion_lag_ms": OPT_INT, "max_topics_per_namespace": OPT_INT,
    "schema_auto_update_compatibility_strategy": str, "schema_compatibility_strategy": str,
    "is_allow_auto_update_schema": OPT_BOOL, "schema_validation_enforced": bool,
    "offload_policies": OPT_DICT, "deduplicationSnapshotIntervalSeconds": OPT_INT,
    "subscription_types_enabled": list, "properties": dict, "resource_group_name": OPT_STR,
}  # fmt: skip


def test_namespace_limits_on_producers_consumers_and_unacked(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    assert call(node, "PUT", "/namespaces/public/limits")[0] == 204
    base = "/namespaces/public/limits"
    document = ok(node, "GET", base)
    conforms(document, POLICIES)
    assert document["bundles"] == ok(node, "GET", f"{base}/bundles")  # Pulsar's BundlesData
    assert document["bundles"]["numBundles"] == len(document["bundles"]["boundaries"]) - 1
    assert document["max_producers_per_topic"] is None  # unset: the broker's (no limit)
    for policy, value in (
        ("maxProducersPerTopic", 1),
        ("maxConsumersPerSubscription", 1),
        ("maxUnackedMessagesPerConsumer", 2),
    ):
        assert call(node, "POST", f"{base}/{policy}", value)[0] == 204
        assert ok(node, "GET", f"{base}/{policy}") == value
    assert call(node, "POST", f"{base}/maxProducersPerTopic", -1)[0] == 400
    assert ok(node, "GET", base)["max_producers_per_topic"] == 1
    topic = "persistent://public/limits/t"
    first = pc.create_producer(topic, batching_enabled=False)
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer(topic)
    consumer = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    for i in range(5):
        first.send(f"m{i}".encode())
    held = [consumer.receive(10_000) for _ in range(2)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)  # two unacked: no more until one is acknowledged
    consumer.acknowledge(held[0])
    assert consumer.receive(10_000).data() == b"m2"
    first.close()
    consumer.close()
    assert call(node, "DELETE", f"{base}/maxProducersPerTopic")[0] == 204
    assert ok(node, "GET", base)["max_producers_per_topic"] is None


def eventually(condition: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_backlog_quota_consumer_backlog_eviction(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    assert call(node, "PUT", "/namespaces/public/quota")[0] == 204
    base = "/namespaces/public/quota"
    topic = "persistent://public/quota/t"
    path = "/persistent/public/quota/t"
    pc.subscribe(topic, "slow").close()
    producer = pc.create_producer(topic, batching_enabled=False)
    for _ in range(20):
        producer.send(b"x" * 100)
    producer.close()
    assert ok(node, "GET", f"{base}/backlogQuotaMap") == {}
    quota = {"limitSize": 1000, "limitTime": -1, "policy": "consumer_backlog_eviction"}
    assert call(node, "POST", f"{base}/backlogQuota", {**quota, "policy": "drop"})[0] == 400
    assert call(node, "POST", f"{base}/backlogQuota?backlogQuotaType=other", quota)[0] == 412
    assert call(node, "POST", f"{base}/backlogQuota", quota)[0] == 204
    assert ok(node, "GET", f"{base}/backlogQuotaMap") == {"destination_storage": quota}
    stats = ok(node, "GET", f"{path}/stats")
    kept = int(1000 // (stats["storageSize"] / 20))
    assert 0 < kept < 20
    eventually(
        lambda: ok(node, "GET", f"{path}/stats")["subscriptions"]["slow"]["msgBacklog"] == kept,
        "the oldest messages evicted down to the size quota",
    )
    age = {"limitSize": -1, "limitTime": 0, "policy": "consumer_backlog_eviction"}
    assert call(node, "POST", f"{base}/backlogQuota?backlogQuotaType=message_age", age)[0] == 204
    eventually(
        lambda: ok(node, "GET", f"{path}/stats")["subscriptions"]["slow"]["msgBacklog"] == 0,
        "every message older than the age quota evicted",
    )
    assert call(node, "DELETE", f"{base}/backlogQuota")[0] == 204
    assert list(ok(node, "GET", f"{base}/backlogQuotaMap")) == ["message_age"]


def test_topic_backlog_quota_and_ttl_act_on_their_topic_only(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    """A topic's own consumer_backlog_eviction quota, and its own message TTL, empty its
    subscriptions; a sibling topic of the namespace (no policy of its own, none on the
    namespace) keeps its whole backlog."""
    assert call(node, "PUT", "/namespaces/public/tquota")[0] == 204
    for name in ("own", "sibling"):
        pc.subscribe(f"persistent://public/tquota/{name}", "slow").close()
        producer = pc.create_producer(f"persistent://public/tquota/{name}", batching_enabled=False)
        for _ in range(10):
            producer.send(b"x" * 100)
        producer.close()
    quota = {"limitSize": -1, "limitTime": 0, "policy": "consumer_backlog_eviction"}
    path = "/persistent/public/tquota/own"
    assert call(node, "POST", f"{path}/backlogQuota?backlogQuotaType=message_age", quota)[0] == 204
    eventually(
        lambda: ok(node, "GET", f"{path}/stats")["subscriptions"]["slow"]["msgBacklog"] == 0,
        "the topic's age quota evicting every message",
    )
    sibling = ok(node, "GET", "/persistent/public/tquota/sibling/stats")
    assert sibling["subscriptions"]["slow"]["msgBacklog"] == 10
    # The topic's own message TTL: applied when it is set (and at each policy round).
    pc.subscribe("persistent://public/tquota/ttl", "slow").close()
    producer = pc.create_producer("persistent://public/tquota/ttl", batching_enabled=False)
    for _ in range(5):
        producer.send(b"y")
    producer.close()
    time.sleep(1.2)  # the messages are now older than the TTL about to be set
    ttl_path = "/persistent/public/tquota/ttl"
    assert call(node, "POST", f"{ttl_path}/messageTTL?messageTTL=1")[0] == 204
    eventually(
        lambda: ok(node, "GET", f"{ttl_path}/stats")["subscriptions"]["slow"]["msgBacklog"] == 0,
        "the topic's TTL expiring its messages",
    )
    sibling = ok(node, "GET", "/persistent/public/tquota/sibling/stats")
    assert sibling["subscriptions"]["slow"]["msgBacklog"] == 10


def test_inactive_topics_deleted(node: StandaloneProcess, pc: pulsar.Client) -> None:
    assert call(node, "PUT", "/namespaces/public/idle")[0] == 204
    base = "/namespaces/public/idle"
    for name in ("gone", "kept"):
        producer = pc.create_producer(f"persistent://public/idle/{name}")
        producer.send(b"x")
        producer.close()
    consumer = pc.subscribe("persistent://public/idle/kept", "reading")  # a client: active
    policy = {
        "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
        "maxInactiveDurationSeconds": 1,
        "deleteWhileInactive": True,
    }
    assert call(node, "POST", f"{base}/inactiveTopicPolicies", {**policy, "x": 1})[0] == 204
    assert ok(node, "GET", f"{base}/inactiveTopicPolicies") == policy
    time.sleep(1.2)

    def deleted() -> bool:
        call(node, "POST", f"{base}/inactiveTopicPolicies", policy)  # a policy round now
        return ok(node, "GET", f"{base}/topics") == ["persistent://public/idle/kept"]

    eventually(deleted, "the idle topic deleted, the one with a consumer kept")
    consumer.close()


def test_topic_bundle_properties_and_trim(node: StandaloneProcess, pc: pulsar.Client) -> None:
    base = "/persistent/public/default/housekept"
    produce(pc, "housekept", ["x"])
    bundle = ok(node, "GET", f"{base}/bundle")
    bundles = ok(node, "GET", "/namespaces/public/default/bundles")["boundaries"]
    assert bundle in {f"{low}_{high}" for low, high in itertools.pairwise(bundles)}
    assert ok(node, "GET", f"{base}/properties") == {}  # Magnetar's own are not shown
    assert call(node, "PUT", f"{base}/properties", {"owner": "billing", "tier": "1"})[0] == 204
    assert call(node, "PUT", f"{base}/properties", {"tier": "2"})[0] == 204
    assert ok(node, "GET", f"{base}/properties") == {"owner": "billing", "tier": "2"}
    assert call(node, "DELETE", f"{base}/properties?key=owner")[0] == 204
    assert ok(node, "GET", f"{base}/properties") == {"tier": "2"}
    assert call(node, "PUT", f"{base}/properties", ["not", "a", "map"])[0] == 412
    assert call(node, "POST", f"{base}/trim")[0] == 204
    assert ok(node, "GET", f"{base}/stats")["msgInCounter"] == 1
    # Kept with the topic: unloaded and loaded again, the properties are still there.
    assert call(node, "PUT", f"{base}/unload")[0] == 204
    assert ok(node, "GET", f"{base}/properties") == {"tier": "2"}


def test_namespace_properties(node: StandaloneProcess) -> None:
    assert call(node, "PUT", "/namespaces/public/props")[0] == 204
    base = "/namespaces/public/props"
    assert ok(node, "GET", f"{base}/properties") == {}
    assert call(node, "PUT", f"{base}/properties", {"team": "payments"})[0] == 204
    assert call(node, "PUT", f"{base}/properties", {"tier": "gold"})[0] == 204
    assert ok(node, "GET", f"{base}/properties") == {"team": "payments", "tier": "gold"}
    assert ok(node, "GET", base)["properties"] == {"team": "payments", "tier": "gold"}
    assert call(node, "PUT", f"{base}/properties", {"n": 1})[0] == 412
    assert call(node, "DELETE", f"{base}/properties")[0] == 204
    assert ok(node, "GET", f"{base}/properties") == {}


def refused_producer(pc: pulsar.Client, topic: str) -> bool:
    """Whether one more producer is refused as over the limit (ProducerBusy)."""
    try:
        pc.create_producer(topic).close()
    except pulsar.ProducerBusy:
        return True
    return False


def test_topic_policies_over_the_namespaces(node: StandaloneProcess, pc: pulsar.Client) -> None:
    assert call(node, "PUT", "/namespaces/public/tp")[0] == 204
    assert call(node, "POST", "/namespaces/public/tp/maxProducersPerTopic", 1)[0] == 204
    base = "/persistent/public/tp/own"
    assert call(node, "GET", f"{base}/maxProducers")[0] == 404  # no such topic
    assert call(node, "PUT", base)[0] == 204
    assert ok(node, "GET", f"{base}/maxProducers") is None  # none of its own
    first = pc.create_producer("persistent://public/tp/own")
    assert refused_producer(pc, "persistent://public/tp/own")  # the namespace's limit
    assert call(node, "POST", f"{base}/maxProducers", 2)[0] == 204
    assert ok(node, "GET", f"{base}/maxProducers") == 2
    eventually(
        lambda: not refused_producer(pc, "persistent://public/tp/own"),
        "the topic's own limit (2) over the namespace's (1)",
    )
    assert call(node, "POST", f"{base}/maxProducers", -2)[0] == 400
    assert call(node, "DELETE", f"{base}/maxProducers")[0] == 204
    eventually(
        lambda: refused_producer(pc, "persistent://public/tp/own"),
        "the namespace's limit again",
    )
    first.close()
    retention = {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}
    assert call(node, "POST", f"{base}/retention", retention)[0] == 204
    assert ok(node, "GET", f"{base}/retention") == retention
    assert call(node, "POST", f"{base}/messageTTL?messageTTL=120")[0] == 204
    assert ok(node, "GET", f"{base}/messageTTL") == 120
    quota = {"limitSize": 10, "limitTime": -1, "policy": "consumer_backlog_eviction"}
    assert call(node, "POST", f"{base}/backlogQuota", quota)[0] == 204
    assert ok(node, "GET", f"{base}/backlogQuotaMap") == {"destination_storage": quota}
    # Deleted with the topic: a new topic of that name starts with none.
    assert call(node, "DELETE", base)[0] == 204
    assert call(node, "PUT", base)[0] == 204
    assert ok(node, "GET", f"{base}/retention") is None


def test_topic_level_limits_and_deduplication_take_effect(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    """A topic's own maxConsumers, maxConsumersPerSubscription, maxUnackedMessagesOnConsumer and
    deduplicationEnabled act on its clients (its namespace sets none)."""
    assert call(node, "PUT", "/namespaces/public/tlimits")[0] == 204
    name = "persistent://public/tlimits/t"
    base = "/persistent/public/tlimits/t"
    assert call(node, "PUT", base)[0] == 204
    for policy, value in (
        ("maxConsumers", 2),
        ("maxConsumersPerSubscription", 1),
        ("maxUnackedMessagesOnConsumer", 2),
        ("deduplicationEnabled", True),
    ):
        assert call(node, "POST", f"{base}/{policy}", value)[0] == 204
    shared = pulsar.ConsumerType.Shared
    consumer = pc.subscribe(name, "s", consumer_type=shared)
    with pytest.raises(pulsar.ConsumerBusy):  # one per subscription
        pc.subscribe(name, "s", consumer_type=shared)
    other = pc.subscribe(name, "o", consumer_type=shared)
    with pytest.raises(pulsar.ConsumerBusy):  # two on the topic
        pc.subscribe(name, "third", consumer_type=shared)
    producer = pc.create_producer(name, producer_name="dedup", batching_enabled=False)
    for sequence_id in (0, 1, 2, 1, 2, 3, 4):  # 1 and 2 again: duplicates, dropped
        producer.send(f"m{sequence_id}".encode(), sequence_id=sequence_id)
    producer.close()
    assert ok(node, "GET", f"{base}/stats")["msgInCounter"] == 5
    held = [consumer.receive(10_000) for _ in range(2)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)  # two unacked: no more until one is acknowledged
    consumer.acknowledge(held[0])
    assert consumer.receive(10_000).data() == b"m2"
    consumer.close()
    other.close()
    for policy in ("maxConsumers", "maxConsumersPerSubscription", "maxUnackedMessagesOnConsumer"):
        assert call(node, "DELETE", f"{base}/{policy}")[0] == 204

    def unlimited() -> bool:
        consumers = []
        try:
            for sub in ("a", "a", "b"):  # two on one subscription, three on the topic
                consumers.append(pc.subscribe(name, sub, consumer_type=shared))
        except pulsar.ConsumerBusy:
            return False
        finally:
            for c in consumers:
                c.close()
        return True

    eventually(unlimited, "the limits gone with the topic's policies")


def test_partitioned_topic_policies_apply_to_partitions(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    base = "/persistent/public/default/limited"
    assert call(node, "PUT", f"{base}/partitions", 2)[0] == 204
    assert call(node, "POST", f"{base}/maxProducers", 1)[0] == 204
    assert ok(node, "GET", f"{base}/maxProducers") == 1
    producer = pc.create_producer("persistent://public/default/limited")
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer("persistent://public/default/limited")
    producer.close()


INTERNAL_STATS = {
    "entriesAddedCounter": int, "numberOfEntries": int, "totalSize": int,
    "currentLedgerEntries": int, "currentLedgerSize": int, "lastLedgerCreatedTimestamp": str,
    "waitingCursorsCount": int, "pendingAddEntriesCount": int, "lastConfirmedEntry": str,
    "state": str, "ledgers": list, "cursors": dict,
}  # fmt: skip
CURSOR_STATS = {
    "markDeletePosition": str, "readPosition": str, "messagesConsumedCounter": int,
    "cursorLedger": int, "individuallyDeletedMessages": str, "state": str,
    "totalNonContiguousDeletedMessagesRange": int, "properties": dict,
}  # fmt: skip


def test_internal_stats_have_pulsars_shape(node: StandaloneProcess, pc: pulsar.Client) -> None:
    topic = "persistent://public/default/internals"
    consumer = pc.subscribe(topic, "gaps")
    ids = produce(pc, "internals", [f"m{i}" for i in range(6)])
    received = {consumer.receive(10_000).message_id().entry_id(): None for _ in range(6)}
    assert len(received) == 6
    # Acknowledge the 2nd and 4th..5th only: two ranges past the mark-delete position.
    for index in (1, 3, 4):
        consumer.acknowledge(ids[index])
    base = "/persistent/public/default/internals/internalStats"

    def two_ranges() -> bool:
        cursor = ok(node, "GET", base)["cursors"]["gaps"]
        return cursor["totalNonContiguousDeletedMessagesRange"] == 2

    eventually(two_ranges, "the acknowledgements stored as two ranges")
    stats = ok(node, "GET", base)
    conforms(stats, INTERNAL_STATS)
    assert stats["numberOfEntries"] == 6 and stats["state"] == "LedgerOpened"
    [ledger] = stats["ledgers"]
    assert ledger["entries"] == 6 and ledger["size"] == stats["totalSize"] > 0
    assert stats["currentLedgerEntries"] == 6 and stats["currentLedgerSize"] == stats["totalSize"]
    cursor = stats["cursors"]["gaps"]
    conforms(cursor, CURSOR_STATS)
    lid, first = ids[0].ledger_id(), ids[0].entry_id()
    assert cursor["markDeletePosition"] == f"{lid}:{first - 1}"
    assert cursor["individuallyDeletedMessages"] == (
        f"[({lid}:{first}..{lid}:{first + 1}], ({lid}:{first + 2}..{lid}:{first + 4}]]"
    )
    consumer.close()


def test_create_missed_partitions(node: StandaloneProcess) -> None:
    base = "/persistent/public/default/lazy"
    assert call(node, "POST", f"{base}/createMissedPartitions")[0] == 404
    assert call(node, "PUT", f"{base}/partitions", 3)[0] == 204

    def served() -> set[str]:
        tree = ok(node, "GET", "/broker-stats/topics").get("public/default", {})
        return {t for b in tree.values() for t in b.get("persistent", {}) if "/lazy-" in t}

    assert served() == set()  # partitions are stored when first used
    assert call(node, "POST", f"{base}/createMissedPartitions")[0] == 204
    assert served() == {f"persistent://public/default/lazy-partition-{i}" for i in range(3)}
    assert call(node, "POST", f"{base}/createMissedPartitions")[0] == 204  # none missing now


def test_truncate(node: StandaloneProcess, pc: pulsar.Client) -> None:
    base = "/persistent/public/default/truncated"
    pc.subscribe("persistent://public/default/truncated", "s").close()
    produce(pc, "truncated", ["a", "b", "c"])
    assert call(node, "PUT", f"{base}/unload")[0] == 204  # its ledger closed
    produce(pc, "truncated", ["d", "e"])
    before = ok(node, "GET", f"{base}/internalStats")
    assert len(before["ledgers"]) >= 2 and before["numberOfEntries"] == 5
    assert backlog(node, "truncated", "s") == 5
    assert call(node, "DELETE", f"{base}/truncate")[0] == 204
    after = ok(node, "GET", f"{base}/internalStats")
    assert backlog(node, "truncated", "s") == 0
    assert [ledger["ledgerId"] for ledger in after["ledgers"]] == [
        before["ledgers"][-1]["ledgerId"]
    ]  # only the ledger being written is left
    assert call(node, "DELETE", "/non-persistent/public/default/truncated/truncate")[0] in (
        404,
        405,
    )


def test_dispatch_rates_hold_consumers_back(node: StandaloneProcess, pc: pulsar.Client) -> None:
    assert call(node, "PUT", "/namespaces/public/rated")[0] == 204
    base = "/namespaces/public/rated"
    rate = {
        "dispatchThrottlingRateInMsg": 10,
        "dispatchThrottlingRateInByte": -1,
        "ratePeriodInSecond": 1,
        "relativeToPublishRate": False,
    }
    assert ok(node, "GET", f"{base}/dispatchRate") is None
    assert call(node, "POST", f"{base}/dispatchRate", {**rate, "ratePeriodInSecond": 0})[0] == 400
    assert call(node, "POST", f"{base}/dispatchRate", rate)[0] == 204
    assert ok(node, "GET", f"{base}/dispatchRate") == rate
    topic = "persistent://public/rated/t"
    consumer = pc.subscribe(topic, "s")
    produce_to = pc.create_producer(topic, batching_enabled=False)
    # All at once (not a send and its receipt at a time, which a slow machine could pace
    # under the limit): the dispatcher meets thirty messages together.
    for i in range(30):
        produce_to.send_async(f"m{i}".encode(), None)
    produce_to.flush()
    got = [consumer.receive(10_000).data() for _ in range(30)]
    # Ten a window: the thirty needed three, so the broker held the dispatch at the topic's
    # limit (it counts each hold, as Pulsar's stats do) and never at a subscription's.
    assert got == [f"m{i}".encode() for i in range(30)]
    held = ok(node, "GET", "/persistent/public/rated/t/stats")["subscriptions"]["s"]
    assert held["dispatchThrottledMsgEventsByTopicLimit"] >= 2
    assert held["dispatchThrottledMsgEventsBySubscriptionLimit"] == 0
    assert held["dispatchThrottledBytesEventsByTopicLimit"] == 0  # no byte limit
    # The topic's own subscription rate, over the namespace's: one subscription at 5 a window.
    assert call(node, "DELETE", f"{base}/dispatchRate")[0] == 204
    per_sub = {**rate, "dispatchThrottlingRateInMsg": 5}
    path = "/persistent/public/rated/t/subscriptionDispatchRate"
    assert call(node, "POST", path, per_sub)[0] == 204
    assert ok(node, "GET", path) == per_sub
    time.sleep(1.1)  # the policy applied, a fresh window
    for i in range(10):
        produce_to.send_async(f"n{i}".encode(), None)
    produce_to.flush()
    assert [consumer.receive(10_000).data() for _ in range(10)] == [
        f"n{i}".encode() for i in range(10)
    ]
    after = ok(node, "GET", "/persistent/public/rated/t/stats")["subscriptions"]["s"]
    assert after["dispatchThrottledMsgEventsBySubscriptionLimit"] >= 1  # five a window
    assert (
        after["dispatchThrottledMsgEventsByTopicLimit"]
        == held["dispatchThrottledMsgEventsByTopicLimit"]
    )  # the namespace's rate is gone
    produce_to.close()
    consumer.close()


def test_terminate_refuses_producers_and_lets_consumers_drain(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "persistent://public/default/terminated"
    path = "/persistent/public/default/terminated"
    consumer = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    reader = pc.create_reader(topic, pulsar.MessageId.earliest)
    producer = pc.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(5)]
    last = ok(node, "POST", f"{path}/terminate")
    assert last == {
        "ledgerId": ids[-1].ledger_id(),
        "entryId": ids[-1].entry_id(),
        "partitionIndex": -1,
    }
    assert ok(node, "POST", f"{path}/terminate") == last  # again: the same answer
    with pytest.raises(pulsar.TopicTerminated):
        producer.send(b"late")
    with pytest.raises(pulsar.TopicTerminated):
        pc.create_producer(topic)
    assert receive(consumer, 5) == [f"m{i}" for i in range(5)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)  # nothing more, and no hang
    read = []
    while reader.has_message_available():
        read.append(reader.read_next(10_000).data())
    assert read == [f"m{i}".encode() for i in range(5)]
    assert not reader.has_message_available()
    internal = ok(node, "GET", f"{path}/internalStats")
    assert internal["state"] == "Terminated"
    assert internal["lastConfirmedEntry"] == f"{last['ledgerId']}:{last['entryId']}"
    assert ok(node, "GET", f"{path}/stats")["msgInCounter"] == 5
    # A new subscription still reads everything the topic holds.
    late = pc.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    assert receive(late, 5) == [f"m{i}" for i in range(5)]
    with pytest.raises(pulsar.AlreadyClosed):
        producer.close()  # the client closed it when it was refused
    for closing in (consumer, reader, late):
        closing.close()


def test_terminated_consumer_is_told_it_reached_the_end(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    """A client that handles REACHED_END_OF_TOPIC (the Java and Go clients do; the C++ client
    under the Python one does not, so it is not sent it) is told once it has acknowledged
    everything, not before, in every subscription mode."""
    topic = "persistent://public/default/terminated-raw"
    produce(pc, "terminated-raw", [f"m{i}" for i in range(3)])
    ok(node, "POST", "/persistent/public/default/terminated-raw/terminate")
    Sub = pb.CommandSubscribe
    with RawConnection(node) as raw:
        raw.connect()
        for consumer_id, mode in enumerate(
            (Sub.Exclusive, Sub.Shared, Sub.Failover, Sub.Key_Shared), start=1
        ):
            raw.command(
                Sub(
                    topic=topic,
                    subscription=f"raw-{Sub.SubType.Name(mode)}",
                    subType=mode,
                    consumer_id=consumer_id,
                    request_id=consumer_id,
                    initialPosition=Sub.Earliest,
                )
            )
            frame = raw.next_frame()
            if frame.type == pb.BaseCommand.ACTIVE_CONSUMER_CHANGE:  # failover
                frame = raw.next_frame()
            assert frame.type == pb.BaseCommand.SUCCESS, frame
            raw.command(pb.CommandFlow(consumer_id=consumer_id, messagePermits=10))
            received = []
            while len(received) < 3:
                frame = raw.next_frame()
                if frame.type == pb.BaseCommand.MESSAGE:
                    received.append(frame.body.message_id)  # type: ignore[attr-defined]
            if mode == Sub.Exclusive:
                with pytest.raises(TimeoutError):
                    raw.next_frame(0.5)  # nothing acknowledged: not the end yet
            raw.command(
                pb.CommandAck(
                    consumer_id=consumer_id,
                    ack_type=pb.CommandAck.Individual,
                    message_id=received,
                )
            )
            end = raw.expect(pb.BaseCommand.REACHED_END_OF_TOPIC).body
            assert end.consumer_id == consumer_id, mode  # type: ignore[attr-defined]
        with pytest.raises(TimeoutError):
            raw.next_frame(0.5)  # each told once


def test_terminate_partitions_and_refusals(node: StandaloneProcess, pc: pulsar.Client) -> None:
    path = "/persistent/public/default/terminated-parts"
    assert call(node, "PUT", f"{path}/partitions", 2)[0] == 204
    producer = pc.create_producer(
        "persistent://public/default/terminated-parts", batching_enabled=False
    )
    for i in range(4):
        producer.send(f"m{i}".encode(), partition_key=f"k{i}")
    producer.close()
    status, _, body = call(node, "POST", f"{path}/terminate")
    assert status == 405 and b"partitioned topic" in body
    answer = ok(node, "POST", f"{path}/terminate/partitions")
    assert sorted(answer) == ["0", "1"]
    for index, message_id in answer.items():
        assert message_id["partitionIndex"] == int(index)
        assert isinstance(message_id["ledgerId"], int)
        assert isinstance(message_id["entryId"], int)
        stats = ok(node, "GET", f"{path}-partition-{index}/internalStats")
        assert stats["state"] == "Terminated"
    with pytest.raises(pulsar.TopicTerminated):
        pc.create_producer("persistent://public/default/terminated-parts")
    assert (
        call(node, "POST", "/persistent/public/default/terminated/terminate/partitions")[0] == 405
    )
    assert call(node, "POST", "/persistent/public/default/never-made/terminate")[0] == 404
    assert call(node, "POST", "/non-persistent/public/default/np/terminate")[0] == 405


def quota_over_backlog(node: StandaloneProcess, pc: pulsar.Client, namespace: str, policy: str):
    """A topic of ``namespace`` with a subscription 20 messages behind, its producer still
    attached, and a 1000-byte quota with ``policy`` set on the namespace (a policy round runs
    at once): the producer is disconnected and stays refused."""
    assert call(node, "PUT", f"/namespaces/{namespace}")[0] == 204
    topic = f"persistent://{namespace}/t"
    consumer = pc.subscribe(topic, "slow")
    producer = pc.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"m{i:02}".encode() + b"x" * 100)
    quota = {"limitSize": 1000, "limitTime": -1, "policy": policy}
    assert call(node, "POST", f"/namespaces/{namespace}/backlogQuota", quota)[0] == 204
    stats = f"/persistent/{namespace}/t/stats"
    eventually(lambda: ok(node, "GET", stats)["publishers"] == [], "the producer disconnected")
    # Pulsar's TopicStats say the quota in force.
    in_force = ok(node, "GET", stats)
    assert (in_force["backlogQuotaLimitSize"], in_force["backlogQuotaLimitTime"]) == (1000, -1)
    return topic, consumer, producer


def test_backlog_quota_producer_request_hold(node: StandaloneProcess, pc: pulsar.Client) -> None:
    topic, consumer, producer = quota_over_backlog(
        node, pc, "public/quota-hold", "producer_request_hold"
    )
    results: list[pulsar.Result] = []
    for i in range(5):
        producer.send_async(f"held{i}".encode(), lambda result, _id: results.append(result))
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
        pc.create_producer(topic)
    assert results == []  # held by the client while the broker refuses it
    got = []
    while len(got) < 25:
        message = consumer.receive(30_000)
        consumer.acknowledge(message)
        got.append(message.data().rstrip(b"x"))
    # Drained under the quota: the held producer is taken back and its five sends stored.
    assert got == [f"m{i:02}".encode() for i in range(20)] + [f"held{i}".encode() for i in range(5)]
    eventually(lambda: len(results) == 5, "every held send answered")
    assert results == [pulsar.Result.Ok] * 5
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)  # exactly 25
    pc.create_producer(topic).close()
    producer.close()
    consumer.close()


def test_backlog_quota_producer_exception(node: StandaloneProcess, pc: pulsar.Client) -> None:
    topic, consumer, producer = quota_over_backlog(
        node, pc, "public/quota-exception", "producer_exception"
    )
    results: list[pulsar.Result] = []
    for i in range(3):
        producer.send_async(f"refused{i}".encode(), lambda result, _id: results.append(result))
    eventually(lambda: len(results) == 3, "every send answered")
    assert results == [pulsar.Result.ProducerBlockedQuotaExceededException] * 3
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        pc.create_producer(topic)
    assert receive(consumer, 20) == [f"m{i:02}" + "x" * 100 for i in range(20)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)  # the refused sends were not stored
    again = pc.create_producer(topic)  # under the quota: accepted again
    again.send(b"after")
    assert receive(consumer, 1) == ["after"]
    # The age limit too: a message unacknowledged longer than limitTime holds producers back.
    age = {"limitSize": -1, "limitTime": 1, "policy": "producer_exception"}
    path = "/namespaces/public/quota-exception/backlogQuota"
    assert call(node, "DELETE", path)[0] == 204
    assert call(node, "POST", f"{path}?backlogQuotaType=message_age", age)[0] == 204
    again.send(b"aging")
    time.sleep(1.1)
    assert call(node, "POST", f"{path}?backlogQuotaType=message_age", age)[0] == 204  # a round
    stats = "/persistent/public/quota-exception/t/stats"
    eventually(lambda: ok(node, "GET", stats)["publishers"] == [], "the producer disconnected")
    in_force = ok(node, "GET", stats)
    assert (in_force["backlogQuotaLimitSize"], in_force["backlogQuotaLimitTime"]) == (-1, 1)
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        pc.create_producer(topic)
    for closing in (again, producer):
        try:
            closing.close()
        except pulsar.AlreadyClosed:
            pass
    consumer.close()


def bk(node: StandaloneProcess, *argv: str) -> subprocess.CompletedProcess[str]:
    url = f"local://{node.data_dir / 'meta.db'}"
    return subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "bk", argv[0], "--metadata-url", url, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_bk_tools_read_a_running_standalone(node: StandaloneProcess, pc: pulsar.Client) -> None:
    """``magnetar bk`` on the running standalone's own store: the reading tools open it
    read-only and answer; a tool that would change it is refused, and nothing changed."""
    produce(pc, "inspected", ["a", "b", "c"])
    stats = ok(node, "GET", "/persistent/public/default/inspected/internalStats")
    ledger = str(stats["ledgers"][-1]["ledgerId"])
    listed = bk(node, "listbookies")
    assert listed.returncode == 0, listed.stderr
    assert f":{node.bookie_port}\twritable" in listed.stdout
    assert "in use by a running process: reading it read-only" in listed.stderr
    ledgers = bk(node, "listledgers")
    assert ledgers.returncode == 0 and ledger in ledgers.stdout.split(), ledgers.stderr
    metadata = bk(node, "ledgermetadata", ledger)
    assert metadata.returncode == 0, metadata.stderr
    assert "managed-ledger = b'public/default/persistent/inspected'" in metadata.stdout
    entries = bk(node, "readledger", ledger)
    assert entries.returncode == 0, entries.stderr
    # An open ledger is read up to its LAC: the last entry's reaches the bookie with the next add.
    lines = entries.stdout.splitlines()
    assert len(lines) in (2, 3) and [line.split("\t")[0] for line in lines[:2]] == ["0", "1"]
    refused = bk(node, "autorecovery", "enable")
    assert refused.returncode == 1
    assert "this tool changes the store or the bookies, so stop that process" in refused.stderr
    # The broker goes on as before: its ledger still takes writes.
    produce(pc, "inspected", ["d"])
    assert ok(node, "GET", "/persistent/public/default/inspected/stats")["msgInCounter"] == 4


def test_publish_rate_pauses_producers_without_losing_a_message(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    assert call(node, "PUT", "/namespaces/public/pubrate")[0] == 204
    base = "/namespaces/public/pubrate"
    rate = {"publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": -1}
    assert ok(node, "GET", f"{base}/publishRate") is None
    assert call(node, "POST", f"{base}/publishRate", {"publishThrottlingRateInMsg": -2})[0] == 400
    assert call(node, "POST", f"{base}/publishRate", rate)[0] == 204
    assert ok(node, "GET", f"{base}/publishRate") == rate
    assert ok(node, "GET", base)["publishMaxMessageRate"] == {"standalone": rate}
    topic = "persistent://public/pubrate/t"
    path = "/persistent/public/pubrate/t"
    consumer = pc.subscribe(topic, "s")
    producer = pc.create_producer(topic, batching_enabled=False)
    results: list[pulsar.Result] = []
    for i in range(40):
        producer.send_async(f"m{i}".encode(), lambda result, _id: results.append(result))
    producer.flush()
    assert results == [pulsar.Result.Ok] * 40  # paused, never refused
    stats = ok(node, "GET", f"{path}/stats")
    # Ten a second: the broker stopped reading the producer at least three times, and the rate
    # it reports since the topic loaded stays near the limit (unthrottled: hundreds a second).
    assert stats["publishRateLimitedTimes"] >= 3
    assert stats["msgInCounter"] == 40
    assert stats["msgRateIn"] < 20
    assert receive(consumer, 40) == [f"m{i}" for i in range(40)]
    # The topic's own rate, over the namespace's; removed, the namespace's applies again.
    own = {"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": 100}
    assert call(node, "POST", f"{path}/publishRate", own)[0] == 204
    assert ok(node, "GET", f"{path}/publishRate") == own
    assert call(node, "DELETE", f"{path}/publishRate")[0] == 204
    assert ok(node, "GET", f"{path}/publishRate") is None
    assert call(node, "DELETE", f"{base}/publishRate")[0] == 204
    assert ok(node, "GET", f"{base}/publishRate") is None
    producer.close()
    consumer.close()


def test_health_check_round_trips_through_the_heartbeat_topic(node: StandaloneProcess) -> None:
    """``GET /brokers/health`` writes a message to this broker's heartbeat topic's managed
    ledger and reads it back (Pulsar's health check); its ledgers do not pile up."""
    [broker] = ok(node, "GET", "/brokers/standalone")
    name = f"pulsar/{broker}/persistent/healthcheck"
    for _ in range(4):
        status, _, body = call(node, "GET", "/brokers/health")
        assert (status, body) == (200, b"ok")

    async def heartbeat_ledgers() -> list[int]:
        # The standalone's own store, read beside it (as `magnetar bk` does).
        store = await open_store(f"local://{node.data_dir / 'meta.db'}", read_only=True)
        try:
            found = await store.get(managed_ledger_key(name))
        finally:
            await store.close()
        assert found is not None, f"no managed ledger {name}"
        return [i.ledger_id for i in ManagedLedgerRecord.from_bytes(name, found.value).ledgers]

    # The one written by the last check and at most the one before: four checks, four ledgers
    # made, the older ones deleted.
    assert 1 <= len(asyncio.run(heartbeat_ledgers())) <= 2
