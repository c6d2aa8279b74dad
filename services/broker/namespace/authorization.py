"""Pulsar's authorization model: who may produce to, consume from and look up a topic, who
administers a tenant, and the grants that decide it. No HTTP here: the protocol room asks
before PRODUCER, SUBSCRIBE and LOOKUP, the admin room before its calls and for the grants.

Roles and rules, as Pulsar's default provider has them:

- with ``authorization_enabled`` off every check passes;
- a role in ``superuser_roles`` passes every check; a tenant's admins are the roles in its
  ``adminRoles`` (and the superusers);
- produce: the role holds ``produce`` on the namespace, or on the topic, or (a partition) on
  its partitioned topic; consume likewise with ``consume``, and when a subscription is named
  and ``subscription_auth_roles`` lists roles for it, the role must be one of them; lookup:
  produce or consume;
- with ``authorization_allow_wildcards_matching`` a granted role ending with ``*`` matches
  every role starting with what comes before it, one starting with ``*`` every role ending
  with what follows (``*`` alone matches every role);
- a proxy (a role in ``proxy_roles``) relays a client: it must name that client
  (``original_principal``, itself no proxy role), and then the proxy's role and the client's
  are each checked, both must pass (each on its own: a superuser client through a proxy
  without the grant is refused, as is an ungranted client through a superuser proxy).

The grants are stored as Pulsar stores them, in the namespace's policy document
(``records.NAMESPACES_PATH``/``<tenant>/<namespace>``) under ``auth_policies``::

    {"namespace_auth": {role: [action, ...]},
     "destination_auth": {topic: {role: [action, ...]}},
     "subscription_auth_roles": {subscription: [role, ...]}}

with actions among ``produce``, ``consume``, ``functions``, ``sources``, ``sinks``,
``packages``. Writes are compare-and-set on the document's version and retried on a
conflict, so two grants at once both land and no other policy of the document is lost.

Staleness: the checks read each namespace's grants and each tenant's admins through a cache
of ``cache_seconds`` (2 s by default). A grant or revoke made through this service is seen by
this broker at once (it drops its cache entry); one made through another broker is seen here
within ``cache_seconds``. The admin room reads tenants fresh (``fresh=True``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import PolicyError, parse_document
from magnetar.broker.namespace.records import (
    NAMESPACES_PATH,
    TENANTS_PATH,
    read_partitioned,
)
from magnetar.common.auth.settings import SecuritySettings, names
from magnetar.common.metadata import BadVersionError, MetadataStore

#: Pulsar's AuthAction values.
ACTIONS = ("produce", "consume", "functions", "sources", "sinks", "packages")

AUTH_POLICIES = "auth_policies"
NAMESPACE_AUTH = "namespace_auth"
DESTINATION_AUTH = "destination_auth"
SUBSCRIPTION_AUTH = "subscription_auth_roles"

#: An authorization check of one role (None: an unauthenticated caller).
Check = Callable[[str | None], Awaitable[bool]]


class NamespaceMissingError(LookupError):
    """The namespace whose grants are asked for or changed does not exist."""


class GrantNotFoundError(LookupError):
    """A revoke names a grant that is not there (its message is Pulsar's)."""


def empty_auth_policies() -> dict[str, Any]:
    return {NAMESPACE_AUTH: {}, DESTINATION_AUTH: {}, SUBSCRIPTION_AUTH: {}}


@dataclass(frozen=True, slots=True)
class AuthPolicies:
    """A namespace's grants, read from its policy document (anything malformed is ignored:
    a damaged grant grants nothing)."""

    namespace_auth: dict[str, frozenset[str]] = field(default_factory=dict)
    destination_auth: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    subscription_auth_roles: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> AuthPolicies:
        auth = document.get(AUTH_POLICIES)
        if not isinstance(auth, dict):
            return cls()
        topics = auth.get(DESTINATION_AUTH)
        return cls(
            _string_sets(auth.get(NAMESPACE_AUTH)),
            {
                topic: _string_sets(roles)
                for topic, roles in (topics.items() if isinstance(topics, dict) else ())
            },
            _string_sets(auth.get(SUBSCRIPTION_AUTH)),
        )


def _string_sets(value: Any) -> dict[str, frozenset[str]]:
    if not isinstance(value, dict):
        return {}
    return {
        key: frozenset(v for v in items if isinstance(v, str))
        for key, items in value.items()
        if isinstance(key, str) and isinstance(items, list)
    }


@dataclass(frozen=True, slots=True)
class TenantInfo:
    """A tenant's record, Pulsar's TenantInfo: ``{"adminRoles": [...], "allowedClusters":
    [...]}`` (a record stored as ``{}`` has neither)."""

    admin_roles: tuple[str, ...] = ()
    allowed_clusters: tuple[str, ...] = ()

    @classmethod
    def from_bytes(cls, raw: bytes) -> TenantInfo:
        try:
            document = json.loads(raw) if raw else {}
        except (ValueError, RecursionError):
            document = {}
        if not isinstance(document, dict):
            document = {}
        return cls(_strings(document.get("adminRoles")), _strings(document.get("allowedClusters")))

    def to_json(self) -> dict[str, list[str]]:
        return {
            "adminRoles": list(self.admin_roles),
            "allowedClusters": list(self.allowed_clusters),
        }


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, str))


