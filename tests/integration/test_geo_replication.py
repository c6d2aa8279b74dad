"""Geo-replication between real clusters (issue 25): clusters ``east``, ``west`` and ``north``, each
its own etcd, two bookies and a broker, sharing a configuration etcd where the clusters are
registered; the namespace is replicated in a full mesh.

- docs/geo-replication.md's commands set everything up: clusters registered, the tenant and
  the namespace made once (they live in the shared configuration store, not in the clusters'
  own etcds) and replicated through another cluster's admin;
- clusters registered once are seen from every cluster;
- a replication list set through one cluster's admin reaches another cluster's loaded topics
  through the brokers' watch on the configuration store (policy rounds are 600 s apart);
- a replication list naming a cluster the tenant does not allow is refused (403);
- a cluster left out of a namespace's replication list refuses lookups of its topics (Pulsar's
  MetadataError / 412 naming the list) and serves them once added;
- a namespace replicated both ways with the official client producing on two sides and
  consuming on all three: exact counts, no duplicates, nothing replicated back or around (no
  loops: each cluster stores each message once); ``replication`` in topic stats;
- the remote's subscriptions in all four modes each get every message once;
- per-message ``replication_clusters`` and ``disable_replication`` honoured;
- replicated subscriptions: a consumer acknowledges half in east and the application moves to
  west, which delivers the other half plus at most what east stored after the snapshot the
  update came from (read from the markers in east's topic); markers reach no consumer in any
  mode, in any cluster, and count in no stats; a topic without replicated subscription gets
  no marker;
- every broker of the remote (two) killed (-9) while the local side keeps producing: the
  backlog is seen rising in the local stats, counts in the topic's backlog quota, drains when
  the remote returns, and the remote has every message once (the remote's deduplication drops
  a resend of what it had stored); then the local broker killed (-9) in the middle of a
  stream: its replicator resumes from its durable cursor;
- a single cluster restarted with a configuration store moves its tenants, namespaces and
  partitioned topics there and keeps serving them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from magnetar.broker.model import markers
from magnetar.common.metadata import open_store
from magnetar.common.proto import markers_pb2 as mk
from magnetar.common.proto import pulsar_api_pb2 as pb
from tests.support.cluster import (
    BrokerProcess,
    MagnetarCluster,
    PacedProducer,
    assert_no_traceback,
)
from tests.support.etcd import EtcdServer
from tests.support.raw_client import RawConnection
from tests.support.standalone import QUIET

TENANT = "geo"
NAMESPACE = f"{TENANT}/rep"
CLUSTERS = ("east", "west", "north")


DOC = Path(__file__).resolve().parents[2] / "docs" / "geo-replication.md"


def doc_examples() -> list[str]:
    """The lines of the doc's ``bash`` blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def run_doc_line(line: str, clusters: dict[str, MagnetarCluster]) -> str:
    """One ``magnetar`` line of the doc, with ``<cluster>-broker`` put in for each broker."""
    for name, cluster in clusters.items():
        broker = cluster.brokers[0]
        line = line.replace(f"{name}-broker:8080", f"127.0.0.1:{broker.http_port}")
        line = line.replace(f"{name}-broker:6650", f"127.0.0.1:{broker.port}")
    argv = shlex.split(line)
    assert argv[0] == "magnetar", line
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.cli", *argv[1:]],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, (line, done.stdout, done.stderr)
    return done.stdout


class Geo:
    def __init__(self, config: EtcdServer, clusters: dict[str, MagnetarCluster]) -> None:
        self.config = config
        self.clusters = clusters
        #: What each line of docs/geo-replication.md printed when the fixture ran it.
        self.doc_outputs: dict[str, str] = {}

    def broker(self, name: str) -> BrokerProcess:
        return self.clusters[name].brokers[0]

    def client(self, name: str) -> pulsar.Client:
        return pulsar.Client(self.broker(name).url, operation_timeout_seconds=30, logger=QUIET)

    def config_keys(self, prefix: str) -> dict[str, bytes]:
        """What the configuration etcd holds under ``prefix``."""

        async def read() -> dict[str, bytes]:
            store = await open_store(self.config.url)
            try:
                return {k: v.value for k, v in (await store.scan(prefix)).items()}
            finally:
                await store.close()

        return asyncio.run(read())

    def stats(self, name: str, topic: str) -> dict:
        return self.clusters[name].admin_json("GET", f"/admin/v2/persistent/{topic}/stats")


@pytest.fixture(scope="module")
def geo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Geo]:
    base: Path = tmp_path_factory.mktemp("geo")
    config = EtcdServer(name="configuration").start()
    clusters: dict[str, MagnetarCluster] = {}
    try:
        for name in CLUSTERS:
            clusters[name] = MagnetarCluster(
                base / name,
                bookies=2,
                brokers=2 if name == "west" else 1,  # every broker of a cluster killed
                broker_settings={
                    "cluster_name": name,
                    "configuration_metadata_url": config.url,
                    # A policy set through one cluster reaches the others' brokers through
                    # their watch on the configuration store, not by a periodic round.
                    "policy_check_interval_seconds": 600,
                    # Snapshots of replicated subscriptions every 200 ms (Pulsar: 1 s).
                    "replicated_subscriptions_snapshot_frequency_millis": 200,
                },
            ).start()
        geo = Geo(config, clusters)
        # The clusters registered, the tenant and the namespace made once (they live in the
        # configuration store) and replicated: by running docs/geo-replication.md's commands.
        for line in doc_examples():
            geo.doc_outputs[line] = run_doc_line(line, clusters)
        yield geo
    finally:
        for cluster in clusters.values():
            cluster.close()
        config.close()


