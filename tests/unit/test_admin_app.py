"""The admin app without a broker: every resource group reads its names through the one request
helper (412 for a bad tenant or namespace, before the broker is asked anything), and every
failure is answered in one shape, ``{"reason": ...}``, by the one error middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from magnetar.broker.admin.app import build_app
from magnetar.broker.admin.errors import AdminError, errors
from magnetar.common.auth.service import AuthenticationService
from magnetar.common.auth.settings import SecuritySettings


class NoBroker:
    """Answers only what a route may ask before it reads the store; anything else fails (500)."""

    store = object()  # set, as in a started broker, but never read by these requests
    config = SecuritySettings()  # authentication and authorization off, as by default
    authentication = AuthenticationService(config)
    proxy_roles: frozenset[str] = frozenset()

    async def namespace_policies(self, namespace: str) -> None:
        return None


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_app(NoBroker()))) as c:  # type: ignore[arg-type]
        yield c


BAD = "x$y"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/admin/v2/namespaces/public/{BAD}"),  # namespaces
        ("PUT", f"/admin/v2/namespaces/{BAD}/ns"),
        ("POST", f"/admin/v2/namespaces/public/{BAD}/messageTTL"),
        ("GET", f"/admin/v2/persistent/public/{BAD}"),  # topics
        ("GET", f"/admin/v2/non-persistent/public/{BAD}/t/stats"),
        ("DELETE", f"/admin/v2/persistent/public/{BAD}/t"),
        ("PUT", f"/admin/v2/persistent/public/{BAD}/t/partitions"),  # partitioned
        ("GET", f"/admin/v2/persistent/{BAD}/ns/partitioned"),
        ("GET", f"/admin/v2/namespaces/public/{BAD}/bundles"),  # cluster
        ("PUT", f"/admin/v2/namespaces/public/{BAD}/unload"),
        ("PUT", f"/admin/v2/namespaces/{BAD}/ns/0x00000000_0xffffffff/split"),
        ("PUT", f"/admin/v2/persistent/public/{BAD}/t/unload"),
        ("GET", f"/lookup/v2/topic/persistent/public/{BAD}/t"),
        ("GET", f"/admin/v2/schemas/public/{BAD}/t/schema"),  # schemas
        ("POST", f"/admin/v2/schemas/{BAD}/ns/t/schema"),
    ],
)
async def test_every_group_answers_412_for_a_bad_namespace_name(
    client: TestClient[Any, Any], method: str, path: str
) -> None:
    response = await client.request(method, path, data="1")
    assert response.status == 412, await response.text()
    assert (await response.json())["reason"].startswith("Namespace name is not valid")


async def test_a_bad_tenant_name_is_412(client: TestClient[Any, Any]) -> None:
    response = await client.put(f"/admin/v2/tenants/{BAD}")
    assert response.status == 412
    assert (await response.json())["reason"].startswith("Tenant name is not valid")


@pytest.mark.parametrize(
    ("body", "reason"),
    [("{", "request body is not valid JSON: "), ("[" * 100_000, "nested too deeply")],
)
async def test_a_body_that_is_not_json_is_400(
    client: TestClient[Any, Any], body: str, reason: str
) -> None:
    response = await client.post("/admin/v2/schemas/public/default/t/schema", data=body)
    assert response.status == 400
    assert reason in (await response.json())["reason"]


async def test_the_middleware_answers_every_failure_with_a_reason() -> None:
    async def refused(request: web.Request) -> web.Response:
        raise AdminError(409, "already there")

    async def broken(request: web.Request) -> web.Response:
        raise KeyError("oops")

    app = web.Application(middlewares=[errors])
    app.router.add_put("/refused", refused)
    app.router.add_get("/broken", broken)
    async with TestClient(TestServer(app)) as c:
        for method, path, status, reason in (
            ("PUT", "/refused", 409, "already there"),
            ("GET", "/broken", 500, "internal error: KeyError: 'oops'"),
            ("GET", "/nowhere", 404, "Not Found"),
            ("POST", "/refused", 405, "Method Not Allowed"),
        ):
            response = await c.request(method, path)
            assert (response.status, await response.json()) == (status, {"reason": reason})
