"""Geo-replication between two clusters on this machine: lag at a steady rate, and throughput.

Starts a configuration etcd and two clusters (``a`` and ``b``: each its own etcd,
``--bookies`` bookie processes and one broker, E2/Qw2/Qa2, the test support's
``MagnetarCluster``), registers them, and makes one tenant and one namespace replicated
``a <-> b`` (made once: they live in the configuration store). A consumer on ``b`` (exclusive,
from the earliest message) receives every message; the producer is on ``a`` (the official
client, batching off: one message per entry, the replicator's unit). Every payload carries its
sequence number and the wall-clock time it was handed to ``send_async`` on ``a``, so ``b``
counts lost, duplicated and reordered messages.

- lag: ``--rate`` msg/s for ``--seconds``; the lag of a message is the time from its
  ``send_async`` on ``a`` to its receipt by the consumer on ``b`` (both on this machine's clock):
  the publish on ``a``, the replicator's read and send, the store on ``b``, the dispatch;
- throughput: ``--burst`` messages sent on ``a`` as fast as the client takes them (at most 1,000
  pending); replication throughput is the messages received on ``b`` over the time from the
  first send to the last receipt on ``b`` (``a``'s own publish rate printed beside it).

    python bench/replication_bench.py [--rate 200] [--seconds 20] [--burst 20000] [--size 256]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cluster_bench import percentile
from tests.support.cluster import ConsumerThread, MagnetarCluster
from tests.support.etcd import EtcdServer
from tests.support.standalone import QUIET

NAMESPACE = "bench/geo"


class Receiver:
    """The consumer on ``b`` (the test support's ``ConsumerThread``): (sequence, receive time,
    send time) of every message."""

    def __init__(self, client: pulsar.Client, topic: str) -> None:
        self.thread = ConsumerThread(
            client, topic, "bench", pulsar.ConsumerType.Exclusive, name="bench"
        ).start()

    @property
    def got(self) -> list[tuple[int, float, float]]:
        out = []
        for delivery in self.thread.deliveries:
            sequence, sent, _ = delivery.payload.split("|", 2)
            out.append((int(sequence), delivery.received, float(sent)))
        return out

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.thread.deliveries) < count:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"only {len(self.thread.deliveries)} of {count} messages reached b"
                    f" (consumer errors: {self.thread.errors[-3:]})"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        self.thread.close()


def payload(sequence: int, size: int) -> bytes:
    head = f"{sequence}|{time.time():.6f}|".encode()
    return head + b"x" * max(0, size - len(head))


def check(got: list[tuple[int, float, float]], sent: int) -> str:
    sequences = [s for s, _, _ in got]
    lost = sent - len(set(sequences))
    duplicated = len(sequences) - len(set(sequences))
    reordered = sum(1 for x, y in itertools.pairwise(sequences) if y < x)
    return f"lost {lost}, duplicated {duplicated}, reordered {reordered}"


def steady(a: pulsar.Client, b: pulsar.Client, rate: float, seconds: float, size: int) -> None:
    topic = f"persistent://{NAMESPACE}/steady"
    receiver = Receiver(b, topic)
    producer = a.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    total = int(rate * seconds)
    started = time.monotonic()
    for i in range(total):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        producer.send_async(payload(i, size), None)
    producer.flush()
    receiver.wait_for(total, timeout=120)
    receiver.stop()
    producer.close()
    lags = [(received - sent) * 1000 for _, received, sent in receiver.got]
    print(
        f"lag at {rate:g} msg/s for {seconds:g} s ({total} x {size} B): "
        f"p50 {percentile(lags, 50):.1f} ms  p99 {percentile(lags, 99):.1f} ms  "
        f"max {max(lags):.1f} ms  mean {statistics.fmean(lags):.1f} ms; "
        f"{check(receiver.got, total)}"
    )


def burst(a: pulsar.Client, b: pulsar.Client, count: int, size: int) -> None:
    topic = f"persistent://{NAMESPACE}/burst"
    receiver = Receiver(b, topic)
    producer = a.create_producer(
        topic, batching_enabled=False, block_if_queue_full=True, max_pending_messages=1000
    )
    started = time.time()
    for i in range(count):
        producer.send_async(payload(i, size), None)
    producer.flush()
    published = time.time() - started
    receiver.wait_for(count, timeout=600)
    last = max(received for _, received, _ in receiver.got)
    receiver.stop()
    producer.close()
    seconds = last - started
    print(
        f"throughput, {count} x {size} B sent at once: published on a at "
        f"{count / published:,.0f} msg/s; replicated to b at {count / seconds:,.0f} msg/s "
        f"({count * size / seconds / 1e6:.2f} MB/s), the last one {seconds - published:.1f} s "
        f"after the last publish; {check(receiver.got, count)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--bookies", type=int, default=2)
    args = parser.parse_args()
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="replication-bench-") as base:
        config = EtcdServer(name="configuration").start()
        clusters: dict[str, MagnetarCluster] = {}
        try:
            for name in ("a", "b"):
                clusters[name] = MagnetarCluster(
                    Path(base) / name,
                    bookies=args.bookies,
                    brokers=1,
                    broker_settings={
                        "cluster_name": name,
                        "configuration_metadata_url": config.url,
                    },
                ).start()
            a, b = clusters["a"], clusters["b"]
            for name, cluster in clusters.items():
                broker = cluster.brokers[0]
                a.admin_json(
                    "PUT",
                    f"/admin/v2/clusters/{name}",
                    {"serviceUrl": broker.http_url, "brokerServiceUrl": broker.url},
                )
            a.admin_json("PUT", "/admin/v2/tenants/bench", {"allowedClusters": ["a", "b"]})
            a.admin_json("PUT", f"/admin/v2/namespaces/{NAMESPACE}")
            b.admin_json("POST", f"/admin/v2/namespaces/{NAMESPACE}/replication", ["a", "b"])
            client_a = pulsar.Client(a.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)
            client_b = pulsar.Client(b.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)
            try:
                steady(client_a, client_b, args.rate, args.seconds, args.size)
                burst(client_a, client_b, args.burst, args.size)
            finally:
                client_a.close()
                client_b.close()
        finally:
            for cluster in clusters.values():
                cluster.close()
            config.close()
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
