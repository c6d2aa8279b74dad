"""The broker's own state over HTTP: the liveness ``GET /health``, Pulsar's health check
``GET /admin/v2/brokers/health`` (a message round-tripped through the broker's heartbeat topic),
the readiness ``GET /admin/v2/brokers/ready`` and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from aiohttp import web

from magnetar.broker.admin.errors import AdminError
from magnetar.broker.ledger.heartbeat import HeartbeatFailedError
from magnetar.common.metrics import CONTENT_TYPE, render

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker


@runtime_checkable
class Readiness(Protocol):
    """A broker that can say whether it is ready for clients (the process's ``Broker``)."""

    def not_ready_reason(self) -> str | None: ...


@runtime_checkable
class HealthCheck(Protocol):
    """A broker that can round-trip a message through its heartbeat topic (the process's)."""

    async def heartbeat(self) -> None: ...


def add_health_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get("/health")
    async def health(request: web.Request) -> web.Response:
        # The liveness probe: unhealthy once this broker can no longer write safely (its
        # metadata session may have expired: its bundles may be someone else's). It touches
        # no bookie, so a bookie outage does not get brokers restarted.
        if not broker.may_serve():
            raise AdminError(503, "the broker's metadata session expired or is not open")
        return web.Response(text="ok")

    @routes.get("/admin/v2/brokers/health")
    async def healthcheck(request: web.Request) -> web.Response:
        # Pulsar's health check: a message written and read back through this broker's
        # heartbeat topic (metadata store and bookies); 500 with where it stopped.
        if not broker.may_serve():
            raise AdminError(503, "the broker's metadata session expired or is not open")
        if isinstance(broker, HealthCheck):
            try:
                await broker.heartbeat()
            except HeartbeatFailedError as e:
                raise AdminError(500, f"health check failed: {e}") from None
        return web.Response(text="ok")

    @routes.get("/admin/v2/brokers/ready")
    async def ready(request: web.Request) -> web.Response:
        # Kubernetes' readiness probe: 200 once the broker is registered and can own bundles,
        # 503 while starting and again from the moment a graceful shutdown begins.
        reason = broker.not_ready_reason() if isinstance(broker, Readiness) else None
        if reason is not None:
            raise AdminError(503, reason)
        return web.Response(text="ok")


def add_metrics_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        m = broker.metrics
        m.topics.set(len(broker.topics))
        m.connections.set(len(broker.connections))
        m.entries_in.set(sum(t.msg_in for t in broker.topics.values()))
        m.bytes_in.set(sum(t.bytes_in for t in broker.topics.values()))
        return web.Response(body=render(m.registry), headers={"Content-Type": CONTENT_TYPE})
