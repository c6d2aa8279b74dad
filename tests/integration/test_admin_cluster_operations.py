"""The operator's admin calls on a three-broker cluster: a topic's calls made at a broker that does
not serve it are redirected to its owner (307, as Pulsar does) and work there; the namespace-wide
ones (clearBacklog, unsubscribe) reach every bundle's owner; partitioned stats gather each
partition from the broker serving it; ``magnetar admin`` follows the redirects."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from tests.support.cluster import (
    BrokerProcess,
    MagnetarCluster,
    assert_no_traceback,
    cluster_fixture,
)
from tests.support.standalone import QUIET

NAMESPACE = "ops/spread"
TOPICS = [f"persistent://{NAMESPACE}/t{i}" for i in range(8)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    yield from cluster_fixture(tmp_path_factory.mktemp("admin-cluster"), bookies=2, brokers=3)


@pytest.fixture(scope="module")
def loaded(cluster: MagnetarCluster) -> Iterator[pulsar.Client]:
    """Eight topics of a namespace of eight bundles, spread over the brokers, each with
    subscriptions ``a`` and ``b`` and five messages."""
    assert cluster.admin("PUT", "/admin/v2/tenants/ops", {})[0] == 204
    status, body = cluster.admin(
        "PUT", f"/admin/v2/namespaces/{NAMESPACE}", {"bundles": {"numBundles": 8}}
    )
    assert status == 204, body
    urls = ",".join(b.url.removeprefix("pulsar://") for b in cluster.brokers)
    client = pulsar.Client(f"pulsar://{urls}", operation_timeout_seconds=30, logger=QUIET)
    for topic in TOPICS:
        for sub in ("a", "b"):
            client.subscribe(topic, sub).close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(5):
            producer.send(f"{topic[-2:]}-{i}".encode())
        producer.close()
    try:
        yield client
    finally:
        client.close()
        for broker in cluster.brokers:
            assert_no_traceback(broker)
            assert " ERROR " not in broker.log_text(), broker.log_tail()


def not_owner(cluster: MagnetarCluster, topic: str) -> BrokerProcess:
    owner = cluster.owner_of_topic(topic)
    return next(b for b in cluster.brokers if b.broker_id != owner)


def raw(url: str, method: str = "GET") -> tuple[int, dict[str, str]]:
    """One request, redirects not followed."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(Stay())
    try:
        with opener.open(urllib.request.Request(url, method=method), timeout=30) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def path_of(topic: str) -> str:
    return "/admin/v2/" + topic.replace("://", "/", 1)


def backlog(cluster: MagnetarCluster, topic: str, sub: str) -> int:
    stats = cluster.admin_json("GET", f"{path_of(topic)}/stats")
    return stats["subscriptions"][sub]["msgBacklog"]


def test_topic_calls_are_redirected_to_the_owner(
    cluster: MagnetarCluster, loaded: pulsar.Client
) -> None:
    topic = TOPICS[0]
    owner = cluster.broker(cluster.owner_of_topic(topic) or "")
    other = not_owner(cluster, topic)
    for suffix, method in (
        ("/subscription/a/skip/2", "POST"),
        ("/subscription/a/position/1", "GET"),
        ("/lastMessageId", "GET"),
        ("/examinemessage", "GET"),
    ):
        status, headers = raw(f"{other.http_url}{path_of(topic)}{suffix}", method)
        assert status == 307 and headers["Location"].startswith(owner.http_url), (suffix, status)
    status, body = other.http("POST", f"{path_of(topic)}/subscription/a/skip/2")
    assert status == 204, body
    assert backlog(cluster, topic, "a") == 3 and backlog(cluster, topic, "b") == 5
    status, body = other.http("GET", f"{path_of(topic)}/subscription/a/position/1")
    assert status == 200 and body == b"t0-2"
    status, body = other.http("POST", f"{path_of(topic)}/subscription/a/resetcursor/0")
    assert status == 204, body
    assert backlog(cluster, topic, "a") == 5


#: Every topic call of the admin API that only the topic's owner can answer (the calls are not
#: followed here, so none of them runs: terminate, truncate and the rest change nothing).
OWNER_CALLS = (
    ("GET", "/stats"),
    ("GET", "/internalStats"),
    ("GET", "/subscriptions"),
    ("PUT", "/subscription/made"),
    ("DELETE", "/subscription/b"),
    ("POST", "/subscription/a/skip_all"),
    ("POST", "/subscription/a/expireMessages/10"),
    ("POST", "/all_subscription/expireMessages/10"),
    ("POST", "/subscription/a/resetcursor/0"),
    ("POST", "/subscription/a/resetcursor"),
    ("GET", "/ledger/1/entry/0"),
    ("GET", "/messageid/0"),
    ("POST", "/terminate"),
    ("POST", "/trim"),
    ("DELETE", "/truncate"),
    ("GET", "/properties"),
    ("PUT", "/properties"),
    ("GET", "/maxProducers"),
    ("POST", "/retention"),
    ("PUT", "/schemaCompatibilityStrategy"),
)


