"""The storage path against a cluster over TLS (issue 23): an etcd serving TLS only and
requiring client certificates, three bookies serving TLS only and requiring client
certificates, one broker reaching both with its TLS settings; ledgers on two bookies each
(E2 Qw2 Qa2), rolled every 10 entries. The source reaches etcd and the bookies with the
``metadata.tls.*`` and ``bookkeeper.tls.*`` options.

- A bookie of the open ledger's ensemble is killed while the topic is written: the ledger
  changes its ensemble (the third bookie takes the dead one's place). The topic is unloaded
  (every ledger closed). The broker path and the storage path (``metadata.url`` = the etcd
  URL) then return identical rows and message ids, every entry on the dead bookie read from
  its other replica.
- With the dead bookie back, a storage task is read in the test's process, one entry chunk at
  a time; after its first chunk another bookie is killed: the task still returns every row,
  each entry from whichever of its replicas is alive.
- The TLS options are checked when the query is defined (no process needed).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pulsar
import pytest
from pyspark.sql import SparkSession

from magnetar.common.ledger.bookie_client import BookieTls
from magnetar.common.ledger.metadata import LedgerMetadata, ledger_key
from magnetar.common.metadata.etcd import EtcdTls
from magnetar.spark import storage
from magnetar.spark.options import OptionError, SourceOptions
from magnetar.spark.source import UNTYPED, PulsarBatchReader, read_partition
from tests.support.certs import Pki, make_pki
from tests.support.cluster import MagnetarCluster, cluster_fixture
from tests.support.etcd_tls import TlsEtcdServer
from tests.support.standalone import QUIET

NAMESPACE = "spark-storage/c"
TOPIC = f"persistent://{NAMESPACE}/events"
TOPIC_PATH = f"/admin/v2/persistent/{NAMESPACE}/events"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[MagnetarCluster]:
    ca, certificate, key = pki.ca.certificate, pki.client.certificate, pki.client.key
    etcd_tls = {
        "etcd_use_tls": True,
        "etcd_tls_trust_certs_file_path": ca,
        "etcd_tls_certificate_file_path": certificate,
        "etcd_tls_key_file_path": key,
    }
    for cluster in cluster_fixture(
        tmp_path_factory.mktemp("spark-storage-cluster"),
        bookies=3,
        brokers=1,
        etcd=TlsEtcdServer(
            certificate=pki.server.certificate,
            key=pki.server.key,
            ca=ca,
            client_ca=ca,
            health_client=(certificate, key),
        ),
        store_tls=EtcdTls(str(ca), str(certificate), str(key)),
        bookie_settings={
            "tls_certificate_path": pki.server.certificate,
            "tls_key_store": pki.server.key,
            "tls_trust_store": ca,
            "tls_client_authentication": True,
            # Its client would show the server certificate, which is not for client use.
            "auto_recovery_daemon_enabled": False,
            **etcd_tls,
        },
        broker_settings={
            "max_entries_per_ledger": 10,
            "default_retention_time_minutes": -1,
            "default_retention_size_mb": -1,
            "bookkeeper_tls_client_authentication": True,
            "bookkeeper_tls_trust_certs_file_path": ca,
            "bookkeeper_tls_certificate_file_path": certificate,
            "bookkeeper_tls_key_file_path": key,
            **etcd_tls,
        },
    ):
        cluster.create_namespace(*NAMESPACE.split("/"))
        yield cluster


def produce(cluster: MagnetarCluster, first: int, count: int) -> None:
    client = pulsar.Client(cluster.brokers[0].url, logger=QUIET, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(
            TOPIC, batching_enabled=True, batching_max_messages=4, batching_max_publish_delay_ms=5
        )
        for i in range(first, first + count):
            producer.send_async(f"c-{i:05d}".encode(), None, partition_key=f"k{i % 3}")
        producer.flush()
        producer.close()
    finally:
        client.close()


def ledger_metadata(cluster: MagnetarCluster) -> dict[int, LedgerMetadata]:
    stats = cluster.admin_json("GET", f"{TOPIC_PATH}/internalStats")
    found = {}
    for ledger in stats["ledgers"]:
        key = ledger_key(int(ledger["ledgerId"]))
        found[int(ledger["ledgerId"])] = LedgerMetadata.from_bytes(cluster.scan(key)[key])
    return found


def tls_options(tls: EtcdTls) -> dict[str, str]:
    """The source's TLS options: the same CA and client certificate to etcd and to bookies."""
    files = {
        "trustCertsFilePath": tls.trust_certs_file,
        "certificateFilePath": tls.certificate_file,
        "keyFilePath": tls.key_file,
    }
    return {
        f"{peer}.tls.{name}": path
        for peer in ("metadata", "bookkeeper")
        for name, path in files.items()
    }


