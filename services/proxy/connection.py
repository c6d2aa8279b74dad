"""One client connection to the proxy, in Pulsar's proxy states:

``init`` -> ``connecting`` (CONNECT received, credentials being checked) -> either ``lookup``
(no ``proxy_to_broker_url``: CONNECTED at once, lookups answered by the proxy, see
``lookup.py``) or ``connecting-to-broker`` (the target validated, see ``targets.py``, and
dialled with the proxy's own CONNECT) -> ``relaying`` (bytes both ways, see ``relay.py``) ->
``closing``.

Refusals follow the broker's shapes: ``CommandError(request_id=2**64-1, ...)`` then close, with
AuthenticationError for credentials, UnsupportedVersionError below protocol version 10,
ServiceNotReady "Target broker cannot be validated." for a relay target that is not an allowed
registered broker, and a broker's own refusal passed through with its code.

From CONNECT on, a connection that asked to be relayed is read raw: frames that came in the
same read as CONNECT are framed again exactly (the codec keeps a payload's bytes), later bytes
are kept as they are until the relay starts, then handed to the broker first.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from magnetar.common.auth.provider import AuthenticationError, Credentials
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.transport import FrameConnection
from magnetar.common.tls import peer_certificate_der
from magnetar.proxy import refusals
from magnetar.proxy.broker_link import BrokerRefused, BrokerUnreachable
from magnetar.proxy.relay import Relay
from magnetar.proxy.targets import REFUSAL, TargetRefused, validate_target

if TYPE_CHECKING:
    from magnetar.proxy.proxy import Proxy

log = logging.getLogger(__name__)
Type = pb.BaseCommand.Type

SERVER_VERSION = "magnetar-proxy-0.1"
#: Pulsar's request id for errors that answer no request (an unsigned -1 on the wire).
NO_REQUEST = 2**64 - 1
#: Clients below this protocol version are refused (Pulsar's proxy: v10).
MIN_PROTOCOL_VERSION = 10
#: Client bytes held while the broker is being connected; beyond, reading pauses.
EARLY_BYTES_LIMIT = 1024 * 1024
#: Frames held while a lookup connection's credentials are checked; a client that sends more
#: before CONNECTED is closed.
HELD_FRAMES_LIMIT = 1000
LOOKUP_COMMANDS = frozenset(
    {Type.LOOKUP, Type.PARTITIONED_METADATA, Type.GET_TOPICS_OF_NAMESPACE, Type.GET_SCHEMA}
)


class Phase(enum.Enum):
    INIT = "init"
    CONNECTING = "connecting"
    LOOKUP = "lookup"
    CONNECTING_TO_BROKER = "connecting-to-broker"
    RELAYING = "relaying"
    CLOSING = "closing"


@dataclass(slots=True)
class Identity:
    """Who the client proved to be (role None while authentication is off)."""

    role: str | None = None
    method: str = ""
    #: The client's credentials as CONNECT carried them, forwarded with
    #: ``forward_authorization_credentials``.
    auth_data: str = ""
    expires_at: float | None = None


def _frame_bytes(frame: codec.Frame) -> bytes:
    if frame.type in codec.PAYLOAD_COMMANDS:
        return codec.encode_payload_command_raw(frame.command, frame.headers_and_payload)
    return codec.encode_command(frame.command)


class ProxyConnection(FrameConnection):
    def __init__(self, proxy: Proxy) -> None:
        config = proxy.config
        super().__init__(
            config.max_message_size + codec.FRAME_PADDING, config.keep_alive_interval_seconds, 0.0
        )
        self.proxy = proxy
        self.phase = Phase.INIT
        self.identity = Identity()
        self.ip = "?"
        self.protocol_version = 0
        self.relay: Relay | None = None
        self.admitted = False
        self._raw = False  # a relay was asked for: bytes are not decoded any more
        self._early = bytearray()
        self._held: list[codec.Frame] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._handshake_timer: asyncio.TimerHandle | None = None

    # -- life cycle -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.ip = str(peer[0]) if peer else "?"
        if not self.proxy.admit(self):
            self.phase = Phase.CLOSING
            transport.close()
            return
        self.admitted = True
        self._handshake_timer = asyncio.get_running_loop().call_later(
            self.proxy.config.handshake_timeout_seconds, self._handshake_expired
        )

    def closed(self, exc: Exception | None) -> None:
        self.phase = Phase.CLOSING
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self.relay is not None:
            self.relay.close()
        if self.admitted:
            self.proxy.release(self)

    def close(self) -> None:
        self.phase = Phase.CLOSING
        super().close()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` for this connection; cancelled when it closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "connection %s: %s",
                self.peer,
                task.exception(),
                exc_info=task.exception(),
            )
            self.close()

    def _handshake_expired(self) -> None:
        if self.phase in (Phase.INIT, Phase.CONNECTING, Phase.CONNECTING_TO_BROKER):
            self.proxy.refusals.refused(
                refusals.HANDSHAKE_TIMEOUT,
                self.peer,
                f"CONNECT not completed within {self.proxy.config.handshake_timeout_seconds:g} s "
                f"(handshake_timeout_seconds; state {self.phase.value})",
            )
            self.close()

    # -- bytes in ---------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.relay is not None:
            self.relay.to_broker(data)
        elif self._raw:
            self._early += data
            if len(self._early) > EARLY_BYTES_LIMIT and self.transport is not None:
                self.transport.pause_reading()  # resumed when the relay starts
        elif self.phase is not Phase.CLOSING:
            super().data_received(data)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.relay is not None:
            self.relay.client_write_paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.relay is not None:
            self.relay.client_write_resumed()

    def check_alive(self) -> None:
        if self.phase in (Phase.INIT, Phase.LOOKUP):
            super().check_alive()
        elif self.phase in (Phase.CONNECTING, Phase.CONNECTING_TO_BROKER):
            # The handshake timeout bounds these; look again afterwards.
            asyncio.get_running_loop().call_later(1.0, self.check_alive)
        # Relaying: the broker's PINGs and the client's PONGs travel through the relay.

    def checksum_failed(self, error: codec.ChecksumError) -> None:
        log.info("connection %s: payload command on a lookup connection; closing", self.peer)
        self.close()

    def handle_frame(self, frame: codec.Frame) -> None:
        kind = frame.type
        if kind == Type.CONNECT:
            self._connect(frame.body)  # type: ignore[arg-type]
        elif kind == Type.PING:
            self.send(pb.CommandPong())
        elif kind == Type.PONG:
            pass
        elif self._raw:
            self._early += _frame_bytes(frame)
        elif self.phase is Phase.CONNECTING:
            if len(self._held) >= HELD_FRAMES_LIMIT:
                log.info("connection %s: too many frames before CONNECTED; closing", self.peer)
                self.close()
                return
            self._held.append(frame)
        elif self.phase is Phase.LOOKUP:
            if kind in LOOKUP_COMMANDS:
                self.proxy.lookups.serve(self, frame)
            else:
                self._not_served(frame)

    def _not_served(self, frame: codec.Frame) -> None:
        request_id = getattr(frame.body, "request_id", None)
        message = (
            f"{frame.name} is not served on a lookup connection of the proxy: look the topic "
            "up, then connect through the proxy to its broker"
        )
        log.info("connection %s: %s refused in lookup mode", self.peer, frame.name)
        if request_id is None:
            self.close()
        else:
            self.send(
                pb.CommandError(request_id=request_id, error=pb.NotAllowedError, message=message)
            )

    # -- CONNECT ----------------------------------------------------------------------------------

    def _refuse(self, reason: str, detail: str, error: int, message: str) -> None:
        self.proxy.refusals.refused(reason, self.peer, detail)
        self.send(pb.CommandError(request_id=NO_REQUEST, error=error, message=message))
        self.close()

    def _connect(self, body: pb.CommandConnect) -> None:
        if body.protocol_version < MIN_PROTOCOL_VERSION:
            message = (
                f"protocol version {body.protocol_version} is not supported by the proxy "
                f"(at least {MIN_PROTOCOL_VERSION}): upgrade the client"
            )
            self._refuse(refusals.PROTOCOL_VERSION, message, pb.UnsupportedVersionError, message)
            return
        self.protocol_version = codec.negotiate_protocol_version(body.protocol_version)
        self.phase = Phase.CONNECTING
        if body.proxy_to_broker_url:
            self._raw = True
            for frame in self.buffered_frames():
                self._early += _frame_bytes(frame)
        self.spawn(self._handshake(body))

    async def _handshake(self, body: pb.CommandConnect) -> None:
        if not await self._authenticate(body) or self.phase is Phase.CLOSING:
            return
        if body.proxy_to_broker_url:
            await self._connect_to_broker(body)
        else:
            self._enter_lookup_mode()

    async def _authenticate(self, body: pb.CommandConnect) -> bool:
        identity = self.identity
        identity.method = body.auth_method_name or ("none" if not body.auth_data else "")
        identity.auth_data = body.auth_data.decode("utf-8", "replace")
        authentication = self.proxy.authentication
        if not authentication.enabled:
            return True
        assert self.transport is not None
        credentials = Credentials(body.auth_data, peer_certificate_der(self.transport))
        try:
            found = await asyncio.to_thread(
                authentication.authenticate, identity.method, credentials
            )
        except AuthenticationError as e:
            reason = str(e)
        except Exception as e:  # a provider's own failure: refused and logged
            log.exception("connection %s: authenticating CONNECT failed", self.peer)
            reason = f"internal error: {type(e).__name__}"
        else:
            identity.role, identity.expires_at = found.role, found.expires_at
            return True
        authentication.failures.refused("CONNECT", self.peer, reason)
        self.proxy.metrics.rejected_connections.labels(reason=refusals.AUTHENTICATION).inc()
        self.send(
            pb.CommandError(request_id=NO_REQUEST, error=pb.AuthenticationError, message=reason)
        )
        self.close()
        return False

    def _handshake_done(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def _enter_lookup_mode(self) -> None:
        self.phase = Phase.LOOKUP
        self._handshake_done()
        self.send(
            pb.CommandConnected(
                server_version=SERVER_VERSION,
                protocol_version=self.protocol_version,
                max_message_size=self.proxy.config.max_message_size,
            )
        )
        held, self._held = self._held, []
        for frame in held:
            if self.phase is not Phase.LOOKUP:
                return
            self.handle_frame(frame)

    async def _connect_to_broker(self, body: pb.CommandConnect) -> None:
        self.phase = Phase.CONNECTING_TO_BROKER
        proxy = self.proxy
        try:
            address, dial_host = await validate_target(
                body.proxy_to_broker_url, proxy.rules, proxy.directory
            )
        except TargetRefused as e:
            detail = f"proxy_to_broker_url {body.proxy_to_broker_url!r}: {e}"
            self._refuse(refusals.TARGET_NOT_ALLOWED, detail, pb.ServiceNotReady, REFUSAL)
            return
        flags = pb.FeatureFlags()
        flags.CopyFrom(body.feature_flags)
        if not proxy.config.forward_authorization_credentials:
            # The broker holds only the proxy's credentials, which the client cannot refresh:
            # expired client credentials close the relay instead (Proxy._check_credentials).
            # With the client's credentials forwarded, the broker challenges the client
            # through the relay (its flag kept) and checks the answer itself.
            flags.supports_auth_refresh = False
        base = pb.CommandConnect(
            client_version=body.client_version or SERVER_VERSION,
            protocol_version=body.protocol_version,
            feature_flags=flags,
        )
        identity = self.identity
        forwarded = identity.auth_data if proxy.config.forward_authorization_credentials else ""
        connect = await proxy.broker_connect(identity.role, identity.method, forwarded, base)
        try:
            link = await proxy.dial(address, dial_host, connect)
        except BrokerRefused as e:
            self._refuse(refusals.BROKER_REFUSED, f"broker {address}: {e}", e.error, e.message)
            return
        except BrokerUnreachable as e:
            self._refuse(refusals.BROKER_UNREACHABLE, str(e), pb.ServiceNotReady, str(e))
            return
        if self.phase is Phase.CLOSING:
            link.close()
            return
        connected = link.connected.result()
        answer = pb.CommandConnected(
            server_version=connected.server_version or SERVER_VERSION,
            protocol_version=connected.protocol_version,
        )
        if connected.HasField("max_message_size"):
            answer.max_message_size = connected.max_message_size
        if connected.HasField("feature_flags"):
            answer.feature_flags.CopyFrom(connected.feature_flags)
        self.send(answer)
        self._flush()  # CONNECTED leaves before any relayed byte
        self.phase = Phase.RELAYING
        self._handshake_done()
        self.relay = Relay(proxy, self, link, address)
        early, self._early = bytes(self._early), bytearray()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()  # paused if early bytes passed their limit
        self.relay.start(early)
        log.info(
            "connection %s: relaying to broker %s%s",
            self.peer,
            address,
            f" for {identity.role!r}" if identity.role else "",
        )