def test_every_owner_call_is_redirected_from_another_broker(
    cluster: MagnetarCluster, loaded: pulsar.Client
) -> None:
    topic = TOPICS[1]
    owner = cluster.broker(cluster.owner_of_topic(topic) or "")
    other = not_owner(cluster, topic)
    for method, suffix in OWNER_CALLS:
        status, headers = raw(f"{other.http_url}{path_of(topic)}{suffix}", method)
        assert status == 307, (method, suffix, status)
        assert headers["Location"] == f"{owner.http_url}{path_of(topic)}{suffix}", (method, suffix)
    # Nothing ran at the other broker: the subscriptions and messages are as they were.
    stats = cluster.admin_json("GET", f"{path_of(topic)}/stats")
    assert sorted(stats["subscriptions"]) == ["a", "b"]
    assert stats["msgInCounter"] == 5


def test_namespace_calls_reach_every_bundle_owner(
    cluster: MagnetarCluster, loaded: pulsar.Client
) -> None:
    # Asked where at least one topic is not served: that bundle's owner is asked in turn.
    status, body = not_owner(cluster, TOPICS[0]).http(
        "POST", f"/admin/v2/namespaces/{NAMESPACE}/clearBacklog/b"
    )
    assert status == 204, body
    assert [backlog(cluster, t, "b") for t in TOPICS] == [0] * len(TOPICS)
    assert all(backlog(cluster, t, "a") > 0 for t in TOPICS)
    status, body = not_owner(cluster, TOPICS[1]).http(
        "POST", f"/admin/v2/namespaces/{NAMESPACE}/unsubscribe/b"
    )
    assert status == 204, body
    for topic in TOPICS:
        assert cluster.admin_json("GET", f"{path_of(topic)}/subscriptions") == ["a"]
    served = [
        t
        for broker in cluster.brokers
        for bundles in json.loads(broker.http("GET", "/admin/v2/broker-stats/topics")[1])
        .get(NAMESPACE, {})
        .values()
        for t in bundles.get("persistent", {})
    ]
    assert sorted(served) == sorted(TOPICS)  # each topic reported by its one owner


def test_partitioned_stats_gather_every_partition(
    cluster: MagnetarCluster, loaded: pulsar.Client
) -> None:
    topic = f"persistent://{NAMESPACE}/parts"
    assert cluster.admin("PUT", f"{path_of(topic)}/partitions", 6)[0] == 204
    producer = loaded.create_producer(topic, batching_enabled=False)
    for i in range(60):
        producer.send(b"x", partition_key=f"k{i}")
    producer.close()
    # Asked at every broker: each asks the owners of the partitions it does not serve.
    for broker in cluster.brokers:
        stats = json.loads(broker.http("GET", f"{path_of(topic)}/partitioned-stats")[1])
        assert stats["msgInCounter"] == 60 and len(stats["partitions"]) == 6


def test_magnetar_admin_follows_redirects(cluster: MagnetarCluster, loaded: pulsar.Client) -> None:
    topic = TOPICS[1]
    other = not_owner(cluster, topic)
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "admin", "--admin-url", other.http_url,
         "topics", "skip", topic, "-s", "a", "-n", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert backlog(cluster, topic, "a") == 4


def test_topic_policies_are_set_at_the_owner(
    cluster: MagnetarCluster, loaded: pulsar.Client
) -> None:
    topic = TOPICS[2]
    owner = cluster.broker(cluster.owner_of_topic(topic) or "")
    other = not_owner(cluster, topic)
    status, headers = raw(f"{other.http_url}{path_of(topic)}/maxProducers", "GET")
    assert status == 307 and headers["Location"].startswith(owner.http_url)
    status, body = other.http("POST", f"{path_of(topic)}/maxProducers", 1)
    assert status == 204, body
    producer = loaded.create_producer(topic)
    deadline = time.monotonic() + 10  # applied by the owner's next policy round, woken now
    while True:
        try:
            loaded.create_producer(topic).close()
        except pulsar.ProducerBusy:
            break
        assert time.monotonic() < deadline, "the topic's maxProducers never applied"
        time.sleep(0.1)
    producer.close()
    assert json.loads(other.http("GET", f"{path_of(topic)}/maxProducers")[1]) == 1


def test_partitioned_terminate_reaches_every_partitions_owner(
    cluster: MagnetarCluster, loaded: pulsar.Client
) -> None:
    topic = f"persistent://{NAMESPACE}/ends"
    assert cluster.admin("PUT", f"{path_of(topic)}/partitions", 6)[0] == 204
    producer = loaded.create_producer(topic, batching_enabled=False)
    for i in range(12):
        producer.send(b"x", partition_key=f"k{i}")
    producer.close()
    # Asked at a broker that does not serve partition 0: that one, at least, is another's.
    asked = not_owner(cluster, f"{topic}-partition-0")
    status, body = asked.http("POST", f"{path_of(topic)}/terminate/partitions")
    assert status == 200, body
    ends = json.loads(body)
    assert sorted(ends) == [str(i) for i in range(6)]
    assert [ends[str(i)]["partitionIndex"] for i in range(6)] == list(range(6))
    assert sum(end["entryId"] + 1 for end in ends.values()) == 12  # each partition's last entry
    for i in range(6):
        internal = cluster.admin_json("GET", f"{path_of(topic)}-partition-{i}/internalStats")
        assert internal["state"] == "Terminated"
    with pytest.raises(pulsar.TopicTerminated):
        loaded.create_producer(topic)
