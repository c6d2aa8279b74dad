"""Rates from counter deltas, and Pulsar's families summed per namespace when topic-level
metrics are off, without a broker process (stand-in topics carry the counters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from magnetar.broker.cluster.resource_usage import ResourceUsage
from magnetar.broker.ledger.ml_stats import ENTRY_SIZE_BOUNDS, LATENCY_BOUNDS_MS, Buckets
from magnetar.broker.metrics import (
    ENTRY_SIZE_NAMES,
    ML_BUCKET_FAMILIES,
    WRITE_LATENCY_NAMES,
    BrokerMetrics,
    CounterRates,
)
from magnetar.broker.model.topic_name import TopicName


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_first_rate_is_the_average_since_loaded_then_deltas_between_scrapes() -> None:
    clock = Clock()
    rates = CounterRates(min_window_s=1.0, clock=clock)
    key = object()
    assert rates.rates(key, (50, 500), since=90.0) == (5.0, 50.0)
    clock.now = 102.0
    assert rates.rates(key, (70, 500), since=90.0) == (10.0, 0.0)
    clock.now = 102.5  # too soon: the previous rates, the window is not reset
    assert rates.rates(key, (1000, 500), since=90.0) == (10.0, 0.0)
    clock.now = 104.0
    assert rates.rates(key, (1000, 500), since=90.0) == (465.0, 0.0)


def test_deltas_are_the_growth_of_the_window_rates_share() -> None:
    clock = Clock()
    rates = CounterRates(min_window_s=1.0, clock=clock)
    key = object()
    assert rates.deltas(key, (3, 7), since=98.0) == (3, 7)
    clock.now = 101.0
    assert rates.deltas(key, (5, 7), since=98.0) == (2, 0)
    assert rates.rates(key, (9, 9), since=98.0) == (2.0, 0.0)  # same window: same answer


def test_buckets_put_a_bound_in_its_own_bucket_as_pulsar_ranges_do() -> None:
    """Pulsar's ranges are (lower, upper]: 0.5 ms is in le_0_5, 0.51 ms in le_1, and what
    passes the last bound in the overflow."""
    latency = Buckets(LATENCY_BOUNDS_MS)
    for seconds in (0.0005, 0.00051, 0.001, 2.0):
        latency.add_latency(seconds)
    assert latency.counts == [1, 2, 0, 0, 0, 0, 0, 0, 0, 1]
    assert latency.count == 4 and round(latency.sum) == 500 + 510 + 1000 + 2_000_000  # µs
    size = Buckets(ENTRY_SIZE_BOUNDS)
    for n in (128, 129, 1_048_576, 1_048_577):
        size.add(n)
    assert size.counts == [1, 1, 0, 0, 0, 0, 0, 1, 1]


def test_pulsars_bucket_names_and_quantile_labels() -> None:
    assert WRITE_LATENCY_NAMES[0] == "pulsar_storage_write_latency_le_0_5"
    assert WRITE_LATENCY_NAMES[-2:] == (
        "pulsar_storage_write_latency_le_1000",
        "pulsar_storage_write_latency_overflow",
    )
    assert ENTRY_SIZE_NAMES[2] == "pulsar_entry_size_le_1_kb"
    assert ENTRY_SIZE_NAMES[-2:] == ("pulsar_entry_size_le_1_mb", "pulsar_entry_size_le_overflow")
    quantiles = {name: q for name, _, _, q in ML_BUCKET_FAMILIES}
    assert quantiles["pulsar_ml_AddEntryLatencyBuckets"][:2] == ("0.0_0.5", "0.5_1.0")
    assert quantiles["pulsar_ml_AddEntryLatencyBuckets"][-1] == "200.0_1000.0"
    assert quantiles["pulsar_ml_EntrySizeBuckets"][-1] == "102400.0_1048576.0"


def test_objects_not_asked_about_are_forgotten() -> None:
    clock = Clock()
    rates = CounterRates(clock=clock)
    gone, kept = object(), object()
    rates.rates(gone, (1,), since=99.0)
    rates.rates(kept, (1,), since=99.0)
    rates.forget_unseen()
    rates.rates(kept, (2,), since=99.0)
    rates.forget_unseen()
    clock.now = 110.0
    # Seen again after being forgotten: counted as new (average since loaded), not a delta.
    assert rates.rates(gone, (11,), since=100.0) == (1.1,)


@dataclass(eq=False)
class FakeTopic:
    name: TopicName
    messages_in: int
    bytes_in: int
    msg_out: int = 0
    bytes_out: int = 0
    loaded_at: float = 0.0
    producers: list[Any] = field(default_factory=list)
    subscriptions: dict[str, Any] = field(default_factory=dict)

    @property
    def msg_in(self) -> int:
        return self.messages_in


def _broker(*topics: FakeTopic) -> Any:
    return SimpleNamespace(
        config=SimpleNamespace(cluster_name="c1"),
        topics={str(t.name): t for t in topics},
        info=SimpleNamespace(broker_id="b1:8080"),
        ownership=None,
        load_manager=None,
        authentication=SimpleNamespace(
            successes={("AuthenticationProviderToken", "token"): 2}, refusals={}
        ),
        resource_usage=ResourceUsage(cpu=12.5, memory=40.0),
        topic_loads_pending=0,
    )


def _samples(metrics: BrokerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_namespace_level_sums_topics_and_leaves_out_subscriptions() -> None:
    metrics = BrokerMetrics()
    metrics.bind(
        _broker(
            FakeTopic(TopicName.parse("non-persistent://t/a/x"), 3, 30),
            FakeTopic(TopicName.parse("non-persistent://t/a/y"), 4, 40),
            FakeTopic(TopicName.parse("non-persistent://t/b/z"), 5, 50),
        ),
        topic_level=False,
    )
    samples = _samples(metrics)
    a = frozenset({"cluster": "c1", "namespace": "t/a"}.items())
    b = frozenset({"cluster": "c1", "namespace": "t/b"}.items())
    assert samples[("pulsar_in_messages_total", a)] == 7
    assert samples[("pulsar_in_bytes_total", a)] == 70
    assert samples[("pulsar_in_messages_total", b)] == 5
    assert samples[("pulsar_topics_count", a)] == 2
    assert not any("topic" in dict(labels) for _, labels in samples)
    assert not any(name.startswith("pulsar_subscription_") for name, _ in samples)
    assert samples[("pulsar_broker_topics_count", frozenset({("cluster", "c1")}))] == 3
    # No ownership store, no load manager: nothing owned, not the leader.
    me = frozenset({"cluster": "c1", "broker": "b1:8080"}.items())
    assert samples[("magnetar_broker_owned_bundles", me)] == 0
    assert samples[("magnetar_load_manager_leader", me)] == 0


def test_bind_twice_keeps_one_collector() -> None:
    metrics = BrokerMetrics()
    broker = _broker()
    assert metrics.bind(broker) is metrics.bind(broker)
    generate_latest(metrics.registry)  # no duplicate families
