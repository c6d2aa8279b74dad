"""``magnetar perf produce|consume``: load generators in the spirit of pulsar-perf.

They drive the official Pulsar client (the ``perf`` extra: ``pip install 'magnetar[perf]'``), so
what they measure is what a Pulsar application would see. Every few seconds they print the rate,
throughput and latency percentiles of the last interval, then a summary for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="perf_command", required=True, metavar="MODE")
    for mode, help_text in (("produce", "publish messages"), ("consume", "receive messages")):
        p = sub.add_parser(mode, help=help_text)
        p.add_argument("topic")
        p.add_argument("--service-url", default="pulsar://localhost:6650")
        p.add_argument("--messages", type=int, default=0, help="stop after this many (0: no limit)")
        p.add_argument(
            "--duration",
            type=float,
            default=None,
            help="stop after this many seconds [default: 30 without --messages, else no limit]",
        )
        p.add_argument(
            "--interval", type=float, default=5.0, help="seconds between reports [default: 5]"
        )
        p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
        if mode == "produce":
            p.add_argument(
                "--rate", type=float, default=0, help="messages per second (0: as fast as possible)"
            )
            p.add_argument(
                "--size", type=int, default=1024, help="message size in bytes [default: 1024]"
            )
            p.add_argument("--producers", type=int, default=1)
            p.add_argument("--batching", action=argparse.BooleanOptionalAction, default=True)
            p.add_argument("--batch-delay-ms", type=int, default=1)
            p.add_argument("--max-pending", type=int, default=1000)
        else:
            p.add_argument("--subscription", default="perf")
            p.add_argument(
                "--type",
                default="Exclusive",
                choices=["Exclusive", "Shared", "Failover", "KeyShared"],
            )
            p.add_argument("--consumers", type=int, default=1)
            p.add_argument(
                "--initial-position",
                default="latest",
                choices=["latest", "earliest"],
                help="where a new subscription starts [default: latest]",
            )


@dataclass
class Recorder:
    """Thread-safe counters and latency samples (client callbacks run on its own threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0
    size: int = 0
    failed: int = 0
    window: list[float] = field(default_factory=list)
    all: list[float] = field(default_factory=list)

    def record(self, size: int, latency_s: float) -> None:
        with self.lock:
            self.count += 1
            self.size += size
            self.window.append(latency_s)
            self.all.append(latency_s)

    def fail(self) -> None:
        with self.lock:
            self.failed += 1

    def take_window(self) -> list[float]:
        with self.lock:
            window, self.window = self.window, []
        return window


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def run(args: argparse.Namespace) -> int:
    try:
        import pulsar
    except ImportError:
        print(
            "magnetar perf needs the official client: pip install 'magnetar[perf]'", file=sys.stderr
        )
        return 2
    # The client's own logger: a Python logger here makes the client abort at exit
    # (apache/pulsar-client-python#256).
    quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    client = pulsar.Client(args.service_url, operation_timeout_seconds=30, logger=quiet)
    recorder = Recorder()
    try:
        if args.perf_command == "produce":
            return _produce(pulsar, client, args, recorder)
        return _consume(pulsar, client, args, recorder)
    finally:
        client.close()


def _duration(args: argparse.Namespace) -> float:
    if args.duration is not None:
        return args.duration
    return float("inf") if args.messages else 30.0


def _report_loop(
    args: argparse.Namespace, recorder: Recorder, done: threading.Event, verb: str
) -> None:
    last_count, last_size, last_time = 0, 0, time.monotonic()
    while not done.wait(args.interval):
        now = time.monotonic()
        with recorder.lock:
            count, size = recorder.count, recorder.size
        window = recorder.take_window()
        elapsed = now - last_time
        print(
            f"{verb} {(count - last_count) / elapsed:10,.0f} msg/s {(size - last_size) / elapsed / 1e6:8.2f} MB/s"
            f"   latency ms p50 {percentile(window, 50):7.2f} p99 {percentile(window, 99):7.2f}",
            flush=True,
        )
        last_count, last_size, last_time = count, size, now


def _summary(args: argparse.Namespace, recorder: Recorder, elapsed: float, verb: str) -> None:
    result = {
        "mode": args.perf_command,
        "messages": recorder.count,
        "failed": recorder.failed,
        "seconds": round(elapsed, 3),
        "msg_per_s": round(recorder.count / elapsed, 1),
        "mb_per_s": round(recorder.size / elapsed / 1e6, 3),
        "latency_ms": {
            p: round(percentile(recorder.all, float(p[1:])), 3)
            for p in ("p50", "p95", "p99", "p999")
        },
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        lat = result["latency_ms"]
        print(
            f"summary: {verb} {recorder.count:,} messages ({recorder.failed} failed) in {elapsed:.1f} s: "
            f"{result['msg_per_s']:,.0f} msg/s, {result['mb_per_s']:.2f} MB/s, latency ms "
            f"p50 {lat['p50']} p95 {lat['p95']} p99 {lat['p99']} p99.9 {lat['p999']}",  # type: ignore[index]
            flush=True,
        )


def _produce(pulsar, client, args: argparse.Namespace, recorder: Recorder) -> int:  # type: ignore[no-untyped-def]
    producers = [
        client.create_producer(
            args.topic,
            batching_enabled=args.batching,
            batching_max_publish_delay_ms=args.batch_delay_ms,
            max_pending_messages=args.max_pending,
            block_if_queue_full=True,
            send_timeout_millis=60_000,
        )
        for _ in range(args.producers)
    ]
    payload = os.urandom(args.size)
    done = threading.Event()
    reporter = threading.Thread(
        target=_report_loop, args=(args, recorder, done, "produced"), daemon=True
    )
    reporter.start()
    started = time.monotonic()
    deadline = started + _duration(args)
    sent = 0

    def callback(result, _msg_id, sent_at=0.0):  # type: ignore[no-untyped-def]
        if result == pulsar.Result.Ok:
            recorder.record(args.size, time.monotonic() - sent_at)
        else:
            recorder.fail()

    while (not args.messages or sent < args.messages) and time.monotonic() < deadline:
        if args.rate > 0:
            delay = started + sent / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        sent_at = time.monotonic()
        producers[sent % len(producers)].send_async(
            payload, lambda r, m, t=sent_at: callback(r, m, t)
        )
        sent += 1
    for producer in producers:
        producer.flush()
    elapsed = time.monotonic() - started
    done.set()
    reporter.join()  # its last line must not come after the summary
    _summary(args, recorder, elapsed, "produced")
    return 0 if recorder.failed == 0 else 1


def _consume(pulsar, client, args: argparse.Namespace, recorder: Recorder) -> int:  # type: ignore[no-untyped-def]
    consumer_type = getattr(pulsar.ConsumerType, args.type)
    consumers = [
        client.subscribe(
            args.topic,
            args.subscription,
            consumer_type=consumer_type,
            initial_position=getattr(pulsar.InitialPosition, args.initial_position.capitalize()),
        )
        for _ in range(args.consumers)
    ]
    done = threading.Event()
    reporter = threading.Thread(
        target=_report_loop, args=(args, recorder, done, "consumed"), daemon=True
    )
    reporter.start()
    started = time.monotonic()
    deadline = started + _duration(args)
    received = 0
    while (not args.messages or received < args.messages) and time.monotonic() < deadline:
        for consumer in consumers:
            try:
                message = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            # End to end: from the producer's publish time to now (same machine clocks).
            latency = max(time.time() - message.publish_timestamp() / 1000, 0.0)
            recorder.record(len(message.data()), latency)
            consumer.acknowledge(message)
            received += 1
    elapsed = time.monotonic() - started
    done.set()
    reporter.join()  # its last line must not come after the summary
    _summary(args, recorder, elapsed, "consumed")
    return 0
