"""Rates from counter deltas, and Pulsar's families summed per namespace when topic-level
metrics are off, without a broker process (stand-in topics carry the counters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from magnetar.broker.metrics import BrokerMetrics, CounterRates
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
