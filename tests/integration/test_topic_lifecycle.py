"""A topic's end of life against one real standalone whose subscriptions expire fast (the broker's
``subscription_expiration_time_minutes`` at 0.02, about a second, checked every 0.3 s): idle
subscriptions deleted as Pulsar deletes them (never one with a consumer, never in a namespace
whose policy says 0), and a terminated topic still terminated after the standalone restarts."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from tests.support.polling import wait_until
from tests.support.raw_client import module_standalone
from tests.support.standalone import StandaloneProcess, client


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(
        tmp_path_factory.mktemp("topic-lifecycle") / "standalone",
        extra=[
            "--subscription-expiration-time-minutes", "0.02",
            "--subscription-expiry-check-interval-in-minutes", "0.005",
        ],
    )  # fmt: skip


def call(node: StandaloneProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(node.admin_url + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def subscriptions(node: StandaloneProcess, topic: str) -> list[str]:
    status, found = call(node, "GET", f"/persistent/{topic}/subscriptions")
    assert status == 200, (status, found)
    return found


def test_idle_subscriptions_expire(node: StandaloneProcess) -> None:
    assert call(node, "PUT", "/namespaces/public/kept-subs")[0] == 204
    policy = "/namespaces/public/kept-subs/subscriptionExpirationTime"
    assert call(node, "GET", policy) == (200, None)  # unset: the broker's
    assert call(node, "POST", policy, -1)[0] == 400
    assert call(node, "POST", policy, 0) == (204, None)  # never, in this namespace
    assert call(node, "GET", policy) == (200, 0)
    pc = client(node)
    try:
        pc.subscribe("persistent://public/default/expiring", "idle").close()
        busy = pc.subscribe("persistent://public/default/expiring", "busy")
        pc.subscribe("persistent://public/kept-subs/t", "idle").close()
        wait_until(
            lambda: subscriptions(node, "public/default/expiring") == ["busy"],
            "the idle subscription deleted, the one with a consumer kept",
            timeout=15.0,
        )
        assert subscriptions(node, "public/kept-subs/t") == ["idle"]
        busy.close()
        wait_until(
            lambda: subscriptions(node, "public/default/expiring") == [],
            "idle once its consumer left, then deleted",
            timeout=15.0,
        )
        assert subscriptions(node, "public/kept-subs/t") == ["idle"]
    finally:
        pc.close()
    assert call(node, "DELETE", policy) == (204, None)
    assert call(node, "GET", policy) == (200, None)


def test_terminated_topic_stays_terminated_after_a_restart(node: StandaloneProcess) -> None:
    assert call(node, "PUT", "/namespaces/public/kept-ends")[0] == 204
    assert (
        call(node, "POST", "/namespaces/public/kept-ends/subscriptionExpirationTime", 0)[0] == 204
    )
    topic = "persistent://public/kept-ends/t"
    path = "/persistent/public/kept-ends/t"
    pc = client(node)
    try:
        pc.subscribe(topic, "s").close()
        producer = pc.create_producer(topic, batching_enabled=False)
        for i in range(3):
            producer.send(f"m{i}".encode())
        status, last = call(node, "POST", f"{path}/terminate")
        assert status == 200
        producer.close()
    finally:
        pc.close()
    node.stop()
    node.start()
    pc = client(node)
    try:
        with pytest.raises(pulsar.TopicTerminated):
            pc.create_producer(topic)
        consumer = pc.subscribe(topic, "s")
        got = []
        for _ in range(3):
            message = consumer.receive(10_000)
            consumer.acknowledge(message)
            got.append(message.data())
        assert got == [b"m0", b"m1", b"m2"]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(300)
        status, internal = call(node, "GET", f"{path}/internalStats")
        assert internal["state"] == "Terminated"
        assert call(node, "POST", f"{path}/terminate") == (200, last)
        consumer.close()
    finally:
        pc.close()
