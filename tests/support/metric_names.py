"""The metric names issue 22 asks each service for, with the type and the labels Pulsar and
BookKeeper give them, and one check that a scraped ``/metrics`` has every one of them.

A family is named as prometheus_client's parser names it: a counter without its ``_total``
(Pulsar's ``pulsar_broker_lookup_answers`` is scraped as ``..._answers_total``), BookKeeper's
bare counters as written. Labels are the label names of every sample of the family; summaries
add ``quantile`` to the quantile samples.
"""

from __future__ import annotations

import time
import urllib.request

Families = dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

CLUSTER = frozenset({"cluster"})
NAMESPACE = frozenset({"cluster", "namespace"})
TOPIC = frozenset({"cluster", "namespace", "topic"})
SUBSCRIPTION = frozenset({"cluster", "namespace", "topic", "subscription"})
BROKER_METRIC = frozenset({"cluster", "broker", "metric"})
DIRS = frozenset({"ledgerDir", "indexDir"})
NONE: frozenset[str] = frozenset()
SUCCESS = frozenset({"success"})

#: Every Magnetar service: the process and interpreter collectors.
PROCESS: dict[str, tuple[str, frozenset[str]]] = {
    "process_cpu_seconds": ("counter", NONE),
    "process_resident_memory_bytes": ("gauge", NONE),
    "process_virtual_memory_bytes": ("gauge", NONE),
    "process_open_fds": ("gauge", NONE),
    "process_max_fds": ("gauge", NONE),
    "process_start_time_seconds": ("gauge", NONE),
    "python_info": (
        "gauge",
        frozenset({"implementation", "major", "minor", "patchlevel", "version"}),
    ),
    "python_gc_collections": ("counter", frozenset({"generation"})),
}

_LATENCY = ("0_5", "1", "5", "10", "20", "50", "100", "200", "1000")
_SIZES = ("128", "512", "1_kb", "2_kb", "4_kb", "16_kb", "100_kb", "1_mb", "overflow")