def options(cluster: MagnetarCluster, **extra: str) -> dict[str, str]:
    broker = cluster.brokers[0]
    assert cluster.store_tls is not None
    return {
        "service.url": broker.url,
        "admin.url": f"http://127.0.0.1:{broker.http_port}",
        "topic": TOPIC,
        "metadata.url": cluster.url,
        **tls_options(cluster.store_tls),
        **extra,
    }


def rows(spark: SparkSession, opts: dict[str, str]) -> list[tuple]:
    frame = spark.read.format("pulsar").options(**opts).load()
    return sorted((tuple(r) for r in frame.collect()), key=lambda r: bytes(r[3]))


def test_an_ensemble_change_and_a_dead_bookie_read_the_same_from_storage(
    spark: SparkSession, cluster: MagnetarCluster
) -> None:
    produce(cluster, 0, 100)
    metadata = ledger_metadata(cluster)
    open_ledger = max(metadata)
    victim = metadata[open_ledger].last_fragment.bookies[0]
    cluster.bookie(victim).kill()
    produce(cluster, 100, 100)
    cluster.admin_json("PUT", f"{TOPIC_PATH}/unload")
    changed = ledger_metadata(cluster)[open_ledger]
    assert len(changed.fragments) > 1, "the open ledger did not change its ensemble"
    through_broker = rows(spark, options(cluster, readFromStorage="never"))
    from_storage = rows(spark, options(cluster, readFromStorage="always"))
    assert len(through_broker) == 200
    assert from_storage == through_broker
    cluster.bookie(victim).start()


def test_a_bookie_killed_during_a_storage_read(
    cluster: MagnetarCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = SourceOptions.parse(options(cluster, readFromStorage="always"), streaming=False)
    tasks = [p for p in PulsarBatchReader(opts).partitions() if p.segments]
    assert tasks
    monkeypatch.setattr(storage, "READ_CHUNK_ENTRIES", 5)
    monkeypatch.setattr(storage, "ARROW_BATCH_ROWS", 1)
    batches = iter(read_partition(tasks[0], UNTYPED))
    values = next(batches).column("value").to_pylist()
    first_ledger = tasks[0].segments[0][0]
    victim = ledger_metadata(cluster)[first_ledger].fragments[0].bookies[1]
    cluster.bookie(victim).kill()
    try:
        for batch in batches:
            values += batch.column("value").to_pylist()
        for task in tasks[1:]:
            for batch in read_partition(task, UNTYPED):
                values += batch.column("value").to_pylist()
    finally:
        cluster.bookie(victim).start()
    planned = sum(last - first + 1 for t in tasks for _, first, last in t.segments)
    assert planned > 0
    assert sorted(values) == [f"c-{i:05d}".encode() for i in range(200)]


def test_tls_options_are_checked_when_the_query_is_defined() -> None:
    base = {
        "service.url": "pulsar://b:6650",
        "admin.url": "http://b:8080",
        "topic": TOPIC,
        "metadata.url": "etcd://etcd:2379",
    }
    parsed = SourceOptions.parse(base, streaming=False)
    assert (parsed.metadata_tls, parsed.bookkeeper_tls) == (None, None)
    parsed = SourceOptions.parse(
        {**base, "metadata.tls.trustCertsFilePath": "/ca.pem", "bookkeeper.tls.enabled": "true"},
        streaming=False,
    )
    assert parsed.metadata_tls == EtcdTls("/ca.pem")
    assert parsed.bookkeeper_tls == BookieTls()  # TLS with gRPC's public roots
    refused = {
        "metadata.tls.*": {**base, "metadata.url": "local:///m.db", "metadata.tls.enabled": "true"},
        "keyFilePath": {**base, "bookkeeper.tls.certificateFilePath": "/c.pem"},
        "enabled is false": {
            **base,
            "bookkeeper.tls.enabled": "false",
            "bookkeeper.tls.trustCertsFilePath": "/ca.pem",
        },
        "true or false": {**base, "metadata.tls.enabled": "yes"},
    }
    for expected, opts in refused.items():
        with pytest.raises(OptionError, match=re.escape(expected)):
            SourceOptions.parse(opts, streaming=False)
