"""Where the plain-flow check's backlog messages go: every send's result, what the topic
stored, what a consumer drains.

Runs the check's loop (2,000 ``send_async`` from a Python loop, the client's default queue of
1,000, no ``block_if_queue_full``) against one ``magnetar standalone``, batched and not, and
prints the send results by kind, the topic's ``msgInCounter`` and the count drained. If the
drained count equals the stored one and the rest are ProducerQueueIsFull, the client refused
the missing sends before any reached the broker.

    python bench/smoke_receipts.py [--messages 2000]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.standalone import StandaloneProcess  # noqa: E402


def one_round(node: StandaloneProcess, c: pulsar.Client, count: int, batching: bool) -> str:
    topic = f"persistent://public/default/receipts-{int(batching)}-{time.time_ns()}"
    consumer = c.subscribe(topic, "s")
    producer = c.create_producer(topic, batching_enabled=batching)
    results: collections.Counter[str] = collections.Counter()
    for i in range(count):
        producer.send_async(
            f"m{i}".encode(), lambda r, _id: results.update([str(r)]), partition_key=f"k{i % 16}"
        )
    producer.flush()
    producer.close()  # every callback has run once it returns
    drained = 0
    while True:
        try:
            consumer.acknowledge(consumer.receive(timeout_millis=3000))
            drained += 1
        except pulsar.Timeout:
            break
    consumer.close()
    name = topic.rsplit("/", 1)[1]
    with urllib.request.urlopen(f"{node.admin_url}/persistent/public/default/{name}/stats") as r:
        stored = json.load(r)["msgInCounter"]
    return f"batching={batching}: sends {dict(results)}; stored {stored}; drained {drained}"


def main(count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="magnetar-receipts-") as workdir:
        node = StandaloneProcess(Path(workdir) / "standalone").start()
        try:
            c = pulsar.Client(node.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
            for batching in (False, True):
                print(one_round(node, c, count, batching), flush=True)
            c.close()
        finally:
            node.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    main(parser.parse_args().messages)
