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


def test_subscription_operations_are_the_tenant_admins() -> None:
    path = "/admin/v2/persistent/acme/ns/t/subscription/s/skip/5"
    assert _allowed(path, "acme-admin", "POST")
    assert not _allowed(path, "other-admin", "POST")


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
