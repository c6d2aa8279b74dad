"""An entry whose every copy is damaged, seen through the broker (standalone, one bookie).

The consumer gets every message before the damaged entry; delivery then waits at it (Pulsar's
default) while the topic's stats name the entry and /metrics counts it, or, with
``auto_skip_non_recoverable_data``, goes on without it. Nothing else is lost either way.
"""

from __future__ import annotations

import json
import urllib.request
from contextlib import closing
from pathlib import Path

import pulsar

from tests.support.damage import flip_byte_of
from tests.support.raw_client import drain
from tests.support.standalone import StandaloneProcess, client

N = 60
BAD = 30


def entry_log_files(node: StandaloneProcess) -> list[Path]:
    return sorted((node.data_dir / "bookie" / "ledgers" / "current").glob("*.log"))


def payload(i: int) -> bytes:
    return f"unreadable-test-message-{i:04d}-{'x' * 40}".encode()


def produce_and_damage(tmp_path: Path, extra: list[str]) -> StandaloneProcess:
    node = StandaloneProcess(tmp_path / "node", extra).start()
    with closing(client(node)) as c:
        producer = c.create_producer("damaged", batching_enabled=False)
        for i in range(N):
            producer.send(payload(i))
    node.stop()  # the final checkpoint writes every entry into the entry logs
    flip_byte_of(entry_log_files(node), payload(BAD))
    return node.start()


def drain_from_earliest(node: StandaloneProcess) -> list[bytes]:
    c = client(node)
    try:
        consumer = c.subscribe("damaged", "s", initial_position=pulsar.InitialPosition.Earliest)
        return [message.data() for message in drain(consumer, quiet_ms=4000)]
    finally:
        c.close()


def http_get(node: StandaloneProcess, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}{path}", timeout=10) as r:
        return r.read().decode()


def test_delivery_waits_at_an_unreadable_entry_and_says_which(tmp_path: Path) -> None:
    node = produce_and_damage(tmp_path, [])
    try:
        got = drain_from_earliest(node)
        assert got == [payload(i) for i in range(BAD)]
        stats = json.loads(http_get(node, "/admin/v2/persistent/public/default/damaged/stats"))
        unreadable = stats["unreadableEntries"]
        assert len(unreadable) == 1
        ((position, why),) = unreadable.items()
        assert position.endswith(f":{BAD}") and "no intact copy" in why
        metrics = http_get(node, "/metrics")
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith("magnetar_broker_unreadable_entries_total")
        )
        assert float(line.split()[-1]) >= 1
        assert "Traceback" not in node.log_tail(200_000)
    finally:
        node.stop()


def test_auto_skip_goes_on_without_the_unreadable_entry(tmp_path: Path) -> None:
    node = produce_and_damage(tmp_path, ["--auto-skip-non-recoverable-data"])
    try:
        got = drain_from_earliest(node)
        assert got == [payload(i) for i in range(N) if i != BAD]
        metrics = http_get(node, "/metrics")
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith("magnetar_broker_skipped_unreadable_entries_total")
        )
        assert float(line.split()[-1]) == 1
        assert "Traceback" not in node.log_tail(200_000)
    finally:
        node.stop()
