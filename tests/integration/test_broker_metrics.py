"""The broker's Prometheus ``/metrics`` with Pulsar's names, scraped from a real standalone after
the official client produced and consumed."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pulsar
from prometheus_client.parser import text_string_to_metric_families

from tests.support.standalone import StandaloneProcess, client

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

TOPIC = "persistent://public/default/metrics-flow"
BATCHED = "persistent://public/default/metrics-batched"
CLUSTER = "standalone"


def _scrape(node: StandaloneProcess) -> Samples:
    url = f"http://127.0.0.1:{node.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, (
        f"{name}{labels} not scraped; got {sorted(k for k in samples if k[0] == name)}"
    )
    return samples[key]


def _topic(topic: str) -> dict[str, str]:
    return {"cluster": CLUSTER, "namespace": "public/default", "topic": topic}


def _eventually(node: StandaloneProcess, check: Callable[[Samples], bool]) -> Samples:
    deadline = time.monotonic() + 10
    while True:
        samples = _scrape(node)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def test_topic_and_subscription_metrics_count_what_was_produced_and_consumed(
    standalone: StandaloneProcess,
) -> None:
    n = 25
    c = client(standalone)
    try:
        consumer = c.subscribe(TOPIC, "dash", receiver_queue_size=100)
        producer = c.create_producer(TOPIC, batching_enabled=False)
        for i in range(n):
            producer.send(f"m-{i}".encode())

        sub = {**_topic(TOPIC), "subscription": "dash"}
        before = _scrape(standalone)
        assert _value(before, "pulsar_in_messages_total", **_topic(TOPIC)) == n
        assert _value(before, "pulsar_in_bytes_total", **_topic(TOPIC)) > 0
        assert _value(before, "pulsar_msg_backlog", **_topic(TOPIC)) == n
        assert _value(before, "pulsar_subscription_back_log", **sub) == n
        assert _value(before, "pulsar_storage_size", **_topic(TOPIC)) > 0
        assert _value(before, "pulsar_producers_count", **_topic(TOPIC)) == 1
        assert _value(before, "pulsar_consumers_count", **_topic(TOPIC)) == 1
        assert _value(before, "pulsar_subscriptions_count", **_topic(TOPIC)) == 1
        assert _value(before, "pulsar_subscription_consumers_count", **sub) == 1
        # First scrape of a topic: rates are its averages since it was loaded.
        assert _value(before, "pulsar_rate_in", **_topic(TOPIC)) > 0
        assert _value(before, "pulsar_throughput_in", **_topic(TOPIC)) > 0
        for name in ("pulsar_rate_out", "pulsar_throughput_out", "pulsar_storage_write_rate"):
            assert _value(before, name, **_topic(TOPIC)) >= 0
        for name in ("pulsar_subscription_msg_rate_out", "pulsar_subscription_msg_throughput_out"):
            assert _value(before, name, **sub) >= 0
        assert _value(before, "pulsar_topics_count", cluster=CLUSTER, namespace="public/default")
        assert _value(before, "pulsar_broker_topics_count", cluster=CLUSTER) >= 1
        assert _value(before, "pulsar_broker_msg_backlog", cluster=CLUSTER) >= n

        for _ in range(n):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        after = _eventually(
            standalone,
            lambda s: s.get(("pulsar_subscription_back_log", frozenset(sub.items()))) == 0,
        )
        assert _value(after, "pulsar_subscription_back_log", **sub) == 0
        assert _value(after, "pulsar_msg_backlog", **_topic(TOPIC)) == 0
        assert _value(after, "pulsar_subscription_unacked_messages", **sub) == 0
        assert _value(after, "pulsar_out_messages_total", **_topic(TOPIC)) == n
        assert _value(after, "pulsar_out_bytes_total", **_topic(TOPIC)) == _value(
            after, "pulsar_in_bytes_total", **_topic(TOPIC)
        )
        assert _value(after, "pulsar_in_messages_total", **_topic(TOPIC)) == n

        # A batch counts each of its messages, as Pulsar's msgInCounter does.
        batched = c.create_producer(
            BATCHED,
            batching_enabled=True,
            batching_max_messages=10,
            batching_max_publish_delay_ms=50,
        )
        for i in range(30):
            batched.send_async(f"b-{i}".encode(), None)
        batched.flush()
        samples = _scrape(standalone)
        assert _value(samples, "pulsar_in_messages_total", **_topic(BATCHED)) == 30
        assert (
            _value(samples, "pulsar_topics_count", cluster=CLUSTER, namespace="public/default") == 2
        )
    finally:
        c.close()


def test_bundle_ownership_and_load_manager_metrics(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer(TOPIC, batching_enabled=False)
        consumer = c.subscribe(TOPIC, "dash", consumer_type=pulsar.ConsumerType.Shared)
        producer.send(b"one")
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        samples = _eventually(
            standalone,
            lambda s: any(k[0] == "magnetar_load_manager_leader" and v == 1 for k, v in s.items()),
        )
    finally:
        c.close()
    (broker,) = {
        dict(labels)["broker"] for name, labels in samples if name == "magnetar_load_manager_leader"
    }
    me = {"cluster": CLUSTER, "broker": broker}
    # A cluster of one: this broker is the leader and owns the bundle of the topic it serves.
    assert _value(samples, "magnetar_load_manager_leader", **me) == 1
    owned = _value(samples, "magnetar_broker_owned_bundles", **me)
    assert owned >= 1
    bundles = {
        dict(labels)["bundle"]: value
        for (name, labels), value in samples.items()
        if name == "pulsar_bundle_topics_count"
    }
    assert len(bundles) == owned
    assert all(b.startswith("public/default/0x") for b in bundles)
    topics = _value(samples, "pulsar_topics_count", cluster=CLUSTER, namespace="public/default")
    assert sum(bundles.values()) == topics
    for name in (
        "pulsar_bundle_msg_rate_in",
        "pulsar_bundle_msg_rate_out",
        "pulsar_bundle_msg_throughput_in",
        "pulsar_bundle_msg_throughput_out",
        "pulsar_bundle_producer_count",
        "pulsar_bundle_consumer_count",
    ):
        assert sum(v for (n, _), v in samples.items() if n == name) >= 0
        assert any(n == name for n, _ in samples)
    # No shedding or splitting with one broker and no thresholds passed.
    unloading = {"cluster": CLUSTER, "metric": "bundleUnloading"}
    assert _value(samples, "pulsar_lb_unload_bundle_total", **unloading) == 0
    assert _value(samples, "pulsar_lb_unload_broker_total", **unloading) == 0
    split = {"cluster": CLUSTER, "metric": "bundlesSplit"}
    assert _value(samples, "pulsar_lb_bundles_split_total", **split) == 0
