"""`magnetar perf` takes pulsar-perf's flags with pulsar-perf's meanings (and its own older names).

Each flag form is parsed here; the run itself is tested against a standalone in
tests/integration/test_perf_cli.py.
"""

from __future__ import annotations

import argparse

import pytest
from hdrh.histogram import HdrHistogram

from magnetar import perf


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="magnetar perf")
    perf.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["-r", "500"], "rate", 500.0),
        (["--rate", "500"], "rate", 500.0),
        (["-s", "100"], "size", 100),
        (["--size", "100"], "size", 100),
        (["-n", "3"], "num_producers", 3),
        (["--num-producers", "3"], "num_producers", 3),
        (["--producers", "3"], "num_producers", 3),
        (["-m", "42"], "num_messages", 42),
        (["--num-messages", "42"], "num_messages", 42),
        (["--messages", "42"], "num_messages", 42),
        (["-time", "7"], "test_duration", 7.0),
        (["--test-duration", "7"], "test_duration", 7.0),
        (["--duration", "7"], "test_duration", 7.0),
        (["-u", "pulsar://h:6651"], "service_url", "pulsar://h:6651"),
        (["--service-url", "pulsar://h:6651"], "service_url", "pulsar://h:6651"),
        (["-b", "5"], "batch_time_window", 5.0),
        (["--batch-time-window", "0.5"], "batch_time_window", 0.5),
        (["--batch-delay-ms", "5"], "batch_time_window", 5.0),
        (["-db"], "disable_batching", True),
        (["--disable-batching"], "disable_batching", True),
        (["--no-batching"], "disable_batching", True),
        (["-bm", "10"], "batch_max_messages", 10),
        (["-bb", "2048"], "batch_max_bytes", 2048),
        (["-o", "50"], "max_outstanding", 50),
        (["--max-pending", "50"], "max_outstanding", 50),
        (["-p", "70"], "max_outstanding_across", 70),
        (["-np", "4"], "partitions", 4),
        (["-au", "http://h:8081"], "admin_url", "http://h:8081"),
        (["-z", "lz4"], "compression", "LZ4"),
        (["--compression", "ZLIB"], "compression", "ZLib"),
        (["-pn", "bench"], "producer_name", "bench"),
        (["-ch"], "chunking", True),
        (["-d", "3"], "delay", 3),
        (["-set"], "set_event_time", True),
        (["-ef"], "exit_on_failure", True),
        (["-mk", "autoIncrement"], "message_key_generation_mode", "autoIncrement"),
        (["-am", "WaitForExclusive"], "access_mode", "WaitForExclusive"),
        (["--warmup-time", "0"], "warmup_time", 0.0),
        (["-f", "p.txt", "-e", ";"], "payload_delimiter", ";"),
        (["-t", "2"], "num_topics", 2),
        (["-ioThreads", "2"], "io_threads", 2),
        (["-lt", "2"], "listener_threads", 2),
        (["-i", "60"], "stats_interval_seconds", 60),
        (["--histogram-file", "h.hlog"], "histogram_file", "h.hlog"),
        (
            ["--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationToken"],
            "auth_plugin",
            "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        ),
        (["--auth-params", "token:abc"], "auth_params", "token:abc"),
    ],
)
def test_produce_flags(argv: list[str], field: str, value: object) -> None:
    args = parse("produce", *argv, "my-topic")
    assert getattr(args, field) == value
    assert args.topics == ["my-topic"]


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["-n", "2", "-st", "Shared"], "num_consumers", 2),
        (["--num-consumers", "2", "-st", "Shared"], "num_consumers", 2),
        (["--consumers", "2", "-st", "Shared"], "num_consumers", 2),
        (["-st", "Key_Shared"], "subscription_type", "KeyShared"),
        (["--subscription-type", "Failover"], "subscription_type", "Failover"),
        (["--type", "KeyShared"], "subscription_type", "KeyShared"),
        (["-ss", "a,b", "-ns", "2"], "subscriptions", ["a", "b"]),
        (["-ss", "a", "-ss", "b", "-ns", "2"], "subscriptions", ["a", "b"]),
        (["--subscriptions", "a"], "subscriptions", ["a"]),
        (["--subscription", "a"], "subscriptions", ["a"]),
        (["-ns", "3"], "num_subscriptions", 3),
        (["-s", "pre"], "subscriber_name", "pre"),
        (["-sp", "Earliest"], "subscription_position", "Earliest"),
        (["--subscription-position", "Latest"], "subscription_position", "Latest"),
        (["--initial-position", "earliest"], "subscription_position", "Earliest"),
        (["-r", "10"], "rate", 10.0),
        (["-q", "10"], "receiver_queue_size", 10),
        (["-p", "100"], "receiver_queue_across", 100),
        (["-m", "5"], "num_messages", 5),
        (["-time", "5"], "test_duration", 5.0),
        (["-u", "pulsar://h:1"], "service_url", "pulsar://h:1"),
        (["-rs"], "replicated", True),
        (["--batch-index-ack"], "batch_index_ack", True),
    ],
)
def test_consume_flags(argv: list[str], field: str, value: object) -> None:
    args = parse("consume", *argv, "persistent://public/default/t")
    assert getattr(args, field) == value
    perf.plan(args)  # every combination above is a valid run


