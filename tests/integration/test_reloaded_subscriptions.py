"""Durable subscriptions survive a reload of their topic (issue 16, item 1).

A subscription whose consumer left keeps its cursor; when the topic is loaded again (admin
unload, broker restart, bundle moved to another broker) that cursor is a subscription again at
once, without waiting for a consumer: listed, in stats and internalStats, in the metrics,
expired by the namespace's TTL, holding back retention, removable by the admin API and by
UNSUBSCRIBE. Until a consumer comes its mode is unknown (stats say ``None``, as Pulsar's do)
and the next consumer may use any mode.

Each reload kind runs the same scenario on a subscription with exactly 5 messages of backlog.
The brokers' logs must hold no traceback and no ERROR line.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pulsar
import pytest
from prometheus_client.parser import text_string_to_metric_families

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from tests.support.cluster import (
    BrokerProcess,
    MagnetarCluster,
    assert_no_traceback,
    cluster_fixture,
    http_request,
)
from tests.support.polling import wait_until
from tests.support.raw_client import assert_log_clean, module_standalone
from tests.support.standalone import QUIET, StandaloneProcess, client

T = TypeVar("T")

SUB = "held"
BACKLOG = 5
POLICY_INTERVAL = "1"  # seconds between TTL / retention rounds on the brokers under test
_BAD_LOG_LINE = re.compile(r"Traceback|\s(ERROR|CRITICAL)\s")


def eventually(check: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    """Poll ``check`` until it returns a truthy value (returned); fail after ``timeout``."""
    return wait_until(check, what, timeout, interval=0.2)


@dataclass(slots=True)
class Target:
    """Where one scenario's topic lives: ``http()`` is the base URL of the broker serving it
    now (admin calls there are answered, not redirected, and its /metrics holds the topic),
    ``service_url()`` a broker for the official client, ``reload()`` the reload under test."""

    topic: str
    http: Callable[[], str]
    service_url: Callable[[], str]
    reload: Callable[[], None]

    @property
    def namespace(self) -> str:
        return self.topic.removeprefix("persistent://").rsplit("/", 1)[0]

    @property
    def path(self) -> str:
        return "/admin/v2/" + self.topic.replace("://", "/", 1)

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, raw = http_request(method, self.http() + path, body)
        return status, json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        status, answer = self.admin("GET", path)
        assert status == 200, f"GET {path}: HTTP {status} {answer!r}"
        return answer

    def subscriptions(self) -> list[str]:
        return self.get(self.path + "/subscriptions")

    def stats(self) -> dict[str, Any]:
        return self.get(self.path + "/stats")

    def internal_stats(self) -> dict[str, Any]:
        return self.get(self.path + "/internalStats")

    def metric(self, name: str, **labels: str) -> float | None:
        """The one sample of ``name`` for this topic (and ``labels``), None if there is none."""
        with_topic = {"topic": self.topic, **labels}
        with urllib.request.urlopen(self.http() + "/metrics", timeout=10) as response:
            text = response.read().decode()
        values = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in with_topic.items())
        ]
        assert len(values) <= 1, f"{name}{with_topic}: {values}"
        return values[0] if values else None

    def policy(self, method: str, policy: str, body: Any = None) -> None:
        path = f"/admin/v2/namespaces/{self.namespace}/{policy}"
        status, answer = self.admin(method, path, body)
        assert status == 204, f"{method} {path}: HTTP {status} {answer!r}"

    def produce(self, count: int) -> None:
        c = pulsar.Client(self.service_url(), operation_timeout_seconds=30, logger=QUIET)
        try:
            producer = c.create_producer(self.topic, batching_enabled=False)
            for i in range(count):
                producer.send(f"m-{i}".encode())
            producer.close()
        finally:
            c.close()

    def subscribe_and_leave(self, consumer_type: pulsar.ConsumerType) -> None:
        c = pulsar.Client(self.service_url(), operation_timeout_seconds=30, logger=QUIET)
        try:
            c.subscribe(self.topic, SUB, consumer_type=consumer_type).close()
        finally:
            c.close()


def ledgers(target: Target) -> list[tuple[int, int]]:
    """``(ledger id, entries)`` of the topic's ledgers, the one being written last."""
    return [
        (ledger["ledgerId"], ledger["entries"]) for ledger in target.internal_stats()["ledgers"]
    ]