def admin(broker: BrokerProcess, *words: str) -> str:
    """``magnetar admin`` against ``broker``, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "admin", "--admin-url",
         f"http://127.0.0.1:{broker.http_port}", *words],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"magnetar admin {' '.join(words)}: {done.stderr}"
    return done.stdout


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def receive_all(consumer: pulsar.Consumer, expected: int, timeout: float = 30.0) -> list[str]:
    """Every message until ``expected`` arrived, then whatever comes in one more second."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wait_ms = 1000 if len(got) >= expected else 2000
        try:
            message = consumer.receive(timeout_millis=wait_ms)
        except pulsar.Timeout:
            if len(got) >= expected:
                break
            continue
        got.append(message.data().decode())
        consumer.acknowledge(message)
    return got


def test_clusters_are_shared_and_replication_lists_are_checked(geo: Geo) -> None:
    for cluster in geo.clusters.values():
        assert cluster.admin_json("GET", "/admin/v2/clusters") == sorted(CLUSTERS)
        west = cluster.admin_json("GET", "/admin/v2/clusters/west")
        assert west["brokerServiceUrl"] == geo.broker("west").url
    east = geo.clusters["east"]
    assert east.admin("PUT", "/admin/v2/clusters/west", {"serviceUrl": "http://x:1"})[0] == 409
    assert east.admin("GET", "/admin/v2/clusters/nowhere")[0] == 404
    assert east.admin_json("GET", f"/admin/v2/namespaces/{NAMESPACE}/replication") == list(CLUSTERS)
    west_view = admin(geo.broker("west"), "--json", "namespaces", "get-clusters", NAMESPACE)
    assert json.loads(west_view) == list(CLUSTERS)
    assert json.loads(admin(geo.broker("north"), "--json", "clusters", "list")) == sorted(CLUSTERS)
    east.admin_json("PUT", "/admin/v2/tenants/narrow", {"allowedClusters": ["east"]})
    east.admin_json("PUT", "/admin/v2/namespaces/narrow/ns")
    status, body = east.admin("POST", "/admin/v2/namespaces/narrow/ns/replication", CLUSTERS)
    assert status == 403, body
    status, body = east.admin("POST", "/admin/v2/namespaces/narrow/ns/replication", [])
    assert status == 412 and "ClusterIds should not be null or empty" in str(body), body
    assert east.admin_json("GET", "/admin/v2/namespaces/narrow/ns/replication") == []
    east.admin_json("DELETE", "/admin/v2/namespaces/narrow/ns")  # not replicated: deleted here


def test_a_cluster_left_out_of_the_replication_list_refuses_its_topics(geo: Geo) -> None:
    """Pulsar's rule: a namespace replicated to clusters that leave this one out is not served
    here; lookups (binary and HTTP) and partitioned metadata answer an error naming them."""
    east = geo.clusters["east"]
    east.admin_json("PUT", "/admin/v2/tenants/apart", {"allowedClusters": list(CLUSTERS)})
    # Made replicated at once (pulsar-admin's `namespaces create --clusters`), the list checked
    # as set-clusters checks it.
    bad = {"replication_clusters": ["east", "nowhere"]}
    assert east.admin("PUT", "/admin/v2/namespaces/apart/bad", bad)[0] == 403
    assert east.admin("GET", "/admin/v2/namespaces/apart/bad")[0] == 404
    admin(geo.broker("east"), "namespaces", "create", "apart/ns", "--clusters", "east,north")
    assert east.admin_json("GET", "/admin/v2/namespaces/apart/ns/replication") == ["east", "north"]
    topic = "persistent://apart/ns/t"
    expected = (
        "Namespace missing local cluster name in clusters list: "
        "local_cluster=west ns=apart/ns clusters=[east, north]"
    )
    status, raw = geo.broker("west").http("GET", "/lookup/v2/topic/persistent/apart/ns/t")
    assert status == 412 and expected in raw.decode(), (status, raw)
    assert east.http_lookup(topic)["brokerUrl"] == geo.broker("east").url
    with RawConnection(geo.broker("west")) as raw:  # type: ignore[arg-type]
        raw.connect()
        raw.command(pb.CommandPartitionedTopicMetadata(topic=topic, request_id=1))
        answer = raw.expect(pb.BaseCommand.PARTITIONED_METADATA_RESPONSE).body
        assert (answer.response, answer.error, answer.message) == (
            answer.Failed, pb.MetadataError, expected
        ), answer  # fmt: skip
        raw.command(pb.CommandLookupTopic(topic=topic, request_id=2))
        answer = raw.expect(pb.BaseCommand.LOOKUP_RESPONSE).body
        assert (answer.response, answer.error, answer.message) == (
            answer.Failed, pb.MetadataError, expected
        ), answer  # fmt: skip
    # The official client retries a metadata error until its operation timeout, as with Pulsar.
    refused = pulsar.Client(geo.broker("west").url, operation_timeout_seconds=2, logger=QUIET)
    try:
        with pytest.raises(pulsar.Timeout):
            refused.create_producer(topic)
    finally:
        refused.close()
    west, east_client = geo.client("west"), geo.client("east")
    try:
        east_client.create_producer(topic).send(b"x")  # served where it is listed
        # West added to the list: served there too, with what east stored.
        admin(geo.broker("north"), "namespaces", "set-clusters", "apart/ns",
              "--clusters", "east,north,west")  # fmt: skip
        consumer = west.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
        assert receive_all(consumer, 1) == ["x"]
    finally:
        west.close()
        east_client.close()
    assert_no_traceback(geo.broker("west"))


