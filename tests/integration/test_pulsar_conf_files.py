"""An operator's Pulsar files start a working cluster: etcd, a bookie started with only
``--config bookkeeper.conf`` and a broker with only ``--config broker.conf`` (Pulsar's key
names, units and value forms), then the official client publishes and consumes through it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from tests.support.bookie import BookieProcess
from tests.support.cluster import BrokerProcess, assert_no_traceback
from tests.support.etcd import EtcdServer
from tests.support.standalone import QUIET

# A few of the many keys of Pulsar's files that Magnetar has no use for: warned about, not fatal.
IGNORED_BROKER_KEYS = ["numIOThreads=4", "failureDomainsEnabled=false", "zookeeperServers="]
IGNORED_BOOKIE_KEYS = ["numAddWorkerThreads=1", "minorCompactionThreshold=0.2"]


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConfBookie, ConfBroker]]:
    base = tmp_path_factory.mktemp("pulsar-conf")
    etcd = EtcdServer().start()
    bookie: ConfBookie | None = None
    broker: ConfBroker | None = None
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
                    *IGNORED_BROKER_KEYS,
                ]
            )
            + "\n"
        )
        broker.start()
        yield bookie, broker
    finally:
        if broker is not None:
            broker.stop()
        if bookie is not None:
            bookie.stop()
        etcd.close()


def test_cluster_from_pulsar_files_serves_the_official_client(
    cluster: tuple[ConfBookie, ConfBroker],
) -> None:
    bookie, broker = cluster
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
