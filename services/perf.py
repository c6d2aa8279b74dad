"""``magnetar perf produce|consume``: load generators that take pulsar-perf's flags.

They drive the official Pulsar client, so what they measure is what a Pulsar application would
see. The flags are pulsar-perf's (``-r``, ``-s``, ``-n``, ``-m``, ``-time``, ``-u``, ``-st``,
``-ss``, ``-b``, ...) with pulsar-perf's meanings; magnetar's older long names (``--messages``,
``--duration``, ``--producers``, ...) are kept as aliases. Latencies go into HDR histograms (one
for the interval, one for the run), so memory stays bounded however long the run. Every
``--interval`` seconds a line in pulsar-perf's form gives the interval's throughput and latency
(mean, median, 95, 99, 99.9, 99.99 percentiles and max); at the end the aggregated throughput and
latency of the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter

from magnetar.admin_cli import UsageError, topic_path

# Latencies are recorded in microseconds; a sample above an hour is clamped (a run that slow is
# broken, not slow), as pulsar-perf does. Three significant digits keep each histogram ~200 KB.
MAX_LATENCY_US = 3_600_000_000
SIGNIFICANT_DIGITS = 3
#: The longest the producer waits, after flush, for the client to run the last send callbacks.
CALLBACKS_SETTLE_S = 10.0

SUBSCRIPTION_TYPES = {
    "exclusive": "Exclusive",
    "shared": "Shared",
    "failover": "Failover",
    "key_shared": "KeyShared",
    "keyshared": "KeyShared",
}
COMPRESSION_TYPES = {
    "none": "NONE",
    "lz4": "LZ4",
    "zlib": "ZLib",
    "zstd": "ZSTD",
    "snappy": "SNAPPY",
}
ACCESS_MODES = {
    "shared": "Shared",
    "exclusive": "Exclusive",
    "waitforexclusive": "WaitForExclusive",
    "exclusivewithfencing": "ExclusiveWithFencing",
}


def _choice(table: dict[str, str], what: str):  # type: ignore[no-untyped-def]
    def convert(text: str) -> str:
        try:
            return table[text.lower()]
        except KeyError:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r} (one of {', '.join(sorted(set(table.values())))})"
            ) from None

    return convert


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


def _add_client_arguments(p: argparse.ArgumentParser) -> None:
    """pulsar-perf's PerformanceBaseArguments that the official Python client can honour."""
    p.add_argument(
        "topics", nargs="+", metavar="TOPIC", help="persistent://tenant/ns/topic (or a short name)"
    )
    p.add_argument(
        "-t",
        "--num-topics",
        "--num-topic",
        dest="num_topics",
        type=_positive,
        default=1,
        help="number of topics; with one TOPIC given, TOPIC-0 .. TOPIC-(N-1) [default: 1]",
    )
    p.add_argument("-u", "--service-url", default="pulsar://localhost:6650")
    p.add_argument("--auth-plugin", "--auth_plugin", dest="auth_plugin", default=None)
    p.add_argument("--auth-params", default=None, help="e.g. token:JWT or a JSON object")
    p.add_argument("--trust-cert-file", default=None)
    p.add_argument("--tls-allow-insecure", action="store_true")
    p.add_argument("--tls-enable-hostname-verification", action="store_true")
    p.add_argument("-ioThreads", "--num-io-threads", dest="io_threads", type=_positive, default=1)
    p.add_argument(
        "-lt", "--num-listener-threads", dest="listener_threads", type=_positive, default=1
    )
    p.add_argument("--listener-name", default=None)
    p.add_argument(
        "-i",
        "--stats-interval-seconds",
        dest="stats_interval_seconds",
        type=int,
        default=0,
        help="the client's own statistics log interval (0: off)",
    )
    p.add_argument(
        "-m",
        "--num-messages",
        "--messages",
        dest="num_messages",
        type=int,
        default=0,
        help="messages in total, then stop (<= 0: no limit)",
    )
    p.add_argument(
        "-time",
        "--test-duration",
        "--duration",
        dest="test_duration",
        type=float,
        default=None,
        help="seconds, then stop (<= 0: no limit) [default: 30 without -m, else no limit]",
    )
    p.add_argument(
        "--interval", type=float, default=5.0, help="seconds between reports [default: 5]"
    )
    p.add_argument(
        "--histogram-file", default=None, help="write interval histograms (HdrHistogram log)"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line too")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="perf_command", required=True, metavar="MODE")
    p = sub.add_parser("produce", help="publish messages", allow_abbrev=False)
    _add_client_arguments(p)
    p.add_argument(
        "-r",
        "--rate",
        type=float,
        default=0,
        help="messages per second across topics (0: as fast as possible)",
    )
    p.add_argument("-s", "--size", type=int, default=1024, help="message size in bytes [1024]")
    p.add_argument(
        "-n",
        "--num-producers",
        "--producers",
        dest="num_producers",
        type=_positive,
        default=1,
        help="producers per topic [default: 1]",
    )
    p.add_argument("-pn", "--producer-name", default=None, help="name prefix: NAME-<n>")
    p.add_argument("--separator", default="-", help="between a name prefix and its number")
    p.add_argument(
        "--send-timeout", type=int, default=60, help="seconds; 0: wait for ever [default: 60]"
    )
    p.add_argument(
        "-o",
        "--max-outstanding",
        "--max-pending",
        dest="max_outstanding",
        type=int,
        default=1000,
        help="messages pending per producer [default: 1000]",
    )
    p.add_argument(
        "-p", "--max-outstanding-across-partitions", dest="max_outstanding_across", type=int,
        default=50000,
    )  # fmt: skip
    p.add_argument(
        "-np",
        "--partitions",
        type=int,
        default=None,
        help="create each topic partitioned with this many partitions first (through -au)",
    )
    p.add_argument("-au", "--admin-url", default="http://localhost:8080")
    p.add_argument(
        "-z", "--compression", type=_choice(COMPRESSION_TYPES, "compression"), default="NONE"
    )
    p.add_argument("-f", "--payload-file", default=None, help="payloads from this UTF-8 file")
    p.add_argument("-e", "--payload-delimiter", default="\\n")
    p.add_argument(
        "-b",
        "--batch-time-window",
        dest="batch_time_window",
        type=float,
        default=1.0,
        help="batch messages in this many ms [default: 1]",
    )
    p.add_argument("--batch-delay-ms", dest="batch_time_window", type=float)
    p.add_argument("-db", "--disable-batching", action="store_true")
    p.add_argument(
        "--no-batching", dest="disable_batching", action="store_true", help=argparse.SUPPRESS
    )
    p.add_argument(
        "--batching", dest="disable_batching", action="store_false", help=argparse.SUPPRESS
    )
    p.add_argument("-bm", "--batch-max-messages", type=int, default=1000)
    p.add_argument("-bb", "--batch-max-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("-ch", "--chunking", action="store_true")
    p.add_argument("--warmup-time", type=float, default=1.0, help="seconds not in the latencies")
    p.add_argument("-d", "--delay", type=int, default=0, help="deliver each message after N s")
    p.add_argument("-set", "--set-event-time", action="store_true")
    p.add_argument("-ef", "--exit-on-failure", action="store_true")
    p.add_argument(
        "-mk",
        "--message-key-generation-mode",
        choices=["autoIncrement", "random"],
        default=None,
    )
    p.add_argument(
        "-am", "--access-mode", type=_choice(ACCESS_MODES, "access mode"), default="Shared"
    )

    c = sub.add_parser("consume", help="receive messages", allow_abbrev=False)
    _add_client_arguments(c)
    c.add_argument(
        "-n",
        "--num-consumers",
        "--consumers",
        dest="num_consumers",
        type=_positive,
        default=1,
        help="consumers per subscription [default: 1]",
    )
    c.add_argument(
        "-ns", "--num-subscriptions", dest="num_subscriptions", type=_positive, default=1
    )
    c.add_argument("-s", "--subscriber-name", default=None, help="subscription name prefix")
    c.add_argument(
        "-ss",
        "--subscriptions",
        "--subscription",
        dest="subscriptions",
        type=_names,
        action="extend",
        default=None,
        help="subscription names (repeat or comma-separate) [default: sub]",
    )
    c.add_argument(
        "-st",
        "--subscription-type",
        "--type",
        dest="subscription_type",
        type=_choice(SUBSCRIPTION_TYPES, "subscription type"),
        default="Exclusive",
        help="Exclusive, Shared, Failover or Key_Shared [default: Exclusive]",
    )
    c.add_argument(
        "-sp",
        "--subscription-position",
        "--initial-position",
        dest="subscription_position",
        type=_choice({"latest": "Latest", "earliest": "Earliest"}, "position"),
        default="Latest",
    )
    c.add_argument("-r", "--rate", type=float, default=0, help="slow consumer: at most msg/s")
    c.add_argument("-q", "--receiver-queue-size", type=int, default=1000)
    c.add_argument(
        "-p", "--receiver-queue-size-across-partitions", dest="receiver_queue_across", type=int,
        default=50000,
    )  # fmt: skip
    c.add_argument("-rs", "--replicated", action="store_true")
    c.add_argument("--batch-index-ack", action="store_true")


@dataclass(slots=True, frozen=True)
class Plan:
    """What a run does, resolved from the flags as pulsar-perf resolves them."""

    topics: tuple[str, ...]
    subscriptions: tuple[str, ...] = ()
    duration: float = float("inf")


def plan(args: argparse.Namespace) -> Plan:
    """Topics from ``-t``, subscriptions from ``-ss``/``-ns``/``-s``, the stop time from ``-time``.

    As pulsar-perf: one TOPIC with ``-t N`` means TOPIC-0 .. TOPIC-(N-1), otherwise the number of
    topics given must be N; one subscription name with ``-ns N`` means NAME-0 .. NAME-(N-1) (the
    name from ``-s`` when given), otherwise the names given must be N; Exclusive allows one
    consumer per subscription. Raises ValueError with the reason.
    """
    for topic in args.topics:
        if topic.startswith("-"):
            raise ValueError(f"invalid option {topic!r}; a topic of that name needs its full name")
    topics = list(args.topics)
    if len(topics) != args.num_topics:
        if len(topics) != 1:
            raise ValueError(
                f"the number of topic names ({len(topics)}) must be equal to --num-topics ({args.num_topics})"
            )
        topics = [f"{topics[0]}-{i}" for i in range(args.num_topics)]
    subscriptions: list[str] = []
    if args.perf_command == "consume":
        if args.subscription_type == "Exclusive" and args.num_consumers > 1:
            raise ValueError("only one consumer is allowed when the subscription type is Exclusive")
        subscriptions = list(args.subscriptions or ["sub"])
        if len(subscriptions) != args.num_subscriptions:
            if len(subscriptions) != 1:
                raise ValueError("the number of subscriptions must be equal to --num-subscriptions")
            prefix = args.subscriber_name or subscriptions[0]
            subscriptions = [f"{prefix}-{i}" for i in range(args.num_subscriptions)]
    if args.test_duration is None:
        duration = float("inf") if args.num_messages > 0 else 30.0
    else:
        duration = args.test_duration if args.test_duration > 0 else float("inf")
    return Plan(tuple(topics), tuple(subscriptions), duration)


def _histogram() -> HdrHistogram:
    return HdrHistogram(1, MAX_LATENCY_US, SIGNIFICANT_DIGITS)


@dataclass
class Recorder:
    """Counters and two latency histograms (this interval, the whole run), thread-safe.

    The client's callbacks run on its own threads. Latencies are microseconds.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0
    size: int = 0
    failed: int = 0
    interval: HdrHistogram = field(default_factory=_histogram)
    cumulative: HdrHistogram = field(default_factory=_histogram)

    def record(self, size: int, latency_us: int | None) -> None:
        with self.lock:
            self.count += 1
            self.size += size
            if latency_us is not None:
                value = min(max(latency_us, 1), MAX_LATENCY_US)
                self.interval.record_value(value)
                self.cumulative.record_value(value)

    def answered(self) -> int:
        """Sends told so far, stored or failed."""
        with self.lock:
            return self.count + self.failed

    def fail(self) -> None:
        with self.lock:
            self.failed += 1

    def take_interval(self) -> HdrHistogram:
        """The interval's histogram; a fresh one starts."""
        with self.lock:
            taken, self.interval = self.interval, _histogram()
        return taken


def latency_figures(histogram: HdrHistogram) -> dict[str, float]:
    """Mean, percentiles and max in milliseconds (0 for an empty histogram, as pulsar-perf)."""

    def ms(value: float) -> float:
        return round(value / 1000.0, 3)

    if histogram.get_total_count() == 0:
        return dict.fromkeys(("mean", "p50", "p95", "p99", "p999", "p9999", "p99999", "max"), 0.0)
    return {
        "mean": ms(histogram.get_mean_value()),
        "p50": ms(histogram.get_value_at_percentile(50)),
        "p95": ms(histogram.get_value_at_percentile(95)),
        "p99": ms(histogram.get_value_at_percentile(99)),
        "p999": ms(histogram.get_value_at_percentile(99.9)),
        "p9999": ms(histogram.get_value_at_percentile(99.99)),
        "p99999": ms(histogram.get_value_at_percentile(99.999)),
        "max": ms(histogram.get_max_value()),
    }


def latency_line(figures: dict[str, float], *, with_p99999: bool = False) -> str:
    """pulsar-perf's latency part of a line, in milliseconds."""
    p99999 = f" - 99.999pct: {figures['p99999']:7.3f}" if with_p99999 else ""
    return (
        f"Latency: mean: {figures['mean']:7.3f} ms - med: {figures['p50']:7.3f}"
        f" - 95pct: {figures['p95']:7.3f} - 99pct: {figures['p99']:7.3f}"
        f" - 99.9pct: {figures['p999']:7.3f} - 99.99pct: {figures['p9999']:7.3f}"
        f"{p99999} - Max: {figures['max']:7.3f}"
    )


def run(args: argparse.Namespace) -> int:
    try:
        the_plan = plan(args)
    except ValueError as e:
        print(f"magnetar perf: {e}", file=sys.stderr)
        return 2
    try:
        import pulsar
    except ImportError:
        print("magnetar perf needs the official client: pip install pulsar-client", file=sys.stderr)
        return 2
    if args.perf_command == "produce" and args.partitions:
        try:
            for topic in the_plan.topics:
                _create_partitioned(args.admin_url, topic, args.partitions)
        except ValueError as e:
            print(f"magnetar perf: {e}", file=sys.stderr)
            return 1
    # The client's own logger: a Python logger here makes the client abort at exit
    # (apache/pulsar-client-python#256).
    quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    client_args: dict[str, Any] = {
        "operation_timeout_seconds": 30,
        "logger": quiet,
        "io_threads": args.io_threads,
        "message_listener_threads": args.listener_threads,
        "tls_allow_insecure_connection": args.tls_allow_insecure,
        "tls_validate_hostname": args.tls_enable_hostname_verification,
    }
    if args.stats_interval_seconds > 0:
        client_args["stats_interval_in_seconds"] = args.stats_interval_seconds
    if args.trust_cert_file:
        client_args["tls_trust_certs_file_path"] = args.trust_cert_file
    if args.listener_name:
        client_args["listener_name"] = args.listener_name
    if args.auth_plugin:
        client_args["authentication"] = pulsar.Authentication(
            args.auth_plugin, args.auth_params or ""
        )
    client = pulsar.Client(args.service_url, **client_args)
    recorder = Recorder()
    histogram_log = open(args.histogram_file, "w") if args.histogram_file else None
    try:
        if args.perf_command == "produce":
            return _produce(pulsar, client, args, the_plan, recorder, histogram_log)
        return _consume(pulsar, client, args, the_plan, recorder, histogram_log)
    finally:
        client.close()
        if histogram_log is not None:
            histogram_log.close()


def _create_partitioned(admin_url: str, topic: str, partitions: int) -> None:
    """PUT .../partitions, as pulsar-perf's ``-np`` does; an existing one must have as many."""
    name = topic if "://" in topic else f"persistent://public/default/{topic}"
    try:
        url = f"{admin_url.rstrip('/')}/admin/v2/{topic_path(topic)}/partitions"
    except UsageError as e:
        raise ValueError(str(e)) from None
    request = urllib.request.Request(
        url,
        data=str(partitions).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(request, timeout=30).close()
        return
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise ValueError(f"cannot create {name}: HTTP {e.code} {e.reason}") from None
    except OSError as e:
        raise ValueError(f"cannot reach {admin_url}: {e}") from None
    with urllib.request.urlopen(url, timeout=30) as answer:
        existing = json.loads(answer.read())["partitions"]
    if existing != partitions:
        raise ValueError(
            f"topic {name} already exists with {existing} partitions, expecting {partitions}"
        )


class _Reporter:
    """Prints pulsar-perf's periodic line from a thread; joined before the final lines.

    With ``--histogram-file`` each interval's histogram is also written as an HdrHistogram log
    (the format HdrHistogram's tools read; values in microseconds, times from the run's start).
    """

    def __init__(self, args: argparse.Namespace, recorder: Recorder, verb: str, log) -> None:  # type: ignore[no-untyped-def]
        self.args, self.recorder, self.verb = args, recorder, verb
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.writer = HistogramLogWriter(log) if log is not None else None
        if self.writer is not None:
            self.writer.output_log_format_version()
            self.writer.base_time = int(time.time() * 1000)
            self.writer.output_base_time(self.writer.base_time)
            self.writer.output_legend()

    def __enter__(self) -> _Reporter:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()  # its last line must not come after the summary

    def _loop(self) -> None:
        last_count, last_size, last_time = 0, 0, time.monotonic()
        last_ms = int(time.time() * 1000)
        while not self.done.wait(self.args.interval):
            now = time.monotonic()
            with self.recorder.lock:
                count, size, failed = self.recorder.count, self.recorder.size, self.recorder.failed
            histogram = self.recorder.take_interval()
            elapsed = now - last_time
            rate = (count - last_count) / elapsed
            mbit = (size - last_size) / elapsed / 1024 / 1024 * 8
            failure = f" --- failure {failed:7d} msg" if self.verb == "produced" else ""
            print(
                f"Throughput {self.verb}: {count:7d} msg --- {rate:8.1f} msg/s --- {mbit:8.1f} Mbit/s"
                f"{failure} --- {latency_line(latency_figures(histogram))}",
                flush=True,
            )
            if self.writer is not None:
                now_ms = int(time.time() * 1000)
                histogram.set_start_time_stamp(last_ms)
                histogram.set_end_time_stamp(now_ms)
                self.writer.output_interval_histogram(histogram, max_value_unit_ratio=1000.0)
                last_ms = now_ms
            last_count, last_size, last_time = count, size, now


def _summary(args: argparse.Namespace, recorder: Recorder, elapsed: float, verb: str) -> None:
    # Under the recorder's lock: the client may still be running callbacks of the last
    # messages on its own threads, and a histogram must not change while it is read.
    with recorder.lock:
        figures = latency_figures(recorder.cumulative)
        samples = recorder.cumulative.get_total_count()
        count, size, failed = recorder.count, recorder.size, recorder.failed
    rate = count / elapsed if elapsed > 0 else 0.0
    mbit = size / elapsed / 1024 / 1024 * 8 if elapsed > 0 else 0.0
    tail = (
        f" --- AckRate: {rate:.1f} msg/s --- ack failed {failed} msg" if verb == "received" else ""
    )
    print(
        f"Aggregated throughput stats --- {count} records {verb} --- {rate:.3f} msg/s"
        f" --- {mbit:.3f} Mbit/s{tail}",
        flush=True,
    )
    print(
        f"Aggregated latency stats --- {latency_line(figures, with_p99999=True)}",
        flush=True,
    )
    if args.json:
        result = {
            "mode": args.perf_command,
            "messages": count,
            "failed": failed,
            "latency_samples": samples,
            "seconds": round(elapsed, 3),
            "msg_per_s": round(rate, 1),
            "mb_per_s": round(size / elapsed / 1e6, 3) if elapsed > 0 else 0.0,
            "mbit_per_s": round(mbit, 3),
            "latency_ms": figures,
        }
        print(json.dumps(result), flush=True)


def _payloads(args: argparse.Namespace) -> list[bytes]:
    if args.payload_file is None:
        return [os.urandom(args.size)]
    try:
        with open(args.payload_file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read the payload file: {e}") from None
    delimiter = "\n" if args.payload_delimiter == "\\n" else args.payload_delimiter
    payloads = [line.encode() for line in text.split(delimiter) if line]
    if not payloads:
        raise ValueError(f"the payload file {args.payload_file} is empty")
    return payloads


def _produce(pulsar, client, args, the_plan: Plan, recorder: Recorder, log) -> int:  # type: ignore[no-untyped-def]
    import datetime
    import random

    try:
        payloads = _payloads(args)
    except ValueError as e:
        print(f"magnetar perf: {e}", file=sys.stderr)
        return 2
    batching = not args.disable_batching and not args.chunking
    producers = []
    for topic in the_plan.topics:
        for n in range(args.num_producers):
            options: dict[str, Any] = {
                "batching_enabled": batching,
                "batching_max_publish_delay_ms": max(int(args.batch_time_window), 1),
                "batching_max_messages": args.batch_max_messages,
                "batching_max_allowed_size_in_bytes": args.batch_max_bytes,
                "chunking_enabled": args.chunking,
                "max_pending_messages": args.max_outstanding,
                "max_pending_messages_across_partitions": args.max_outstanding_across,
                "block_if_queue_full": True,
                "send_timeout_millis": args.send_timeout * 1000,
                "compression_type": getattr(pulsar.CompressionType, args.compression),
                "access_mode": getattr(pulsar.ProducerAccessMode, args.access_mode),
            }
            if args.producer_name:
                options["producer_name"] = f"{args.producer_name}{args.separator}{n}"
            try:
                producers.append(client.create_producer(topic, **options))
            except pulsar.PulsarException as e:
                print(
                    f"magnetar perf: cannot create a producer on {topic}: {type(e).__name__}: {e}",
                    file=sys.stderr,
                )
                return 1
    failed_hard = threading.Event()
    sent = 0
    started = time.monotonic()
    warmup_end = started + args.warmup_time
    deadline = started + the_plan.duration

    def callback(result, _msg_id, sent_at: float, size: int) -> None:  # type: ignore[no-untyped-def]
        if result == pulsar.Result.Ok:
            now = time.monotonic()
            recorder.record(size, int((now - sent_at) * 1e6) if now > warmup_end else None)
        else:
            recorder.fail()
            if args.exit_on_failure:
                failed_hard.set()

    send_options: dict[str, Any] = {}
    if args.delay > 0:
        send_options["deliver_after"] = datetime.timedelta(seconds=args.delay)
    with _Reporter(args, recorder, "produced", log):
        while (args.num_messages <= 0 or sent < args.num_messages) and time.monotonic() < deadline:
            if failed_hard.is_set():
                break
            if args.rate > 0:
                delay = started + sent / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            payload = payloads[0] if len(payloads) == 1 else random.choice(payloads)
            if args.message_key_generation_mode == "autoIncrement":
                send_options["partition_key"] = str(sent)
            elif args.message_key_generation_mode == "random":
                send_options["partition_key"] = str(random.getrandbits(31))
            if args.set_event_time:
                send_options["event_timestamp"] = int(time.time() * 1000)
            sent_at, size = time.monotonic(), len(payload)
            producers[sent % len(producers)].send_async(
                payload,
                lambda r, m, t=sent_at, s=size: callback(r, m, t, s),
                **send_options,
            )
            sent += 1
        for producer in producers:
            producer.flush()
        elapsed = time.monotonic() - started
        # flush returns once the broker acknowledged everything, but the client may still be
        # running the last callbacks on its own thread: count them all before the summary.
        settled_by = time.monotonic() + CALLBACKS_SETTLE_S
        while recorder.answered() < sent and time.monotonic() < settled_by:
            time.sleep(0.005)
    _summary(args, recorder, elapsed, "sent")
    return 0 if recorder.failed == 0 else 1


def _consume(pulsar, client, args, the_plan: Plan, recorder: Recorder, log) -> int:  # type: ignore[no-untyped-def]
    consumer_type = getattr(pulsar.ConsumerType, args.subscription_type)
    consumers = []
    for topic in the_plan.topics:
        for subscription in the_plan.subscriptions:
            for _ in range(args.num_consumers):
                try:
                    consumers.append(
                        client.subscribe(
                            topic,
                            subscription,
                            consumer_type=consumer_type,
                            initial_position=getattr(
                                pulsar.InitialPosition, args.subscription_position
                            ),
                            receiver_queue_size=args.receiver_queue_size,
                            max_total_receiver_queue_size_across_partitions=args.receiver_queue_across,
                            replicate_subscription_state_enabled=args.replicated,
                            batch_index_ack_enabled=args.batch_index_ack,
                        )
                    )
                except pulsar.PulsarException as e:
                    print(
                        f"magnetar perf: cannot subscribe to {topic} as {subscription}: "
                        f"{type(e).__name__}: {e}",
                        file=sys.stderr,
                    )
                    return 1
    started = time.monotonic()
    deadline = started + the_plan.duration
    # One thread per consumer, as pulsar-perf polls: a consumer with nothing to receive must not
    # hold up one that has a queue full.
    stop = threading.Event()
    claimed = [0]
    claim_lock = threading.Lock()

    def claim() -> int | None:
        """The number of this message in the run, or None when -m is reached."""
        with claim_lock:
            if args.num_messages > 0 and claimed[0] >= args.num_messages:
                return None
            claimed[0] += 1
            return claimed[0]

    def poll(consumer) -> None:  # type: ignore[no-untyped-def]
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            number = claim()
            if number is None:  # beyond -m: left unacknowledged, redelivered to the next run
                stop.set()
                return
            if args.rate > 0:
                delay = started + number / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            # End to end: from the producer's publish time to now (same machine clocks).
            latency_us = int((time.time() - message.publish_timestamp() / 1000) * 1e6)
            recorder.record(len(message.data()), latency_us if latency_us >= 0 else None)
            try:
                consumer.acknowledge(message)
            except pulsar.PulsarException:
                recorder.fail()
            if args.num_messages > 0 and number >= args.num_messages:
                stop.set()

    with _Reporter(args, recorder, "received", log):
        pollers = [threading.Thread(target=poll, args=(c,), daemon=True) for c in consumers]
        for poller in pollers:
            poller.start()
        for poller in pollers:
            poller.join()
        elapsed = time.monotonic() - started
    _summary(args, recorder, elapsed, "received")
    return 0
