"""The proxy's composition root: the metadata store and the broker directory, the binary
servers (plain and TLS), the HTTP app (``http.py``), the lookup pool and the periodic checks
(expired client credentials, idle lookup connections)."""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time

from aiohttp import web

from magnetar.common.auth.client import ClientCredentials
from magnetar.common.auth.service import AuthenticationService
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.config import ConfigError
from magnetar.common.metadata import MetadataStore, open_store
from magnetar.common.net import listen_binary, listen_http
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.tls import ServerTls, client_context
from magnetar.proxy import refusals
from magnetar.proxy.broker_link import BrokerLink, open_link
from magnetar.proxy.brokers import Address, BrokerDirectory, broker_addresses
from magnetar.proxy.config import ProxyConfig
from magnetar.proxy.connection import SERVER_VERSION, Phase, ProxyConnection
from magnetar.proxy.http import build_http_app
from magnetar.proxy.lookup import LookupService
from magnetar.proxy.metrics import ProxyMetrics
from magnetar.proxy.refusals import RefusalLog
from magnetar.proxy.targets import TargetRules

log = logging.getLogger(__name__)

#: How often idle lookup connections are looked for.
SWEEP_SECONDS = 10.0
#: The lease of the proxy's metadata session: it holds no ephemeral key, so a long one only
#: keeps a briefly paused proxy from losing (and reporting) a session it does not need.
SESSION_TTL_SECONDS = 60


