"""Lookup mode: LOOKUP, PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE and GET_SCHEMA answered by
the proxy, through its own connections to brokers (Pulsar's ``LookupProxyHandler``).

Each request is sent again under a request id of the proxy's own on a pooled connection to a
registered broker (pooled per broker and per client identity, since the broker authorizes the
client's ``original_principal``), and the answer goes back under the client's id. A LOOKUP
follows the brokers' Redirect answers (with their ``authoritative`` flag, at most
:data:`MAX_HOPS`, each to a registered broker only) and answers the client ``Connect`` naming
the owner with ``proxy_through_service_url=true``: the client then connects to the proxy again
(its service URL) and names that broker in CONNECT's ``proxy_to_broker_url``, which is the
relay. A broker's error is passed back with its code; the proxy's own failures are
``ServiceNotReady``, which clients retry.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.proxy import metrics as m
from magnetar.proxy.broker_link import BrokerLink, BrokerRefused, BrokerUnreachable
from magnetar.proxy.brokers import Address, NoBrokerAvailable

if TYPE_CHECKING:
    from magnetar.proxy.connection import ProxyConnection
    from magnetar.proxy.proxy import Proxy

log = logging.getLogger(__name__)
Type = pb.BaseCommand.Type

#: Redirects a lookup follows before it gives up (Pulsar's proxy: 10).
MAX_HOPS = 10
#: A pooled connection unused this long is closed.
IDLE_SECONDS = 60.0
TOO_MANY = "Too many concurrent lookup requests"


class LookupFailed(Exception):
    def __init__(self, error: int, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


class Unreachable(LookupFailed):
    """The broker asked could not be reached or did not answer in time."""


@dataclass(slots=True, frozen=True)
class LinkKey:
    """Whose requests a pooled connection carries: one per broker and client identity."""

    address: Address
    principal: str | None
    method: str
    forwarded: str  # the client's credentials, when forwarded; "" otherwise


class LookupPool:
    """Connections to brokers for lookups, opened on first use, closed when idle or when their
    broker's registration disappears."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self._links: dict[LinkKey, BrokerLink] = {}
        self._opening: dict[LinkKey, asyncio.Future[BrokerLink]] = {}

    async def link(self, key: LinkKey) -> BrokerLink:
        held = self._links.get(key)
        if held is not None and not held.closed:
            return held
        opening = self._opening.get(key)
        if opening is None:
            # A task of its own: a client that goes away must not cancel a dial others await.
            opening = asyncio.get_running_loop().create_task(self._open(key))
            self._opening[key] = opening
            # Retrieved here so a failure nobody waits for any more is not reported as lost.
            opening.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(opening)

    async def _open(self, key: LinkKey) -> BrokerLink:
        try:
            connect = await self.proxy.broker_connect(
                key.principal, key.method, key.forwarded, pb.CommandConnect()
            )
            link = await self.proxy.dial(key.address, key.address.host, connect)
        finally:
            self._opening.pop(key, None)
        self._links[key] = link
        link.on_close(lambda: self._forget(key, link))
        return link

    def _forget(self, key: LinkKey, link: BrokerLink) -> None:
        if self._links.get(key) is link:
            del self._links[key]

    def close_idle(self, now: float) -> None:
        for link in list(self._links.values()):
            if now - link.last_used > IDLE_SECONDS:
                link.close()

    def close_broker(self, addresses: list[Address]) -> None:
        for key, link in list(self._links.items()):
            if key.address in addresses:
                link.close()

    def close(self) -> None:
        for link in list(self._links.values()):
            link.close()


def _url(proxy: Proxy, plain: str, tls: str) -> str:
    if proxy.config.tls_enabled_with_broker and tls:
        return tls
    return plain


