"""The proxy's HTTP port: probes and metrics of its own, and the brokers' admin and lookup REST
API forwarded to a broker, so clients that reach only the proxy can administer the cluster.

Open paths (no credentials, as on a broker): ``/status.html`` and ``/health`` (200 while the
proxy runs), ``/ready`` (200 once the host says it can serve: metadata store open and a broker
registered; 503 before), ``/metrics`` (the :class:`ProxyMetrics` registry).

Forwarded paths: ``/admin/...`` and ``/lookup/...``, any method, as Pulsar's proxy
(``AdminProxyHandler``) forwards them:

- The client is authenticated by the proxy first, with the brokers' providers
  (``Authorization`` header, else the client certificate of an HTTPS connection, else the
  anonymous role); a refusal is answered here, 401 ``{"reason": ...}``, never sent on.
- The broker is called with the proxy's own credentials (``broker_client_authentication_*``)
  and ``X-Original-Principal: <client role>``: brokers accept that header only from a role in
  their ``proxy_roles`` and authorize both roles. A client's own ``X-Original-Principal`` is
  dropped, or any client could speak as anyone through the proxy's role. With
  ``forward_authorization_credentials`` the client's ``Authorization`` header is sent instead
  and the broker authenticates the client itself (no principal header: the caller then is the
  client, not a proxy). With authentication off at the proxy, there is no client role to name.
- Method, path and query (as the client encoded them), body and content type are kept; the
  answer's status, body and end-to-end headers come back.
- A broker's redirect (a topic owned elsewhere) is followed here, at most
  :data:`MAX_REDIRECTS` hops, and only to a registered broker (never to an address a response
  names: the proxy would otherwise dial anything a broker, or whoever answers as one, points
  at). The client only ever sees the proxy.
- Failures are the proxy's own ``{"reason": ...}`` answers: 413 for a body over
  :data:`MAX_REQUEST_BODY_BYTES`, 503 when no broker is registered or none can be reached, 504
  when the broker does not answer within ``broker_proxy_read_timeout_ms``, 502 for a redirect
  out of the cluster or one hop too many.

Every call to a forwarded path is counted in ``http_requests{code}`` with the status the client
got, the proxy's own refusals included.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Iterable
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from magnetar.common.auth.client import ClientCredentials
from magnetar.common.auth.provider import AuthenticationError
from magnetar.common.auth.service import AuthenticationService
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.config import ConfigError
from magnetar.common.metrics import CONTENT_TYPE, render
from magnetar.common.tls import client_context, peer_certificate_der
from magnetar.proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

#: Redirects followed per request before giving up (Pulsar's proxy: 10 lookup hops too).
MAX_REDIRECTS = 10
#: Largest request body forwarded; larger ones are answered 413 without calling a broker.
MAX_REQUEST_BODY_BYTES = 5 * 1024 * 1024
#: Redirect statuses that keep the method and body, the ones brokers answer.
REDIRECTS = frozenset({307, 308})

ORIGINAL_PRINCIPAL_HEADER = "X-Original-Principal"
#: Headers of one connection, not of the request (RFC 9110 section 7.6.1): never copied from the
#: client to the broker or back.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
#: Client headers not sent on: the connection's, and those the proxy sets itself.
NOT_FORWARDED = HOP_BY_HOP | {
    "host",
    "content-length",
    "expect",
    "authorization",
    ORIGINAL_PRINCIPAL_HEADER.lower(),
    # aiohttp asks for and decodes compression on its own; the client's wish is not passed on
    # so the body handed back is always the decoded one.
    "accept-encoding",
}
NOT_RETURNED = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}


class ProxyHttpConfig(Protocol):
    """The settings of ``ProxyConfig`` this module reads."""

    @property
    def authentication_enabled(self) -> bool: ...
    @property
    def forward_authorization_credentials(self) -> bool: ...
    @property
    def tls_enabled_with_broker(self) -> bool: ...
    @property
    def tls_hostname_verification_enabled(self) -> bool: ...
    @property
    def broker_client_trust_certs_file_path(self) -> str: ...
    @property
    def broker_proxy_read_timeout_ms(self) -> int: ...


class BrokerDirectory(Protocol):
    """The registered brokers, as the proxy's metadata-store watch knows them."""

    def brokers(self) -> list[BrokerInfo]: ...

    def pick(self) -> BrokerInfo:
        """A broker to send a request to (``LookupError`` when none is registered)."""
        ...