def tls_client_files(credentials: ClientCredentials) -> tuple[str, str]:
    """The certificate and key the ``tls`` client plugin shows brokers, from Pulsar's
    parameters ``tlsCertFile:/path,tlsKeyFile:/path`` (or their JSON form)."""
    if credentials.method != "tls":
        return "", ""
    text = credentials.parameters.strip()
    found: dict[str, str] = {}
    if text.startswith("{"):
        import json

        try:
            found = {str(k): str(v) for k, v in json.loads(text).items()}
        except (ValueError, AttributeError):
            raise ConfigError(
                "broker_client_authentication_parameters: tls needs "
                '{"tlsCertFile": ..., "tlsKeyFile": ...}'
            ) from None
    else:
        for part in text.split(","):
            key, sep, value = part.partition(":")
            if sep:
                found[key.strip()] = value.strip()
    cert, key = found.get("tlsCertFile", ""), found.get("tlsKeyFile", "")
    if not cert or not key:
        raise ConfigError(
            "broker_client_authentication_parameters: tls needs tlsCertFile:...,tlsKeyFile:..."
        )
    return cert.removeprefix("file://"), key.removeprefix("file://")


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.authentication = AuthenticationService(config)
        #: How the proxy authenticates to brokers (binary CONNECT and HTTP).
        self.client_credentials = ClientCredentials.parse(
            config.broker_client_authentication_plugin,
            config.broker_client_authentication_parameters,
        )
        self.metrics = ProxyMetrics()
        self.refusals = RefusalLog(self.metrics.rejected_connections)
        self.rules = TargetRules.of(config)
        self.lookups = LookupService(self)
        self.store: MetadataStore | None = None
        self._directory: BrokerDirectory | None = None
        self.connections: set[ProxyConnection] = set()
        self._per_ip: collections.Counter[str] = collections.Counter()
        self.server_tls: ServerTls | None = None
        self._broker_tls: ssl.SSLContext | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._http: web.AppRunner | None = None
        self._sites: list[web.TCPSite] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._serving = False
        #: The ports bound (0: none), known once started.
        self.port = config.port
        self.http_port = config.http_port
        self.port_tls = 0
        self.https_port = 0

    @property
    def directory(self) -> BrokerDirectory:
        assert self._directory is not None, "the proxy is not started"
        return self._directory

    def ready(self) -> bool:
        """Serving, with the metadata store open and at least one broker registered."""
        return self._serving and self._directory is not None and bool(self._directory.brokers())

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        if config.tls_enabled_with_broker:
            cert, key = tls_client_files(self.client_credentials)
            self._broker_tls = client_context(
                config.broker_client_trust_certs_file_path,
                cert,
                key,
                verify_hostname=config.tls_hostname_verification_enabled,
            )
            if not config.tls_hostname_verification_enabled:
                self._broker_tls.check_hostname = False
        if config.service_port_tls >= 0 or config.web_service_port_tls >= 0:
            self.server_tls = ServerTls(
                config.tls_certificate_file_path,
                config.tls_key_file_path,
                config.tls_trust_certs_file_path,
                config.tls_require_trusted_client_cert_on_connect,
                config.tls_cert_refresh_check_duration_sec,
            )
        self.store = await open_store(
            config.metadata_url, session_ttl=SESSION_TTL_SECONDS, tls=config.etcd_tls()
        )
        self._directory = BrokerDirectory(self.store)
        self._directory.on_gone(self._broker_gone)
        await self._directory.start()
        self._http = web.AppRunner(build_http_app(self), access_log=None)
        await self._http.setup()
        self.http_port = await self._listen_http("http_port", config.http_port, None)
        if config.web_service_port_tls >= 0:
            self.https_port = await self._listen_http(
                "web_service_port_tls", config.web_service_port_tls, self.server_tls
            )
        self.port = await self._listen_binary("port", config.port, None)
        if config.service_port_tls >= 0:
            self.port_tls = await self._listen_binary(
                "service_port_tls", config.service_port_tls, self.server_tls
            )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._sweep(), name="proxy sweep"))
        if self.authentication.enabled:
            self._tasks.append(loop.create_task(self._check_credentials(), name="proxy expiry"))
        self._serving = True
        log.info(
            "proxy serving pulsar://%s:%d%s (http %d), %d broker(s) registered",
            config.advertised_address,
            self.port,
            f" and pulsar+ssl://{config.advertised_address}:{self.port_tls}"
            if self.port_tls
            else "",
            self.http_port,
            len(self._directory.brokers()),
        )

    async def stop(self) -> None:
        self._serving = False
        for server in self._servers:
            server.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        for connection in list(self.connections):
            connection.close()
        self.lookups.pool.close()
        if self._http is not None:
            await self._http.cleanup()
        if self._directory is not None:
            await self._directory.close()
        if self.store is not None:
            await self.store.close()
        log.info("proxy stopped")

    async def _listen_http(self, setting: str, port: int, tls: ServerTls | None) -> int:
        assert self._http is not None
        context = tls.context if tls else None
        site, bound = await listen_http(
            self._http, self.config.bind_address, port, setting, context
        )
        self._sites.append(site)
        return bound

    async def _listen_binary(self, setting: str, port: int, tls: ServerTls | None) -> int:
        server, bound = await listen_binary(
            lambda: ProxyConnection(self),
            self.config.bind_address,
            port,
            setting,
            tls.context if tls else None,
        )
        self._servers.append(server)
        return bound

    # -- connections ------------------------------------------------------------------------------

    def admit(self, connection: ProxyConnection) -> bool:
        """Count a new client connection in, or refuse it (limits)."""
        config = self.config
        limit = config.max_concurrent_inbound_connections
        if limit and len(self.connections) >= limit:
            self.refusals.refused(
                refusals.MAX_CONNECTIONS,
                connection.peer,
                f"{limit} connections are open (max_concurrent_inbound_connections)",
            )
            return False
        per_ip = config.max_concurrent_inbound_connections_per_ip
        if per_ip and self._per_ip[connection.ip] >= per_ip:
            self.refusals.refused(
                refusals.MAX_CONNECTIONS_PER_IP,
                connection.peer,
                f"{per_ip} connections from {connection.ip} are open "
                "(max_concurrent_inbound_connections_per_ip)",
            )
            return False
        self.connections.add(connection)
        self._per_ip[connection.ip] += 1
        self.metrics.new_connections.inc()
        self.metrics.active_connections.inc()
        return True

    def release(self, connection: ProxyConnection) -> None:
        if connection not in self.connections:
            return
        self.connections.discard(connection)
        self._per_ip[connection.ip] -= 1
        if self._per_ip[connection.ip] <= 0:
            del self._per_ip[connection.ip]
        self.metrics.active_connections.dec()

    def _broker_gone(self, info: BrokerInfo) -> None:
        """A broker's registration disappeared: every connection to it is closed now, so its
        clients look their topics up again and reach the next owner."""
        addresses = broker_addresses(info)
        closed = 0
        for connection in list(self.connections):
            relay = connection.relay
            if relay is not None and relay.broker in addresses:
                relay.close()
                closed += 1
        self.lookups.pool.close_broker(addresses)
        if closed:
            log.info(
                "broker %s is gone: closed %d relayed connection(s) to it", info.broker_id, closed
            )

    # -- towards brokers --------------------------------------------------------------------------

    async def broker_connect(
        self, principal: str | None, method: str, forwarded: str, base: pb.CommandConnect
    ) -> pb.CommandConnect:
        """The CONNECT the proxy sends a broker: its own credentials, the client's role."""
        connect = pb.CommandConnect()
        connect.CopyFrom(base)
        if not connect.client_version:
            connect.client_version = SERVER_VERSION
        if not connect.HasField("protocol_version"):
            connect.protocol_version = codec.SERVER_PROTOCOL_VERSION
        credentials = self.client_credentials
        if credentials.method:
            connect.auth_method_name = credentials.method
            connect.auth_data = await asyncio.to_thread(credentials.auth_data)
        if principal is not None:
            connect.original_principal = principal
            connect.original_auth_method = method
            if forwarded:
                connect.original_auth_data = forwarded
        return connect

    async def dial(
        self, address: Address, dial_host: str, connect: pb.CommandConnect
    ) -> BrokerLink:
        return await open_link(
            address,
            dial_host,
            connect,
            ssl_context=self._broker_tls,
            server_hostname=address.host,
            timeout=self.config.broker_proxy_connect_timeout_ms / 1000,
            max_frame_size=max(self.config.max_message_size, codec.DEFAULT_MAX_MESSAGE_SIZE)
            + codec.FRAME_PADDING,
        )

    # -- periodic checks --------------------------------------------------------------------------

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self.lookups.pool.close_idle(asyncio.get_running_loop().time())

    async def _check_credentials(self) -> None:
        """Every ``authentication_refresh_check_seconds``: client connections whose credentials
        expired are closed; the client connects again with fresh ones. A relay that forwarded
        the client's credentials is left to the broker, which checks those and challenges the
        client through the relay."""
        while True:
            await asyncio.sleep(self.config.authentication_refresh_check_seconds)
            now = time.time()
            for connection in list(self.connections):
                expires_at = connection.identity.expires_at
                if expires_at is None or now < expires_at:
                    continue
                relayed_with_credentials = (
                    connection.phase is Phase.RELAYING
                    and self.config.forward_authorization_credentials
                )
                if relayed_with_credentials:
                    continue  # the broker challenges the client through the relay
                if connection.phase in (Phase.LOOKUP, Phase.RELAYING):
                    log.info(
                        "connection %s: credentials of %r expired; closing",
                        connection.peer,
                        connection.identity.role,
                    )
                    connection.close()
