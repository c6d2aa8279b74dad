"""What each admin call requires of its caller, in one middleware that runs after
authentication and before every route (with ``authorization_enabled``), as Pulsar's REST
resources check them:

============================================  ================================================
call                                          who may
============================================  ================================================
``/admin/v2/tenants...``, ``/brokers...``,    superusers
``/broker-stats...``, ``/bookies...``
``GET /admin/v2/clusters...``                 any authenticated caller; other methods:
                                              superusers
``GET .../{t}/{ns}`` topic lists (namespaces  a namespace grant of produce or consume (Pulsar's
``.../topics``, ``/persistent/{t}/{ns}``)     GET_TOPICS), or the tenant's admins
``GET`` a topic, its ``partitions``,          produce or consume on the topic (Pulsar's LOOKUP
``stats``, ``internalStats``,                 and GET_STATS: clients read partition counts
``partitioned-stats``; ``/lookup/v2/...``;    over HTTP), or the tenant's admins
``GET`` its schema, ``POST`` a compatibility
or version question about one
``GET`` a topic's ``subscriptions``; a        consume on the topic (and the subscription's
subscription's create, delete, skip, expire,  roles, when it has some), or the tenant's admins
reset and peek; ``examinemessage``, a
message by id or by time
everything else under a tenant                the tenant's admins (and superusers)
============================================  ================================================

A proxy's call is checked for the proxy's role and for the client it relays, each on its own.
Refusals are 403 with a reason (401 stays for missing or bad credentials).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin.authentication import OPEN_PATHS, ORIGINAL_PRINCIPAL, ROLE
from magnetar.broker.admin.errors import error_response
from magnetar.broker.model.topic_name import InvalidTopicNameError, TopicName

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Check = Callable[[str | None], Awaitable[bool]]

NOT_ADMIN = "Don't have admin permission"
NOT_SUPERUSER = "This operation requires super-user access"
#: Topic reads a client with produce or consume may make (Pulsar's LOOKUP / GET_STATS).
TOPIC_READS = frozenset(
    {
        (),
        ("partitions",),
        ("stats",),
        ("internalStats",),
        ("partitioned-stats",),
        ("partitioned-internalStats",),
        ("lastMessageId",),
    }
)
#: What follows a topic in the calls a consumer may make on it (Pulsar's SUBSCRIBE,
#: UNSUBSCRIBE, SKIP, EXPIRE_MESSAGES, RESET_CURSOR, PEEK_MESSAGES): ``subscription/{sub}/...``,
#: ``all_subscription/expireMessages/{s}``, ``examinemessage``, ``ledger/{l}/entry/{e}``,
#: ``messageid/{timestamp}``.
CONSUMER_CALLS = frozenset(
    {"subscription", "all_subscription", "examinemessage", "ledger", "messageid"}
)


def _requirement(broker: AdminBroker, method: str, parts: list[str]) -> tuple[Check, str] | None:
    """The check the call at ``parts`` (the path's segments) needs and its refusal, or None
    when any authenticated caller may make it."""
    service = broker.authorization

    async def superuser(role: str | None) -> bool:
        return await service.is_superuser(role)

    def tenant_admin(tenant: str) -> tuple[Check, str]:
        async def check(role: str | None) -> bool:
            return await service.is_tenant_admin(tenant, role, fresh=True)

        return check, NOT_ADMIN

    def or_admin(tenant: str, check: Check, refusal: str) -> tuple[Check, str]:
        async def either(role: str | None) -> bool:
            return await service.is_tenant_admin(tenant, role) or await check(role)

        return either, refusal

    def listing(tenant: str, namespace: str) -> tuple[Check, str]:
        async def check(role: str | None) -> bool:
            return await service.allows_namespace_action(
                namespace, role, "produce"
            ) or await service.allows_namespace_action(namespace, role, "consume")

        return or_admin(tenant, check, "Client is not authorized to GetTopicsOfNamespace")

    def topic_read(
        name: TopicName, consume: bool, subscription: str | None = None
    ) -> tuple[Check, str]:
        async def check(role: str | None) -> bool:
            if consume:
                return await service.can_consume(name, role, subscription)
            return await service.can_lookup(name, role)

        refusal = "Client is not authorized to " + ("Consume" if consume else "Lookup")
        return or_admin(name.tenant, check, refusal)

    def topic(domain: str, tenant: str, namespace: str, local: str) -> TopicName:
        return TopicName.parse(f"{domain}://{tenant}/{namespace}/{local}")

    if parts[:2] == ["lookup", "v2"] and len(parts) >= 7:
        return topic_read(topic(parts[3], parts[4], parts[5], parts[6]), consume=False)
    if parts[:2] != ["admin", "v2"] or len(parts) < 3:
        return None
    group, rest = parts[2], parts[3:]
    if group in ("tenants", "brokers", "broker-stats", "bookies"):
        return superuser, NOT_SUPERUSER
    if group == "clusters":
        return None if method == "GET" else (superuser, NOT_SUPERUSER)
    if not rest:
        return None
    tenant = rest[0]
    if group == "namespaces":
        if len(rest) >= 3 and rest[2] == "topics" and method == "GET":
            return listing(tenant, f"{tenant}/{rest[1]}")
        return tenant_admin(tenant)
    if group in ("persistent", "non-persistent"):
        if len(rest) == 2 and method == "GET":
            return listing(tenant, f"{tenant}/{rest[1]}")
        if len(rest) >= 4 and rest[3] in CONSUMER_CALLS:
            name = topic(group, tenant, rest[1], rest[2])
            subscription = rest[4] if rest[3] == "subscription" and len(rest) > 4 else None
            return topic_read(name, consume=True, subscription=subscription)
        if len(rest) >= 3 and method == "GET":
            name = topic(group, tenant, rest[1], rest[2])
            if tuple(rest[3:]) in TOPIC_READS:
                return topic_read(name, consume=False)
            if tuple(rest[3:]) == ("subscriptions",):
                return topic_read(name, consume=True)
        return tenant_admin(tenant)
    # Reading a schema, and asking whether one would be compatible or which version it has
    # (stores nothing), is a lookup (Pulsar's GET_SCHEMA).
    schema_question = method == "POST" and rest[3:] in (["compatibility"], ["version"])
    if group == "schemas" and len(rest) >= 3 and (method == "GET" or schema_question):
        return topic_read(topic("persistent", tenant, rest[1], rest[2]), consume=False)
    return tenant_admin(tenant)


def authorization(
    broker: AdminBroker,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
        config = broker.config
        if not config.authorization_enabled or request.path in OPEN_PATHS:
            return await handler(request)
        parts = [part for part in request.path.split("/") if part]
        try:
            required = _requirement(broker, request.method, parts)
        except InvalidTopicNameError:
            required = None  # the route answers 412 for the name
        if required is None:
            return await handler(request)
        check, refusal = required
        role, original = request.get(ROLE), request.get(ORIGINAL_PRINCIPAL)
        if not await broker.authorization.allowed_through_proxy(check, role, original):
            return error_response(403, refusal)
        return await handler(request)

    return authorize
