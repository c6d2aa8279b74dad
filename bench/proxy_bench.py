"""Through the proxy against direct to the broker, in one run: end-to-end throughput, publish
latency, and the proxy's CPU per message.

Starts etcd, one bookie and one broker (the test support's ``MagnetarCluster``, E1/Qw1/Qa1 so
the storage side takes as little of the machine as it can) and a ``magnetar proxy`` in front of
them (``ProxyProcess``). Each workload then runs through both paths, one after the other on a
fresh topic each time, ``--rounds`` times alternating which path goes first:

- batched: one producer, batching on (1 ms delay, at most 1,000 messages pending), 1 KiB
  messages, ``--batched`` of them;
- unbatched: ``--producers`` producers on one topic, batching off (one message per entry),
  256 B messages, ``--unbatched`` in all.

Producers and the consumer run in child processes (this script with ``--role``) on the official
``pulsar-client``, given ``pulsar://`` URLs of either the broker or the proxy; the client then
does its lookups through the proxy and is relayed to the broker. Producers send as fast as
they can; throughput is messages received over the time from the common start to the last one
received. Publish latency is ``send_async`` to receipt, at that saturation (so it is mostly
queueing: compare the two paths, not with a fixed-rate figure). The proxy's CPU is user +
system time from ``/proc/<pid>/stat`` before the start and after the last receive, over the
messages relayed (each one goes in once from a producer and out once to the consumer).

    python bench/proxy_bench.py [--batched 50000] [--unbatched 20000] [--producers 4]
                                [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.e2e_bench import cpu_seconds, percentile_ms, read_line, tell  # noqa: E402

SEQUENCE_BYTES = 8
READY_TIMEOUT_S = 60.0
RECEIVE_TIMEOUT_S = 120.0


# -- client roles (child processes) -------------------------------------------------------------


def _client(url: str) -> Any:
    import pulsar

    quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    return pulsar.Client(url, operation_timeout_seconds=30, logger=quiet)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_producers(args: argparse.Namespace) -> int:
    """``args.producers`` producers on one topic, sending ``args.count`` messages between them
    (round-robin) once told "go"; prints counts and publish latency."""
    import pulsar

    client = _client(args.url)
    try:
        options: dict[str, Any] = {
            "max_pending_messages": 1000,
            "block_if_queue_full": True,
            "send_timeout_millis": 60_000,
        }
        if args.batching:
            options.update(batching_enabled=True, batching_max_publish_delay_ms=1)
        else:
            options.update(batching_enabled=False)
        producers = [client.create_producer(args.topic, **options) for _ in range(args.producers)]
        filler = os.urandom(args.size - SEQUENCE_BYTES)
        lock = threading.Lock()
        latencies: list[float] = []
        failed = 0

        def acked(result: Any, sent_at: float) -> None:
            nonlocal failed
            now = time.monotonic()
            with lock:
                if result == pulsar.Result.Ok:
                    latencies.append(now - sent_at)
                else:
                    failed += 1

        _say("ready")
        sys.stdin.readline()  # "go"
        started = time.monotonic()
        for sequence in range(args.count):
            sent_at = time.monotonic()
            producers[sequence % len(producers)].send_async(
                sequence.to_bytes(SEQUENCE_BYTES, "big") + filler,
                lambda r, _m, t=sent_at: acked(r, t),
            )
        for producer in producers:
            producer.flush()
        elapsed = time.monotonic() - started
        with lock:
            done, failures = list(latencies), failed
        _say(
            json.dumps(
                {
                    "acked": len(done),
                    "failed": failures,
                    "seconds": elapsed,
                    "p50_ms": percentile_ms(done, 50),
                    "p99_ms": percentile_ms(done, 99),
                }
            )
        )
        for producer in producers:
            producer.close()
    finally:
        client.close()
    return 0


def run_consumer(args: argparse.Namespace) -> int:
    """Receives (and acknowledges) until ``args.count`` distinct messages came or time ran out;
    prints how many and the time from "go" to the last one."""
    import pulsar

    client = _client(args.url)
    try:
        consumer = client.subscribe(
            args.topic,
            "proxy-bench",
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=5000,
        )
        _say("ready")
        sys.stdin.readline()  # "go"
        started = last_at = time.monotonic()
        deadline = started + RECEIVE_TIMEOUT_S
        seen = bytearray(args.count)
        unique = duplicates = 0
        while unique < args.count and time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            last_at = time.monotonic()
            consumer.acknowledge(message)
            sequence = int.from_bytes(message.data()[:SEQUENCE_BYTES], "big")
            if sequence < args.count and not seen[sequence]:
                seen[sequence] = 1
                unique += 1
            else:
                duplicates += 1
        _say(json.dumps({"unique": unique, "duplicates": duplicates, "seconds": last_at - started}))
        consumer.close()
    finally:
        client.close()
    return 0


# -- one pass: one workload through one path ----------------------------------------------------


@dataclass(slots=True, frozen=True)
class Workload:
    name: str
    count: int
    size: int
    producers: int
    batching: bool


@dataclass(slots=True, frozen=True)
class Pass:
    path: str  # "direct" or "proxy"
    workload: Workload
    produced: dict[str, Any]
    consumed: dict[str, Any]
    proxy_cpu_s: float
    broker_cpu_s: float

    @property
    def msg_per_s(self) -> float:
        return self.consumed["unique"] / self.consumed["seconds"]

    @property
    def problems(self) -> str:
        found = []
        if self.produced["failed"]:
            found.append(f"{self.produced['failed']} sends failed")
        if self.consumed["unique"] < self.workload.count:
            found.append(f"{self.workload.count - self.consumed['unique']} not received")
        if self.consumed["duplicates"]:
            found.append(f"{self.consumed['duplicates']} duplicates")
        return ", ".join(found) or "ok"


def role_command(role: str, url: str, topic: str, workload: Workload) -> list[str]:
    return [
        sys.executable, __file__, "--role", role, "--url", url, "--topic", topic,
        "--count", str(workload.count), "--size", str(workload.size),
        "--producers", str(workload.producers),
        *(["--batching"] if workload.batching else []),
    ]  # fmt: skip


def run_pass(path: str, url: str, workload: Workload, proxy_pid: int, broker_pid: int) -> Pass:
    topic = f"persistent://public/default/proxy-bench-{workload.name}-{uuid.uuid4().hex[:8]}"
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    consumer = subprocess.Popen(role_command("consumer", url, topic, workload), **pipes)
    producer = None
    try:
        read_line(consumer, READY_TIMEOUT_S, "consumer")
        producer = subprocess.Popen(role_command("producer", url, topic, workload), **pipes)
        read_line(producer, READY_TIMEOUT_S, "producer")
        proxy_before, broker_before = cpu_seconds(proxy_pid), cpu_seconds(broker_pid)
        tell(consumer, "go")
        tell(producer, "go")
        produced = json.loads(read_line(producer, RECEIVE_TIMEOUT_S + 60, "producer"))
        consumed = json.loads(read_line(consumer, RECEIVE_TIMEOUT_S + 60, "consumer"))
        proxy_cpu = cpu_seconds(proxy_pid) - proxy_before
        broker_cpu = cpu_seconds(broker_pid) - broker_before
        return Pass(path, workload, produced, consumed, proxy_cpu, broker_cpu)
    finally:
        for child in (producer, consumer):
            if child is not None:
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(10)


# -- the run ------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(workload: Workload, passes: list[Pass]) -> None:
    print(
        f"\n{workload.name}: {workload.count:,} x {workload.size} B, "
        f"{workload.producers} producer(s), batching {'on' if workload.batching else 'off'}"
    )
    print(
        f"  {'path':<7} {'msg/s':>9} {'MB/s':>7} {'pub p50 ms':>11} {'pub p99 ms':>11} "
        f"{'proxy CPU us/msg':>17} {'broker CPU us/msg':>18}  check"
    )
    for p in passes:
        print(
            f"  {p.path:<7} {p.msg_per_s:>9,.0f} {p.msg_per_s * workload.size / 1e6:>7.1f} "
            f"{p.produced['p50_ms']:>11.1f} {p.produced['p99_ms']:>11.1f} "
            + (
                f"{p.proxy_cpu_s / workload.count * 1e6:>17.1f} "
                if p.path == "proxy"
                else f"{'-':>17} "
            )
            + f"{p.broker_cpu_s / workload.count * 1e6:>18.1f}  {p.problems}"
        )
    direct = [p for p in passes if p.path == "direct"]
    proxied = [p for p in passes if p.path == "proxy"]
    rate_ratio = median([p.msg_per_s for p in proxied]) / median([p.msg_per_s for p in direct])
    p50_ratio = median([p.produced["p50_ms"] for p in proxied]) / median(
        [p.produced["p50_ms"] for p in direct]
    )
    p99_ratio = median([p.produced["p99_ms"] for p in proxied]) / median(
        [p.produced["p99_ms"] for p in direct]
    )
    cpu = median([p.proxy_cpu_s / workload.count * 1e6 for p in proxied])
    print(
        f"  proxy/direct: throughput {rate_ratio:.2f}x, publish p50 {p50_ratio:.2f}x, "
        f"p99 {p99_ratio:.2f}x; proxy CPU {cpu:.1f} us per message relayed"
        + (" (medians)" if len(proxied) > 1 else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batched", type=int, default=50_000, help="messages, batched workload")
    parser.add_argument(
        "--unbatched", type=int, default=20_000, help="messages, unbatched workload"
    )
    parser.add_argument("--producers", type=int, default=4, help="producers, unbatched workload")
    parser.add_argument(
        "--rounds", type=int, default=5, help="passes of each path per workload (medians)"
    )
    # Child process roles.
    parser.add_argument("--role", choices=["producer", "consumer"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batching", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "producer":
        return run_producers(args)
    if args.role == "consumer":
        return run_consumer(args)

    from tests.support.cluster import MagnetarCluster
    from tests.support.proxy import ProxyProcess

    workloads = [
        Workload("batched", args.batched, 1024, 1, True),
        Workload("unbatched", args.unbatched, 256, args.producers, False),
    ]
    cpus = os.cpu_count()
    print(
        f"proxy vs direct, {cpus} CPU(s); etcd, 1 bookie (journal not fsynced), 1 broker "
        "(E1/Qw1/Qa1) and the proxy each one process, clients in their own processes"
    )
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        base = Path(tmp)
        cluster = MagnetarCluster(
            base / "cluster",
            bookies=1,
            brokers=1,
            broker_settings={"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1},
        )
        proxy = None
        try:
            cluster.start()
            broker = cluster.brokers[0]
            proxy = ProxyProcess(
                base / "proxy",
                cluster.url,
                settings={"broker_proxy_allowed_target_ports": broker.port},
            )
            proxy.start()
            assert proxy.pid is not None and broker.pid is not None
            urls = {"direct": broker.url, "proxy": proxy.url}
            started = time.monotonic()
            for workload in workloads:
                passes = []
                for round_ in range(args.rounds):
                    order = ["direct", "proxy"] if round_ % 2 == 0 else ["proxy", "direct"]
                    for path in order:
                        passes.append(run_pass(path, urls[path], workload, proxy.pid, broker.pid))
                report(workload, passes)
            print(f"\n(measured in {time.monotonic() - started:.0f} s)")
        finally:
            if proxy is not None:
                proxy.stop()
            cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
