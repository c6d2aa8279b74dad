"""Admin REST of permissions, on Pulsar's paths:

- ``GET    /admin/v2/namespaces/{tenant}/{namespace}/permissions``: role -> actions
- ``POST   /admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}`` (body: actions)
- ``DELETE /admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}``
- ``GET    /admin/v2/namespaces/{tenant}/{namespace}/permissions/subscription``: sub -> roles
- ``POST   /admin/v2/namespaces/{tenant}/{namespace}/permissions/subscription/{sub}`` (body:
  roles)
- ``DELETE /admin/v2/namespaces/{tenant}/{namespace}/permissions/{sub}/{role}``
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions``: the namespace's
  grants joined with the topic's
- ``POST|DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}/permissions/{role}``

The grants themselves are ``namespace.authorization``'s. Who may call: the namespace routes are
Pulsar's namespace operations (GET_PERMISSION, GRANT_PERMISSION, REVOKE_PERMISSION: superusers
and the tenant's admins, 403 otherwise), the topic routes its tenant-admin check
(:func:`require_tenant_admin`, 401 otherwise). Granting answers 501 while authorization is off,
as Pulsar's does. Register these routes before the namespace policies'
(``.../{namespace}/{policy}`` would take ``.../permissions``).

Who the caller is: ``request[ROLE]`` and ``request[ORIGINAL_PRINCIPAL]``, put there by the
authentication middleware; a request it has not seen (no ``role`` key) is an unauthenticated
caller, the ``anonymous_user_role`` if one is set (:func:`caller`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.authentication import ORIGINAL_PRINCIPAL, ROLE
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.namespace.authorization import (
    AuthorizationService,
    GrantNotFoundError,
    NamespaceMissingError,
    check_actions,
    check_roles,
)
from magnetar.broker.namespace.policies import PolicyError

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

T = TypeVar("T")

NOT_ENABLED = "Authorization is not enabled"
NEED_AUTHENTICATION = "Need to authenticate to perform the request"
NOT_TENANT_ADMIN = "Don't have admin permission"
NOT_SUPERUSER = "This operation requires super-user access"
TENANT_MISSING = "Tenant does not exist"
NAMESPACE_MISSING = "Namespace does not exist"
#: Pulsar's answer when a grant's namespace is gone (for a namespace grant too).
GRANT_NAMESPACE_MISSING = "Topic's namespace does not exist"


def caller(request: web.Request, broker: AdminBroker) -> tuple[str | None, str | None]:
    """The caller's role and, when a proxy relays it, the client's (``original_principal``).
    Without the authentication middleware's word (no ``role`` key) the caller is anonymous:
    the ``anonymous_user_role`` while authentication is on and one is set, else None."""
    if ROLE in request:
        return request[ROLE], request.get(ORIGINAL_PRINCIPAL)
    config = broker.config
    anonymous = config.anonymous_user_role if config.authentication_enabled else ""
    return (anonymous or None), None


def _checked(broker: AdminBroker) -> bool:
    """Pulsar checks admin callers only with both authentication and authorization on."""
    return bool(broker.config.authentication_enabled and broker.config.authorization_enabled)


def _authorization(broker: AdminBroker) -> AuthorizationService:
    return broker.authorization


async def require_tenant_admin(request: web.Request, broker: AdminBroker, tenant: str) -> None:
    """Pulsar's tenant-admin check (``validateAdminAccessForTenant``): 404 for a missing
    tenant; then, with authentication and authorization on, 403 for an unauthenticated caller
    and 403 unless the caller is a superuser or one of the tenant's ``adminRoles``. A proxy
    passes as a tenant admin itself, or when it and the client it relays are both superusers
    (Pulsar's rule)."""
    authorization = _authorization(broker)
    if await authorization.tenant(tenant, fresh=True) is None:
        raise AdminError(404, TENANT_MISSING)
    if not _checked(broker):
        return
    role, original = caller(request, broker)
    if role is None:
        raise AdminError(403, NEED_AUTHENTICATION)
    _require_valid_pair(authorization, role, original)
    if authorization.is_proxy_role(role):
        if await authorization.is_tenant_admin(tenant, role, fresh=True):
            return
        if not (
            await authorization.is_superuser(role) and await authorization.is_superuser(original)
        ):
            raise AdminError(
                401,
                f"Proxy not authorized to access resource (proxy:{role},original:{original})",
            )
        return
    if not await authorization.is_tenant_admin(tenant, role, fresh=True):
        raise AdminError(403, NOT_TENANT_ADMIN)


async def require_superuser(request: web.Request, broker: AdminBroker) -> None:
    """Pulsar's superuser check (``validateSuperUserAccess``): with authentication and
    authorization on, 403 unless the caller is a superuser (a proxy: it and its client)."""
    if not _checked(broker):
        return
    authorization = _authorization(broker)
    role, original = caller(request, broker)
    if role is None:
        raise AdminError(403, NEED_AUTHENTICATION)
    _require_valid_pair(authorization, role, original)
    if authorization.is_proxy_role(role):
        allowed = await authorization.is_superuser(role) and await authorization.is_superuser(
            original
        )
    else:
        allowed = await authorization.is_superuser(role)
    if not allowed:
        raise AdminError(403, NOT_SUPERUSER)


async def require_namespace_operation(
    request: web.Request, broker: AdminBroker, namespace: str, operation: str
) -> None:
    """Pulsar's check of a namespace operation reserved to tenant admins (``GRANT_PERMISSION``,
    ``GET_PERMISSION``, ``REVOKE_PERMISSION``, ``CREATE_TOPIC``, ...): with authentication and
    authorization on, 403 for an unauthenticated caller, 404 for a missing tenant, 403 unless
    the caller (and the client a proxy relays) is a superuser or a tenant admin."""
    if not _checked(broker):
        return
    authorization = _authorization(broker)
    role, original = caller(request, broker)
    if role is None:
        raise AdminError(403, NEED_AUTHENTICATION)
    tenant = namespace.split("/")[0]
    if await authorization.tenant(tenant, fresh=True) is None:
        raise AdminError(404, TENANT_MISSING)

    async def admin(r: str | None) -> bool:
        return await authorization.is_tenant_admin(tenant, r, fresh=True)

    if not await authorization.allowed_through_proxy(admin, role, original):
        raise AdminError(
            403,
            f"Unauthorized to validateNamespaceOperation for operation [{operation}] on "
            f"namespace [{namespace}]",
        )


def _require_valid_pair(
    authorization: AuthorizationService, role: str | None, original: str | None
) -> None:
    if authorization.is_valid_original_principal(role, original):
        return
    if not original:
        raise AdminError(401, "Original principal cannot be empty if the request is via proxy.")
    raise AdminError(401, "Original principal cannot be a proxy role")


async def _stored(call: Awaitable[T], missing: str = NAMESPACE_MISSING) -> T:
    """``call``'s answer; a namespace that is not there is 404 ``missing``."""
    try:
        return await call
    except NamespaceMissingError:
        raise AdminError(404, missing) from None


def _require_enabled(broker: AdminBroker) -> None:
    if not broker.config.authorization_enabled:
        raise AdminError(501, NOT_ENABLED)


async def _body(request: web.Request, check: Any) -> list[str]:
    if not request.can_read_body:
        raise AdminError(412, "a JSON array is expected as the request body")
    try:
        return check(await requests.json_body(request))  # type: ignore[no-any-return]
    except PolicyError as e:
        raise AdminError(412, str(e)) from None


def add_permission_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    ns_base = "/admin/v2/namespaces/{tenant}/{namespace}/permissions"
    topic_base = (
        "/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}/{topic}/permissions"
    )

    @routes.get(ns_base)
    async def namespace_permissions(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await require_namespace_operation(request, broker, namespace, "GET_PERMISSION")
        found = await _stored(_authorization(broker).namespace_permissions(namespace))
        return web.json_response(found)

    @routes.get(ns_base + "/subscription")
    async def subscription_permissions(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await require_namespace_operation(request, broker, namespace, "GET_PERMISSION")
        found = await _stored(_authorization(broker).subscription_permissions(namespace))
        return web.json_response(found)

    @routes.post(ns_base + "/subscription/{subscription}")
    async def grant_subscription(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        _require_enabled(broker)
        await require_namespace_operation(request, broker, namespace, "GRANT_PERMISSION")
        roles = await _body(request, check_roles)
        await _stored(
            _authorization(broker).grant_subscription(
                namespace, request.match_info["subscription"], roles
            )
        )
        return web.Response(status=204)

    @routes.delete(ns_base + "/{subscription}/{role}")
    async def revoke_subscription(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        _require_enabled(broker)
        await require_namespace_operation(request, broker, namespace, "REVOKE_PERMISSION")
        try:
            await _authorization(broker).revoke_subscription(
                namespace, request.match_info["subscription"], request.match_info["role"]
            )
        except NamespaceMissingError:
            raise AdminError(404, NAMESPACE_MISSING) from None
        except GrantNotFoundError as e:
            raise AdminError(404, str(e)) from None
        return web.Response(status=204)

    @routes.post(ns_base + "/{role}")
    async def grant_namespace(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        _require_enabled(broker)
        await require_namespace_operation(request, broker, namespace, "GRANT_PERMISSION")
        actions = await _body(request, check_actions)
        await _stored(
            _authorization(broker).grant_namespace(namespace, request.match_info["role"], actions),
            GRANT_NAMESPACE_MISSING,
        )
        return web.Response(status=204)

    @routes.delete(ns_base + "/{role}")
    async def revoke_namespace(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        _require_enabled(broker)
        await require_namespace_operation(request, broker, namespace, "REVOKE_PERMISSION")
        await _stored(
            _authorization(broker).revoke_namespace(namespace, request.match_info["role"])
        )
        return web.Response(status=204)

    @routes.get(topic_base)
    async def topic_permissions(request: web.Request) -> web.Response:
        topic = requests.topic(request)
        await require_tenant_admin(request, broker, topic.tenant)
        found = await _stored(_authorization(broker).topic_permissions(topic))
        return web.json_response(found)

    @routes.post(topic_base + "/{role}")
    async def grant_topic(request: web.Request) -> web.Response:
        topic = requests.topic(request)
        await require_tenant_admin(request, broker, topic.tenant)
        _require_enabled(broker)
        actions = await _body(request, check_actions)
        await _stored(
            _authorization(broker).grant_topic(topic, request.match_info["role"], actions),
            GRANT_NAMESPACE_MISSING,
        )
        return web.Response(status=204)

    @routes.delete(topic_base + "/{role}")
    async def revoke_topic(request: web.Request) -> web.Response:
        topic = requests.topic(request)
        await require_tenant_admin(request, broker, topic.tenant)
        _require_enabled(broker)
        try:
            await _authorization(broker).revoke_topic(topic, request.match_info["role"])
        except NamespaceMissingError:
            raise AdminError(404, NAMESPACE_MISSING) from None
        except GrantNotFoundError as e:
            raise AdminError(412, str(e)) from None
        return web.Response(status=204)


__all__ = [
    "add_permission_routes",
    "caller",
    "require_namespace_operation",
    "require_superuser",
    "require_tenant_admin",
]
