"""Cluster figures: lookup latency and the pause of a bundle transfer.

Starts one etcd, ``--bookies`` bookie processes and ``--brokers`` broker processes (the test
support's ``MagnetarCluster``, E2/Qw2/Qa2), then:

- lookup latency: HTTP lookups (``/lookup/v2/topic/...``, redirects followed) of ``--topics``
  fresh topics through one broker: the first lookup of a topic whose bundle nobody owns yet
  (leader placement + claim) and a second one (the bundle owned);
- transfer pause: one producer at ``--rate`` msg/s (async sends, receipts timed) while the
  topic's bundle is unloaded ``--moves`` times; the pause of a move is the time from the unload
  request to the first receipt from the new owner (the bundle goes to another broker).

    python bench/cluster_bench.py [--brokers 3] [--bookies 2] [--topics 100] [--moves 10]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from tests.support.cluster import MagnetarCluster, PacedProducer
from tests.support.standalone import QUIET


def bundle_and_owner(cluster: MagnetarCluster, topic: str) -> tuple[str, str]:
    """The bundle holding ``topic`` and its owner."""
    namespace = topic.split("://", 1)[1].rsplit("/", 1)[0]
    h = topic_hash(topic)
    for (owned_ns, bundle), owner in cluster.ownership().items():
        if owned_ns == namespace and BundleRange.parse(bundle).contains(h):
            return bundle, owner
    raise AssertionError(f"nobody owns the bundle of {topic}")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def lookup_ms(http_url: str, topic: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(f"{http_url}/lookup/v2/topic/persistent/{topic}", timeout=30) as r:
        r.read()
    return (time.perf_counter() - started) * 1000


def bench_lookups(cluster: MagnetarCluster, topics: int) -> None:
    cluster.create_namespace("bench", "lookups")
    entry = cluster.brokers[0]
    first, second = [], []
    for i in range(topics):
        # A namespace per 4 topics: most first lookups find their bundle unowned.
        if i % 4 == 0:
            cluster.create_namespace("bench", f"l{i // 4}")
        topic = f"bench/l{i // 4}/t{i}"
        first.append(lookup_ms(entry.http_url, topic))
        second.append(lookup_ms(entry.http_url, topic))
    for name, values in (("first (placement + claim)", first), ("again (owned)", second)):
        print(
            f"lookup {name:<26} n={len(values):>4}  p50 {percentile(values, 50):7.2f} ms  "
            f"p99 {percentile(values, 99):7.2f} ms  max {max(values):7.2f} ms"
        )


def bench_transfers(cluster: MagnetarCluster, moves: int, rate: float) -> None:
    cluster.create_namespace("bench", "moves")
    topic = "persistent://bench/moves/t"
    client = pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)
    try:
        producer = PacedProducer(client, topic, interval=1.0 / rate).start()
        producer.wait_for(50)
        pauses, owners = [], []
        for _ in range(moves):
            bundle, before = bundle_and_owner(cluster, topic)
            asked = time.monotonic()
            cluster.unload_bundle("bench/moves", bundle)
            producer.wait_for(50)
            # The pause: the longest silence between receipts from the unload request on.
            times = sorted(t for t in producer.receipted.values() if t >= asked)
            gaps = [times[0] - asked] + [b - a for a, b in itertools.pairwise(times)]
            pauses.append(max(gaps) * 1000)
            owners.append((before, bundle_and_owner(cluster, topic)[1]))
        producer.stop()
        moved = sum(1 for a, b in owners if a != b)
        print(
            f"transfer pause             n={len(pauses):>4}  p50 {percentile(pauses, 50):7.1f} ms  "
            f"p99 {percentile(pauses, 99):7.1f} ms  max {max(pauses):7.1f} ms  "
            f"(moved to another broker {moved}/{len(owners)}; {len(producer.errors)} send errors, "
            f"{len(producer.receipted)} receipted at {rate:.0f} msg/s)"
        )
        print(f"mean pause {statistics.mean(pauses):.1f} ms")
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--bookies", type=int, default=2)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--moves", type=int, default=10)
    parser.add_argument("--rate", type=float, default=200.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as work:
        cluster = MagnetarCluster(Path(work), bookies=args.bookies, brokers=args.brokers)
        with cluster.start():
            print(f"cluster: 1 etcd, {args.bookies} bookies, {args.brokers} brokers (E2/Qw2/Qa2)")
            bench_lookups(cluster, args.topics)
            bench_transfers(cluster, args.moves, args.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