class ProxyHttpHost(Protocol):
    """What the HTTP half needs of the proxy's composition root."""

    @property
    def config(self) -> ProxyHttpConfig: ...
    @property
    def authentication(self) -> AuthenticationService: ...
    @property
    def directory(self) -> BrokerDirectory: ...
    @property
    def metrics(self) -> ProxyMetrics: ...
    @property
    def client_credentials(self) -> ClientCredentials: ...

    def ready(self) -> bool:
        """Metadata store open and at least one broker registered."""
        ...


class ForwardError(Exception):
    """Answered to the client as ``{"reason": ...}`` with this status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def build_http_app(proxy: ProxyHttpHost) -> web.Application:
    """The proxy's HTTP application; the caller serves it (HTTP, and HTTPS on
    ``web_service_port_tls`` with the proxy's ``ServerTls`` context)."""
    app = web.Application(client_max_size=MAX_REQUEST_BODY_BYTES)
    forwarder = Forwarder(proxy)

    async def broker_session(app: web.Application) -> AsyncIterator[None]:
        forwarder.session = _new_session(proxy)
        yield
        await forwarder.session.close()

    app.cleanup_ctx.append(broker_session)

    async def status(_: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def ready(_: web.Request) -> web.Response:
        if proxy.ready():
            return web.Response(text="OK")
        return web.Response(status=503, text="Not ready: no metadata store or no broker registered")

    async def metrics(_: web.Request) -> web.Response:
        body = await asyncio.to_thread(render, proxy.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/status.html", status)
    app.router.add_get("/health", status)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/admin/{tail:.*}", forwarder.handle)
    app.router.add_route("*", "/lookup/{tail:.*}", forwarder.handle)
    return app


def _new_session(proxy: ProxyHttpHost) -> aiohttp.ClientSession:
    config = proxy.config
    context: ssl.SSLContext | bool = True
    if config.tls_enabled_with_broker:
        cert_file, key_file = client_certificate(proxy.client_credentials)
        context = client_context(
            config.broker_client_trust_certs_file_path,
            cert_file,
            key_file,
            verify_hostname=config.tls_hostname_verification_enabled,
        )
    timeout_ms = config.broker_proxy_read_timeout_ms
    seconds = timeout_ms / 1000 if timeout_ms > 0 else None
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context),
        timeout=aiohttp.ClientTimeout(total=None, connect=seconds, sock_read=seconds),
        # Cookies belong to the clients, not to the proxy's one session.
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def client_certificate(credentials: ClientCredentials) -> tuple[str, str]:
    """The proxy's client certificate and key files for TLS authentication to brokers, from
    Pulsar's ``tlsCertFile:<path>,tlsKeyFile:<path>`` (or its JSON form); empty otherwise."""
    if credentials.method != "tls" or not credentials.parameters:
        return "", ""
    text = credentials.parameters
    found: dict[str, str] = {}
    if text.startswith("{"):
        try:
            document = json.loads(text)
            found = {str(k): str(v) for k, v in document.items()}
        except (ValueError, AttributeError):
            raise ConfigError(
                "broker_client_authentication_parameters: tls needs "
                "tlsCertFile:<path>,tlsKeyFile:<path> or its JSON form"
            ) from None
    else:
        for part in text.split(","):
            key, _, value = part.partition(":")
            found[key.strip()] = value.strip()
    return found.get("tlsCertFile", ""), found.get("tlsKeyFile", "")


class Forwarder:
    """Sends one client request to a broker and hands the broker's answer back."""

    def __init__(self, proxy: ProxyHttpHost) -> None:
        self.proxy = proxy
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        response: web.StreamResponse
        try:
            response = await self._forward(request)
        except ForwardError as e:
            response = web.json_response({"reason": e.reason}, status=e.status)
        self.proxy.metrics.http_requests.labels(code=str(response.status)).inc()
        return response

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        headers = await self._broker_headers(request)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ForwardError(
                413, f"Request body larger than {MAX_REQUEST_BODY_BYTES} bytes"
            ) from None
        answer = await self._call(request.method, request.raw_path, headers, body)
        try:
            return await self._relay(request, answer)
        finally:
            answer.release()

    async def _broker_headers(self, request: web.Request) -> CIMultiDict[str]:
        proxy = self.proxy
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED
        )
        client_authorization = request.headers.get("Authorization")
        role: str | None = None
        if proxy.config.authentication_enabled:
            transport = request.transport
            certificate = peer_certificate_der(transport) if transport is not None else None
            service = proxy.authentication
            try:
                role = (
                    await asyncio.to_thread(
                        service.authenticate_http, client_authorization, certificate
                    )
                ).role
            except AuthenticationError as e:
                service.failures.refused(
                    f"HTTP {request.method} {request.path} at the proxy",
                    request.remote or "?",
                    str(e),
                )
                raise ForwardError(401, f"Authentication required: {e}") from None
        if proxy.config.forward_authorization_credentials and client_authorization:
            headers["Authorization"] = client_authorization
        else:
            headers.update(proxy.client_credentials.http_headers())
            if role:
                headers[ORIGINAL_PRINCIPAL_HEADER] = role
        if request.remote:
            headers["X-Forwarded-For"] = request.remote
        headers["X-Forwarded-Proto"] = request.scheme
        return headers

    def _base(self, broker: BrokerInfo) -> str:
        if self.proxy.config.tls_enabled_with_broker:
            if not broker.https_url:
                raise ForwardError(
                    503, f"Broker {broker.broker_id} has no HTTPS port (tls_enabled_with_broker)"
                )
            return broker.https_url.rstrip("/")
        return broker.http_url.rstrip("/")

    def _first_brokers(self) -> list[BrokerInfo]:
        """The picked broker, then the others to try if it cannot be reached."""
        directory = self.proxy.directory
        try:
            first = directory.pick()
        except LookupError:
            raise ForwardError(503, "No broker is registered (is the cluster up?)") from None
        return [first, *(b for b in directory.brokers() if b.broker_id != first.broker_id)]

    def registered_target(self, location: str, current: str) -> tuple[BrokerInfo, str]:
        """The registered broker a redirect names, and the path and query to ask it."""
        target = URL(location, encoded=True)
        if not target.is_absolute():
            target = URL(current, encoded=True).join(target)
        where = origin(str(target))
        for broker in self.proxy.directory.brokers():
            if where in (origin(broker.http_url), origin(broker.https_url)):
                return broker, target.raw_path_qs
        raise ForwardError(502, f"Broker redirected to {where}, which is not a registered broker")

    async def _call(
        self, method: str, path_qs: str, headers: CIMultiDict[str], body: bytes
    ) -> aiohttp.ClientResponse:
        candidates = self._first_brokers()
        broker = candidates[0]
        for hop in range(MAX_REDIRECTS + 1):
            answer = None
            tried = candidates if hop == 0 else [broker]
            for index, broker in enumerate(tried):
                try:
                    answer = await self._send(method, self._base(broker) + path_qs, headers, body)
                    break
                except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                    # Nothing was sent: another broker may take the request.
                    log.warning("proxy: broker %s unreachable: %s", broker.broker_id, e)
                    if index == len(tried) - 1:
                        raise ForwardError(
                            503, f"Broker {broker.broker_id} unreachable: {e}"
                        ) from None
            assert answer is not None
            if answer.status not in REDIRECTS or "Location" not in answer.headers:
                return answer
            location = answer.headers["Location"]
            current = str(answer.url)
            answer.release()
            broker, path_qs = self.registered_target(location, current)
        raise ForwardError(502, f"More than {MAX_REDIRECTS} redirects between brokers")

    async def _send(
        self, method: str, url: str, headers: CIMultiDict[str], body: bytes
    ) -> aiohttp.ClientResponse:
        assert self.session is not None, "the app is not started"
        try:
            return await self.session.request(
                method,
                URL(url, encoded=True),
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            raise
        except TimeoutError:
            raise ForwardError(
                504,
                f"Broker at {origin(url)} did not answer within "
                f"{self.proxy.config.broker_proxy_read_timeout_ms} ms",
            ) from None
        except aiohttp.ClientError as e:
            raise ForwardError(503, f"Broker at {origin(url)} failed: {e}") from None

    async def _relay(
        self, request: web.Request, answer: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=answer.status, reason=answer.reason)
        for key, value in _returned(answer.headers.items()):
            response.headers.add(key, value)
        await response.prepare(request)
        try:
            async for chunk in answer.content.iter_chunked(64 * 1024):
                await response.write(chunk)
        except (TimeoutError, aiohttp.ClientError) as e:
            # The status line is out: the only honest answer left is a cut connection.
            log.warning(
                "proxy: broker's answer to %s %s broke off: %r", request.method, request.path, e
            )
            raise
        await response.write_eof()
        return response


def _returned(headers: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
    return ((k, v) for k, v in headers if k.lower() not in NOT_RETURNED)


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, the port made explicit, for comparing brokers."""
    if not url:
        return ""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"