def test_defaults_are_pulsar_perfs_where_the_run_allows() -> None:
    args = parse("produce", "t")
    assert (args.size, args.num_producers, args.batch_time_window) == (1024, 1, 1.0)
    assert (args.disable_batching, args.batch_max_messages, args.warmup_time) == (False, 1000, 1.0)
    consume = parse("consume", "t")
    assert consume.subscription_type == "Exclusive"
    assert consume.subscription_position == "Latest"
    assert perf.plan(consume).subscriptions == ("sub",)


def test_topics_and_subscriptions_expand_as_pulsar_perf() -> None:
    produce = perf.plan(parse("produce", "-t", "3", "orders"))
    assert produce.topics == ("orders-0", "orders-1", "orders-2")
    assert perf.plan(parse("produce", "-t", "2", "a", "b")).topics == ("a", "b")
    consume = perf.plan(parse("consume", "-ns", "2", "-ss", "audit", "t"))
    assert consume.subscriptions == ("audit-0", "audit-1")
    assert perf.plan(parse("consume", "-ns", "2", "-s", "pre", "t")).subscriptions == (
        "pre-0",
        "pre-1",
    )


def test_durations() -> None:
    assert perf.plan(parse("produce", "t")).duration == 30.0
    assert perf.plan(parse("produce", "-m", "10", "t")).duration == float("inf")
    assert perf.plan(parse("produce", "-time", "0", "t")).duration == float("inf")
    assert perf.plan(parse("produce", "-time", "-1", "t")).duration == float("inf")
    assert perf.plan(parse("produce", "-time", "4", "t")).duration == 4.0


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["produce", "-t", "3", "a", "b"], "must be equal to --num-topics"),
        (["consume", "-n", "2", "t"], "only one consumer is allowed"),
        (["consume", "-ss", "a,b", "-ns", "3", "t"], "equal to --num-subscriptions"),
    ],
)
def test_invalid_combinations_are_refused_with_the_reason(argv: list[str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        perf.plan(parse(*argv))


@pytest.mark.parametrize(
    "argv",
    [
        ["consume", "-st", "Keyshard", "t"],
        ["produce", "-z", "gzip", "t"],
        ["produce", "-n", "0", "t"],
        ["produce", "-mk", "sequential", "t"],
        ["produce", "-tim", "3", "t"],  # no abbreviations: -time only
    ],
)
def test_bad_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(*argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_recorder_keeps_latencies_in_bounded_histograms() -> None:
    recorder = perf.Recorder()
    size_before = len(recorder.cumulative.counts)
    for i in range(1, 200_001):
        recorder.record(10, i)  # 1 us .. 200 ms
    recorder.record(10, 10 * perf.MAX_LATENCY_US)  # clamped, not lost
    recorder.record(10, None)  # counted, no latency (warm-up)
    assert len(recorder.cumulative.counts) == size_before
    assert (recorder.count, recorder.size) == (200_002, 2_000_020)
    assert recorder.cumulative.get_total_count() == 200_001
    figures = perf.latency_figures(recorder.cumulative)
    assert figures["p50"] == pytest.approx(100.0, rel=0.01)
    assert figures["p99"] == pytest.approx(198.0, rel=0.01)
    assert figures["max"] == pytest.approx(perf.MAX_LATENCY_US / 1000, rel=0.001)
    interval = recorder.take_interval()
    assert isinstance(interval, HdrHistogram) and interval.get_total_count() == 200_001
    assert recorder.interval.get_total_count() == 0
    assert perf.latency_figures(recorder.interval)["mean"] == 0.0


def test_latency_line_has_pulsar_perfs_figures() -> None:
    histogram = perf.Recorder().cumulative
    for value in (1000, 2000, 3000):
        histogram.record_value(value)
    line = perf.latency_line(perf.latency_figures(histogram), with_p99999=True)
    for label in (
        "mean:",
        "med:",
        "95pct:",
        "99pct:",
        "99.9pct:",
        "99.99pct:",
        "99.999pct:",
        "Max:",
    ):
        assert label in line
    assert "mean:   2.000 ms" in line
