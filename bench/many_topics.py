"""Broker memory and setup time for many topics, each with one producer and one consumer.

Starts one ``magnetar standalone`` (metadata store, bookie and broker in one process) on free
ports with a temp data dir, and records its RSS idle. Then, through the official
``pulsar-client``, subscribes one consumer and creates one producer on each of ``--topics``
topics (``--threads`` at a time), sends ``--messages`` per topic, receives and acks them all,
and records the RSS again. Prints the broker's memory per topic, the setup time with
per-operation latencies, and how many messages made the round trip. The C++ client's own
memory is in this process, not in the standalone's RSS.

    python bench/many_topics.py [--topics 1000] [--messages 5] [--threads 16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pulsar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.standalone import StandaloneProcess  # noqa: E402

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class Sample:
    rss_kib: int
    hwm_kib: int
    threads: int
    cpu_s: float


def sample(pid: int) -> Sample:
    """VmRSS, VmHWM (peak RSS) and threads from /proc/PID/status; user + system CPU time."""
    fields: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    # The command name in /proc/PID/stat may hold spaces: count fields after its ")".
    stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return Sample(
        rss_kib=int(fields["VmRSS"].split()[0]),
        hwm_kib=int(fields["VmHWM"].split()[0]),
        threads=int(fields["Threads"]),
        cpu_s=(int(stat[11]) + int(stat[12])) / ticks,
    )


def mib(kib: int) -> str:
    return f"{kib / 1024:,.1f} MiB"


@dataclass(slots=True)
class Topic:
    name: str
    consumer: pulsar.Consumer | None = None
    producer: pulsar.Producer | None = None
    subscribe_ms: float = 0.0
    producer_ms: float = 0.0
    received: int = 0
    errors: list[str] = field(default_factory=list)


def timed(call: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = call()
    return result, (time.perf_counter() - start) * 1000


def set_up(client: pulsar.Client, topic: Topic) -> None:
    try:
        topic.consumer, topic.subscribe_ms = timed(
            lambda: client.subscribe(
                topic.name, "many-topics", consumer_type=pulsar.ConsumerType.Exclusive
            )
        )
        topic.producer, topic.producer_ms = timed(
            lambda: client.create_producer(topic.name, batching_enabled=False)
        )
    except Exception as e:  # reported per topic; the run goes on
        topic.errors.append(f"set up: {e!r}")


def round_trip(topic: Topic, messages: int, timeout_ms: int) -> None:
    """Sends ``messages`` to the topic, then receives and acks them, counting those in order."""
    if topic.producer is None or topic.consumer is None:
        return
    try:
        for seq in range(messages):
            topic.producer.send(f"{topic.name}/{seq}".encode())
        for seq in range(messages):
            msg = topic.consumer.receive(timeout_millis=timeout_ms)
            if msg.data() != f"{topic.name}/{seq}".encode():
                topic.errors.append(f"message {seq}: got {msg.data()!r}")
            else:
                topic.received += 1
            topic.consumer.acknowledge(msg)
    except Exception as e:  # a timeout is a lost message: counted
        topic.errors.append(f"round trip after {topic.received} received: {e!r}")


def run_all(threads: int, work: Callable[[Topic], None], topics: list[Topic]) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(work, topics):
            pass
    return time.perf_counter() - start


def latencies(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: none"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"{name}: p50 {statistics.median(ordered):.1f} ms, p99 {p99:.1f} ms, "
        f"max {ordered[-1]:.1f} ms"
    )


def raise_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=5, help="messages per topic")
    parser.add_argument(
        "--threads", type=int, default=16, help="client calls in flight at once [default: 16]"
    )
    parser.add_argument(
        "--receive-timeout", type=float, default=30.0, help="seconds to wait for each message"
    )
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds to wait before each RSS reading"
    )
    parser.add_argument("--dir", help="scratch directory [default: a temp dir]")
    parser.add_argument(
        "--keep", action="store_true", help="keep the data dir and standalone log afterwards"
    )
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, raise_on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="many-topics-", dir=args.dir))
    standalone = StandaloneProcess(workdir / "standalone")
    client: pulsar.Client | None = None
    try:
        standalone.start()
        assert standalone.process is not None
        pid = standalone.process.pid
        time.sleep(args.settle)
        idle = sample(pid)

        client = pulsar.Client(
            standalone.url,
            operation_timeout_seconds=60,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        run_id = os.getpid()
        topics = [
            Topic(f"persistent://public/default/many-topics-{run_id}-{i}")
            for i in range(args.topics)
        ]
        setup_s = run_all(args.threads, lambda t: set_up(client, t), topics)
        after_setup = sample(pid)
        trip_s = run_all(
            args.threads,
            lambda t: round_trip(t, args.messages, int(args.receive_timeout * 1000)),
            topics,
        )
        time.sleep(args.settle)
        loaded = sample(pid)

        close_start = time.perf_counter()
        client.close()
        client = None
        close_s = time.perf_counter() - close_start
        time.sleep(args.settle)
        closed = sample(pid)
        alive = standalone.process.poll() is None
    except KeyboardInterrupt:
        print(f"interrupted; standalone log kept: {standalone.log_path}", file=sys.stderr)
        raise SystemExit(130) from None
    except BaseException:
        print(f"standalone log kept: {standalone.log_path}", file=sys.stderr)
        raise
    finally:
        if client is not None:
            client.close()
        standalone.stop()

    sent = args.topics * args.messages
    received = sum(t.received for t in topics)
    failed = [t for t in topics if t.errors]
    ready = sum(1 for t in topics if t.producer is not None and t.consumer is not None)
    print(
        f"{args.topics:,} topics, 1 producer + 1 exclusive consumer each, "
        f"{args.messages} messages per topic, {args.threads} client calls in flight"
    )
    print(f"standalone RSS idle:           {mib(idle.rss_kib)} ({idle.threads} threads)")
    print(
        f"standalone RSS with topics:    {mib(loaded.rss_kib)} ({loaded.threads} threads), "
        f"peak {mib(loaded.hwm_kib)}"
    )
    print(
        f"memory per topic:              "
        f"{(loaded.rss_kib - idle.rss_kib) / max(args.topics, 1):,.1f} KiB"
    )
    print(f"standalone RSS clients closed: {mib(closed.rss_kib)} ({closed.threads} threads)")
    print(
        f"set up {ready:,} producers + consumers in {setup_s:.2f} s "
        f"({ready / setup_s:,.0f} topics/s), "
        f"standalone CPU {after_setup.cpu_s - idle.cpu_s:.2f} s"
    )
    print("  " + latencies("subscribe", [t.subscribe_ms for t in topics if t.consumer]))
    print("  " + latencies("create producer", [t.producer_ms for t in topics if t.producer]))
    print(
        f"round-tripped {received:,} of {sent:,} messages in {trip_s:.2f} s "
        f"({received / trip_s:,.0f} msg/s), standalone CPU {loaded.cpu_s - after_setup.cpu_s:.2f} s"
    )
    print(f"clients closed in {close_s:.2f} s")
    if not alive:
        print("standalone EXITED during the run", file=sys.stderr)
    if failed:
        print(f"{len(failed)} topics had errors; first ones:", file=sys.stderr)
        for t in failed[:10]:
            print(f"  {t.name}: {'; '.join(t.errors)}", file=sys.stderr)
    if failed or not alive or args.keep:
        print(f"standalone log kept: {standalone.log_path}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if failed or not alive:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
