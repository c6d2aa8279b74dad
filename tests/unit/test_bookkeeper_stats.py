"""BookKeeper's metric names as its Prometheus provider writes them (services/bookie/bookkeeper_stats.py),
and what every service's /metrics shares (common/metrics.py)."""

from __future__ import annotations

import math

from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

from magnetar.bookie.bookkeeper_stats import QUANTILES, BookKeeperStats, OpStats, StorageGauges
from magnetar.bookie.metrics import BookieMetrics
from magnetar.broker.metrics import BrokerMetrics
from magnetar.common.metrics import CONTENT_TYPE, render, service_registry
from magnetar.proxy.metrics import ProxyMetrics

GAUGES = StorageGauges(
    writable=True,
    journal_queue_size=3,
    ledgers=2,
    entries=40,
    write_cache_bytes=1000,
    read_cache_bytes=500,
    ledger_dir="/data/ledgers/current",
    index_dir="/data/ledgers/current",
)


def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    return {
        f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def test_op_stats_counts_sums_and_quantiles_in_milliseconds() -> None:
    stats = OpStats()
    assert math.isnan(stats.quantile(0.5))
    for ms in range(1, 101):
        stats.record_latency(ms / 1000.0)
    stats.record_latency(0.5, success=False, events=3)
    assert stats.count() == 100 and stats.count(success=False) == 3
    assert stats.quantile(0.5) == 50.0 and stats.quantile(0.99) == 99.0
    assert stats.quantile(1.0) == 100.0
    lines = stats.lines("bookkeeper_server_ADD_ENTRY")
    assert lines[0] == "# TYPE bookkeeper_server_ADD_ENTRY summary"
    assert 'bookkeeper_server_ADD_ENTRY_count{success="true"} 100.0' in lines
    assert 'bookkeeper_server_ADD_ENTRY_sum{success="true"} 5050.0' in lines
    assert 'bookkeeper_server_ADD_ENTRY_count{success="false"} 3.0' in lines
    assert 'bookkeeper_server_ADD_ENTRY_sum{success="false"} 1500.0' in lines


def test_render_has_bookkeepers_names_types_and_labels() -> None:
    bk = BookKeeperStats()
    bk.added(0.002, entries=5, size=500)
    bk.added(0.001, entries=1, size=0, success=False)
    bk.read(0.001, size=100)
    bk.journal_sync.record_latency(0.004)
    bk.auditor_under_replicated.record(2)
    text = bk.render(GAUGES)
    # Counters keep their bare names (no _total), as BookKeeper writes them.
    assert "# TYPE bookie_WRITE_BYTES counter\nbookie_WRITE_BYTES 500\n" in text
    assert "# TYPE bookie_READ_BYTES counter\nbookie_READ_BYTES 100\n" in text
    assert "# TYPE bookie_SERVER_STATUS gauge\nbookie_SERVER_STATUS 1\n" in text
    dirs = '{ledgerDir="/data/ledgers/current",indexDir="/data/ledgers/current"}'
    assert f"bookie_ledgers_count{dirs} 2\n" in text
    assert f"bookie_entries_count{dirs} 40\n" in text
    assert f"bookie_write_cache_size{dirs} 1000\n" in text
    assert f"bookie_read_cache_size{dirs} 500\n" in text
    assert "bookie_journal_JOURNAL_QUEUE_SIZE 3\n" in text
    found = families(text)
    for name in (
        "bookkeeper_server_ADD_ENTRY",
        "bookkeeper_server_ADD_ENTRY_REQUEST",
        "bookkeeper_server_READ_ENTRY",
        "bookkeeper_server_READ_ENTRY_REQUEST",
        "bookie_journal_JOURNAL_SYNC",
        "replication_auditor_NUM_UNDER_REPLICATED_LEDGERS",
        "replication_auditor_CHECK_ALL_LEDGERS_TIME",
        "replication_auditor_URL_PUBLISH_TIME_FOR_LOST_BOOKIE",
        "replication_replication_worker_rereplicate",
    ):
        kind, samples = found[name]
        assert kind == "summary", name
        quantiles = {s[1]["quantile"] for s in samples if "quantile" in s[1]}
        assert quantiles == {str(q) for q in QUANTILES}, name
        assert {s[1]["success"] for s in samples} == {"true", "false"}, name
    counts = {(s[0], s[1]["success"]): s[2] for s in found["bookkeeper_server_ADD_ENTRY"][1]}
    assert counts[("bookkeeper_server_ADD_ENTRY_count", "true")] == 5
    assert counts[("bookkeeper_server_ADD_ENTRY_count", "false")] == 1
    assert counts[("bookkeeper_server_ADD_ENTRY_sum", "true")] == 10.0  # 5 x 2 ms
    read = {(s[0], s[1]["success"]): s[2] for s in found["bookkeeper_server_READ_ENTRY"][1]}
    assert read[("bookkeeper_server_READ_ENTRY_count", "true")] == 1
    for name in (
        "NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
        "NUM_ENTRIES_READ",
        "NUM_BYTES_READ",
        "NUM_ENTRIES_WRITTEN",
        "NUM_BYTES_WRITTEN",
    ):
        assert f"# TYPE replication_replication_worker_{name} counter\n" in text
    assert "# TYPE replication_auditor_NUM_LEDGERS_CHECKED counter\n" in text
    read_only = BookKeeperStats().render(
        StorageGauges(False, 0, 0, 0, 0, 0, "/l/current", "/l/current")
    )
    assert "bookie_SERVER_STATUS 0\n" in read_only


def test_every_service_registry_has_process_and_python_and_no_created() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    for registry in (
        service_registry(),
        BookieMetrics().registry,
        BrokerMetrics().registry,
        ProxyMetrics().registry,
    ):
        Counter("magnetar_test_events", "test", registry=registry).inc()
        text = render(registry).decode()
        names = families(text)
        for name in (
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
            "python_info",
            "python_gc_collections",
        ):
            assert name in names, (name, sorted(names))
        series = {line.split("{")[0].split(" ")[0] for line in text.splitlines()}
        assert not [n for n in series if n.endswith("_created")], series
