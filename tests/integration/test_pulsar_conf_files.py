"""An operator's Pulsar files start a working cluster: etcd, a bookie started with only
``--config bookkeeper.conf``, a broker with only ``--config broker.conf`` and a proxy with only
``--config proxy.conf`` (Pulsar's key names, units and value forms), then the official client
publishes and consumes through it, and each service's ``/metrics`` has the names of issue 22."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from tests.support.bookie import BookieProcess
from tests.support.cluster import BrokerProcess, assert_no_traceback
from tests.support.etcd import EtcdServer
from tests.support.metric_names import (
    BOOKIE,
    BROKER,
    PROXY,
    check,
    scrape,
    scrape_drained,
    value,
)
from tests.support.proxy import ProxyProcess
from tests.support.standalone import QUIET

# A few of the many keys of Pulsar's files that Magnetar has no use for: warned about, not fatal.
IGNORED_BROKER_KEYS = ["numIOThreads=4", "failureDomainsEnabled=false", "zookeeperServers="]
IGNORED_BOOKIE_KEYS = ["numAddWorkerThreads=1", "minorCompactionThreshold=0.2"]
IGNORED_PROXY_KEYS = ["numIOThreads=2", "zooKeeperSessionTimeoutMillis=30000"]


class ConfBookie(BookieProcess):
    def __init__(self, base_dir: Path, conf: Path) -> None:
        super().__init__(base_dir)
        self.conf = conf

    def command(self) -> list[str]:
        return [sys.executable, "-m", "magnetar.cli", "bookie", "--config", str(self.conf)]


class ConfBroker(BrokerProcess):
    def __init__(self, base_dir: Path, conf: Path) -> None:
        super().__init__(base_dir, "")
        self.conf = conf

    def command(self) -> list[str]:
        return [sys.executable, "-m", "magnetar.cli", "broker", "--config", str(self.conf)]


class ConfProxy(ProxyProcess):
    def __init__(self, base_dir: Path, conf: Path) -> None:
        super().__init__(base_dir, "")
        self.conf = conf

    def command(self) -> list[str]:
        return [sys.executable, "-m", "magnetar.cli", "proxy", "--config", str(self.conf)]


Cluster = tuple[ConfBookie, ConfBroker, ConfProxy]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("pulsar-conf")
    etcd = EtcdServer().start()
    bookie: ConfBookie | None = None
    broker: ConfBroker | None = None
    proxy: ConfProxy | None = None
    try:
        etcd_http = f"http://127.0.0.1:{etcd.client_port}"
        bookie = ConfBookie(base / "bookie", base / "bookkeeper.conf")
        bookie.conf.write_text(
            "\n".join(
                [
                    "# BookKeeper's names",
                    f"bookiePort={bookie.port}",
                    f"httpServerPort={bookie.http_port}",
                    "advertisedAddress=127.0.0.1",
                    "bindAddress=127.0.0.1",
                    f"metadataServiceUri=metadata-store:etcd:{etcd_http}/ledgers",
                    f"journalDirectories={bookie.journal_dir}",
                    f"ledgerDirectories={bookie.ledger_dir}",
                    "journalSyncData=false",
                    "dbStorage_writeCacheMaxSizeMb=16",
                    "gcWaitTime=900000",
                    *IGNORED_BOOKIE_KEYS,
                ]
            )
            + "\n"
        )
        bookie.start()
        broker = ConfBroker(base / "broker", base / "broker.conf")
        broker.conf.write_text(
            "\n".join(
                [
                    f"metadataStoreUrl=etcd:{etcd_http}",
                    f"brokerServicePort={broker.port}",
                    f"webServicePort={broker.http_port}",
                    "bindAddress=127.0.0.1",
                    "advertisedAddress=127.0.0.1",
                    "clusterName=standalone",
                    "managedLedgerDefaultEnsembleSize=1",
                    "managedLedgerDefaultWriteQuorum=1",
                    "managedLedgerDefaultAckQuorum=1",
                    "metadataStoreSessionTimeoutMillis=10000",
                    "maxMessageSize=1048576",
                    "brokerServicePortTls=",
                    "loadBalancerBrokerOverloadedThresholdPercentage=90",
                    "loadBalancerBrokerThresholdShedderPercentage=25",
                    "exposeTopicLevelMetricsInPrometheus=true",
                    *IGNORED_BROKER_KEYS,
                ]
            )
            + "\n"
        )
        broker.start()
        proxy = ConfProxy(base / "proxy", base / "proxy.conf")
        proxy.conf.write_text(
            "\n".join(
                [
                    f"metadataStoreUrl=etcd:{etcd_http}",
                    f"servicePort={proxy.port}",
                    f"webServicePort={proxy.http_port}",
                    "bindAddress=127.0.0.1",
                    "advertisedAddress=127.0.0.1",
                    f"brokerProxyAllowedTargetPorts={broker.port}",
                    *IGNORED_PROXY_KEYS,
                ]
            )
            + "\n"
        )
        proxy.start()
        yield bookie, broker, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        if broker is not None:
            broker.stop()
        if bookie is not None:
            bookie.stop()
        etcd.close()


def test_cluster_from_pulsar_files_serves_the_official_client(cluster: Cluster) -> None:
    bookie, broker, _ = cluster
    client = pulsar.Client(broker.url, operation_timeout_seconds=10, logger=QUIET)
    try:
        topic = "persistent://public/default/from-pulsar-conf"
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        for i in range(10):
            producer.send(b"m%d" % i)
        got = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
        assert [m.data() for m in got] == [b"m%d" % i for i in range(10)]
        for m in got:
            consumer.acknowledge(m)
        # maxMessageSize=1048576 reached the broker: a larger message is refused.
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"x" * (1048576 + 1))
    finally:
        client.close()

    # Each service named the keys it ignored, once, in one warning; nothing worse was logged.
    broker_log = broker.log_text()
    warned = [line for line in broker_log.splitlines() if "were ignored" in line]
    assert len(warned) == 1, broker_log[-3000:]
    assert all(key.split("=")[0] in warned[0] for key in IGNORED_BROKER_KEYS[:2])
    bookie_log = bookie.log_text()
    warned = [line for line in bookie_log.splitlines() if "were ignored" in line]
    assert len(warned) == 1, bookie_log[-3000:]
    assert all(key.split("=")[0] in warned[0] for key in IGNORED_BOOKIE_KEYS)
    for text in (broker_log, bookie_log):
        assert " ERROR " not in text and "CRITICAL" not in text, text[-3000:]
    assert_no_traceback(broker)

    # Pulsar's two load-balancer thresholds landed on the settings of their meaning.
    url = f"http://127.0.0.1:{broker.http_port}/admin/v2/brokers/configuration/runtime"
    with urllib.request.urlopen(url, timeout=10) as response:
        runtime = json.load(response)
    assert runtime["load_balancer_broker_overloaded_threshold_percentage"] == "90.0"
    assert runtime["load_balancer_broker_threshold_shedder_percentage"] == "25.0"


def test_every_service_has_the_metric_names_operators_read(cluster: Cluster) -> None:
    """After traffic through the proxy: every name of issue 22 with its type and labels on
    the broker, the bookie and the proxy (process_* and python_* on each, the 0.0.4 content
    type, no _created series)."""
    bookie, broker, proxy = cluster
    n = 12
    topic = "persistent://public/default/metrics-through-proxy"
    client = pulsar.Client(proxy.url, operation_timeout_seconds=10, logger=QUIET)
    try:
        consumer = client.subscribe(topic, "dash", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer.send(b"p%d" % i)
        for _ in range(n):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        _, _, first = scrape(broker.http_port)  # since the topic loaded: exact bucket counts
        content_type, text, found = scrape_drained(broker.http_port, topic, "dash")
    finally:
        client.close()
    check(content_type, text, found, BROKER)
    assert value(first, "pulsar_entry_size_le_128", topic=topic) == n
    assert value(first, "pulsar_storage_write_latency_count", topic=topic) == n
    assert value(found, "pulsar_subscription_msg_ack_rate", topic=topic) > 0
    # The proxy looked the topic up here and relays the client's connection to this broker.
    assert value(found, "pulsar_broker_lookup_answers", "pulsar_broker_lookup_answers_total") >= 1
    assert value(found, "pulsar_connection_create_success_count") >= 1
    check(*scrape(bookie.http_port), BOOKIE)
    content_type, text, found = scrape(proxy.http_port)
    check(content_type, text, found, PROXY)
    assert value(found, "pulsar_proxy_new_connections", "pulsar_proxy_new_connections_total") >= 1
    assert value(
        found, "pulsar_proxy_binary_bytes", "pulsar_proxy_binary_bytes_total", direction="to_broker"
    ) > 0  # fmt: skip
    proxy_log = proxy.log_text()
    warned = [line for line in proxy_log.splitlines() if "were ignored" in line]
    assert len(warned) == 1 and all(k.split("=")[0] in warned[0] for k in IGNORED_PROXY_KEYS)
    assert " ERROR " not in proxy_log and "Traceback" not in proxy_log, proxy_log[-3000:]
