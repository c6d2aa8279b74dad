"""Each service's /metrics as an operator's stock dashboards read it, scraped from a real
standalone (its broker's port and its bookie's): Prometheus text 0.0.4 with its content type,
``process_*`` and ``python_*``, no ``_created`` series, and on the bookie BookKeeper's own
names with BookKeeper's types, labels and units, counting what the official client sent."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from tests.support.metric_names import (
    BOOKIE,
    BROKER,
    check,
    scrape,
    scrape_drained,
    value,
)
from tests.support.raw_client import assert_log_clean, module_standalone
from tests.support.standalone import StandaloneProcess, client

N = 20
PAYLOAD = 300


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("service-metrics") / "standalone")


def test_broker_and_bookie_metrics(node: StandaloneProcess) -> None:
    """Every name of issue 22 on the standalone's broker and bookie, with its type and
    labels, counting what the official client did: N messages of PAYLOAD bytes produced
    one per entry, one negatively acknowledged and received again, all acknowledged."""
    _, _, before = scrape(node.bookie_http_port)
    adds_before = value(
        before, "bookkeeper_server_ADD_ENTRY", "bookkeeper_server_ADD_ENTRY_count", success="true"
    )
    written_before = value(before, "bookie_WRITE_BYTES", "bookie_WRITE_BYTES_total")

    topic = f"persistent://public/default/service-metrics-{time.time_ns()}"
    c = client(node)
    try:
        consumer = c.subscribe(
            topic,
            "s",
            consumer_type=pulsar.ConsumerType.Shared,
            negative_ack_redelivery_delay_ms=100,
        )
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(N):
            producer.send(bytes([i]) * PAYLOAD)
        first = consumer.receive(timeout_millis=10_000)
        consumer.negative_acknowledge(first)
        received = 1
        while received < N + 1:
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
            received += 1
        # The first scrape of a topic covers the time since it was loaded: the per-window
        # figures (buckets, adds) count everything above exactly.
        _, _, first = scrape(node.http_port)
        content_type, text, broker = scrape_drained(node.http_port, topic, "s")
    finally:
        c.close()

    check(content_type, text, broker, BROKER)
    of_topic = {"topic": topic}
    of_sub = {"topic": topic, "subscription": "s"}
    # One entry per message, each PAYLOAD bytes plus its metadata: all in the (128, 512] bucket.
    assert value(first, "pulsar_entry_size_le_512", **of_topic) == N
    assert value(first, "pulsar_entry_size_count", **of_topic) == N
    assert value(first, "pulsar_entry_size_le_128", **of_topic) == 0
    assert value(first, "pulsar_storage_write_latency_count", **of_topic) == N
    latency_buckets = sum(
        value(first, name, **of_topic)
        for name in BROKER
        if name.startswith("pulsar_storage_write_latency_")
        and not name.endswith(("_count", "_sum"))
    )
    assert latency_buckets == N
    assert value(first, "pulsar_entry_size_sum", **of_topic) > N * PAYLOAD
    assert PAYLOAD < value(first, "pulsar_average_msg_size", **of_topic) < 512
    assert value(first, "pulsar_storage_read_rate", **of_topic) > 0
    assert value(first, "pulsar_subscription_msg_rate_redeliver", **of_sub) > 0
    assert value(broker, "pulsar_storage_backlog_size", **of_topic) == 0  # all acknowledged
    assert value(broker, "pulsar_subscription_msg_ack_rate", **of_sub) > 0
    assert value(broker, "pulsar_subscription_total_msg_expired", **of_sub) == 0
    assert value(broker, "pulsar_subscription_msg_rate_expired", **of_sub) == 0
    assert value(broker, "pulsar_subscription_blocked_on_unacked_messages", **of_sub) == 0
    assert value(broker, "pulsar_subscription_delayed", **of_sub) == 0
    ns = {"namespace": "public/default/persistent"}
    assert value(first, "pulsar_ml_AddEntrySucceed", **ns) >= N
    assert value(first, "pulsar_ml_AddEntryErrors", **ns) == 0
    assert value(first, "pulsar_ml_EntrySizeBuckets", quantile="128.0_512.0", **ns) >= N
    assert value(broker, "pulsar_ml_count") >= 1
    assert value(broker, "pulsar_ml_cache_inserted_entries_total") >= N
    created = value(broker, "pulsar_connection_created_total_count")
    assert created >= value(broker, "pulsar_connection_create_success_count") >= 1
    assert value(broker, "pulsar_connection_create_fail_count") == 0
    assert value(broker, "pulsar_broker_lookup_answers", "pulsar_broker_lookup_answers_total") >= 1
    assert value(broker, "pulsar_broker_lookup", "pulsar_broker_lookup_count") >= 1
    assert value(broker, "pulsar_broker_lookup_pending_requests") == 0
    assert value(broker, "pulsar_broker_topic_load_pending_requests") == 0
    # An HTTP lookup counts as a lookup answered here, as in Pulsar.
    answers = value(broker, "pulsar_broker_lookup_answers", "pulsar_broker_lookup_answers_total")
    path = topic.replace("persistent://", "persistent/")
    with urllib.request.urlopen(
        f"http://127.0.0.1:{node.http_port}/lookup/v2/topic/{path}", timeout=10
    ) as r:
        assert json.load(r)["brokerUrl"].endswith(f":{node.port}")
    _, _, after = scrape(node.http_port)
    assert (
        value(after, "pulsar_broker_lookup_answers", "pulsar_broker_lookup_answers_total")
        == answers + 1
    )
    assert 0 < value(broker, "pulsar_lb_memory_usage") <= 100

    content_type, text, bookie = scrape(node.bookie_http_port)
    check(content_type, text, bookie, BOOKIE)
    # BookKeeper's counters are written under their bare names (no _total), as BookKeeper does
    # (prometheus_client's parser adds the _total to the sample it gives back).
    assert "\nbookie_WRITE_BYTES " in text and "bookie_WRITE_BYTES_total" not in text
    assert value(bookie, "bookie_SERVER_STATUS", "bookie_SERVER_STATUS") == 1
    ledgers = bookie["bookie_ledgers_count"][1][0]
    assert ledgers[2] >= 1, ledgers
    # Every message is one entry of the topic's ledger (ensemble of the one bookie); the
    # cursor's own ledger may add a few more.
    adds = value(
        bookie, "bookkeeper_server_ADD_ENTRY", "bookkeeper_server_ADD_ENTRY_count", success="true"
    )
    assert adds - adds_before >= N
    written = value(bookie, "bookie_WRITE_BYTES", "bookie_WRITE_BYTES_total")
    assert written - written_before >= N * PAYLOAD
    assert value(
        bookie, "bookkeeper_server_ADD_ENTRY", "bookkeeper_server_ADD_ENTRY", success="true",
        quantile="0.99",
    ) > 0  # fmt: skip
    assert (
        value(
            bookie,
            "bookie_journal_JOURNAL_SYNC",
            "bookie_journal_JOURNAL_SYNC_count",
            success="true",
        )
        >= 1
    )
    assert_log_clean(node)


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
            value(
                broker, "pulsar_in_messages", "pulsar_in_messages_total", namespace="public/default"
            )
            == N
        )
        assert "pulsar_subscription_back_log" not in broker
        assert "pulsar_subscription_msg_ack_rate" not in broker
        assert "pulsar_average_msg_size" not in broker  # meaningless summed, as in Pulsar
        # The buckets are summed per namespace too.
        of_namespace = {"cluster": "standalone", "namespace": "public/default"}
        for family in ("pulsar_entry_size_count", "pulsar_storage_write_latency_count"):
            ((_, labels, count),) = broker[family][1]
            assert labels == of_namespace and count >= N, (family, broker[family][1])
        assert value(broker, "pulsar_entry_size_le_128", "pulsar_entry_size_le_128") >= N
    finally:
        node.stop()
    assert_log_clean(node)
