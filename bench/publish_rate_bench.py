"""How closely a topic's publish rate holds (Pulsar's PublishRate: the producer's connection is not
read for the rest of the second once a send takes the topic over it).

Starts one ``magnetar standalone`` on free ports, then per rate: a namespace with that
``publishRate`` (messages a second), one producer sending ``--seconds`` times the rate as fast as
``send_async`` goes (nothing batched), and prints how long the receipts took beside what the
limit makes them take, the broker's ``publishRateLimitedTimes`` and how many sends were stored
(all of them: none may be refused or lost).

    python bench/publish_rate_bench.py [--rates 50,200,1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.raw_client import admin as raw_admin  # noqa: E402
from tests.support.standalone import StandaloneProcess, client  # noqa: E402


def admin(node: StandaloneProcess, method: str, path: str, body: object = None) -> object:
    status, text = raw_admin(node, method, path, None if body is None else json.dumps(body))
    if not 200 <= status < 300:
        raise RuntimeError(f"{method} {path}: HTTP {status} {text}")
    return json.loads(text) if text else None


def one_rate(node: StandaloneProcess, pc: pulsar.Client, rate: int, seconds: int) -> None:
    ns = f"public/rate-{rate}"
    admin(node, "PUT", f"/namespaces/{ns}")
    admin(node, "POST", f"/namespaces/{ns}/publishRate", {"publishThrottlingRateInMsg": rate})
    topic = f"persistent://{ns}/t"
    producer = pc.create_producer(
        topic, batching_enabled=False, block_if_queue_full=True, max_pending_messages=100_000
    )
    total = rate * seconds
    done = threading.Event()
    stamps: list[float] = []

    def receipt(result: pulsar.Result, _id: pulsar.MessageId) -> None:
        if result == pulsar.Result.Ok:
            stamps.append(time.monotonic())
        if len(stamps) == total:
            done.set()

    for i in range(total):
        producer.send_async(b"%d" % i, receipt)
    done.wait(seconds * 5 + 30)
    stats = admin(node, "GET", f"/persistent/{ns}/t/stats")
    assert isinstance(stats, dict)
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    # At the limit, the first window's receipts come at once and each later window's a second
    # after the one before: the last comes (total / rate - 1) seconds after the first.
    print(
        f"limit {rate:>6}/s  sent {total:>6}  stored {stats['msgInCounter']:>6}  "
        f"receipts over {span:5.2f} s (at the limit: {total / rate - 1:4.2f} s)  "
        f"paused {stats['publishRateLimitedTimes']:>4} times"
    )
    producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,200,1000")
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="publish-rate-bench-"))
    node = StandaloneProcess(directory / "standalone").start()
    try:
        pc = client(node)
        try:
            for rate in (int(r) for r in args.rates.split(",")):
                one_rate(node, pc, rate, args.seconds)
        finally:
            pc.close()
    finally:
        node.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
