"""Who calls the admin API: one middleware that authenticates every request before its route
runs, and puts the caller's role (``request[ROLE]``, None while authentication is off) and, for
a request relayed by a proxy, the client's role (``request[ORIGINAL_PRINCIPAL]``) on it.

Credentials come from ``Authorization: Bearer <token>`` or ``Authorization: Basic <base64>``,
else from the client certificate of an HTTPS connection (the ``tls`` provider), else the
anonymous role. Missing or bad credentials are answered 401 with Pulsar's ``{"reason": ...}``.
A proxy names its client in ``X-Original-Principal``, as Pulsar's proxy does; only a role in
``proxy_roles`` may, and it may not name a proxy role.

``/health``, ``/admin/v2/brokers/ready`` and ``/metrics`` stay open: probes and scrapers carry
no credentials. ``/admin/v2/brokers/health``, Pulsar's health check, writes to the bookies and
is for superusers, as in Pulsar.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin.errors import error_response
from magnetar.common.auth.provider import AuthenticationError
from magnetar.common.tls import peer_certificate_der

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: Where the caller's role and the client a proxy relays are kept on the request.
ROLE = web.RequestKey("role", str)
ORIGINAL_PRINCIPAL = web.RequestKey("original_principal", str)
OPEN_PATHS = frozenset({"/health", "/metrics", "/admin/v2/brokers/ready"})
ORIGINAL_PRINCIPAL_HEADER = "X-Original-Principal"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def authentication(
    broker: AdminBroker,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    service = broker.authentication

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[ROLE] = None  # type: ignore[assignment]
        request[ORIGINAL_PRINCIPAL] = None  # type: ignore[assignment]
        if not service.enabled or request.path in OPEN_PATHS:
            return await handler(request)
        try:
            found = await asyncio.to_thread(
                service.authenticate_http,
                request.headers.get("Authorization"),
                peer_certificate_der(request),
            )
            original = request.headers.get(ORIGINAL_PRINCIPAL_HEADER) or None
            if original is not None:
                if found.role not in broker.proxy_roles or original in broker.proxy_roles:
                    raise AuthenticationError("Invalid roles.")
        except AuthenticationError as e:
            service.failures.refused(
                f"HTTP {request.method} {request.path}", request.remote or "?", str(e)
            )
            return error_response(401, f"Authentication required: {e}")
        request[ROLE] = found.role
        request[ORIGINAL_PRINCIPAL] = original  # type: ignore[assignment]
        return await handler(request)

    return authenticate