def assert_held_with_backlog(target: Target) -> None:
    """The consumer-less subscription is there with exactly ``BACKLOG`` entries everywhere it
    is shown, and no mode until a consumer gives it one."""
    assert target.subscriptions() == [SUB]
    stats = target.stats()["subscriptions"]
    assert list(stats) == [SUB], stats
    assert stats[SUB]["msgBacklog"] == BACKLOG, stats
    assert stats[SUB]["isDurable"] is True, stats
    assert stats[SUB]["consumers"] == [], stats
    assert stats[SUB]["type"] == "None", stats
    internal = target.internal_stats()
    assert list(internal["cursors"]) == [SUB], internal
    assert internal["cursors"][SUB]["messagesConsumedCounter"] == (
        internal["numberOfEntries"] - BACKLOG
    ), internal
    assert target.metric("pulsar_subscription_back_log", subscription=SUB) == BACKLOG
    assert target.metric("pulsar_subscription_consumers_count", subscription=SUB) == 0
    assert target.metric("pulsar_msg_backlog") == BACKLOG
    assert target.metric("pulsar_subscriptions_count") == 1


def only_current_ledger(target: Target) -> bool:
    """Retention kept nothing but the ledger being written (it is never deleted)."""
    found = ledgers(target)
    return len(found) == 1 and found[0][1] == 0


def run_scenario(target: Target) -> None:
    """Subscribe and leave, 5 messages, reload: the subscription is whole; TTL expires it and
    retention drops what it held; 5 more, reload again, DELETE: gone everywhere, retention
    drops its ledger, and it stays gone after one more reload."""
    target.subscribe_and_leave(pulsar.ConsumerType.Shared)
    target.produce(BACKLOG)
    assert target.stats()["subscriptions"][SUB]["msgBacklog"] == BACKLOG

    target.reload()
    assert_held_with_backlog(target)
    # The 5 messages are in the ledger closed by the reload; a new one is being written.
    assert [entries for _, entries in ledgers(target)] == [BACKLOG, 0]

    # TTL: the namespace's messageTTL acknowledges them for the subscription once they are
    # older than it...
    target.policy("POST", "messageTTL", 1)
    eventually(
        lambda: target.stats()["subscriptions"][SUB]["msgBacklog"] == 0, "TTL expired the backlog"
    )
    assert target.subscriptions() == [SUB]
    assert target.metric("pulsar_subscription_back_log", subscription=SUB) == 0
    assert target.metric("pulsar_msg_backlog") == 0
    # ...and retention (the default: nothing kept once consumed) then deletes their ledger.
    eventually(lambda: only_current_ledger(target), "retention trimmed the expired ledger")
    target.policy("DELETE", "messageTTL")

    target.produce(BACKLOG)
    target.reload()
    assert_held_with_backlog(target)
    held = ledgers(target)
    assert [entries for _, entries in held] == [BACKLOG, 0]

    status, answer = target.admin("DELETE", f"{target.path}/subscription/{SUB}")
    assert status == 204, (status, answer)
    assert target.subscriptions() == []
    assert target.stats()["subscriptions"] == {}
    assert target.internal_stats()["cursors"] == {}
    assert target.metric("pulsar_subscription_back_log", subscription=SUB) is None
    assert target.metric("pulsar_msg_backlog") == 0
    assert target.metric("pulsar_subscriptions_count") == 0
    # Nothing holds the ledger now: retention deletes it.
    eventually(lambda: only_current_ledger(target), "retention trimmed the deleted sub's ledger")
    assert ledgers(target)[0][0] == held[-1][0]
    status, answer = target.admin("DELETE", f"{target.path}/subscription/{SUB}")
    assert status == 404, (status, answer)

    target.reload()
    assert target.subscriptions() == []
    assert target.internal_stats()["cursors"] == {}