class LookupService:
    """What a connection in lookup mode calls; counts requests in flight against
    ``max_concurrent_lookup_requests``."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.pool = LookupPool(proxy)
        self.in_flight = 0

    def serve(self, conn: ProxyConnection, frame: codec.Frame) -> None:
        kind = {
            Type.LOOKUP: m.LOOKUP,
            Type.PARTITIONED_METADATA: m.PARTITIONED_METADATA,
            Type.GET_TOPICS_OF_NAMESPACE: m.TOPICS_OF_NAMESPACE,
            Type.GET_SCHEMA: m.GET_SCHEMA,
        }[frame.type]
        body: Any = frame.body
        self.proxy.metrics.lookups.labels(kind=kind).inc()
        if self.in_flight >= self.proxy.config.max_concurrent_lookup_requests:
            self.proxy.metrics.lookup_errors.labels(kind=kind).inc()
            conn.send(_failure(frame.type, body.request_id, pb.ServiceNotReady, TOO_MANY))
            return
        self.in_flight += 1
        task = conn.spawn(self._answer(conn, frame.type, kind, body))
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        # A callback, not a finally: a task cancelled before it ran never enters its body.
        self.in_flight -= 1

    async def _answer(self, conn: ProxyConnection, kind_type: int, kind: str, body: Any) -> None:
        client_id = body.request_id
        try:
            if kind_type == Type.LOOKUP:
                answer = await self._lookup(conn, body)
            else:
                answer = await self._forward(conn, body)
        except LookupFailed as e:
            answer = _failure(kind_type, client_id, e.error, e.message)
        except Exception:
            log.exception("connection %s: %s failed", conn.peer, codec.command_name(kind_type))
            answer = _failure(kind_type, client_id, pb.ServiceNotReady, "the proxy failed")
        if _is_error(answer):
            self.proxy.metrics.lookup_errors.labels(kind=kind).inc()
        conn.send(answer)

    def _key(self, conn: ProxyConnection, address: Address) -> LinkKey:
        identity = conn.identity
        forwarded = (
            identity.auth_data if self.proxy.config.forward_authorization_credentials else ""
        )
        return LinkKey(address, identity.role, identity.method, forwarded)

    def _entry_brokers(self) -> list[Address]:
        """Where a request may start: ``broker_service_url``, else every registered broker,
        beginning with the next in round-robin order."""
        static = self.proxy.config.broker_service_url
        if static:
            return [Address.parse(static)]
        directory = self.proxy.directory
        try:
            first = directory.pick()
        except NoBrokerAvailable as e:
            raise LookupFailed(pb.ServiceNotReady, str(e)) from None
        brokers = directory.brokers()
        start = brokers.index(first) if first in brokers else 0
        return [
            Address.parse(_url(self.proxy, info.service_url, info.service_url_tls))
            for info in brokers[start:] + brokers[:start]
        ]

    async def _ask_entry(self, conn: ProxyConnection, body: Any) -> tuple[Address, codec.Frame]:
        """The first hop: a broker that cannot be reached (killed, not yet unregistered) is
        passed over for the next one."""
        failure: LookupFailed | None = None
        for address in self._entry_brokers():
            try:
                return address, await self._ask(conn, address, body)
            except Unreachable as e:
                failure = e
        assert failure is not None
        raise failure

    async def _ask(self, conn: ProxyConnection, address: Address, body: Any) -> codec.Frame:
        try:
            link = await self.pool.link(self._key(conn, address))
            return await link.request(body, self.proxy.config.lookup_timeout_seconds)
        except BrokerRefused as e:
            raise LookupFailed(e.error, e.message) from None
        except BrokerUnreachable as e:
            raise Unreachable(pb.ServiceNotReady, str(e)) from None

    async def _forward(self, conn: ProxyConnection, body: Any) -> Any:
        """PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA: any broker answers."""
        client_id = body.request_id
        request = type(body)()
        request.CopyFrom(body)
        _, frame = await self._ask_entry(conn, request)
        answer: Any = frame.body
        answer.request_id = client_id
        return answer

    async def _lookup(self, conn: ProxyConnection, body: pb.CommandLookupTopic) -> Any:
        reply = pb.CommandLookupTopicResponse
        address: Address | None = None
        authoritative = body.authoritative
        for _ in range(MAX_HOPS):
            request = pb.CommandLookupTopic()
            request.CopyFrom(body)
            request.authoritative = authoritative
            if address is None:
                address, frame = await self._ask_entry(conn, request)
            else:
                frame = await self._ask(conn, address, request)
            if frame.type == Type.ERROR:
                answer: Any = frame.body
                answer.request_id = body.request_id
                return answer
            found: pb.CommandLookupTopicResponse = frame.body  # type: ignore[assignment]
            if found.response == reply.Failed:
                found.request_id = body.request_id
                return found
            url = _url(self.proxy, found.brokerServiceUrl, found.brokerServiceUrlTls)
            try:
                target = Address.parse(url)
            except ValueError:
                raise LookupFailed(
                    pb.ServiceNotReady, f"broker {address} answered an unusable URL {url!r}"
                ) from None
            if not self.proxy.directory.is_registered(target.host, target.port):
                raise LookupFailed(
                    pb.ServiceNotReady,
                    f"lookup of {body.topic} answered {url}, which is not a registered broker",
                )
            if found.response == reply.Connect:
                return reply(
                    request_id=body.request_id,
                    response=reply.Connect,
                    brokerServiceUrl=url,
                    brokerServiceUrlTls=url,
                    authoritative=True,
                    proxy_through_service_url=True,
                )
            address, authoritative = target, found.authoritative
        raise LookupFailed(
            pb.ServiceNotReady, f"lookup of {body.topic}: more than {MAX_HOPS} redirects"
        )


def _is_error(answer: Any) -> bool:
    if isinstance(answer, pb.CommandError):
        return True
    if isinstance(
        answer, pb.CommandLookupTopicResponse | pb.CommandPartitionedTopicMetadataResponse
    ):
        return answer.response == type(answer).Failed
    if isinstance(answer, pb.CommandGetSchemaResponse):
        return answer.HasField("error_code")
    return False


def _failure(kind: int, request_id: int, error: int, message: str) -> Any:
    """The proxy's own refusal of a lookup-mode request, in the answer's shape."""
    if kind == Type.LOOKUP:
        reply = pb.CommandLookupTopicResponse
        return reply(request_id=request_id, response=reply.Failed, error=error, message=message)
    if kind == Type.PARTITIONED_METADATA:
        meta = pb.CommandPartitionedTopicMetadataResponse
        return meta(request_id=request_id, response=meta.Failed, error=error, message=message)
    if kind == Type.GET_SCHEMA:
        return pb.CommandGetSchemaResponse(
            request_id=request_id, error_code=error, error_message=message
        )
    return pb.CommandError(request_id=request_id, error=error, message=message)
