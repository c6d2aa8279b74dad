"""How long topic compaction takes, and how fast a compacted reader reads the result.

Against one ``magnetar standalone``: writes ``--messages`` keyed messages over ``--keys`` keys
(unbatched, then batched), compacts the topic through the admin API, and prints the run's
duration (the broker's ``lastCompactionDurationTimeInMills``), entries per second, the compacted
ledger's entries, and the time a ``read_compacted`` reader takes to read the view from the
earliest message. A second run right after shows the cost with nothing new past the horizon.

    python bench/compaction_bench.py [--messages 50000] [--keys 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.raw_client import admin  # noqa: E402
from tests.support.standalone import StandaloneProcess, client  # noqa: E402


def _admin(node: StandaloneProcess, method: str, path: str) -> object:
    status, text = admin(node, method, path)
    if not 200 <= status < 300:
        raise RuntimeError(f"{method} {path}: HTTP {status} {text}")
    return json.loads(text) if text else None


def _compact(node: StandaloneProcess, topic: str) -> int:
    base = f"/persistent/public/default/{topic}"
    _admin(node, "PUT", f"{base}/compaction")
    while True:
        status = _admin(node, "GET", f"{base}/compaction")
        assert isinstance(status, dict)
        if status["status"] != "RUNNING":
            assert status["status"] == "SUCCESS", status
            break
        time.sleep(0.05)
    stats = _admin(node, "GET", f"{base}/stats")
    assert isinstance(stats, dict)
    took: int = stats["compaction"]["lastCompactionDurationTimeInMills"]
    return took


def one_topic(node: StandaloneProcess, messages: int, keys: int, batched: bool) -> str:
    topic = f"compaction-bench-{int(batched)}-{time.time_ns()}"
    c = client(node)
    try:
        producer = c.create_producer(
            topic, batching_enabled=batched, block_if_queue_full=True, batching_max_messages=100
        )
        for i in range(messages):
            producer.send_async(f"value-{i}".encode(), None, partition_key=f"key-{i % keys}")
        producer.flush()
        producer.close()
        internal = _admin(node, "GET", f"/persistent/public/default/{topic}/internalStats")
        assert isinstance(internal, dict)
        entries = internal["numberOfEntries"]
        first = _compact(node, topic)
        again = _compact(node, topic)
        started = time.monotonic()
        reader = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        read = 0
        while reader.has_message_available():
            reader.read_next(30_000)
            read += 1
        read_s = time.monotonic() - started
        reader.close()
    finally:
        c.close()
    assert read == keys, (read, keys)
    return (
        f"batched={batched}: {messages} messages in {entries} entries, {keys} keys: compaction "
        f"{first} ms ({messages / max(first, 1) * 1000:,.0f} messages/s), again with nothing new "
        f"{again} ms; compacted reader read {read} messages in {read_s * 1000:.0f} ms"
    )


def main(messages: int, keys: int) -> None:
    with tempfile.TemporaryDirectory(prefix="magnetar-compaction-") as workdir:
        node = StandaloneProcess(Path(workdir) / "standalone").start()
        try:
            for batched in (False, True):
                print(one_topic(node, messages, keys, batched), flush=True)
        finally:
            node.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=1_000)
    args = parser.parse_args()
    main(args.messages, args.keys)
