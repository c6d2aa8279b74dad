"""Who may call the admin routes about the broker process and the bookies (broker-stats,
bookies): superusers only, as Pulsar's BrokerStatsBase and BookiesBase; topic operations stay the
tenant's admins'."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from magnetar.broker.admin.authorization import _requirement


class _Service:
    async def is_superuser(self, role: str | None) -> bool:
        return role == "root"

    async def is_tenant_admin(self, tenant: str, role: str | None, fresh: bool = False) -> bool:
        return role == f"{tenant}-admin"

    async def can_consume(self, topic: object, role: str | None, subscription: str | None) -> bool:
        # "reader" consumes everything; "billing-reader" only subscription "billing"
        return role == "reader" or (role == "billing-reader" and subscription in (None, "billing"))

    async def can_lookup(self, topic: object, role: str | None) -> bool:
        return role in ("reader", "billing-reader", "writer")


def _allowed(path: str, role: str, method: str = "GET") -> bool:
    broker = SimpleNamespace(authorization=_Service())
    required = _requirement(broker, method, [p for p in path.split("/") if p])  # type: ignore[arg-type]
    assert required is not None
    check, _refusal = required
    return asyncio.run(check(role))


def test_broker_stats_and_bookies_are_for_superusers() -> None:
    for path in (
        "/admin/v2/broker-stats/topics",
        "/admin/v2/broker-stats/load-report",
        "/admin/v2/bookies/all",
        "/admin/v2/brokers/configuration/runtime",
    ):
        assert _allowed(path, "root")
        assert not _allowed(path, "topics-admin")  # not mistaken for a tenant named after a part
        assert not _allowed(path, "acme-admin")


def test_subscription_operations_are_the_tenant_admins_and_consumers() -> None:
    """Pulsar lets a role that may consume skip, expire, reset and peek (its subscriptions)."""
    for method, path in (
        ("POST", "/admin/v2/persistent/acme/ns/t/subscription/billing/skip/5"),
        ("POST", "/admin/v2/persistent/acme/ns/t/subscription/billing/skip_all"),
        ("POST", "/admin/v2/persistent/acme/ns/t/subscription/billing/expireMessages/60"),
        ("POST", "/admin/v2/persistent/acme/ns/t/subscription/billing/resetcursor/0"),
        ("GET", "/admin/v2/persistent/acme/ns/t/subscription/billing/position/1"),
        ("PUT", "/admin/v2/persistent/acme/ns/t/subscription/billing"),
        ("DELETE", "/admin/v2/persistent/acme/ns/t/subscription/billing"),
    ):
        assert _allowed(path, "acme-admin", method)
        assert _allowed(path, "reader", method)
        assert _allowed(path, "billing-reader", method)
        assert not _allowed(path, "writer", method)
        assert not _allowed(path, "other-admin", method)
    other = "/admin/v2/persistent/acme/ns/t/subscription/audit/skip/5"
    assert not _allowed(other, "billing-reader", "POST")  # not its subscription
    for path in (
        "/admin/v2/persistent/acme/ns/t/examinemessage",
        "/admin/v2/persistent/acme/ns/t/messageid/0",
    ):
        assert _allowed(path, "reader") and not _allowed(path, "writer")
    for path in (
        "/admin/v2/persistent/acme/ns/t/lastMessageId",
        "/admin/v2/persistent/acme/ns/t/partitioned-internalStats",
    ):
        assert _allowed(path, "writer") and not _allowed(path, "nobody")
    # Schema questions are lookups; storing or deleting a schema stays the tenant admins'.
    schema = "/admin/v2/schemas/acme/ns/t/schema"
    assert _allowed(schema, "writer") and not _allowed(schema, "nobody")
    for question in ("compatibility", "version"):
        assert _allowed(f"/admin/v2/schemas/acme/ns/t/{question}", "writer", "POST")
    assert not _allowed(schema, "writer", "POST")
    assert not _allowed(schema, "writer", "DELETE")
    # Deleting or truncating the topic stays the tenant admins'.
    assert not _allowed("/admin/v2/persistent/acme/ns/t", "reader", "DELETE")
    assert not _allowed("/admin/v2/persistent/acme/ns/t/truncate", "reader", "DELETE")


def test_runtime_configuration_masks_secrets() -> None:
    from magnetar.broker.admin.brokers import MASK, runtime_configuration
    from magnetar.broker.config import BrokerConfig

    shown = runtime_configuration(
        BrokerConfig(
            token_secret_key="data:;base64,c2VjcmV0",
            broker_client_authentication_parameters="token:x",
        )
    )
    assert shown["token_secret_key"] == MASK
    assert shown["broker_client_authentication_parameters"] == MASK
    assert shown["authentication_enabled"] == "false"
    assert shown["cluster_name"] == BrokerConfig().cluster_name