#: The broker families the issue names (with topic-level metrics on, Pulsar's default).
BROKER: dict[str, tuple[str, frozenset[str]]] = {
    "pulsar_storage_backlog_size": ("gauge", TOPIC),
    "pulsar_storage_read_rate": ("gauge", TOPIC),
    "pulsar_average_msg_size": ("gauge", TOPIC),
    **{f"pulsar_storage_write_latency_le_{b}": ("gauge", TOPIC) for b in _LATENCY},
    "pulsar_storage_write_latency_overflow": ("gauge", TOPIC),
    "pulsar_storage_write_latency_count": ("gauge", TOPIC),
    "pulsar_storage_write_latency_sum": ("gauge", TOPIC),
    **{f"pulsar_entry_size_le_{b}": ("gauge", TOPIC) for b in _SIZES},
    "pulsar_entry_size_count": ("gauge", TOPIC),
    "pulsar_entry_size_sum": ("gauge", TOPIC),
    "pulsar_subscription_delayed": ("gauge", SUBSCRIPTION),
    "pulsar_subscription_msg_rate_redeliver": ("gauge", SUBSCRIPTION),
    "pulsar_subscription_msg_ack_rate": ("gauge", SUBSCRIPTION),
    "pulsar_subscription_blocked_on_unacked_messages": ("gauge", SUBSCRIPTION),
    "pulsar_subscription_msg_rate_expired": ("gauge", SUBSCRIPTION),
    "pulsar_subscription_total_msg_expired": ("gauge", SUBSCRIPTION),
    # managed ledgers, per namespace ("tenant/ns/persistent") and the cache per broker
    "pulsar_ml_AddEntryBytesRate": ("gauge", NAMESPACE),
    "pulsar_ml_AddEntryWithReplicasBytesRate": ("gauge", NAMESPACE),
    "pulsar_ml_AddEntryMessagesRate": ("gauge", NAMESPACE),
    "pulsar_ml_AddEntrySucceed": ("gauge", NAMESPACE),
    "pulsar_ml_AddEntryErrors": ("gauge", NAMESPACE),
    "pulsar_ml_ReadEntriesRate": ("gauge", NAMESPACE),
    "pulsar_ml_ReadEntriesBytesRate": ("gauge", NAMESPACE),
    "pulsar_ml_ReadEntriesSucceeded": ("gauge", NAMESPACE),
    "pulsar_ml_ReadEntriesErrors": ("gauge", NAMESPACE),
    "pulsar_ml_MarkDeleteRate": ("gauge", NAMESPACE),
    "pulsar_ml_NumberOfMessagesInBacklog": ("gauge", NAMESPACE),
    "pulsar_ml_StoredMessagesSize": ("gauge", NAMESPACE),
    "pulsar_ml_AddEntryLatencyBuckets": ("gauge", NAMESPACE | {"quantile"}),
    "pulsar_ml_AddEntryLatencyBuckets_OVERFLOW": ("gauge", NAMESPACE),
    "pulsar_ml_LedgerAddEntryLatencyBuckets": ("gauge", NAMESPACE | {"quantile"}),
    "pulsar_ml_LedgerAddEntryLatencyBuckets_OVERFLOW": ("gauge", NAMESPACE),
    "pulsar_ml_LedgerSwitchLatencyBuckets": ("gauge", NAMESPACE | {"quantile"}),
    "pulsar_ml_LedgerSwitchLatencyBuckets_OVERFLOW": ("gauge", NAMESPACE),
    "pulsar_ml_EntrySizeBuckets": ("gauge", NAMESPACE | {"quantile"}),
    "pulsar_ml_EntrySizeBuckets_OVERFLOW": ("gauge", NAMESPACE),
    "pulsar_ml_count": ("gauge", CLUSTER),
    "pulsar_ml_cache_used_size": ("gauge", CLUSTER),
    "pulsar_ml_cache_entries": ("gauge", CLUSTER),
    "pulsar_ml_cache_hits_rate": ("gauge", CLUSTER),
    "pulsar_ml_cache_hits_throughput": ("gauge", CLUSTER),
    "pulsar_ml_cache_misses_rate": ("gauge", CLUSTER),
    "pulsar_ml_cache_misses_throughput": ("gauge", CLUSTER),
    "pulsar_ml_cache_inserted_entries_total": ("gauge", CLUSTER),
    "pulsar_ml_cache_evicted_entries_total": ("gauge", CLUSTER),
    # connections and lookups
    "pulsar_active_connections": ("gauge", BROKER_METRIC),
    "pulsar_connection_created_total_count": ("gauge", BROKER_METRIC),
    "pulsar_connection_create_success_count": ("gauge", BROKER_METRIC),
    "pulsar_connection_create_fail_count": ("gauge", BROKER_METRIC),
    "pulsar_connection_closed_total_count": ("gauge", BROKER_METRIC),
    "pulsar_broker_lookup": ("summary", CLUSTER),
    "pulsar_broker_lookup_answers": ("counter", CLUSTER),
    "pulsar_broker_lookup_redirects": ("counter", CLUSTER),
    "pulsar_broker_lookup_failures": ("counter", CLUSTER),
    "pulsar_broker_lookup_pending_requests": ("gauge", CLUSTER),
    "pulsar_broker_topic_load_pending_requests": ("gauge", CLUSTER),
    # load balancing
    "pulsar_lb_cpu_usage": ("gauge", BROKER_METRIC),
    "pulsar_lb_memory_usage": ("gauge", BROKER_METRIC),
    "pulsar_lb_bandwidth_in_usage": ("gauge", BROKER_METRIC),
    "pulsar_lb_bandwidth_out_usage": ("gauge", BROKER_METRIC),
    "pulsar_lb_unload_bundle": ("counter", BROKER_METRIC - {"broker"}),
    "pulsar_lb_unload_broker": ("counter", BROKER_METRIC - {"broker"}),
    "pulsar_lb_bundles_split": ("counter", BROKER_METRIC - {"broker"}),
}

