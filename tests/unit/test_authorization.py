"""The authorization service over a real embedded metadata store: superusers, tenant admins,
namespace, topic and subscription grants, wildcards, proxies relaying clients, the cache, and
grants that race."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.admin.authentication import ORIGINAL_PRINCIPAL, ROLE
from magnetar.broker.admin.errors import errors
from magnetar.broker.admin.permissions import (
    require_namespace_operation,
    require_superuser,
    require_tenant_admin,
)
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.authorization import (
    AuthorizationService,
    GrantNotFoundError,
    NamespaceMissingError,
    wildcard_match,
)
from magnetar.broker.namespace.policies import PolicyError
from magnetar.broker.namespace.records import NAMESPACES_PATH, TENANTS_PATH, partitioned_key
from magnetar.common.auth.settings import SecuritySettings
from magnetar.common.metadata import MetadataStore, open_store

#: The request keys are the authentication middleware's (plain strings, as it sets them).
pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.RequestKey")

TOPIC = TopicName.parse("persistent://acme/orders/events")
OTHER = TopicName.parse("persistent://acme/orders/other")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MetadataStore]:
    opened = await open_store(f"local://{tmp_path}/meta.db")
    await opened.put(f"{TENANTS_PATH}/acme", json.dumps({"adminRoles": ["boss"]}).encode())
    await opened.put(
        f"{NAMESPACES_PATH}/acme/orders", json.dumps({"message_ttl_in_seconds": 60}).encode()
    )
    yield opened
    await opened.close()


def settings(**values: object) -> SecuritySettings:
    config = SecuritySettings(
        authentication_enabled=True, authorization_enabled=True, superuser_roles="root, admin"
    )
    for name, value in values.items():
        setattr(config, name, value)
    return config


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def authz(store: MetadataStore, clock: Clock) -> AuthorizationService:
    return AuthorizationService(store, settings(proxy_roles="proxy"), clock=clock)


async def test_authorization_off_lets_everything_through(store: MetadataStore) -> None:
    service = AuthorizationService(store, settings(authorization_enabled=False))
    assert await service.can_produce(TOPIC, None)
    assert await service.can_consume(TOPIC, "nobody", "sub")
    assert await service.can_lookup(TOPIC, "nobody")
    assert await service.allowed_through_proxy(service.is_superuser, "proxy", None)


async def test_superusers_and_tenant_admins(authz: AuthorizationService) -> None:
    assert await authz.is_superuser("root") and await authz.is_superuser("admin")
    assert not await authz.is_superuser("boss") and not await authz.is_superuser(None)
    assert await authz.is_tenant_admin("acme", "boss")
    assert await authz.is_tenant_admin("acme", "root")
    assert not await authz.is_tenant_admin("acme", "alice")
    assert not await authz.is_tenant_admin("acme", None)
    assert not await authz.is_tenant_admin("nosuch", "boss")
    assert await authz.is_tenant_admin("nosuch", "root")
    assert await authz.can_produce(TOPIC, "root") and await authz.can_consume(TOPIC, "admin", "s")
    # A tenant admin is no producer or consumer by that alone (Pulsar).
    assert not await authz.can_produce(TOPIC, "boss")


async def test_namespace_grants(authz: AuthorizationService, store: MetadataStore) -> None:
    assert not await authz.can_produce(TOPIC, "alice")
    await authz.grant_namespace("acme/orders", "alice", ["produce"])
    await authz.grant_namespace("acme/orders", "bob", ["consume", "functions"])
    assert await authz.can_produce(TOPIC, "alice") and await authz.can_produce(OTHER, "alice")
    assert not await authz.can_consume(TOPIC, "alice")
    assert await authz.can_consume(TOPIC, "bob", "any") and not await authz.can_produce(
        TOPIC, "bob"
    )
    assert await authz.can_lookup(TOPIC, "alice") and await authz.can_lookup(TOPIC, "bob")
    assert not await authz.can_lookup(TOPIC, "carol")
    assert await authz.allows_namespace_action("acme/orders", "bob", "functions")
    assert not await authz.allows_namespace_action("acme/orders", "alice", "functions")
    assert await authz.allows_namespace_action("acme/orders", "boss", "sinks")  # tenant admin
    assert await authz.namespace_permissions("acme/orders") == {
        "alice": ["produce"],
        "bob": ["consume", "functions"],
    }
    # Stored as Pulsar stores it, the other policies kept.
    found = await store.get(f"{NAMESPACES_PATH}/acme/orders")
    assert found is not None
    document = json.loads(found.value)
    assert document["message_ttl_in_seconds"] == 60
    assert document["auth_policies"] == {
        "namespace_auth": {"alice": ["produce"], "bob": ["consume", "functions"]},
        "destination_auth": {},
        "subscription_auth_roles": {},
    }
    # A grant replaces the role's actions; a revoke drops them.
    await authz.grant_namespace("acme/orders", "alice", ["consume"])
    assert not await authz.can_produce(TOPIC, "alice") and await authz.can_consume(TOPIC, "alice")
    await authz.revoke_namespace("acme/orders", "alice")
    assert not await authz.can_lookup(TOPIC, "alice")
    assert await authz.namespace_permissions("acme/orders") == {"bob": ["consume", "functions"]}


async def test_topic_grants_and_the_merged_view(authz: AuthorizationService) -> None:
    await authz.grant_namespace("acme/orders", "bob", ["consume"])
    await authz.grant_topic(TOPIC, "bob", ["produce"])
    await authz.grant_topic(TOPIC, "alice", ["produce"])
    assert await authz.can_produce(TOPIC, "alice") and not await authz.can_produce(OTHER, "alice")
    assert await authz.can_produce(TOPIC, "bob") and await authz.can_consume(OTHER, "bob")
    assert await authz.topic_permissions(TOPIC) == {
        "alice": ["produce"],
        "bob": ["consume", "produce"],
    }
    assert await authz.topic_permissions(OTHER) == {"bob": ["consume"]}
    await authz.revoke_topic(TOPIC, "alice")
    assert not await authz.can_produce(TOPIC, "alice")
    with pytest.raises(GrantNotFoundError, match="Permissions are not set at the topic level"):
        await authz.revoke_topic(TOPIC, "alice")


async def test_partitioned_topic_grants_reach_partitions(
    authz: AuthorizationService, store: MetadataStore
) -> None:
    await store.put(partitioned_key(TOPIC), b'{"partitions": 2}')
    await authz.grant_topic(TOPIC, "alice", ["produce"])
    for i in range(2):
        assert await authz.can_produce(TOPIC.partition(i), "alice")
    # A partition added later has its partitioned topic's grant (Pulsar #10300).
    assert await authz.can_produce(TOPIC.partition(7), "alice")
    await authz.revoke_topic(TOPIC, "alice")
    for i in (0, 1, 7):
        assert not await authz.can_produce(TOPIC.partition(i), "alice")
    grants = await authz.auth_policies("acme/orders")
    assert grants["destination_auth"] == {}


async def test_subscription_permissions(authz: AuthorizationService) -> None:
    await authz.grant_namespace("acme/orders", "alice", ["consume"])
    await authz.grant_namespace("acme/orders", "bob", ["consume"])
    await authz.grant_subscription("acme/orders", "billing", ["alice", "root"])
    assert await authz.can_consume(TOPIC, "alice", "billing")
    assert not await authz.can_consume(TOPIC, "bob", "billing")
    assert await authz.can_consume(TOPIC, "bob", "other-sub")
    assert await authz.can_consume(TOPIC, "bob", None)
    assert await authz.can_lookup(TOPIC, "bob")  # lookup names no subscription
    # The subscription's list does not grant consume by itself.
    await authz.grant_subscription("acme/orders", "audit", ["carol"])
    assert not await authz.can_consume(TOPIC, "carol", "audit")
    assert await authz.subscription_permissions("acme/orders") == {
        "billing": ["alice", "root"],
        "audit": ["carol"],
    }
    await authz.revoke_subscription("acme/orders", "billing", "alice")
    await authz.revoke_subscription("acme/orders", "billing", "root")
    # An emptied list restricts nobody (Pulsar skips the check for an empty set).
    assert await authz.can_consume(TOPIC, "bob", "billing")
    with pytest.raises(GrantNotFoundError):
        await authz.revoke_subscription("acme/orders", "nosuch", "alice")


async def test_wildcards_only_when_allowed(store: MetadataStore) -> None:
    plain = AuthorizationService(store, settings())
    wild = AuthorizationService(store, settings(authorization_allow_wildcards_matching=True))
    await plain.grant_namespace("acme/orders", "team-*", ["produce"])
    await plain.grant_topic(TOPIC, "*.ops", ["consume"])
    assert not await plain.can_produce(TOPIC, "team-a")
    assert await wild.can_produce(TOPIC, "team-a") and await wild.can_produce(OTHER, "team-")
    assert not await wild.can_produce(TOPIC, "a-team")
    assert await wild.can_consume(TOPIC, "db.ops") and not await wild.can_consume(OTHER, "db.ops")
    assert not await wild.can_consume(TOPIC, "db.ops2")
    assert not await wild.can_produce(TOPIC, None)


@given(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8))
def test_wildcard_matching_is_prefix_or_suffix(head: str, middle: str, tail: str) -> None:
    role = head + middle + tail
    assert wildcard_match(head + "*", role)
    assert wildcard_match("*" + tail, role)
    assert wildcard_match("*", role)
    assert not wildcard_match("", role) and not wildcard_match(head + "*", None)
    # Without a star only the role itself would match, and that is not a wildcard's business.
    if "*" not in role and role:
        assert not wildcard_match(role + "x", role)
    # A prefix grant matches exactly the roles starting with it.
    assert wildcard_match(role + "*", head) == head.startswith(role)


async def test_proxy_rules(authz: AuthorizationService) -> None:
    await authz.grant_namespace("acme/orders", "proxy", ["produce"])
    await authz.grant_namespace("acme/orders", "alice", ["produce"])

    def produce(role: str | None) -> object:
        return authz.can_produce(TOPIC, role)

    through = authz.allowed_through_proxy
    assert await through(produce, "proxy", "alice")
    assert not await through(produce, "proxy", "carol")  # the client needs it too
    assert not await through(produce, "proxy", None)  # a proxy must name its client
    assert not await through(produce, "proxy", "proxy")  # which is no proxy
    assert await through(produce, "alice", None)
    assert not await through(produce, "carol", None)
    # A superuser client still needs the proxy authorized, and a superuser proxy its client.
    await authz.revoke_namespace("acme/orders", "proxy")
    assert not await through(produce, "proxy", "root")
    superproxy = AuthorizationService(
        authz.store, settings(proxy_roles="proxy,root"), clock=Clock()
    )
    assert not await superproxy.allowed_through_proxy(
        lambda r: superproxy.can_produce(TOPIC, r), "root", "carol"
    )
    assert await superproxy.allowed_through_proxy(
        lambda r: superproxy.can_produce(TOPIC, r), "root", "alice"
    )
    # A non-proxy naming a client: both are checked (Pulsar), the pair itself is valid.
    assert authz.is_valid_original_principal("alice", "carol")
    assert not authz.is_valid_original_principal("alice", "carol", allow_equal=False)
    assert not await through(produce, "alice", "carol")


async def test_cache_bound_and_local_invalidation(
    authz: AuthorizationService, store: MetadataStore, clock: Clock
) -> None:
    other_broker = AuthorizationService(store, settings(), clock=clock)
    assert not await authz.can_produce(TOPIC, "alice")  # cached: no grant
    await other_broker.grant_namespace("acme/orders", "alice", ["produce"])
    assert await other_broker.can_produce(TOPIC, "alice")  # its own write: seen at once
    assert not await authz.can_produce(TOPIC, "alice")  # here: stale within the bound
    clock.now += authz.cache_seconds + 0.01
    assert await authz.can_produce(TOPIC, "alice")
    # Tenant admins likewise, and the admin room's invalidate() sees them at once.
    assert not await authz.is_tenant_admin("acme", "deputy")
    await store.put(f"{TENANTS_PATH}/acme", b'{"adminRoles": ["boss", "deputy"]}')
    assert not await authz.is_tenant_admin("acme", "deputy")
    authz.invalidate(tenant="acme")
    assert await authz.is_tenant_admin("acme", "deputy")


async def test_concurrent_grants_all_land(
    authz: AuthorizationService, store: MetadataStore
) -> None:
    others = [AuthorizationService(store, settings()) for _ in range(4)]
    await asyncio.gather(
        *(
            service.grant_namespace("acme/orders", f"role-{i}-{j}", ["produce"])
            for i, service in enumerate([authz, *others])
            for j in range(5)
        ),
        *(authz.grant_topic(TOPIC, f"t-{j}", ["consume"]) for j in range(5)),
    )
    granted = await authz.namespace_permissions("acme/orders")
    assert len(granted) == 25
    assert set(await authz.topic_permissions(TOPIC)) >= {f"t-{j}" for j in range(5)}


async def test_missing_namespace_and_bad_values(authz: AuthorizationService) -> None:
    with pytest.raises(NamespaceMissingError):
        await authz.grant_namespace("acme/nosuch", "alice", ["produce"])
    with pytest.raises(NamespaceMissingError):
        await authz.namespace_permissions("acme/nosuch")
    assert not await authz.can_produce(TopicName.parse("persistent://acme/nosuch/t"), "alice")
    with pytest.raises(PolicyError):
        await authz.grant_namespace("acme/orders", "alice", ["publish"])
    with pytest.raises(PolicyError):
        await authz.grant_subscription("acme/orders", "s", "alice")  # type: ignore[arg-type]


async def test_damaged_grants_grant_nothing(
    authz: AuthorizationService, store: MetadataStore
) -> None:
    await store.put(
        f"{NAMESPACES_PATH}/acme/orders",
        json.dumps(
            {"auth_policies": {"namespace_auth": {"alice": "produce", "bob": ["produce"]}}}
        ).encode(),
    )
    assert not await authz.can_produce(TOPIC, "alice")
    assert await authz.can_produce(TOPIC, "bob")


# -- the admin room's checks ----------------------------------------------------------------


class FakeBroker:
    def __init__(self, store: MetadataStore, config: SecuritySettings) -> None:
        self.store = store
        self.config = config
        self.authorization = AuthorizationService(store, config)


@web.middleware
async def roles_from_headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Stands in for the authentication middleware: X-Role / X-Original (absent: no key)."""
    if "X-Role" in request.headers:
        request[ROLE] = request.headers["X-Role"] or None  # type: ignore[assignment]
        request[ORIGINAL_PRINCIPAL] = request.headers.get("X-Original") or None  # type: ignore[assignment]
    return await handler(request)


