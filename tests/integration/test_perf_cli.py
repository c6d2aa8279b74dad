"""`magnetar perf produce|consume` against a real standalone, as separate processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.raw_client import module_standalone
from tests.support.standalone import StandaloneProcess

LATENCY = re.compile(
    r"Latency: mean: +[\d.]+ ms - med: +[\d.]+ - 95pct: +[\d.]+ - 99pct: +[\d.]+"
    r" - 99\.9pct: +[\d.]+ - 99\.99pct: +[\d.]+( - 99\.999pct: +[\d.]+)? - Max: +[\d.]+"
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("perf") / "standalone")


def perf(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "magnetar.cli", "perf", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[list[str], dict]:
    """The output lines and the JSON summary (the last line)."""
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    lines = out.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_perf_produce_and_consume_report_what_went_through(node: StandaloneProcess) -> None:
    """magnetar's own long flag names (kept as aliases of pulsar-perf's)."""
    common = ["--service-url", node.url, "--interval", "1", "--json"]
    consumer = perf(
        "consume",
        "perf-topic",
        "--messages",
        "3000",
        "--initial-position",
        "earliest",
        "--duration",
        "90",
        *common,
    )
    # No warm-up: with the default second of it, 3000 messages at 3000/s may all be answered
    # inside it, and no latency would be recorded.
    producer = perf(
        "produce",
        "perf-topic",
        "--messages",
        "3000",
        "--size",
        "100",
        "--rate",
        "3000",
        "--warmup-time",
        "0",
        *common,
    )
    _, produced = finish(producer)
    _, consumed = finish(consumer)
    assert produced["messages"] == 3000 and produced["failed"] == 0
    assert produced["latency_samples"] == 3000
    assert produced["mb_per_s"] > 0 and produced["latency_ms"]["p50"] > 0
    assert produced["latency_ms"]["p50"] <= produced["latency_ms"]["p99"]
    assert consumed["messages"] == 3000


def test_pulsar_perf_flags_run_and_print_the_latency_figures(
    node: StandaloneProcess, tmp_path: Path
) -> None:
    """pulsar-perf's flags: a partitioned topic made by -np, two Key_Shared consumers, -m counts."""
    topic = "persistent://public/default/perf-flags"
    hlog = tmp_path / "produce.hlog"
    producer = perf(
        "produce",
        "-u",
        node.url,
        "-au",
        node.admin_url.removesuffix("/admin/v2"),
        "-np",
        "2",
        "-n",
        "2",
        "-r",
        "2000",
        "-s",
        "64",
        "-m",
        "2000",
        "-b",
        "2",
        "-mk",
        "autoIncrement",
        "--warmup-time",
        "0",
        "--interval",
        "0.5",
        "--histogram-file",
        str(hlog),
        "--json",
        topic,
    )
    produce_lines, produced = finish(producer)
    # After the producer, so that -np made the topic partitioned before anything used it.
    consumer = perf(
        "consume",
        "-u",
        node.url,
        "-st",
        "Key_Shared",
        "-n",
        "2",
        "-ss",
        "perf-sub",
        "-sp",
        "Earliest",
        "-m",
        "2000",
        "-time",
        "90",
        "--interval",
        "0.5",
        "--json",
        topic,
    )
    consume_lines, consumed = finish(consumer)

    assert (produced["messages"], produced["failed"], produced["latency_samples"]) == (
        2000,
        0,
        2000,
    )
    assert (consumed["messages"], consumed["failed"], consumed["latency_samples"]) == (
        2000,
        0,
        2000,
    )
    for figures in (produced["latency_ms"], consumed["latency_ms"]):
        assert set(figures) == {"mean", "p50", "p95", "p99", "p999", "p9999", "p99999", "max"}
        assert all(isinstance(value, float) for value in figures.values())
        assert figures["p50"] <= figures["p99"] <= figures["p9999"] <= figures["max"]
    assert produced["latency_ms"]["max"] > 0

    # pulsar-perf's lines: periodic ones during the run, then the aggregated two.
    periodic = [line for line in produce_lines if line.startswith("Throughput produced:")]
    assert periodic and all(LATENCY.search(line) for line in periodic)
    assert "Aggregated throughput stats --- 2000 records sent ---" in "\n".join(produce_lines)
    assert "Aggregated throughput stats --- 2000 records received ---" in "\n".join(consume_lines)
    for lines in (produce_lines, consume_lines):
        final = [line for line in lines if line.startswith("Aggregated latency stats")]
        assert len(final) == 1 and "99.999pct:" in final[0] and LATENCY.search(final[0])

    # -np made the topic partitioned with 2 partitions; -n 2 producers, -n 2 consumers on it.
    import urllib.request

    url = f"{node.admin_url}/persistent/public/default/perf-flags/partitions"
    with urllib.request.urlopen(url) as answer:
        assert json.loads(answer.read())["partitions"] == 2
    # The HdrHistogram log has the interval histograms, as pulsar-perf's --histogram-file.
    text = hlog.read_text()
    assert text.startswith("#[Histogram log format version 1.2]")
    assert (
        '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"' in text
    )
    assert len([line for line in text.splitlines() if line[:1].isdigit()]) == len(periodic)


def test_perf_refuses_a_bad_combination_with_the_reason(node: StandaloneProcess) -> None:
    process = perf("consume", "-u", node.url, "-st", "Exclusive", "-n", "2", "t")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "only one consumer is allowed when the subscription type is Exclusive" in err


def test_perf_says_why_the_broker_refused_its_producer_or_consumer(
    node: StandaloneProcess,
) -> None:
    topic = "persistent://public/default/perf-terminated"
    request = urllib.request.Request(
        f"{node.admin_url}/persistent/public/default/perf-terminated", method="PUT"
    )
    urllib.request.urlopen(request, timeout=10).close()
    request = urllib.request.Request(
        f"{node.admin_url}/persistent/public/default/perf-terminated/terminate",
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()
    process = perf("produce", "-u", node.url, "-m", "10", "--warmup-time", "0", topic)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert f"magnetar perf: cannot create a producer on {topic}: TopicTerminated" in err
    assert "Traceback" not in err
    process = perf("consume", "-u", node.url, "-m", "10", "persistent://no-tenant/ns/t")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "magnetar perf: cannot subscribe to persistent://no-tenant/ns/t" in err
    assert "Traceback" not in err
