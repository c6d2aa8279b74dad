"""The broker's composition root: it opens the metadata session and the ledger client, wires the
rooms together (the loaded topics, bundle operations, cluster membership, the protocol server
and the admin API) and starts and stops them in order.

Where things live: loading, deleting and unloading topics in ``topics/service.py``; which
bundle a topic is in, unloading and splitting bundles in ``cluster/bundle_operations.py``;
joining the cluster, load reports and the metadata session in ``cluster/membership.py``. The
methods below keep the names the protocol and admin rooms call, and only delegate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from magnetar.broker.admin.app import build_app
from magnetar.broker.admin.requests import topic_admin_url
from magnetar.broker.cluster.bundle_operations import BundleOperations
from magnetar.broker.cluster.bundles import BundleRange
from magnetar.broker.cluster.load_manager import LoadManager
from magnetar.broker.cluster.membership import Membership
from magnetar.broker.cluster.ownership import OwnershipStore
from magnetar.broker.cluster.registry import BrokerRegistry
from magnetar.broker.cluster.resource_usage import ResourceUsage
from magnetar.broker.config import BrokerConfig
from magnetar.broker.ledger.heartbeat import Heartbeat
from magnetar.broker.ledger.ledger_info import ManagedLedgerConfig
from magnetar.broker.metrics import BrokerMetrics
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.authorization import AuthorizationService
from magnetar.broker.namespace.clusters import ClusterData, read_cluster
from magnetar.broker.namespace.policies import Policies
from magnetar.broker.namespace.records import (
    NAMESPACES_PATH,
    PARTITIONED_PATH,
    TENANTS_PATH,
    ensure_default_namespace,
    move_to_configuration_store,
)
from magnetar.broker.protocol.authentication import check_expiry
from magnetar.broker.protocol.connection import ServerConnection
from magnetar.broker.topics.replicated_subscriptions import ReplicatedSubscriptionSettings
from magnetar.broker.topics.replicator import ReplicationContext
from magnetar.broker.topics.service import Topic, TopicService
from magnetar.common.auth.client import ClientCredentials
from magnetar.common.auth.service import AuthenticationService
from magnetar.common.auth.settings import names
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.metadata import MetadataStore, open_store
from magnetar.common.net import listen_binary, listen_http
from magnetar.common.tls import ServerTls, client_context

log = logging.getLogger(__name__)

#: How long the health check's round trip may take (Pulsar's health check waits as long).
HEARTBEAT_TIMEOUT_S = 10.0


class Broker:
    """One broker: its metadata session, ledger client, servers and rooms (see the module
    docstring). ``store`` and ``ledger_client`` are replaced when a lost session is."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore | None = None,
        local_bookies: Mapping[str, object] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        #: Bookies in this process (standalone), reached without gRPC: address -> client.
        self.local_bookies = dict(local_bookies or {})
        #: Whether the metadata store was opened here (and so is reopened on a lost session).
        self.owns_store = store is None
        #: The store shared by replicating clusters (``configuration_metadata_url``) when it is
        #: not the local one (``configuration_store`` is the one to use).
        self.shared_configuration_store: MetadataStore | None = None
        self.ledger_client: LedgerClient | None = None
        self._heartbeat: Heartbeat | None = None
        self.connections: set[ServerConnection] = set()
        self.metrics = BrokerMetrics()
        self.authentication = AuthenticationService(config)
        self.proxy_roles = frozenset(names(config.proxy_roles))
        #: How this broker authenticates to other brokers (hand-overs, partition deletes).
        self.client_credentials = ClientCredentials.parse(
            config.broker_client_authentication_plugin,
            config.broker_client_authentication_parameters,
        )
        self._refresh_task: asyncio.Task[None] | None = None
        #: Made once the metadata store is open (``start``).
        self._authorization: AuthorizationService | None = None
        # Pulsar's families, computed from the topics when scraped
        self.metrics.bind(self, topic_level=config.expose_topic_level_metrics_in_prometheus)
        #: Advertised listener names a client may ask for in a lookup (none are configured yet).
        self.listener_names: frozenset[str] = frozenset()
        self._servers: list[asyncio.AbstractServer] = []
        self._sites: list[web.TCPSite] = []
        self._http: web.AppRunner | None = None
        self.server_tls: ServerTls | None = None
        self.port = config.port
        self.http_port = config.http_port
        #: The TLS ports bound (0: none).
        self.port_tls = 0
        self.https_port = 0
        self.info = BrokerInfo("", "", "")
        self._started = False
        self._stopping = False
        self.topic_service = TopicService(self, self.metrics)
        self.bundles = BundleOperations(self, self.topic_service)
        self.membership = Membership(self, self.topic_service, self.bundles)

    @property
    def authorization(self) -> AuthorizationService:
        assert self._authorization is not None, "the broker is not started"
        return self._authorization

    @property
    def configuration_store(self) -> MetadataStore:
        """Where clusters, tenants, namespaces and partitioned topics live (Pulsar's
        configuration metadata store): the shared store ``configuration_metadata_url`` names,
        else the local metadata store (``namespace/records.py`` says what lives where)."""
        store = self.shared_configuration_store or self.store
        assert store is not None, "the metadata store is not open"
        return store

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.config.advertised_address}:{self.port}"

    async def start(self) -> None:
        if self.store is None:
            self.store = await open_store(
                self.config.metadata_url, **self._store_options(), tls=self.config.etcd_tls()
            )
        await self._start_replication()
        self.ledger_client = LedgerClient(self.store, tls=self.config.bookkeeper_tls())
        for address, client in self.local_bookies.items():
            self.ledger_client.add_local_bookie(address, client)
        await ensure_default_namespace(self.configuration_store)
        self._authorization = AuthorizationService(self.configuration_store, self.config)
        if self.config.broker_service_port_tls >= 0 or self.config.web_service_port_tls >= 0:
            self.server_tls = ServerTls(
                self.config.tls_certificate_file_path,
                self.config.tls_key_file_path,
                self.config.tls_trust_certs_file_path,
                self.config.tls_require_trusted_client_cert_on_connect,
                self.config.tls_cert_refresh_check_duration_sec,
            )
        # HTTP first: once clients can connect to the Pulsar port, the admin API is up too.
        self._http = web.AppRunner(build_app(self), access_log=None)
        await self._http.setup()
        self.http_port = await self._listen_http("http_port", self.config.http_port, None)
        if self.config.web_service_port_tls >= 0:
            self.https_port = await self._listen_http(
                "web_service_port_tls", self.config.web_service_port_tls, self.server_tls
            )
        self.port = await self._listen_binary("port", self.config.port, None)
        if self.config.broker_service_port_tls >= 0:
            self.port_tls = await self._listen_binary(
                "broker_service_port_tls", self.config.broker_service_port_tls, self.server_tls
            )
        advertised = self.config.advertised_address
        self.info = BrokerInfo(
            broker_id=f"{advertised}:{self.http_port}",
            service_url=self.service_url,
            http_url=f"http://{advertised}:{self.http_port}",
            service_url_tls=f"pulsar+ssl://{advertised}:{self.port_tls}" if self.port_tls else "",
            https_url=f"https://{advertised}:{self.https_port}" if self.https_port else "",
        )
        await self.membership.join()
        self.topic_service.start()
        if self.authentication.enabled:
            self._refresh_task = asyncio.get_running_loop().create_task(self._check_credentials())
        self._started = True
        log.info(
            "broker serving %s (admin http://%s:%d)",
            self.service_url,
            self.config.advertised_address,
            self.http_port,
        )

    def not_ready_reason(self) -> str | None:
        """Why this broker should not be sent clients yet (None: ready). Ready means started,
        registered (so the load manager can give it bundles), its metadata session surely
        alive, and not shutting down (Pulsar's ``/admin/v2/brokers/ready``)."""
        if self._stopping:
            return "the broker is shutting down: its bundles are moving to other brokers"
        if not self._started:
            return "the broker is starting"
        if not self.membership.registered:
            return "the broker is not registered in the metadata store yet"
        if not self.may_serve():
            return "the broker's metadata session expired or is not open"
        return None

    async def stop(self) -> None:
        """Graceful shutdown (SIGTERM): take no new bundles, hand every owned bundle to the
        other brokers (clients told to reconnect there, cursors persisted, ownership released)
        within ``broker_shutdown_timeout_ms``, then close."""
        self._stopping = True
        await self.topic_service.stop_policies()
        if self._refresh_task is not None:
            self._refresh_task.cancel()
        for server in self._servers:
            server.close()
        await self.membership.drain()
        if self.load_manager is not None:
            await self.load_manager.close()
        if self.ownership is not None and self.store is not None and not self.store.session_lost:
            budget = self.config.broker_shutdown_timeout_ms / 1000
            started = time.monotonic()
            try:
                async with asyncio.timeout(budget):
                    await self._unload_owned()
            except TimeoutError:
                log.warning(
                    "bundles not all unloaded within broker_shutdown_timeout_ms (%d ms): "
                    "closing anyway; the rest move when this broker's session ends",
                    self.config.broker_shutdown_timeout_ms,
                )
            log.info("bundles unloaded in %.2f s", time.monotonic() - started)
        await self.membership.leave()
        if self._http is not None:
            await self._http.cleanup()
        for connection in list(self.connections):
            connection.close()
        await self.topic_service.close()
        if self.ledger_client is not None:
            await self.ledger_client.close()
        if self.owns_store and self.store is not None:
            await self.store.close()
        if self.shared_configuration_store is not None:
            await self.shared_configuration_store.close()
        log.info("broker stopped")

    async def _unload_owned(self) -> None:
        assert self.ownership is not None
        for namespace, bundle in sorted(self.ownership.owned()):
            try:
                await self.unload_bundle(namespace, bundle)
            except Exception as e:
                log.warning("bundle %s/%s did not unload cleanly: %s", namespace, bundle, e)

    async def _listen_http(self, setting: str, port: int, tls: ServerTls | None) -> int:
        """Serve the admin app on ``port`` (HTTPS with ``tls``); the port bound."""
        assert self._http is not None
        context = tls.context if tls else None
        site, bound = await listen_http(
            self._http, self.config.bind_address, port, setting, context
        )
        self._sites.append(site)
        return bound

    async def _listen_binary(self, setting: str, port: int, tls: ServerTls | None) -> int:
        """Serve the Pulsar protocol on ``port`` (over TLS with ``tls``); the port bound."""
        server, bound = await listen_binary(
            lambda: ServerConnection(self),
            self.config.bind_address,
            port,
            setting,
            tls.context if tls else None,
        )
        self._servers.append(server)
        return bound

    async def _check_credentials(self) -> None:
        """Every ``authentication_refresh_check_seconds``: connections whose credentials
        expired are challenged or closed (``protocol/authentication.py``)."""
        while True:
            await asyncio.sleep(self.config.authentication_refresh_check_seconds)
            for connection in list(self.connections):
                check_expiry(connection)

    async def _start_replication(self) -> None:
        """Geo-replication: the configuration store (the local store unless
        ``configuration_metadata_url`` names another one) and what replicators share."""
        url = self.config.configuration_metadata_url
        if url and url != self.config.metadata_url and self.shared_configuration_store is None:
            self.shared_configuration_store = await open_store(url, tls=self.config.etcd_tls())
            assert self.store is not None
            moved = await move_to_configuration_store(self.store, self.shared_configuration_store)
            if any(moved.values()):
                log.info(
                    "moved %d tenant, %d namespace and %d partitioned-topic records from the "
                    "local metadata store (%s) to the configuration store (%s)",
                    moved[TENANTS_PATH],
                    moved[NAMESPACES_PATH],
                    moved[PARTITIONED_PATH],
                    self.config.metadata_url,
                    url,
                )

        async def find_cluster(name: str) -> ClusterData | None:
            return await read_cluster(self.configuration_store, name)

        credentials = self.client_credentials
        trust = self.config.broker_client_trust_certs_file_path
        tls = client_context(trust) if trust else None

        async def ensure_remote_partitions(cluster: ClusterData, name: TopicName) -> None:
            """Create the partitioned topic of partition ``name`` at ``cluster`` (its admin
            REST) with the local partition count, unless it exists there (409)."""
            base = name.partitioned_topic_name
            count = await self.topic_service.partitions_for_client(base)
            service = cluster.service_url
            if tls is not None and cluster.service_url_tls:
                service = cluster.service_url_tls
            url = topic_admin_url(service, base) / "partitions"
            timeout = aiohttp.ClientTimeout(total=10)
            headers = credentials.http_headers()
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.put(url, json=count, headers=headers, ssl=tls or True) as r:
                    if r.status not in (204, 409):
                        raise RuntimeError(
                            f"cluster {cluster.service_url}: creating partitioned topic {base} "
                            f"answered {r.status}: {(await r.text())[:200]}"
                        )

        self.topic_service.replication = ReplicationContext(
            local_cluster=self.config.cluster_name,
            find_cluster=find_cluster,
            auth_method=credentials.method if credentials.method != "tls" else "",
            auth_data=credentials.auth_data,
            batch_size=self.config.replicator_batch_size,
            ensure_remote_partitions=ensure_remote_partitions,
            tls=tls,
            replicated_subscriptions=ReplicatedSubscriptionSettings(
                enabled=self.config.enable_replicated_subscriptions,
                snapshot_frequency_ms=self.config.replicated_subscriptions_snapshot_frequency_millis,
                snapshot_timeout_s=self.config.replicated_subscriptions_snapshot_timeout_seconds,
                max_cached_per_subscription=(
                    self.config.replicated_subscriptions_snapshot_max_cached_per_subscription
                ),
            ),
        )

    # -- the metadata session (membership replaces a lost one) ------------------------------------

    def _store_options(self) -> dict[str, object]:
        if self.config.metadata_url.startswith("etcd://"):
            return {"session_ttl": self.config.broker_session_ttl_seconds}
        return {}

    async def close_session(self) -> None:
        assert self.store is not None
        old, self.store = self.store, None
        try:
            await old.close()
        except Exception as e:
            log.warning("closing the lost metadata session: %s", e)

    async def open_session(self) -> None:
        self.store = await open_store(
            self.config.metadata_url, **self._store_options(), tls=self.config.etcd_tls()
        )
        if self._authorization is not None:
            self._authorization.store = self.configuration_store
        if self.ledger_client is not None:
            await self.ledger_client.close()
        self.ledger_client = LedgerClient(self.store, tls=self.config.bookkeeper_tls())

    # -- the names the protocol and admin rooms call ----------------------------------------------

    @property
    def topics(self) -> dict[str, Topic]:
        return self.topic_service.topics

    @property
    def ownership(self) -> OwnershipStore | None:
        return self.membership.ownership

    @property
    def registry(self) -> BrokerRegistry | None:
        return self.membership.registry

    @property
    def load_manager(self) -> LoadManager | None:
        return self.membership.load_manager

    @property
    def topic_loads_pending(self) -> int:
        return self.topic_service.loads_pending

    @property
    def resource_usage(self) -> ResourceUsage:
        """CPU, memory and bandwidth usage (percent) as of the last load report."""
        return self.membership.resource_usage

    def may_serve(self) -> bool:
        return self.membership.may_serve()

    async def heartbeat(self) -> None:
        """A message round-tripped through this broker's heartbeat topic's managed ledger
        (``ledger/heartbeat.py``); HeartbeatFailedError with the reason otherwise."""
        if self._heartbeat is None:
            c = self.config
            self._heartbeat = Heartbeat(
                self.info.broker_id,
                ManagedLedgerConfig(
                    ensemble_size=c.ensemble_size,
                    write_quorum=c.write_quorum,
                    ack_quorum=c.ack_quorum,
                ),
            )
        assert self.ledger_client is not None and self.store is not None
        await self._heartbeat.round_trip(self.ledger_client, self.store, HEARTBEAT_TIMEOUT_S)

    async def get_topic(self, name: TopicName, *, auto: bool = False) -> Topic:
        return await self.topic_service.get_topic(name, auto=auto)

    async def check_partition(self, name: TopicName) -> None:
        await self.topic_service.check_partition(name)

    async def delete_topic(self, name: TopicName, *, force: bool) -> None:
        await self.topic_service.delete_topic(name, force=force)

    async def unload_topic(self, topic: Topic, receiver: BrokerInfo | None = None) -> None:
        await self.topic_service.unload_topic(topic, receiver)

    def topic_fenced(self, topic: Topic) -> None:
        self.topic_service.topic_fenced(topic)

    async def topic_exists(self, name: TopicName) -> bool:
        return await self.topic_service.topic_exists(name)

    async def namespace_policies(self, namespace: str) -> Policies:
        return await self.topic_service.namespace_policies(namespace)

    def policies_changed(self) -> None:
        self.topic_service.policies_changed()

    async def list_topics(self, namespace: str, domains: tuple[str, ...]) -> list[str]:
        return await self.topic_service.list_topics(namespace, domains)

    async def partitions_for_client(self, name: TopicName) -> int:
        return await self.topic_service.partitions_for_client(name)

    async def namespace_bundles(self, namespace: str) -> list[BundleRange]:
        return await self.bundles.namespace_bundles(namespace)

    def forget_bundles(self, namespace: str) -> None:
        self.bundles.forget_bundles(namespace)

    async def bundle_of(self, name: TopicName) -> BundleRange:
        return await self.bundles.bundle_of(name)

    async def check_owner(self, name: TopicName) -> None:
        await self.bundles.check_owner(name)

    async def unload_bundle(
        self, namespace: str, bundle: BundleRange, receiver: BrokerInfo | None = None
    ) -> int:
        return await self.bundles.unload_bundle(namespace, bundle, receiver)

    async def split_bundle(
        self, namespace: str, bundle: BundleRange, algorithm: str, *, unload: bool
    ) -> tuple[BundleRange, BundleRange]:
        return await self.bundles.split_bundle(namespace, bundle, algorithm, unload=unload)

    async def request_unload(self, owner: BrokerInfo, namespace: str, bundle: BundleRange) -> None:
        await self.bundles.request_unload(owner, namespace, bundle)