async def checker(broker: FakeBroker) -> TestClient[Any, Any]:
    routes = web.RouteTableDef()

    @routes.get("/tenant/{tenant}")
    async def tenant(request: web.Request) -> web.Response:
        await require_tenant_admin(request, broker, request.match_info["tenant"])  # type: ignore[arg-type]
        return web.Response(status=204)

    @routes.get("/superuser")
    async def superuser(request: web.Request) -> web.Response:
        await require_superuser(request, broker)  # type: ignore[arg-type]
        return web.Response(status=204)

    @routes.get("/namespace/{tenant}/{namespace}")
    async def namespace(request: web.Request) -> web.Response:
        name = f"{request.match_info['tenant']}/{request.match_info['namespace']}"
        await require_namespace_operation(request, broker, name, "GET_PERMISSION")  # type: ignore[arg-type]
        return web.Response(status=204)

    app = web.Application(middlewares=[errors, roles_from_headers])
    app.add_routes(routes)
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return client


async def answer(
    client: TestClient[Any, Any], path: str, role: str | None = None, original: str = ""
) -> tuple[int, str]:
    headers = {} if role is None else {"X-Role": role, "X-Original": original}
    response = await client.get(path, headers=headers)
    body = await response.json() if response.status != 204 else {}
    return response.status, body.get("reason", "")