#: BookKeeper's names on a bookie (the auditor's only where the auditor runs).
BOOKIE: dict[str, tuple[str, frozenset[str]]] = {
    "bookie_SERVER_STATUS": ("gauge", NONE),
    "bookie_WRITE_BYTES": ("counter", NONE),
    "bookie_READ_BYTES": ("counter", NONE),
    "bookie_ledgers_count": ("gauge", DIRS),
    "bookie_entries_count": ("gauge", DIRS),
    "bookie_write_cache_size": ("gauge", DIRS),
    "bookie_read_cache_size": ("gauge", DIRS),
    "bookie_journal_JOURNAL_QUEUE_SIZE": ("gauge", NONE),
    "bookie_journal_JOURNAL_SYNC": ("summary", SUCCESS),
    "bookkeeper_server_ADD_ENTRY": ("summary", SUCCESS),
    "bookkeeper_server_ADD_ENTRY_REQUEST": ("summary", SUCCESS),
    "bookkeeper_server_READ_ENTRY": ("summary", SUCCESS),
    "bookkeeper_server_READ_ENTRY_REQUEST": ("summary", SUCCESS),
    "replication_auditor_NUM_UNDER_REPLICATED_LEDGERS": ("summary", SUCCESS),
    "replication_auditor_NUM_LEDGERS_CHECKED": ("counter", NONE),
    "replication_auditor_CHECK_ALL_LEDGERS_TIME": ("summary", SUCCESS),
    "replication_auditor_URL_PUBLISH_TIME_FOR_LOST_BOOKIE": ("summary", SUCCESS),
    "replication_replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED": ("counter", NONE),
    "replication_replication_worker_NUM_ENTRIES_READ": ("counter", NONE),
    "replication_replication_worker_NUM_BYTES_READ": ("counter", NONE),
    "replication_replication_worker_NUM_ENTRIES_WRITTEN": ("counter", NONE),
    "replication_replication_worker_NUM_BYTES_WRITTEN": ("counter", NONE),
    "replication_replication_worker_rereplicate": ("summary", SUCCESS),
}

#: Pulsar's proxy families.
PROXY: dict[str, tuple[str, frozenset[str]]] = {
    "pulsar_proxy_active_connections": ("gauge", NONE),
    "pulsar_proxy_new_connections": ("counter", NONE),
    "pulsar_proxy_binary_bytes": ("counter", frozenset({"direction"})),
}


def scrape(port: int) -> tuple[str, str, Families]:
    """``(content type, text, families)`` of ``/metrics`` on ``port``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    found = {
        f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }
    return content_type, text, found


def scrape_drained(port: int, topic: str, subscription: str) -> tuple[str, str, Families]:
    """Scrape until the subscription's backlog is 0 and its acknowledgements show in its ack
    rate (the client sends acknowledgements in groups, a little after ``acknowledge``
    returns, and rates are recomputed at most once a second); the last scrape after 10 s
    otherwise."""

    def of_subscription(found: Families, family: str) -> list[float]:
        return [
            v
            for _, labels, v in found.get(family, ("", []))[1]
            if labels.get("topic") == topic and labels.get("subscription") == subscription
        ]

    deadline = time.monotonic() + 10
    while True:
        scraped = scrape(port)
        backlog = of_subscription(scraped[2], "pulsar_subscription_back_log")
        acks = of_subscription(scraped[2], "pulsar_subscription_msg_ack_rate")
        if (backlog == [0.0] and acks and acks[0] > 0) or time.monotonic() > deadline:
            return scraped
        time.sleep(0.2)


def check(
    content_type: str,
    text: str,
    found: Families,
    expected: dict[str, tuple[str, frozenset[str]]],
) -> None:
    """The 0.0.4 content type, no ``_created`` series, and every expected family with its
    type and, on every one of its samples, exactly its labels (``quantile`` allowed on a
    summary's quantile samples and on Pulsar's bucket gauges that declare it)."""
    assert content_type == CONTENT_TYPE, content_type
    series = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    assert not [s for s in series if s.endswith("_created")], "a _created series"
    wanted = {**PROCESS, **expected}
    missing = sorted(set(wanted) - set(found))
    assert not missing, f"families missing: {missing}"
    for name, (kind, labels) in wanted.items():
        found_kind, samples = found[name]
        assert found_kind == kind, (name, found_kind, kind)
        assert samples, f"{name}: no sample"
        for sample_name, sample_labels, _ in samples:
            names = set(sample_labels)
            if kind == "summary" and sample_name == name:
                names.discard("quantile")
            assert names == labels, (name, sample_name, sorted(names), sorted(labels))


def value(found: Families, family: str, sample: str | None = None, **labels: str) -> float:
    """The value of the first sample of ``family`` named ``sample`` (default: the family's
    name) whose labels include ``labels``."""
    for name, sample_labels, v in found[family][1]:
        if name == (sample or family) and all(sample_labels.get(k) == x for k, x in labels.items()):
            return v
    raise AssertionError(f"{sample or family}{labels} not in {found[family][1]}")
