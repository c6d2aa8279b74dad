"""Whether a connection's role may do what a command asks, with Pulsar's refusals.

Asked before LOOKUP and PARTITIONED_METADATA (produce or consume), PRODUCER (produce),
SUBSCRIBE (consume, and the subscription's own role list), GET_TOPICS_OF_NAMESPACE and the
schema commands (produce or consume). The tenant's admins and the superusers may do all of it,
as Pulsar's topic operations allow. A connection from a proxy is checked for the proxy's role
and for the client it relays, each on its own (``namespace/authorization.py``). A refusal is
``AuthorizationError`` with Pulsar's message, answered in the command's own reply type.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.authorization import Check
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.protocol.connection import ServerConnection

log = logging.getLogger(__name__)


async def permitted(
    conn: ServerConnection,
    request_id: int,
    reply: type | None,
    operation: str,
    tenant: str,
    check: Check,
) -> bool:
    """Whether ``check`` passes for the connection (or the tenant's admins pass); if not, the
    request is answered ``AuthorizationError`` "Client is not authorized to <operation>"."""
    service = conn.broker.authorization
    if not service.enabled:
        return True
    identity = conn.identity

    async def allowed(role: str | None) -> bool:
        return await service.is_tenant_admin(tenant, role) or await check(role)

    if await service.allowed_through_proxy(allowed, identity.role, identity.original_principal):
        return True
    client = "Proxy Client" if identity.original_principal else "Client"
    log.info(
        "connection %s: role %r%s is not authorized to %s",
        conn.peer,
        identity.role,
        f" for {identity.original_principal!r}" if identity.original_principal else "",
        operation,
    )
    conn.error(
        request_id, pb.AuthorizationError, f"{client} is not authorized to {operation}", reply
    )
    return False


async def may_produce(
    conn: ServerConnection, request_id: int, name: TopicName, reply: type | None = None
) -> bool:
    service = conn.broker.authorization
    return await permitted(
        conn,
        request_id,
        reply,
        "Produce",
        name.tenant,
        lambda role: service.can_produce(name, role),
    )


async def may_consume(
    conn: ServerConnection, request_id: int, name: TopicName, subscription: str
) -> bool:
    service = conn.broker.authorization
    return await permitted(
        conn,
        request_id,
        None,
        "subscribe",
        name.tenant,
        lambda role: service.can_consume(name, role, subscription),
    )


async def may_look_up(
    conn: ServerConnection, request_id: int, name: TopicName, reply: type, operation: str
) -> bool:
    service = conn.broker.authorization
    return await permitted(
        conn, request_id, reply, operation, name.tenant, lambda role: service.can_lookup(name, role)
    )


async def may_list(conn: ServerConnection, request_id: int, namespace: str) -> bool:
    """GET_TOPICS_OF_NAMESPACE: a namespace grant of produce or consume (Pulsar's GET_TOPICS)."""
    service = conn.broker.authorization

    async def check(role: str | None) -> bool:
        return await service.allows_namespace_action(
            namespace, role, "consume"
        ) or await service.allows_namespace_action(namespace, role, "produce")

    return await permitted(
        conn, request_id, None, "GetTopicsOfNamespace", namespace.split("/")[0], check
    )
