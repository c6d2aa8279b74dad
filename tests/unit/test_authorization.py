"""The authorization service over a real embedded metadata store: superusers, tenant admins,
namespace, topic and subscription grants, wildcards, proxies relaying clients, the cache, and
grants that race."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