def wildcard_match(granted: str, role: str | None) -> bool:
    """Whether the granted role ``granted`` matches ``role`` by Pulsar's wildcard rule."""
    if role is None or not granted:
        return False
    if granted.endswith("*") and role.startswith(granted[:-1]):
        return True
    return granted.startswith("*") and role.endswith(granted[1:])


def check_actions(value: Any) -> list[str]:
    """A grant's actions: a JSON array of Pulsar's action names (PolicyError otherwise)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"expected a JSON array of actions {list(ACTIONS)}, got {value!r}")
    unknown = sorted(set(value) - set(ACTIONS))
    if unknown:
        raise PolicyError(f"unknown actions {unknown}: actions are {list(ACTIONS)}")
    return sorted(set(value))


def check_roles(value: Any) -> list[str]:
    """A subscription grant's roles: a JSON array of role names (PolicyError otherwise)."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PolicyError(f"expected a JSON array of roles, got {value!r}")
    return sorted(set(value))


class AuthorizationService:
    """The checks and the grants over ``store``; ``config`` carries the security settings
    (``authorization_enabled``, ``superuser_roles``, ``authorization_allow_wildcards_matching``,
    ``proxy_roles``), read at each check."""

    def __init__(
        self,
        store: MetadataStore,
        config: SecuritySettings,
        *,
        cache_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.config = config
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._grants: dict[str, tuple[float, AuthPolicies | None]] = {}
        self._tenants: dict[str, tuple[float, TenantInfo | None]] = {}

    # -- settings ---------------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return bool(self.config.authorization_enabled)

    def superuser_roles(self) -> frozenset[str]:
        return frozenset(names(self.config.superuser_roles))

    def is_proxy_role(self, role: str | None) -> bool:
        return role is not None and role in names(self.config.proxy_roles)

    def is_valid_original_principal(
        self, role: str | None, original_principal: str | None, *, allow_equal: bool = True
    ) -> bool:
        """Pulsar's rule for the pair: a proxy role must name a client that is no proxy role.
        A non-proxy role naming a client is let through (Pulsar warns) when ``allow_equal`` or
        the client is itself; the binary protocol's CONNECT passes ``allow_equal=False``
        (Pulsar refuses a non-proxy connection naming another client there)."""
        if self.is_proxy_role(role):
            return bool(original_principal) and not self.is_proxy_role(original_principal)
        if original_principal and not allow_equal:
            return original_principal == role
        return True

    # -- roles ------------------------------------------------------------------------------------
    async def is_superuser(self, role: str | None) -> bool:
        return role is not None and role in self.superuser_roles()

    async def tenant(self, tenant: str, *, fresh: bool = False) -> TenantInfo | None:
        """The tenant's record (None: no such tenant), through the cache unless ``fresh`` (the
        admin room reads it fresh: its calls are rare, and must not see a stale tenant)."""
        now = self._clock()
        cached = self._tenants.get(tenant)
        if not fresh and cached is not None and cached[0] > now:
            return cached[1]
        found = await self.store.get(f"{TENANTS_PATH}/{tenant}")
        info = None if found is None else TenantInfo.from_bytes(found.value)
        self._tenants[tenant] = (now + self.cache_seconds, info)
        return info

    async def is_tenant_admin(self, tenant: str, role: str | None, *, fresh: bool = False) -> bool:
        """A superuser, or a role in the tenant's ``adminRoles`` (False for a missing tenant)."""
        if await self.is_superuser(role):
            return True
        info = await self.tenant(tenant, fresh=fresh)
        return info is not None and role is not None and role in info.admin_roles

    # -- topic checks -----------------------------------------------------------------------------
    async def can_produce(self, topic: TopicName, role: str | None) -> bool:
        if not self.enabled or await self.is_superuser(role):
            return True
        return await self._has_permission(topic, role, "produce")

    async def can_consume(
        self, topic: TopicName, role: str | None, subscription: str | None = None
    ) -> bool:
        if not self.enabled or await self.is_superuser(role):
            return True
        if subscription:
            grants = await self.grants(topic.namespace_name)
            allowed = grants.subscription_auth_roles.get(subscription) if grants else None
            if allowed and role not in allowed:
                return False
        return await self._has_permission(topic, role, "consume")

    async def can_lookup(self, topic: TopicName, role: str | None) -> bool:
        return await self.can_produce(topic, role) or await self.can_consume(topic, role)

    async def allows_namespace_action(self, namespace: str, role: str | None, action: str) -> bool:
        """A namespace-wide action (``functions``, ``sources``, ``sinks``, ``packages``):
        superusers and the tenant's admins, or a namespace grant of it."""
        if not self.enabled or await self.is_tenant_admin(namespace.split("/")[0], role):
            return True
        grants = await self.grants(namespace)
        if grants is None:
            return False
        return role is not None and self._granted(grants.namespace_auth, role, action)

    async def allowed_through_proxy(
        self, check: Check, role: str | None, original_principal: str | None
    ) -> bool:
        """``check`` for a caller that may be a proxy relaying a client, by Pulsar's rule: an
        invalid pair is refused; a proxy role, or any caller naming a client, passes only if
        ``check`` passes for the role and for the client, each on its own."""
        if not self.enabled:
            return True
        if not self.is_valid_original_principal(role, original_principal):
            return False
        if self.is_proxy_role(role) or original_principal:
            return await check(role) and await check(original_principal)
        return await check(role)

    async def _has_permission(self, topic: TopicName, role: str | None, action: str) -> bool:
        grants = await self.grants(topic.namespace_name)
        if grants is None or role is None:
            return False
        if action in grants.namespace_auth.get(role, ()):
            return True
        topic_roles = grants.destination_auth.get(str(topic), {})
        if action in topic_roles.get(role, ()):
            return True
        if self.config.authorization_allow_wildcards_matching and (
            self._wildcard(grants.namespace_auth, role, action)
            or self._wildcard(topic_roles, role, action)
        ):
            return True
        if topic.partition_index >= 0:
            # A partition added after the grant still has its partitioned topic's.
            base = grants.destination_auth.get(str(topic.partitioned_topic_name), {})
            if action in base.get(role, ()):
                return True
        return False

    def _granted(self, roles: dict[str, frozenset[str]], role: str, action: str) -> bool:
        if action in roles.get(role, ()):
            return True
        return bool(self.config.authorization_allow_wildcards_matching) and self._wildcard(
            roles, role, action
        )

    @staticmethod
    def _wildcard(roles: dict[str, frozenset[str]], role: str, action: str) -> bool:
        return any(
            action in actions and wildcard_match(granted, role)
            for granted, actions in roles.items()
        )

    # -- grants -----------------------------------------------------------------------------------
    async def grants(self, namespace: str) -> AuthPolicies | None:
        """The namespace's grants (None: no such namespace), through the cache."""
        now = self._clock()
        cached = self._grants.get(namespace)
        if cached is not None and cached[0] > now:
            return cached[1]
        found = await self.store.get(f"{NAMESPACES_PATH}/{namespace}")
        grants = None
        if found is not None:
            try:
                grants = AuthPolicies.from_document(parse_document(found.value))
            except PolicyError:
                grants = AuthPolicies()  # a damaged document grants nothing
        self._grants[namespace] = (now + self.cache_seconds, grants)
        return grants

    async def auth_policies(self, namespace: str) -> dict[str, Any]:
        """The stored ``auth_policies`` of the namespace as Pulsar answers them (every map
        present), read from the store; NamespaceMissingError if there is none."""
        found = await self.store.get(f"{NAMESPACES_PATH}/{namespace}")
        if found is None:
            raise NamespaceMissingError(namespace)
        return _auth_of(parse_document(found.value))

    async def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        return dict((await self.auth_policies(namespace))[NAMESPACE_AUTH])

    async def subscription_permissions(self, namespace: str) -> dict[str, list[str]]:
        return dict((await self.auth_policies(namespace))[SUBSCRIPTION_AUTH])

    async def topic_permissions(self, topic: TopicName) -> dict[str, list[str]]:
        """Pulsar's view of a topic's permissions: the namespace's grants, each role's actions
        joined with its grants on the topic."""
        auth = await self.auth_policies(topic.namespace_name)
        merged = {role: set(actions) for role, actions in auth[NAMESPACE_AUTH].items()}
        for role, actions in auth[DESTINATION_AUTH].get(str(topic), {}).items():
            merged.setdefault(role, set()).update(actions)
        return {role: sorted(actions) for role, actions in merged.items()}

    async def grant_namespace(self, namespace: str, role: str, actions: list[str]) -> None:
        """Set ``role``'s actions on the namespace (replacing what it had there)."""
        chosen = check_actions(actions)

        def change(auth: dict[str, Any]) -> None:
            auth[NAMESPACE_AUTH][role] = chosen

        await self._update(namespace, change)

    async def revoke_namespace(self, namespace: str, role: str) -> None:
        def change(auth: dict[str, Any]) -> None:
            auth[NAMESPACE_AUTH].pop(role, None)

        await self._update(namespace, change)

    async def grant_topic(self, topic: TopicName, role: str, actions: list[str]) -> None:
        """Set ``role``'s actions on the topic, and on each of its partitions if it is a
        partitioned topic (as Pulsar), in one write."""
        chosen = check_actions(actions)
        names_ = await self._with_partitions(topic)

        def change(auth: dict[str, Any]) -> None:
            for name in names_:
                auth[DESTINATION_AUTH].setdefault(name, {})[role] = chosen

        await self._update(topic.namespace_name, change)

    async def revoke_topic(self, topic: TopicName, role: str) -> None:
        """Drop ``role``'s grant on the topic (and its partitions'); GrantNotFoundError if the
        topic itself has none for it."""
        names_ = await self._with_partitions(topic)

        def change(auth: dict[str, Any]) -> None:
            if role not in auth[DESTINATION_AUTH].get(str(topic), {}):
                raise GrantNotFoundError("Permissions are not set at the topic level")
            for name in names_:
                roles = auth[DESTINATION_AUTH].get(name)
                if roles is not None:
                    roles.pop(role, None)
                    if not roles:
                        del auth[DESTINATION_AUTH][name]

        await self._update(topic.namespace_name, change)

    async def grant_subscription(self, namespace: str, subscription: str, roles: list[str]) -> None:
        """Set the roles allowed on ``subscription`` across the namespace (replacing)."""
        chosen = check_roles(roles)

        def change(auth: dict[str, Any]) -> None:
            auth[SUBSCRIPTION_AUTH][subscription] = chosen

        await self._update(namespace, change)

    async def revoke_subscription(self, namespace: str, subscription: str, role: str) -> None:
        """Take ``role`` off the subscription's roles; GrantNotFoundError if the subscription
        has no roles set."""

        def change(auth: dict[str, Any]) -> None:
            roles = auth[SUBSCRIPTION_AUTH].get(subscription)
            if roles is None:
                raise GrantNotFoundError("couldn't find subscription")
            auth[SUBSCRIPTION_AUTH][subscription] = [r for r in roles if r != role]

        await self._update(namespace, change)

    def invalidate(self, namespace: str | None = None, tenant: str | None = None) -> None:
        """Forget cached grants of ``namespace`` and the record of ``tenant`` (the admin room
        calls this after writing a tenant)."""
        if namespace is not None:
            self._grants.pop(namespace, None)
        if tenant is not None:
            self._tenants.pop(tenant, None)

    async def _with_partitions(self, topic: TopicName) -> list[str]:
        record = await read_partitioned(self.store, topic)
        count = record.partitions if record is not None else 0
        return [str(topic.partition(i)) for i in range(count)] + [str(topic)]

    async def _update(self, namespace: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Apply ``change`` to the namespace's ``auth_policies`` by compare-and-set, again on
        the new version when another writer came first."""
        key = f"{NAMESPACES_PATH}/{namespace}"
        try:
            while True:
                found = await self.store.get(key)
                if found is None:
                    raise NamespaceMissingError(namespace)
                document = parse_document(found.value)
                auth = _auth_of(document)
                change(auth)
                document[AUTH_POLICIES] = auth
                try:
                    await self.store.put(key, json.dumps(document).encode(), found.version)
                    return
                except BadVersionError:
                    continue
        finally:
            self.invalidate(namespace=namespace)


def _auth_of(document: dict[str, Any]) -> dict[str, Any]:
    """The document's ``auth_policies`` with every map present (a copy to change)."""
    stored = document.get(AUTH_POLICIES)
    auth = empty_auth_policies()
    if isinstance(stored, dict):
        for name in auth:
            if isinstance(stored.get(name), dict):
                auth[name] = json.loads(json.dumps(stored[name]))
        for name, value in stored.items():
            auth.setdefault(name, value)  # fields Pulsar may add, kept as they are
    return auth
