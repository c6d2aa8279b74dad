"""`magnetar perf produce|consume` against a real standalone, as separate processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.standalone import StandaloneProcess


def perf(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "magnetar.cli", "perf", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def summary(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_perf_produce_and_consume_report_what_went_through(tmp_path: Path) -> None:
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
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
        producer = perf(
            "produce",
            "perf-topic",
            "--messages",
            "3000",
            "--size",
            "100",
            "--rate",
            "3000",
            *common,
        )
        produced = summary(producer)
        consumed = summary(consumer)
    finally:
        node.stop()
    assert produced["messages"] == 3000 and produced["failed"] == 0
    assert produced["mb_per_s"] > 0 and produced["latency_ms"]["p50"] > 0
    assert produced["latency_ms"]["p50"] <= produced["latency_ms"]["p99"]
    assert consumed["messages"] == 3000