def test_a_replicated_namespace_is_deleted_where_pulsar_allows(geo: Geo) -> None:
    east = geo.clusters["east"]
    status, body = east.admin("DELETE", f"/admin/v2/namespaces/{NAMESPACE}")
    assert status == 412 and "more than one replication clusters" in str(body), (status, body)
    east.admin_json("PUT", "/admin/v2/tenants/pair", {"allowedClusters": ["east", "west"]})
    east.admin_json("PUT", "/admin/v2/namespaces/pair/gone", {"bundles": {"numBundles": 8}})
    # Made with 8 bundles through east: west's own first layout has 8 too.
    assert (
        geo.clusters["west"].admin_json("GET", "/admin/v2/namespaces/pair/gone/bundles")[
            "numBundles"
        ]
        == 8
    )
    east.admin_json("POST", "/admin/v2/namespaces/pair/gone/replication", ["west"])
    url = f"http://127.0.0.1:{geo.broker('east').http_port}/admin/v2/namespaces/pair/gone"
    try:  # to west, the one cluster it is replicated to
        urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=30)
        raise AssertionError("east deleted a namespace replicated to west only")
    except urllib.error.HTTPError as e:
        assert e.code == 307, e.code
        assert e.headers["Location"].startswith(f"http://127.0.0.1:{geo.broker('west').http_port}/")
    admin(geo.broker("east"), "namespaces", "delete", "pair/gone")  # the CLI follows it
    assert geo.clusters["north"].admin_json("GET", "/admin/v2/namespaces/pair") == []
    east.admin_json("DELETE", "/admin/v2/tenants/pair")


def test_tenants_and_namespaces_live_in_the_configuration_store(geo: Geo) -> None:
    outputs = geo.doc_outputs
    [get_clusters] = [line for line in outputs if "get-clusters" in line]
    assert outputs[get_clusters].split() == ["east", "west", "north"], outputs[get_clusters]
    [consume] = [line for line in outputs if " consume " in line]
    assert [p for p in ("o1", "o2", "o3") if p in outputs[consume]] == ["o1", "o2", "o3"], outputs[
        consume
    ]
    for cluster in geo.clusters.values():
        # Made once through east, visible and usable everywhere; stored only in the shared
        # store (each cluster's own etcd keeps its bundles and ledgers).
        assert cluster.admin_json("GET", f"/admin/v2/namespaces/{TENANT}") == [NAMESPACE]
        assert cluster.admin_json("GET", f"/admin/v2/tenants/{TENANT}")["allowedClusters"] == list(
            CLUSTERS
        )
        assert cluster.scan("/magnetar/admin/namespaces/") == {}
        assert cluster.scan("/magnetar/admin/tenants/") == {}
    shared = geo.config_keys("/magnetar/admin/namespaces/")
    assert f"/magnetar/admin/namespaces/{NAMESPACE}" in shared
    # Through west's admin, set on the one record.
    assert json.loads(shared[f"/magnetar/admin/namespaces/{NAMESPACE}"])["deduplicationEnabled"]