async def test_require_tenant_admin(store: MetadataStore) -> None:
    client = await checker(
        FakeBroker(store, settings(proxy_roles="proxy", anonymous_user_role="boss"))
    )
    try:
        assert await answer(client, "/tenant/acme", "boss") == (204, "")
        assert await answer(client, "/tenant/acme", "root") == (204, "")
        assert await answer(client, "/tenant/acme", "alice") == (
            403,
            "Don't have admin permission",
        )
        assert await answer(client, "/tenant/nosuch", "root") == (404, "Tenant does not exist")
        assert await answer(client, "/tenant/acme", "") == (
            403,
            "Need to authenticate to perform the request",
        )
        # No middleware's word: the anonymous role.
        assert await answer(client, "/tenant/acme") == (204, "")
        # A proxy: a tenant admin itself, or it and its client superusers.
        assert await answer(client, "/tenant/acme", "proxy") == (
            401,
            "Original principal cannot be empty if the request is via proxy.",
        )
        assert await answer(client, "/tenant/acme", "proxy", "proxy") == (
            401,
            "Original principal cannot be a proxy role",
        )
        assert await answer(client, "/tenant/acme", "proxy", "root") == (
            401,
            "Proxy not authorized to access resource (proxy:proxy,original:root)",
        )
        await store.put(f"{TENANTS_PATH}/acme", b'{"adminRoles": ["boss", "proxy"]}')
        assert await answer(client, "/tenant/acme", "proxy", "alice") == (204, "")  # read fresh
    finally:
        await client.close()


