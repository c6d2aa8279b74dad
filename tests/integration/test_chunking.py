"""Chunked messages at default settings: a 10 MB message crosses in chunks of at most the
broker's max message size, each chunk one entry the bookie accepts, with no new ledgers."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from contextlib import closing
from pathlib import Path

from tests.support.standalone import StandaloneProcess, client


def test_ten_megabyte_message_in_chunks(tmp_path: Path) -> None:
    node = StandaloneProcess(tmp_path / "node").start()
    try:
        with closing(client(node)) as c:
            topic = "persistent://public/default/chunked"
            consumer = c.subscribe(topic, "s")
            producer = c.create_producer(topic, chunking_enabled=True, batching_enabled=False)
            big = os.urandom(10 * 1024 * 1024)
            small = b"after the big one"
            producer.send(big)
            producer.send(small)
            first = consumer.receive(timeout_millis=30_000)
            assert first.data() == big
            consumer.acknowledge(first)
            second = consumer.receive(timeout_millis=10_000)
            assert second.data() == small
            consumer.acknowledge(second)
        url = f"{node.admin_url}/persistent/public/default/chunked/internalStats"
        with urllib.request.urlopen(url, timeout=10) as response:
            stats = json.loads(response.read())
        # Three chunks and the small message, in the topic's one ledger: no rollover storm.
        assert stats["numberOfEntries"] == 4
        assert len(stats["ledgers"]) == 1
        time.sleep(0.5)
        assert "rolled over" not in node.log_tail(100_000)
        assert "Traceback" not in node.log_tail(100_000)
    finally:
        node.stop()
