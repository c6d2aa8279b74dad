"""Readiness and draining: ``GET /admin/v2/brokers/ready`` answers 503 with the reason until the
broker can own bundles and again from the start of a graceful shutdown; a draining broker is
given no new bundle while another can take it."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from magnetar.broker.admin.app import build_app
from magnetar.broker.cluster.load_manager import select_broker
from magnetar.broker.cluster.registry import LoadReport
from magnetar.common.auth.service import AuthenticationService
from magnetar.common.auth.settings import SecuritySettings


class FakeBroker:
    """What the admin app needs to answer the probes (authentication off, as by default)."""

    config = SecuritySettings()
    authentication = AuthenticationService(config)
    proxy_roles: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.reason: str | None = "the broker is starting"

    def not_ready_reason(self) -> str | None:
        return self.reason

    def may_serve(self) -> bool:
        return True


async def test_ready_follows_the_brokers_reason() -> None:
    broker = FakeBroker()
    async with TestClient(TestServer(build_app(broker))) as client:  # type: ignore[arg-type]
        starting = await client.get("/admin/v2/brokers/ready")
        assert starting.status == 503
        assert "starting" in (await starting.json())["reason"]
        broker.reason = None
        ready = await client.get("/admin/v2/brokers/ready")
        assert (ready.status, await ready.text()) == (200, "ok")
        broker.reason = "the broker is shutting down: its bundles are moving to other brokers"
        assert (await client.get("/admin/v2/brokers/ready")).status == 503
        # Liveness is another question: a draining broker is alive.
        assert (await client.get("/health")).status == 200


def test_a_draining_broker_gets_no_new_bundle_while_another_can() -> None:
    reports = {"a:1": LoadReport(draining=True), "b:1": LoadReport(msg_rate_in=500.0)}
    assert select_broker(reports, {"a:1": 0, "b:1": 9}) == "b:1"
    # All draining (the whole cluster stopping): still placed somewhere.
    assert select_broker({"a:1": LoadReport(draining=True)}, {}) == "a:1"


def test_draining_travels_in_the_registration() -> None:
    report = LoadReport(topics=3, draining=True)
    assert LoadReport.from_json(report.to_json()) == report
    assert LoadReport.from_dict({"numTopics": 1}).draining is False