async def test_require_superuser_and_namespace_operation(store: MetadataStore) -> None:
    client = await checker(FakeBroker(store, settings(proxy_roles="proxy,root")))
    try:
        assert await answer(client, "/superuser", "admin") == (204, "")
        assert await answer(client, "/superuser", "boss") == (
            403,
            "This operation requires super-user access",
        )
        assert await answer(client, "/superuser", "root", "admin") == (204, "")  # both superusers
        assert (await answer(client, "/superuser", "root", "boss"))[0] == 403
        assert (await answer(client, "/superuser"))[0] == 403  # anonymous, and no anonymous role
        assert await answer(client, "/namespace/acme/orders", "boss") == (204, "")
        assert await answer(client, "/namespace/acme/orders", "alice") == (
            403,
            "Unauthorized to validateNamespaceOperation for operation [GET_PERMISSION] on "
            "namespace [acme/orders]",
        )
        # A superuser proxy relaying a tenant admin; relaying anyone else is refused.
        assert await answer(client, "/namespace/acme/orders", "root", "boss") == (204, "")
        assert (await answer(client, "/namespace/acme/orders", "root", "alice"))[0] == 403
        assert await answer(client, "/namespace/nosuch/ns", "admin") == (
            404,
            "Tenant does not exist",
        )
    finally:
        await client.close()


async def test_admin_checks_pass_while_authorization_is_off(store: MetadataStore) -> None:
    client = await checker(FakeBroker(store, settings(authorization_enabled=False)))
    try:
        assert await answer(client, "/tenant/acme", "alice") == (204, "")
        assert await answer(client, "/superuser") == (204, "")
        assert await answer(client, "/namespace/acme/orders", "alice") == (204, "")
        assert (await answer(client, "/tenant/nosuch", "alice"))[0] == 404  # still must exist
    finally:
        await client.close()
