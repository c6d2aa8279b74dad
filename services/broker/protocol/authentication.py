"""Who is on a connection: CONNECT's credentials, a proxy's original principal, AUTH_RESPONSE,
and the periodic check that a connection's credentials have not expired.

With authentication on, CONNECT is answered only once its credentials are checked (in a thread:
a bcrypt hash costs tens of milliseconds); frames that arrive meanwhile wait and are served
afterwards, so nothing runs before the connection has a role. A refusal is Pulsar's
``CommandError(request_id=-1, AuthenticationError)`` followed by closing the connection.

Through a proxy, the connection is authenticated as the proxy's role and carries the client's
``original_principal``: only a role in ``proxy_roles`` may name one, and it may not name a proxy
role ("Invalid roles."). With ``authenticate_original_auth_data`` the client credentials the
proxy forwards are checked too, and their role is the original principal.

Credentials that expire (a token's ``exp``) are checked every
``authentication_refresh_check_seconds``: a client that announced ``supports_auth_refresh`` is
sent AUTH_CHALLENGE with Pulsar's ``PulsarAuthRefresh`` data and answers with fresh credentials
of the same role; one that cannot refresh, leaves a challenge unanswered until the next check,
or answers with another role is disconnected. On a connection a proxy relays with the client's
credentials forwarded, those are the ones checked and challenged: the proxy passes the
challenge to the client and its answer back, undecoded, and the answer must name the same
client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from magnetar.common.auth.provider import Authenticated, AuthenticationError, Credentials
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

if TYPE_CHECKING:
    from magnetar.broker.protocol.connection import ServerConnection

log = logging.getLogger(__name__)
SERVER_VERSION = "magnetar-0.1"
#: Pulsar's request id for errors that answer no request (an unsigned -1 on the wire).
NO_REQUEST = 2**64 - 1
#: What AUTH_CHALLENGE carries when it asks for refreshed credentials (Pulsar's sentinel).
REFRESH_CHALLENGE = b"PulsarAuthRefresh"


class Identity:
    """The roles a connection acts as, once CONNECT is accepted."""

    __slots__ = (
        "can_refresh",
        "challenged",
        "expires_at",
        "forwarded",
        "method",
        "original_principal",
        "role",
    )

    def __init__(self) -> None:
        #: None while authentication is off (every check passes).
        self.role: str | None = None
        self.original_principal: str | None = None
        self.method = ""
        self.expires_at: float | None = None
        self.can_refresh = False
        self.challenged = False
        #: The relayed client's own credentials were forwarded and checked: ``method`` and
        #: ``expires_at`` are theirs, and refreshing them is the client's to answer.
        self.forwarded = False


def connect(conn: ServerConnection, body: pb.CommandConnect, frame: codec.Frame) -> None:
    conn.protocol_version = codec.negotiate_protocol_version(body.protocol_version)
    conn.client_version = body.client_version
    if not conn.broker.authentication.enabled:
        _connected(conn)
        return
    conn.hold_frames()
    asyncio.get_running_loop().create_task(_authenticate_connect(conn, body))


async def _authenticate_connect(conn: ServerConnection, body: pb.CommandConnect) -> None:
    identity = conn.identity
    identity.method = body.auth_method_name or ("none" if not body.auth_data else "")
    identity.can_refresh = body.feature_flags.supports_auth_refresh
    try:
        found = await _authenticate(conn, identity.method, body.auth_data)
        identity.role, identity.expires_at = found.role, found.expires_at
        identity.original_principal = await _original_principal(conn, body, found.role)
    except AuthenticationError as e:
        _refuse(conn, "CONNECT", str(e))
        return
    except Exception as e:  # a provider's own failure: refused and logged, never left hanging
        log.exception("connection %s: authenticating CONNECT failed", conn.peer)
        _refuse(conn, "CONNECT", f"internal error: {type(e).__name__}")
        return
    if conn.is_closed:
        return
    log.info(
        "connection %s: authenticated as %r%s (%s)",
        conn.peer,
        identity.role,
        f" for {identity.original_principal!r}" if identity.original_principal else "",
        identity.method,
    )
    _connected(conn)
    conn.release_frames()


async def _authenticate(conn: ServerConnection, method: str, data: bytes) -> Authenticated:
    credentials = Credentials(data, conn.peer_certificate())
    return await asyncio.to_thread(conn.broker.authentication.authenticate, method, credentials)


async def _original_principal(
    conn: ServerConnection, body: pb.CommandConnect, role: str
) -> str | None:
    proxy_roles = conn.broker.proxy_roles
    principal = body.original_principal or None
    if role in proxy_roles:
        if body.original_auth_data and conn.broker.config.authenticate_original_auth_data:
            forwarded = await _authenticate(
                conn, body.original_auth_method, body.original_auth_data.encode()
            )
            if principal is not None and principal != forwarded.role:
                raise AuthenticationError("Invalid roles.")
            principal = forwarded.role
            identity = conn.identity
            identity.forwarded = True
            identity.method = body.original_auth_method
            identity.expires_at = forwarded.expires_at
        if principal is None or principal in proxy_roles:
            raise AuthenticationError("Invalid roles.")
        return principal
    if principal is not None and principal != role:
        raise AuthenticationError("Invalid roles.")
    return None


def _connected(conn: ServerConnection) -> None:
    conn.broker.metrics.connection_counts.succeeded += 1
    conn.send(
        pb.CommandConnected(
            server_version=SERVER_VERSION,
            protocol_version=conn.protocol_version,
            max_message_size=conn.broker.config.max_message_size,
        )
    )


def _refuse(conn: ServerConnection, what: str, reason: str) -> None:
    if what == "CONNECT":
        conn.broker.metrics.connection_counts.failed += 1
    conn.broker.authentication.failures.refused(what, conn.peer, reason)
    conn.send(pb.CommandError(request_id=NO_REQUEST, error=pb.AuthenticationError, message=reason))
    conn.close()


def auth_response(conn: ServerConnection, body: pb.CommandAuthResponse, frame: codec.Frame) -> None:
    asyncio.get_running_loop().create_task(_check_response(conn, body))


async def _check_response(conn: ServerConnection, body: pb.CommandAuthResponse) -> None:
    identity = conn.identity
    if not identity.challenged:
        log.info("connection %s: AUTH_RESPONSE without a challenge; ignored", conn.peer)
        return
    method = body.response.auth_method_name or identity.method
    try:
        found = await _authenticate(conn, method, body.response.auth_data)
    except AuthenticationError as e:
        _refuse(conn, "refreshed credentials", str(e))
        return
    expected = identity.original_principal if identity.forwarded else identity.role
    if found.role != expected:
        _refuse(conn, "refreshed credentials", "the refreshed credentials name another role")
        return
    identity.expires_at, identity.challenged = found.expires_at, False
    log.info("connection %s: credentials of %r refreshed", conn.peer, expected)


def check_expiry(conn: ServerConnection, now: float | None = None) -> None:
    """Challenge or disconnect a connection whose credentials expired (the broker calls this
    for every connection every ``authentication_refresh_check_seconds``)."""
    identity = conn.identity
    if identity.expires_at is None or (now or time.time()) < identity.expires_at:
        return
    if identity.challenged:
        log.info(
            "connection %s: credentials of %r expired, challenge unanswered; closing",
            conn.peer,
            identity.role,
        )
        conn.close()
    elif not identity.can_refresh:
        log.info(
            "connection %s: credentials of %r expired and the client cannot refresh them; closing",
            conn.peer,
            identity.role,
        )
        conn.close()
    else:
        identity.challenged = True
        conn.send(
            pb.CommandAuthChallenge(
                server_version=SERVER_VERSION,
                challenge=pb.AuthData(
                    auth_method_name=identity.method, auth_data=REFRESH_CHALLENGE
                ),
                protocol_version=conn.protocol_version,
            )
        )