def test_a_policy_set_through_one_cluster_applies_in_another(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/policy-watch"
    short = topic.removeprefix("persistent://")
    east = geo.client("east")
    try:
        east.create_producer(topic).send(b"x")
        wait_until(
            lambda: set(geo.stats("east", short)["replication"]) == {"west", "north"},
            "east's replicators",
        )
        # The brokers' policy rounds are 600 s apart: only the watch can bring this to east.
        admin(
            geo.broker("north"), "namespaces", "set-clusters", NAMESPACE, "--clusters", "east,west"
        )
        wait_until(
            lambda: set(geo.stats("east", short)["replication"]) == {"west"},
            "east's topic following the list set through north",
        )
        admin(
            geo.broker("west"), "namespaces", "set-clusters", NAMESPACE,
            "--clusters", ",".join(CLUSTERS),
        )  # fmt: skip
        wait_until(
            lambda: set(geo.stats("east", short)["replication"]) == {"west", "north"},
            "east's topic following the list set through west",
        )
    finally:
        east.close()


def test_both_ways_exactly_once_and_no_loops(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/both-ways"
    short = topic.removeprefix("persistent://")
    clients = {name: geo.client(name) for name in CLUSTERS}
    try:
        consumers = {
            name: client.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
            for name, client in clients.items()
        }
        p_east = clients["east"].create_producer(topic)
        p_west = clients["west"].create_producer(topic)
        for i in range(200):
            p_east.send_async(f"east-{i}".encode(), None)
        for i in range(100):
            p_west.send_async(f"west-{i}".encode(), None)
        p_east.flush()
        p_west.flush()
        received = {name: receive_all(consumer, 300) for name, consumer in consumers.items()}
    finally:
        for client in clients.values():
            client.close()
    expected = {f"east-{i}" for i in range(200)} | {f"west-{i}" for i in range(100)}
    for name, got in received.items():
        assert len(got) == 300 and set(got) == expected, name
        # Order per producer kept everywhere.
        assert [m for m in got if m.startswith("east-")] == [f"east-{i}" for i in range(200)]
        assert [m for m in got if m.startswith("west-")] == [f"west-{i}" for i in range(100)]
    time.sleep(2)  # a loop would have stored more by now
    for name in CLUSTERS:
        stats = geo.stats(name, short)
        assert stats["msgInCounter"] == 300, (name, stats)
        assert set(stats["replication"]) == set(CLUSTERS) - {name}
        for remote, replication in stats["replication"].items():
            assert replication["connected"] is True, (name, remote, replication)
            assert replication["replicationBacklog"] == 0, (name, remote, replication)
            # What comes in from it: its replicator's producer here (Pulsar's inbound side).
            assert replication["inboundConnectedSince"], (name, remote, replication)
            [inbound] = [
                p for p in stats["publishers"] if p["producerName"] == f"pulsar.repl.{remote}"
            ]
            assert (replication["msgRateIn"], replication["msgThroughputIn"]) == (
                inbound["msgRateIn"], inbound["msgThroughputIn"]
            ), (name, remote)  # fmt: skip
        assert set(stats["subscriptions"]) == {"app"}, stats["subscriptions"]
    status, raw = geo.broker("east").http("GET", "/metrics")
    assert status == 200
    metrics = raw.decode()
    for remote in ("west", "north"):
        connected = [
            line
            for line in metrics.splitlines()
            if line.startswith("pulsar_replication_connected_count{")
            and f'remote_cluster="{remote}"' in line
            and 'namespace="geo/rep"' in line
        ]
        assert connected and float(connected[0].rsplit(" ", 1)[1]) >= 1, connected
    assert "pulsar_replication_backlog{" in metrics


def test_every_subscription_mode_on_the_remote_gets_every_message(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/modes"
    modes = {
        "exclusive": pulsar.ConsumerType.Exclusive,
        "shared": pulsar.ConsumerType.Shared,
        "failover": pulsar.ConsumerType.Failover,
        "key-shared": pulsar.ConsumerType.KeyShared,
    }
    west, east = geo.client("west"), geo.client("east")
    try:
        consumers = {
            name: west.subscribe(
                topic,
                name,
                consumer_type=mode,
                initial_position=pulsar.InitialPosition.Earliest,
            )
            for name, mode in modes.items()
        }
        producer = east.create_producer(topic)
        for i in range(100):
            producer.send_async(f"k-{i}".encode(), None, partition_key=f"key-{i % 5}")
        producer.flush()
        received = {name: receive_all(consumer, 100) for name, consumer in consumers.items()}
    finally:
        east.close()
        west.close()
    for name, got in received.items():
        assert sorted(got) == sorted(f"k-{i}" for i in range(100)), name
        assert len(got) == 100, name


def test_replication_clusters_and_disable_replication_per_message(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/per-message"
    clients = {name: geo.client(name) for name in CLUSTERS}
    try:
        consumers = {
            name: clients[name].subscribe(
                topic, "app", initial_position=pulsar.InitialPosition.Earliest
            )
            for name in ("west", "north")
        }
        producer = clients["east"].create_producer(topic)
        producer.send(b"all")
        producer.send(b"west-only", replication_clusters=["west"])
        producer.send(b"local-only", disable_replication=True)
        producer.send(b"all-again")
        received = {
            name: receive_all(c, 2 if name == "north" else 3) for name, c in consumers.items()
        }
    finally:
        for client in clients.values():
            client.close()
    assert received["west"] == ["all", "west-only", "all-again"]
    assert received["north"] == ["all", "all-again"]


def test_chunked_messages_replicate_with_deduplication(geo: Geo) -> None:
    """The namespace deduplicates (the doc's commands enable it): every chunk of a message
    carries its sequence id, and only the last chunk is looked at (Pulsar's rule), here and at
    the remote, where the replicator's producer is deduplicated by the original one."""
    topic = f"persistent://{NAMESPACE}/chunked"
    bodies = [bytes([65 + i]) * (6 * 1024 * 1024) for i in range(2)] + [b"small"]
    west, east = geo.client("west"), geo.client("east")
    try:
        consumers = {
            name: client.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
            for name, client in (("east", east), ("west", west))
        }
        producer = east.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        for body in bodies:
            producer.send(body)
        for name, consumer in consumers.items():
            got = []
            for _ in bodies:
                message = consumer.receive(timeout_millis=30000)
                got.append(message.data())
                consumer.acknowledge(message)
            assert got == bodies, (name, [len(b) for b in got])
    finally:
        east.close()
        west.close()
    assert not geo.broker("east").log_lines("still being stored")


def test_bundle_unload_during_replication_no_gap_no_duplicate(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/unloaded"
    east_cluster = geo.clusters["east"]
    west = geo.client("west")
    east = geo.client("east")
    try:
        consumer = west.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
        producer = east.create_producer(topic)
        producer.send(b"u-0")
        h = topic_hash(topic)
        [bundle] = [
            b
            for (ns, b) in east_cluster.ownership()
            if ns == NAMESPACE and BundleRange.parse(b).contains(h)
        ]
        for i in range(1, 300):
            producer.send_async(f"u-{i}".encode(), None)
            if i in (100, 200):  # the topic's bundle unloaded under its replicators
                east_cluster.unload_bundle(NAMESPACE, bundle)
            elif i == 250:
                east_cluster.admin_json("PUT", f"/admin/v2/namespaces/{NAMESPACE}/unload")
        producer.flush()
        got = receive_all(consumer, 300)
    finally:
        east.close()
        west.close()
    assert got == [f"u-{i}" for i in range(300)]
    # Stored once in west: nothing sent twice made it in.
    assert geo.stats("west", topic.removeprefix("persistent://"))["msgInCounter"] == 300


def test_partitioned_topic_replicates_partition_by_partition(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/partitioned"
    path = f"/admin/v2/persistent/{NAMESPACE}/partitioned/partitions"
    geo.clusters["east"].admin_json("PUT", path, 3)
    east = geo.client("east")
    try:
        producer = east.create_producer(topic)
        for i in range(60):
            producer.send(f"p-{i}".encode(), partition_key=f"k{i % 7}")
    finally:
        east.close()
    west_cluster = geo.clusters["west"]
    wait_until(
        lambda: west_cluster.admin("GET", path) == (200, {"partitions": 3}),
        "west's partitioned topic created by the replicators",
    )
    west = geo.client("west")
    try:
        consumer = west.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
        got = receive_all(consumer, 60)
    finally:
        west.close()
    assert sorted(got) == sorted(f"p-{i}" for i in range(60))

    def replication_summed() -> bool:  # the partitions' replication added up, per remote
        stats = geo.clusters["east"].admin_json(
            "GET", f"/admin/v2/persistent/{NAMESPACE}/partitioned/partitioned-stats"
        )
        return set(stats["replication"]) == {"west", "north"} and all(
            (r["msgOutCounter"], r["replicationBacklog"], r["connected"]) == (60, 0, True)
            for r in stats["replication"].values()
        )

    wait_until(replication_summed, "east's partitioned stats adding up its replicators")


def stored_entries(geo: Geo, cluster: str, short: str) -> list[tuple[tuple[int, int], dict, bytes]]:
    """Every entry stored in ``cluster``'s copy of the topic, in order, as the admin API shows
    it (position, X-Pulsar headers, payload): markers included."""
    broker = geo.broker(cluster)
    internal = geo.clusters[cluster].admin_json(
        "GET", f"/admin/v2/persistent/{short}/internalStats"
    )
    found = []
    for ledger in internal["ledgers"]:
        for entry in range(ledger["entries"]):
            url = (
                f"http://127.0.0.1:{broker.http_port}/admin/v2/persistent/{short}"
                f"/ledger/{ledger['ledgerId']}/entry/{entry}"
            )
            with urllib.request.urlopen(url, timeout=30) as response:
                headers = {k.lower(): v for k, v in response.headers.items()}
                found.append(((ledger["ledgerId"], entry), headers, response.read()))
    return found


def position_tuple(message_id: mk.MarkersMessageIdData) -> tuple[int, int]:
    return (message_id.ledger_id, message_id.entry_id)


def marker_type(headers: dict) -> int | None:
    value = headers.get("x-pulsar-marker-type")
    return None if value is None else int(value)


def produce_paced(client: pulsar.Client, topic: str, bodies: list[str]) -> None:
    """Sent one by one with pauses, so snapshots (every 200 ms) fall between messages."""
    producer = client.create_producer(topic, batching_enabled=False)
    for i, body in enumerate(bodies):
        producer.send(body.encode(), partition_key=f"key-{i % 5}")
        time.sleep(0.015)
    producer.close()


def receive_exactly(consumers: dict, expected: int) -> dict:
    """``expected`` messages from each consumer (acknowledged), then one more second in which
    none may get another (a marker delivered would be one more)."""
    received = {}
    for key, consumer in consumers.items():
        got = []
        for _ in range(expected):
            message = consumer.receive(timeout_millis=30_000)
            got.append(message.data().decode())
            consumer.acknowledge(message)
        received[key] = got
    time.sleep(1)
    for key, consumer in consumers.items():
        with pytest.raises(pulsar.Timeout):
            extra = consumer.receive(timeout_millis=50)
            raise AssertionError(f"{key}: one more message {extra.data()!r}")
    return received


def test_replicated_subscription_fails_over_with_bounded_redelivery(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/failover-app"
    short = topic.removeprefix("persistent://")
    bodies = [f"r-{i}" for i in range(100)]
    west = geo.client("west")
    try:  # a subscription of another name in west, not replicated: no update moves it
        west.subscribe(topic, "other", initial_position=pulsar.InitialPosition.Earliest).close()
    finally:
        west.close()
    east = geo.client("east")
    try:
        consumer = east.subscribe(
            topic,
            "app",
            initial_position=pulsar.InitialPosition.Earliest,
            replicate_subscription_state_enabled=True,
        )
        produce_paced(east, topic, bodies)
        first_half: dict[str, tuple[int, int]] = {}
        while len(first_half) < 50:
            message = consumer.receive(timeout_millis=30_000)
            first_half[message.data().decode()] = (
                message.message_id().ledger_id(),
                message.message_id().entry_id(),
            )
            consumer.acknowledge(message)
        consumer.close()
    finally:
        east.close()
    assert list(first_half) == bodies[:50]
    # Markers stored meanwhile are acknowledged as soon as they are stored.
    wait_until(
        lambda: geo.stats("east", short)["subscriptions"]["app"]["msgBacklog"] == 50,
        "east's backlog: the 50 messages not acknowledged, no marker",
    )
    assert geo.stats("east", short)["subscriptions"]["app"]["isReplicated"] is True
    internal = geo.clusters["east"].admin_json("GET", f"/admin/v2/persistent/{short}/internalStats")
    ledger, entry = internal["cursors"]["app"]["markDeletePosition"].split(":")
    mark_delete = (int(ledger), int(entry))
    assert mark_delete >= first_half[bodies[49]], mark_delete

    # East's topic as stored, markers included: the update east wrote last for "app" names
    # west's position from one of its snapshots (the newest its mark-delete position reached
    # that its cache of at most 10 still held).
    def east_markers() -> tuple[list, dict, list, list]:
        entries = stored_entries(geo, "east", short)
        data = [(p, body.decode()) for p, h, body in entries if marker_type(h) is None]
        requests: dict[str, tuple[int, int]] = {}
        snapshots: list[mk.ReplicatedSubscriptionsSnapshot] = []
        updates: list[mk.ReplicatedSubscriptionsUpdate] = []
        for position, headers, payload in entries:
            kind = marker_type(headers)
            if kind is None or "x-pulsar-replicated-from" in headers:
                continue
            body = markers.parse(kind, payload)
            if kind == markers.SNAPSHOT_REQUEST:
                requests.setdefault(body.snapshot_id, position)  # the first round's
            elif kind == markers.SNAPSHOT:
                snapshots.append(body)
            elif kind == markers.UPDATE and body.subscription_name == "app":
                updates.append(body)
        return data, requests, snapshots, updates

    wait_until(lambda: bool(east_markers()[3]), "east's update of app")
    data, requests, snapshots, updates = east_markers()
    assert [body for _, body in data] == bodies

    def west_of(clusters: Iterable[mk.ClusterMessageId]) -> tuple[int, int]:
        return next(position_tuple(c.message_id) for c in clusters if c.cluster == "west")

    west_target = west_of(updates[-1].clusters)
    # The snapshot it came from (the first with that position: the loosest bound if several).
    chosen = next(s for s in snapshots if west_of(s.clusters) == west_target)
    # West may deliver again only what east stored after that snapshot's request: one snapshot
    # round's worth of the first half.
    bound = sum(1 for p, body in data if body in first_half and p > requests[chosen.snapshot_id])
    between = sorted(requests.values())
    per_interval = max(sum(1 for p, _ in data if a < p < b) for a, b in itertools.pairwise(between))
    print(f"redelivery bound {bound}, at most {per_interval} messages between two requests")
    assert bound < 50, (bound, per_interval)

    def west_moved() -> bool:
        internal = geo.clusters["west"].admin_json(
            "GET", f"/admin/v2/persistent/{short}/internalStats"
        )
        cursor = internal["cursors"].get("app")
        if cursor is None:
            return False
        ledger, entry = cursor["markDeletePosition"].split(":")
        return (int(ledger), int(entry)) >= west_target

    wait_until(west_moved, "west's subscription moved by east's update")
    west = geo.client("west")
    try:
        consumer = west.subscribe(topic, "app", replicate_subscription_state_enabled=True)
        got = receive_all(consumer, 50)
    finally:
        west.close()
    assert len(got) == len(set(got)), "no duplicates"
    assert set(bodies[50:]) <= set(got)
    again = [body for body in got if body in first_half]
    assert len(again) <= bound, (len(again), bound)
    assert again == bodies[50 - len(again) : 50], "only the last acknowledged come again"
    assert len(got) == 50 + len(again)
    other = geo.stats("west", short)["subscriptions"]["other"]
    assert other["msgBacklog"] == 100 and other["isReplicated"] is False, other
    # And back: west acknowledged everything, so its own snapshots move east's "app" to the end.
    wait_until(
        lambda: geo.stats("east", short)["subscriptions"]["app"]["msgBacklog"] == 0,
        "east's subscription moved by west's update",
    )
    # The flag is kept with the topic: still replicated after east's topic is reloaded.
    geo.clusters["east"].admin_json("PUT", f"/admin/v2/namespaces/{NAMESPACE}/unload")
    assert geo.stats("east", short)["subscriptions"]["app"]["isReplicated"] is True


def test_markers_reach_no_consumer_in_any_mode(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/markers-hidden"
    short = topic.removeprefix("persistent://")
    modes = {
        "exclusive": pulsar.ConsumerType.Exclusive,
        "shared": pulsar.ConsumerType.Shared,
        "failover": pulsar.ConsumerType.Failover,
        "key-shared": pulsar.ConsumerType.KeyShared,
    }
    bodies = [f"h-{i}" for i in range(60)]
    east, west = geo.client("east"), geo.client("west")
    try:
        replicated = east.subscribe(
            topic,
            "replicated",
            initial_position=pulsar.InitialPosition.Earliest,
            replicate_subscription_state_enabled=True,
        )
        consumers = {
            (cluster, name): client.subscribe(
                topic, name, consumer_type=mode, initial_position=pulsar.InitialPosition.Earliest
            )
            for cluster, client in (("east", east), ("west", west))
            for name, mode in modes.items()
        }
        produce_paced(east, topic, bodies)
        consumers[("east", "replicated")] = replicated
        received = receive_exactly(consumers, 60)
        reader = east.create_reader(topic, pulsar.MessageId.earliest)
        read = []
        while reader.has_message_available():
            read.append(reader.read_next(timeout_millis=10_000).data().decode())
        reader.close()
    finally:
        east.close()
        west.close()
    for key, got in received.items():
        assert sorted(got) == sorted(bodies) and len(got) == 60, key
    assert read == bodies, "a reader stops at the last message, not at a marker after it"
    east_markers = [h for _, h, _ in stored_entries(geo, "east", short) if marker_type(h)]
    west_markers = [h for _, h, _ in stored_entries(geo, "west", short) if marker_type(h)]
    assert east_markers and west_markers, "markers were written and replicated"

    def backlogs(cluster: str) -> dict[str, int]:
        # West's "replicated" has no consumer: it is where east's last update put it.
        subscriptions = geo.stats(cluster, short)["subscriptions"]
        return {n: s["msgBacklog"] for n, s in subscriptions.items() if n != "replicated"}

    for cluster in ("east", "west"):
        # Markers stored until the last snapshot are acknowledged as soon as they are stored.
        wait_until(lambda: set(backlogs(cluster).values()) == {0}, f"{cluster}: no backlog")  # noqa: B023
        stats = geo.stats(cluster, short)
        assert stats["msgInCounter"] == 60, (cluster, stats["msgInCounter"])
        assert len(stats["subscriptions"]) == 5, stats["subscriptions"].keys()
        for name, sub in stats["subscriptions"].items():
            assert sub["isReplicated"] is (name == "replicated"), (cluster, name)
    assert geo.stats("east", short)["subscriptions"]["replicated"]["msgBacklog"] == 0
    status, raw = geo.broker("east").http("GET", "/metrics")
    assert status == 200
    pending = [
        line
        for line in raw.decode().splitlines()
        if line.startswith("pulsar_replicated_subscriptions_pending_snapshots{")
    ]
    assert pending and float(pending[0].rsplit(" ", 1)[1]) >= 0, pending
    # West's copy of the replicated subscription was created by east's updates.
    assert "replicated" in geo.stats("west", short)["subscriptions"]
    for cluster in CLUSTERS:
        assert_no_traceback(geo.broker(cluster))


def test_no_markers_without_a_replicated_subscription(geo: Geo) -> None:
    topic = f"persistent://{NAMESPACE}/no-markers"
    short = topic.removeprefix("persistent://")
    bodies = [f"n-{i}" for i in range(40)]
    east, west = geo.client("east"), geo.client("west")
    try:
        consumer = west.subscribe(topic, "plain", initial_position=pulsar.InitialPosition.Earliest)
        local = east.subscribe(topic, "plain", initial_position=pulsar.InitialPosition.Earliest)
        produce_paced(east, topic, bodies)
        assert sorted(receive_all(consumer, 40)) == sorted(bodies)
        assert sorted(receive_all(local, 40)) == sorted(bodies)
    finally:
        east.close()
        west.close()
    for cluster in CLUSTERS:
        entries = stored_entries(geo, cluster, short)
        assert [body.decode() for _, _, body in entries] == bodies, cluster
        assert not [h for _, h, _ in entries if marker_type(h) is not None], cluster
    # The admin API turns it on and off (pulsar-admin's verbs).
    east_broker = geo.broker("east")
    status = ("topics", "get-replicated-subscription-status", topic, "-s", "plain")
    assert json.loads(admin(east_broker, *status)) == {topic: False}
    admin(east_broker, "topics", "set-replicated-subscription-status", topic, "-s", "plain", "-e")
    assert json.loads(admin(east_broker, *status)) == {topic: True}
    assert geo.stats("east", short)["subscriptions"]["plain"]["isReplicated"] is True
    admin(east_broker, "topics", "set-replicated-subscription-status", topic, "-s", "plain", "-d")
    assert json.loads(admin(east_broker, *status)) == {topic: False}
    path = f"/admin/v2/persistent/{short}/subscription/plain/replicatedSubscriptionStatus"
    assert geo.clusters["east"].admin("POST", path, "yes")[0] == 400
    assert geo.clusters["east"].admin("GET", path.replace("plain", "nobody"))[0] == 404


def replication_of(geo: Geo, cluster: str, topic: str, remote: str) -> dict:
    return geo.stats(cluster, topic.removeprefix("persistent://"))["replication"][remote]


def test_every_remote_broker_killed_under_traffic_then_the_local_one(geo: Geo) -> None:
    """Both of west's brokers killed (-9) while east's producer keeps sending: east serves its
    producer throughout, its replication backlog to west rises (and counts in the topic's
    backlog quota) and drains once west is back, west ends with every message once, in order.
    Then east's own broker is killed mid-stream: its replicator resumes from its stored
    cursor and west's deduplication drops what it had stored already."""
    topic = f"persistent://{NAMESPACE}/restarts"
    quota_topic = f"persistent://{NAMESPACE}/quota"
    west_cluster = geo.clusters["west"]
    assert len(west_cluster.brokers) == 2
    east = geo.client("east")
    traffic: PacedProducer | None = None
    try:
        west = geo.client("west")
        west.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest).close()
        west.close()
        quota_producer = east.create_producer(quota_topic, batching_enabled=False)
        traffic = PacedProducer(east, topic, tag="t", interval=0.01).start()
        traffic.wait_for(100)
        for broker in west_cluster.brokers:
            broker.kill()
        traffic.wait_for(50)
        first = replication_of(geo, "east", topic, "west")
        assert first["connected"] is False and first["replicationBacklog"] > 0, first
        traffic.wait_for(100)
        second = replication_of(geo, "east", topic, "west")
        assert second["replicationBacklog"] >= first["replicationBacklog"] + 100, (first, second)
        assert second["replicationDelayInSeconds"] > 0, second
        # The replication backlog is the topic's backlog for its quota (no subscription here):
        # over 1000 bytes, producers are turned away (producer_exception).
        for i in range(20):
            quota_producer.send(f"q{i:02}".encode() + b"x" * 100)
        quota = {"limitSize": 1000, "limitTime": -1, "policy": "producer_exception"}
        quota_path = f"/admin/v2/persistent/{NAMESPACE}/quota/backlogQuota"
        geo.clusters["east"].admin_json("POST", quota_path, quota)
        quota_stats = quota_topic.removeprefix("persistent://")
        wait_until(
            lambda: geo.stats("east", quota_stats)["publishers"] == [],
            "the quota topic's producer disconnected",
        )
        assert geo.stats("east", quota_stats)["backlogSize"] > 1000
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            east.create_producer(quota_topic)
        for broker in west_cluster.brokers:
            broker.start()
        west_cluster.wait_for(
            lambda: set(west_cluster.registered()) >= {b.broker_id for b in west_cluster.brokers},
            what="west's brokers registered again",
        )
        traffic.wait_for(100)
        traffic.stop()
        assert traffic.errors == [] and traffic.raised == [], (traffic.errors, traffic.raised)
        wait_until(
            lambda: replication_of(geo, "east", topic, "west")["replicationBacklog"] == 0,
            "the backlog drained after west returned",
            timeout=60,
        )
        wait_until(
            lambda: replication_of(geo, "east", quota_topic, "west")["replicationBacklog"] == 0,
            "the quota topic's backlog drained",
        )
        east.create_producer(quota_topic).close()  # under the quota again: accepted
        # East's broker killed (-9) while its producer keeps sending: its replicator's cursor
        # comes back from where it was last stored, so what was sent after that goes to west
        # again and west's deduplication (by the messages' own producer and sequence id)
        # drops it.
        producer = east.create_producer(topic)
        # One receipt before the kill: a client that has none adopts the broker's last
        # sequence id on reconnecting (-1 if nothing of it was stored) as its next one, so
        # with sends still pending it would number new messages like stored ones and
        # deduplication would drop them (the official client's rule, not the broker's).
        producer.send(b"m-0")
        for i in range(1, 50):
            producer.send_async(f"m-{i}".encode(), None)
        geo.broker("east").kill()
        geo.broker("east").start()
        for i in range(50, 150):
            producer.send(f"m-{i}".encode())
        producer.flush()
    finally:
        if traffic is not None:
            traffic.close()
        east.close()
    expected = sorted(traffic.receipted) + [f"m-{i}" for i in range(150)]
    west = geo.client("west")
    try:
        consumer = west.subscribe(topic, "app")
        got = receive_all(consumer, len(expected), timeout=60)
    finally:
        west.close()
    missing = sorted(set(expected) - set(got))
    assert len(got) == len(expected) and not missing, (
        len(got),
        len(expected),
        missing[:5],
        missing[-5:],
        len(missing),
        replication_of(geo, "east", topic, "west"),
        geo.stats("west", topic.removeprefix("persistent://"))["msgInCounter"],
    )
    for tag in ("t-", "m-"):  # order per producer
        mine = [m for m in got if m.startswith(tag)]
        assert mine == sorted(mine, key=lambda m: int(m[2:])), tag
    for broker in (geo.broker("east"), *west_cluster.brokers):
        assert_no_traceback(broker)


def test_a_cluster_that_adds_the_configuration_store_keeps_its_namespaces(
    geo: Geo, tmp_path: Path
) -> None:
    """An upgrade: a single cluster made its tenant, namespace and partitioned topic in its own
    etcd; restarted with ``configuration_metadata_url``, its broker moves them to the shared
    store (one log line), and the namespace, its policies and its topics are all still there."""
    cluster = MagnetarCluster(
        tmp_path / "south",
        bookies=1,
        brokers=1,
        broker_settings={
            "cluster_name": "south",
            "ensemble_size": 1,
            "write_quorum": 1,
            "ack_quorum": 1,
        },
    ).start()
    try:
        cluster.admin_json("PUT", "/admin/v2/tenants/solo", {"allowedClusters": ["south"]})
        cluster.admin_json("PUT", "/admin/v2/namespaces/solo/ns")
        cluster.admin_json("POST", "/admin/v2/namespaces/solo/ns/messageTTL", 3600)
        cluster.admin_json("PUT", "/admin/v2/persistent/solo/ns/parts/partitions", 2)
        broker = cluster.brokers[0]
        client = pulsar.Client(broker.url, operation_timeout_seconds=30, logger=QUIET)
        try:
            consumer = client.subscribe("persistent://solo/ns/parts", "app")
            producer = client.create_producer("persistent://solo/ns/parts")
            for i in range(10):
                producer.send(f"s-{i}".encode(), partition_key=f"k{i}")
        finally:
            client.close()
        assert set(cluster.scan("/magnetar/admin/namespaces/")) == {
            "/magnetar/admin/namespaces/public/default",
            "/magnetar/admin/namespaces/solo/ns",
        }
        broker.stop()
        broker.settings["configuration_metadata_url"] = geo.config.url
        broker.start()
        [moved] = broker.log_lines("to the configuration store")
        # public and public/default are in the shared store already (the same records).
        assert "moved 1 tenant, 1 namespace and 1 partitioned-topic records" in moved, moved
        assert cluster.scan("/magnetar/admin/") == {}
        assert "/magnetar/admin/namespaces/solo/ns" in geo.config_keys("/magnetar/admin/")
        assert cluster.admin_json("GET", "/admin/v2/namespaces/solo") == ["solo/ns"]
        assert cluster.admin_json("GET", "/admin/v2/namespaces/solo/ns/messageTTL") == 3600
        partitions = "/admin/v2/persistent/solo/ns/parts/partitions"
        assert cluster.admin_json("GET", partitions)["partitions"] == 2
        client = pulsar.Client(broker.url, operation_timeout_seconds=30, logger=QUIET)
        try:
            consumer = client.subscribe("persistent://solo/ns/parts", "app")
            assert sorted(receive_all(consumer, 10)) == sorted(f"s-{i}" for i in range(10))
        finally:
            client.close()
        # The shared store keeps the records for the clusters sharing it: remove this one's.
        cluster.admin_json("DELETE", "/admin/v2/persistent/solo/ns/parts/partitions")
        cluster.admin_json("DELETE", "/admin/v2/namespaces/solo/ns")
        cluster.admin_json("DELETE", "/admin/v2/tenants/solo")
        assert_no_traceback(broker)
    finally:
        cluster.close()