# -- standalone: admin unload, and what the next consumer may do --------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(
        tmp_path_factory.mktemp("reloaded") / "standalone",
        ["--policy-check-interval-seconds", POLICY_INTERVAL],
    )


def standalone_target(node: StandaloneProcess, namespace: str, local: str) -> Target:
    status, _ = http_request("PUT", f"{node.admin_url}/namespaces/{namespace}")
    assert status == 204, status
    topic = f"persistent://{namespace}/{local}"
    target = Target(
        topic,
        lambda: f"http://127.0.0.1:{node.http_port}",
        lambda: node.url,
        lambda: None,
    )

    def unload() -> None:
        status, answer = target.admin("PUT", f"{target.path}/unload")
        assert status == 204, (status, answer)

    target.reload = unload
    return target


def test_subscription_survives_admin_unload(node: StandaloneProcess) -> None:
    run_scenario(standalone_target(node, "public/reload-unload", "orders"))


def test_reloaded_subscription_takes_any_mode_delivers_and_unsubscribes(
    node: StandaloneProcess,
) -> None:
    """Left by a Shared consumer and reloaded, the subscription has no mode: an Exclusive
    consumer attaches, gets the 5 messages, and its UNSUBSCRIBE removes it for good."""
    target = standalone_target(node, "public/reload-modes", "events")
    target.subscribe_and_leave(pulsar.ConsumerType.Shared)
    target.produce(BACKLOG)
    target.reload()
    assert_held_with_backlog(target)

    c = client(node)
    try:
        consumer = c.subscribe(target.topic, SUB, consumer_type=pulsar.ConsumerType.Exclusive)
        got = []
        for _ in range(BACKLOG):
            message = consumer.receive(timeout_millis=10_000)
            got.append(message.data())
        assert got == [f"m-{i}".encode() for i in range(BACKLOG)]
        assert target.stats()["subscriptions"][SUB]["type"] == "Exclusive"
        # A second consumer of another mode is refused while this one is attached.
        with pytest.raises(pulsar.ConsumerBusy):
            c.subscribe(target.topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
        status, answer = target.admin("DELETE", f"{target.path}/subscription/{SUB}")
        assert status == 412, (status, answer)  # it has a consumer, and no force
        consumer.unsubscribe()
        assert target.subscriptions() == []
        assert target.internal_stats()["cursors"] == {}
        assert target.metric("pulsar_subscription_back_log", subscription=SUB) is None
        consumer.close()
    finally:
        c.close()
    target.reload()
    assert target.subscriptions() == []


def test_reloaded_subscription_of_a_reader_is_not_listed(node: StandaloneProcess) -> None:
    """A reader's cursor is never stored: after a reload only the durable subscription is."""
    target = standalone_target(node, "public/reload-reader", "log")
    target.subscribe_and_leave(pulsar.ConsumerType.Failover)
    target.produce(BACKLOG)
    c = client(node)
    try:
        reader = c.create_reader(target.topic, pulsar.MessageId.earliest)
        assert reader.read_next(10_000).data() == b"m-0"
        reader.close()
    finally:
        c.close()
    target.reload()
    assert_held_with_backlog(target)


def test_delete_subscription_with_consumers_needs_force(node: StandaloneProcess) -> None:
    """412 while a consumer is attached; ``?force=true`` disconnects it and deletes the cursor
    (the client subscribes again and gets a new one at the end: its backlog of 5 is gone);
    404 for a name the topic does not have. The same for a non-persistent topic."""
    target = standalone_target(node, "public/reload-force", "jobs")
    live = "non-persistent://public/reload-force/live"
    live_path = "/admin/v2/non-persistent/public/reload-force/live"
    c = client(node)
    try:
        consumer = c.subscribe(target.topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
        live_consumer = c.subscribe(live, SUB)
        target.produce(BACKLOG)
        assert target.stats()["subscriptions"][SUB]["msgBacklog"] == BACKLOG
        for path in (target.path, live_path):
            status, answer = target.admin("DELETE", f"{path}/subscription/{SUB}")
            assert status == 412, (path, status, answer)
            status, answer = target.admin("DELETE", f"{path}/subscription/nobody")
            assert status == 404, (path, status, answer)
            status, answer = target.admin("DELETE", f"{path}/subscription/{SUB}?force=true")
            assert status == 204, (path, status, answer)

        def resubscribed_at_the_end() -> bool:
            found = target.stats()["subscriptions"].get(SUB)
            return found is not None and found["consumers"] != [] and found["msgBacklog"] == 0

        eventually(resubscribed_at_the_end, "the consumer came back on a new subscription")
        consumer.close()
        live_consumer.close()
    finally:
        c.close()


# -- standalone: broker restart --------------------------------------------------------------


def test_subscription_survives_broker_restart(tmp_path: Path) -> None:
    own = StandaloneProcess(
        tmp_path / "standalone", extra=["--policy-check-interval-seconds", POLICY_INTERVAL]
    ).start()
    try:
        target = standalone_target(own, "public/reload-restart", "orders")

        def restart() -> None:
            own.stop()
            own.start()

        target.reload = restart
        run_scenario(target)
    finally:
        own.stop()
        print(own.log_tail())
    assert_log_clean(own)


# -- cluster: the bundle moves to another broker ---------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    yield from cluster_fixture(
        tmp_path_factory.mktemp("reload-cluster"),
        bookies=2,
        brokers=2,
        broker_settings={"policy_check_interval_seconds": POLICY_INTERVAL},
    )


def bundle_of(cluster: MagnetarCluster, namespace: str, topic: str) -> str:
    h = topic_hash(topic)
    for ns, bundle in cluster.ownership():
        if ns == namespace and BundleRange.parse(bundle).contains(h):
            return bundle
    raise AssertionError(f"no owned bundle of {namespace} holds {topic}")


def assert_log_has_no_errors(broker: BrokerProcess) -> None:
    assert_no_traceback(broker)
    bad = [line for line in broker.log_text().splitlines() if _BAD_LOG_LINE.search(line)]
    assert not bad, f"broker {broker.broker_id} logged errors:\n" + "\n".join(bad[:40])


def test_subscription_survives_bundle_move_to_another_broker(cluster: MagnetarCluster) -> None:
    cluster.create_namespace("reload-it", "move")
    namespace = "reload-it/move"
    topic = f"persistent://{namespace}/orders"

    def owner() -> BrokerProcess:
        url = cluster.http_lookup(topic)["brokerUrl"]
        return next(b for b in cluster.brokers if b.url == url)

    def move() -> None:
        before = owner()
        receiver = next(b for b in cluster.brokers if b is not before)
        bundle = bundle_of(cluster, namespace, topic)
        cluster.admin_json(
            "PUT",
            f"/admin/v2/namespaces/{namespace}/{bundle}/unload"
            f"?destinationBroker={receiver.broker_id}",
        )
        eventually(lambda: owner() is receiver, f"{topic} owned by {receiver.broker_id}")

    target = Target(
        topic,
        lambda: owner().http_url,
        lambda: cluster.brokers[0].url,
        move,
    )
    try:
        run_scenario(target)
    finally:
        for broker in cluster.brokers:
            print(f"--- {broker.broker_id}\n{broker.log_tail(3000)}")
    for broker in cluster.brokers:
        assert_log_has_no_errors(broker)
