"""Each service's /metrics as an operator's stock dashboards read it, scraped from a real
standalone (its broker's port and its bookie's): Prometheus text 0.0.4 with its content type,
``process_*`` and ``python_*``, no ``_created`` series, and on the bookie BookKeeper's own
names with BookKeeper's types, labels and units, counting what the official client sent."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.raw_client import assert_log_clean, module_standalone
from tests.support.standalone import StandaloneProcess, client

N = 20
PAYLOAD = 300

Families = dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("service-metrics") / "standalone")


def scrape(port: int) -> tuple[str, str, Families]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    found = {
        f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }
    return content_type, text, found


def sample(found: Families, family: str, name: str, **labels: str) -> float:
    for sname, slabels, value in found[family][1]:
        if sname == name and all(slabels.get(k) == v for k, v in labels.items()):
            return value
    raise AssertionError(f"{name}{labels} not in {found[family][1]}")


def check_common(content_type: str, text: str, found: Families) -> None:
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    for name in (
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ):
        assert name in found, name
    assert found["process_open_fds"][1][0][2] > 0
    assert "python_info" in found and "python_gc_collections" in found
    assert "_created" not in text


def test_broker_and_bookie_metrics(node: StandaloneProcess) -> None:
    _, _, before = scrape(node.bookie_http_port)
    adds_before = sample(
        before, "bookkeeper_server_ADD_ENTRY", "bookkeeper_server_ADD_ENTRY_count", success="true"
    )
    written_before = sample(before, "bookie_WRITE_BYTES", "bookie_WRITE_BYTES_total")

    topic = f"persistent://public/default/service-metrics-{time.time_ns()}"
    c = client(node)
    try:
        consumer = c.subscribe(topic, "s")
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(N):
            producer.send(bytes([i]) * PAYLOAD)
        for _ in range(N):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    finally:
        c.close()

    content_type, text, broker = scrape(node.http_port)
    check_common(content_type, text, broker)

    content_type, text, bookie = scrape(node.bookie_http_port)
    check_common(content_type, text, bookie)
    kinds = {
        "bookie_SERVER_STATUS": "gauge",
        "bookie_WRITE_BYTES": "counter",
        "bookie_READ_BYTES": "counter",
        "bookie_ledgers_count": "gauge",
        "bookie_entries_count": "gauge",
        "bookie_write_cache_size": "gauge",
        "bookie_read_cache_size": "gauge",
        "bookie_journal_JOURNAL_QUEUE_SIZE": "gauge",
        "bookie_journal_JOURNAL_SYNC": "summary",
        "bookkeeper_server_ADD_ENTRY": "summary",
        "bookkeeper_server_ADD_ENTRY_REQUEST": "summary",
        "bookkeeper_server_READ_ENTRY": "summary",
        "bookkeeper_server_READ_ENTRY_REQUEST": "summary",
        "replication_auditor_NUM_UNDER_REPLICATED_LEDGERS": "summary",
        "replication_replication_worker_NUM_BYTES_WRITTEN": "counter",
        "replication_replication_worker_NUM_ENTRIES_WRITTEN": "counter",
    }
    for name, kind in kinds.items():
        assert name in bookie, name
        assert bookie[name][0] == kind, (name, bookie[name][0])
    # BookKeeper's counters are written under their bare names (no _total), as BookKeeper does
    # (prometheus_client's parser adds the _total to the sample it gives back).
    assert "\nbookie_WRITE_BYTES " in text and "bookie_WRITE_BYTES_total" not in text
    assert sample(bookie, "bookie_SERVER_STATUS", "bookie_SERVER_STATUS") == 1
    ledgers = bookie["bookie_ledgers_count"][1][0]
    assert ledgers[2] >= 1 and set(ledgers[1]) == {"ledgerDir", "indexDir"}, ledgers
    # Every message is one entry of the topic's ledger (ensemble of the one bookie); the
    # cursor's own ledger may add a few more.
    adds = sample(
        bookie, "bookkeeper_server_ADD_ENTRY", "bookkeeper_server_ADD_ENTRY_count", success="true"
    )
    assert adds - adds_before >= N
    written = sample(bookie, "bookie_WRITE_BYTES", "bookie_WRITE_BYTES_total")
    assert written - written_before >= N * PAYLOAD
    assert sample(
        bookie, "bookkeeper_server_ADD_ENTRY", "bookkeeper_server_ADD_ENTRY", success="true",
        quantile="0.99",
    ) > 0  # fmt: skip
    assert (
        sample(
            bookie,
            "bookie_journal_JOURNAL_SYNC",
            "bookie_journal_JOURNAL_SYNC_count",
            success="true",
        )
        >= 1
    )


def test_topic_level_metrics_off_sums_per_namespace(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Pulsar's exposeTopicLevelMetricsInPrometheus=false, given as its own name in a
    standalone.conf: topic families per namespace, no subscription families."""
    base = tmp_path_factory.mktemp("namespace-metrics")
    conf = base / "standalone.conf"
    conf.write_text("exposeTopicLevelMetricsInPrometheus=false\n")
    node = StandaloneProcess(base / "standalone", extra=["--config", str(conf)]).start()
    try:
        topic = f"persistent://public/default/namespace-metrics-{time.time_ns()}"
        c = client(node)
        try:
            consumer = c.subscribe(topic, "s")
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(N):
                producer.send(b"%d" % i)
            for _ in range(N):
                consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        finally:
            c.close()
        _, _, broker = scrape(node.http_port)
        samples = broker["pulsar_in_messages"][1]
        assert samples and all("topic" not in labels for _, labels, _ in samples), samples
        assert (
            sample(
                broker, "pulsar_in_messages", "pulsar_in_messages_total", namespace="public/default"
            )
            == N
        )
        assert "pulsar_subscription_back_log" not in broker
    finally:
        node.stop()
    assert_log_clean(node)
