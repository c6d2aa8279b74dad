"""SIGKILL a standalone while it compacts a topic: the previous compacted view stays readable
after the restart, the next run completes, and once the topic is deleted no compacted ledger is
left that nobody refers to."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pulsar

from tests.integration.test_compaction import admin, as_map, compact, read_all
from tests.support.raw_client import assert_log_clean
from tests.support.standalone import StandaloneProcess, client

TOPIC = "crash-compaction"
BASE = f"/persistent/public/default/{TOPIC}"
#: Enough entries that a run lasts long enough to be caught RUNNING.
BACKLOG = 20_000
KEYS = 500


def _bk(node: StandaloneProcess, *args: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [
            sys.executable, "-m", "magnetar.cli", "bk", *args, "--json",
            "--metadata-url", f"local://{node.data_dir / 'meta.db'}",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _publish(node: StandaloneProcess, prefix: str, count: int) -> None:
    c = client(node)
    try:
        producer = c.create_producer(TOPIC, batching_enabled=False, block_if_queue_full=True)
        for i in range(count):
            producer.send_async(f"{prefix}-{i}".encode(), None, partition_key=f"k{i % KEYS}")
        producer.flush()
        producer.close()
    finally:
        c.close()


def _compact_and_kill_at(node: StandaloneProcess, phase: str) -> None:
    """Start a run and SIGKILL the standalone as soon as its log says the run reached
    ``phase`` (the status still RUNNING)."""

    def reached() -> int:
        return node.log_path.read_text(errors="replace").count(f": {phase}")

    before = reached()
    assert admin(node, "PUT", f"{BASE}/compaction")[0] == 204
    assert admin(node, "PUT", f"{BASE}/compaction")[0] == 409  # one run at a time
    deadline = time.monotonic() + 60
    while reached() == before:
        assert time.monotonic() < deadline, f"the run never reached {phase!r}"
        time.sleep(0.01)
    assert admin(node, "GET", f"{BASE}/compaction")[1]["status"] == "RUNNING"
    node.kill()


def _compacted_ledger(node: StandaloneProcess) -> int:
    ledger: int = admin(node, "GET", f"{BASE}/internalStats")[1]["compactedLedger"]["ledgerId"]
    return ledger


def _compacted_view(node: StandaloneProcess) -> list[pulsar.Message]:
    c = client(node)
    try:
        reader = c.create_reader(TOPIC, pulsar.MessageId.earliest, is_read_compacted=True)
        found = read_all(reader)
        reader.close()
        return found
    finally:
        c.close()


def test_sigkill_during_compaction_keeps_the_previous_view_and_the_next_run_completes(
    tmp_path: Path,
) -> None:
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
        c = client(node)
        try:
            producer = c.create_producer(TOPIC, batching_enabled=False, block_if_queue_full=True)
            for i in range(KEYS):
                producer.send_async(f"first-{i}".encode(), None, partition_key=f"k{i}")
            producer.flush()
            assert compact(node, TOPIC)["status"] == "SUCCESS"
            first_ledger = _compacted_ledger(node)
            producer.close()
        finally:
            c.close()
        _publish(node, "second", BACKLOG)
        _compact_and_kill_at(node, "reading the keys")

        node.start()
        assert admin(node, "GET", f"{BASE}/compaction")[1] == {
            "status": "NOT_RUN",
            "lastError": "",
        }
        assert _compacted_ledger(node) == first_ledger
        view = _compacted_view(node)
        # The first run's view (one message per key), then every message after its horizon.
        assert len(view) == KEYS + BACKLOG
        assert [m.data() for m in view[:KEYS]] == [f"first-{i}".encode() for i in range(KEYS)]
        final = {f"k{i}": f"second-{BACKLOG - KEYS + i}".encode() for i in range(KEYS)}
        assert as_map(view) == final

        assert compact(node, TOPIC) == {"status": "SUCCESS", "lastError": ""}
        second_ledger = _compacted_ledger(node)
        assert second_ledger not in (-1, first_ledger)
        view = _compacted_view(node)
        assert len(view) == KEYS
        assert {m.partition_key(): m.data() for m in view} == final

        # Again, killed while the run writes the new ledger.
        _publish(node, "third", BACKLOG)
        _compact_and_kill_at(node, "writing")
        node.start()
        assert _compacted_ledger(node) == second_ledger
        view = _compacted_view(node)
        assert len(view) == KEYS + BACKLOG
        final = {f"k{i}": f"third-{BACKLOG - KEYS + i}".encode() for i in range(KEYS)}
        assert as_map(view) == final
        assert compact(node, TOPIC) == {"status": "SUCCESS", "lastError": ""}
        third_ledger = _compacted_ledger(node)
        assert third_ledger not in (-1, first_ledger, second_ledger)
        assert {m.partition_key(): m.data() for m in _compacted_view(node)} == final

        assert admin(node, "DELETE", f"{BASE}?force=true")[0] == 204
    finally:
        node.stop()
    remaining = {row["ledger_id"] for row in _bk(node, "listledgers")}
    assert not {first_ledger, second_ledger, third_ledger} & remaining
    unreferenced = {row["ledger_id"] for row in _bk(node, "listunreferenced")}
    for ledger_id in remaining:
        metadata = _bk(node, "ledgermetadata", str(ledger_id))[0]
        if "compacted-ledger" in json.dumps(metadata):
            # Created in the instant before the run named it: the GC reports it.
            assert ledger_id in unreferenced, metadata
    assert_log_clean(node)
