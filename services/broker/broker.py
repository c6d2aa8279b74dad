"""The broker: accepts Pulsar-protocol connections and serves the topics it has loaded.

This first version serves every topic itself (a single broker, as in standalone mode): lookups
answer with its own address. Bundle ownership and the load manager come later.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping

from aiohttp import web

from magnetar.broker.admin import (
    NAMESPACES_PATH,
    PartitionedMetadataError,
    build_app,
    ensure_default_namespace,
    partition_count,
    partitioned_key,
    partitioned_topics,
)
from magnetar.broker.config import BrokerConfig
from magnetar.broker.connection import ServerConnection
from magnetar.broker.deduplication import Deduplication
from magnetar.broker.dispatch_limits import DispatchLimits
from magnetar.broker.keys import MANAGED_LEDGERS_PATH, decode_name, managed_ledger_key
from magnetar.broker.managed_ledger import ManagedLedger, ManagedLedgerConfig
from magnetar.broker.metrics import BrokerMetrics
from magnetar.broker.nonpersistent import NonPersistentTopic
from magnetar.broker.policies import (
    PartitionCountError,
    Policies,
    check_partition_count,
    effective,
    parse_document,
)
from magnetar.broker.topic import NamespaceNotFoundError, PersistentTopic, TopicNotFoundError
from magnetar.broker.topic_name import TopicName
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore, open_store
from magnetar.common.net import AddressInUseError, listen_error

log = logging.getLogger(__name__)


class Broker:
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
        self._owns_store = store is None
        self.ledger_client: LedgerClient | None = None
        self.topics: dict[str, PersistentTopic | NonPersistentTopic] = {}
        self._loading: dict[str, asyncio.Task[PersistentTopic | NonPersistentTopic]] = {}
        self.connections: set[ServerConnection] = set()
        self.metrics = BrokerMetrics()
        #: Advertised listener names a client may ask for in a lookup (none are configured yet).
        self.listener_names: frozenset[str] = frozenset()
        self._server: asyncio.AbstractServer | None = None
        self._http: web.AppRunner | None = None
        self.port = config.port
        self.http_port = config.http_port
        self._policy_task: asyncio.Task[None] | None = None
        self._policy_wake = asyncio.Event()

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.config.advertised_address}:{self.port}"

    async def start(self) -> None:
        if self.store is None:
            self.store = await open_store(self.config.metadata_url)
        self.ledger_client = LedgerClient(self.store)
        for address, client in self.local_bookies.items():
            self.ledger_client.add_local_bookie(address, client)
        await ensure_default_namespace(self)
        # HTTP first: once clients can connect to the Pulsar port, the admin API is up too.
        self._http = web.AppRunner(build_app(self), access_log=None)
        await self._http.setup()
        host = self.config.bind_address
        # reuse_port off: a port another process listens on must fail the bind, not be shared.
        site = web.TCPSite(self._http, host, self.config.http_port, reuse_port=False)
        try:
            await site.start()
        except OSError as e:
            raise AddressInUseError(
                listen_error("http_port", host, self.config.http_port, e)
            ) from None
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: ServerConnection(self), host, self.config.port, reuse_port=False
            )
        except OSError as e:
            raise AddressInUseError(listen_error("port", host, self.config.port, e)) from None
        self.port = self._server.sockets[0].getsockname()[1]
        self._policy_task = loop.create_task(self._policy_loop(), name="namespace-policies")
        log.info(
            "broker serving %s (admin http://%s:%d)",
            self.service_url,
            self.config.advertised_address,
            self.http_port,
        )

    async def stop(self) -> None:
        if self._policy_task is not None:
            self._policy_task.cancel()
            await asyncio.gather(self._policy_task, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        if self._http is not None:
            await self._http.cleanup()
        for connection in list(self.connections):
            connection.close()
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception as e:
                log.warning("topic %s did not close cleanly: %s", topic.name, e)
        self.topics.clear()
        if self.ledger_client is not None:
            await self.ledger_client.close()
        if self._owns_store and self.store is not None:
            await self.store.close()
        log.info("broker stopped")

    async def get_topic(
        self, name: TopicName, *, auto: bool = False
    ) -> PersistentTopic | NonPersistentTopic:
        """The loaded topic, loading it (and recovering its last ledger) on first use.

        ``auto``: a client asked for it (PRODUCER, SUBSCRIBE), so a topic that does not exist
        yet is created only if the namespace allows auto-creation; otherwise (admin) it is
        created."""
        key = str(name)
        topic = self.topics.get(key)
        if topic is not None:
            return topic
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(
                self._load(name, auto)
            )
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._loading.pop(key, None)

    async def delete_topic(self, name: TopicName, *, force: bool) -> None:
        """Delete a topic's data (ledgers, cursors) and unload it."""
        topic = await self.get_topic(name)
        await topic.delete(force=force)
        self.topics.pop(str(name), None)
        log.info("topic %s deleted", name)

    async def namespace_policies(self, namespace: str) -> Policies:
        """The policies in force for ``namespace`` (its own over the broker's defaults)."""
        assert self.store is not None
        found = await self.store.get(f"{NAMESPACES_PATH}/{namespace}")
        if found is None:
            raise NamespaceNotFoundError(
                f"namespace {namespace} does not exist (create it with the admin API)"
            )
        return effective(parse_document(found.value), self.config)

    async def topic_exists(self, name: TopicName) -> bool:
        """Stored (or loaded) already, or a partition of an existing partitioned topic."""
        assert self.store is not None
        if str(name) in self.topics:
            return True
        if await self.store.get(managed_ledger_key(name.managed_ledger_name)) is not None:
            return True
        index = name.partition_index
        return index >= 0 and index < await partition_count(self, name.partitioned_topic_name)

    def policies_changed(self) -> None:
        """A namespace policy was set: apply it to the loaded topics now."""
        self._policy_wake.set()

    async def _policy_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(
                    self._policy_wake.wait(), self.config.policy_check_interval_seconds
                )
            except TimeoutError:
                pass
            self._policy_wake.clear()
            await self.apply_policies()

    async def apply_policies(self) -> None:
        """Retention, TTL and deduplication of every loaded topic, by its namespace's policies."""
        found: dict[str, Policies | None] = {}
        for topic in list(self.topics.values()):
            namespace = topic.name.namespace_name
            if namespace not in found:
                try:
                    found[namespace] = await self.namespace_policies(namespace)
                except Exception as e:  # a deleted namespace, a store hiccup: next round
                    log.warning("namespace %s: policies not read: %s", namespace, e)
                    found[namespace] = None
            policies = found[namespace]
            if policies is None or self.topics.get(str(topic.name)) is not topic:
                continue
            try:
                await topic.apply_policies(policies)
            except Exception as e:
                log.warning("topic %s: policies not applied: %s", topic.name, e)

    async def list_topics(self, namespace: str, domains: tuple[str, ...]) -> list[str]:
        """Topics of ``tenant/namespace`` in these domains: stored ones, loaded ones (the
        non-persistent ones live only there) and the partitions of partitioned topics."""
        assert self.store is not None
        names: set[str] = set()
        tenant, local_namespace = namespace.split("/", 1)
        for segment in await self.store.children(MANAGED_LEDGERS_PATH):
            parts = decode_name(segment).split("/", 3)  # tenant/namespace/domain/topic
            if len(parts) == 4 and f"{parts[0]}/{parts[1]}" == namespace and parts[2] in domains:
                names.add(f"{parts[2]}://{namespace}/{parts[3]}")
        for key, topic in self.topics.items():
            if topic.name.namespace_name == namespace and topic.name.domain in domains:
                names.add(key)
        limit = self.config.max_num_partitions_per_partitioned_topic
        for domain in domains:
            for partitioned in await partitioned_topics(self, tenant, local_namespace, domain):
                name = TopicName.parse(partitioned)
                try:
                    count = await partition_count(self, name)
                except PartitionedMetadataError as e:
                    log.warning("listing %s: %s", namespace, e)
                    continue
                if count > limit:  # a damaged record must not make the listing unbounded
                    log.warning(
                        "listing %s: partitioned topic %s has %d partitions, more than "
                        "max_num_partitions_per_partitioned_topic=%d; only its stored partitions "
                        "are listed",
                        namespace,
                        name,
                        count,
                        limit,
                    )
                    continue
                names.update(str(name.partition(i)) for i in range(count))
        return sorted(names)

    async def partitions_for_client(self, name: TopicName) -> int:
        """PARTITIONED_METADATA: the partition count (0: not partitioned). Where the namespace
        auto-creates partitioned topics, a topic that does not exist yet is created here.

        A stored count outside 1..``max_num_partitions_per_partitioned_topic`` (a damaged
        record, or the setting lowered since) raises ``PartitionCountError``: the client gets an
        error naming the setting rather than a count it would open that many producers for."""
        limit = self.config.max_num_partitions_per_partitioned_topic
        count = await partition_count(self, name)
        if count:
            if not 0 < count <= limit:
                raise PartitionCountError(
                    f"partitioned topic {name} has {count} partitions in its metadata, outside "
                    f"1..{limit} (max_num_partitions_per_partitioned_topic): raise the setting or "
                    "delete the topic"
                )
            return count
        if name.partition_index >= 0:
            return 0
        auto = (await self.namespace_policies(name.namespace_name)).auto_topic_creation
        if auto.allow and auto.topic_type == "partitioned" and not await self.topic_exists(name):
            assert self.store is not None
            check_partition_count(auto.default_partitions, limit)
            document = json.dumps({"partitions": auto.default_partitions}).encode()
            try:
                await self.store.put(partitioned_key(name), document, NOT_EXISTS)
                log.info("partitioned topic %s auto-created (%d)", name, auto.default_partitions)
            except BadVersionError:
                pass  # created meanwhile
            return await self.partitions_for_client(name)
        return 0

    async def _load(self, name: TopicName, auto: bool) -> PersistentTopic | NonPersistentTopic:
        assert self.ledger_client is not None and self.store is not None
        policies = await self.namespace_policies(name.namespace_name)
        if auto and not policies.auto_topic_creation.allow and not await self.topic_exists(name):
            raise TopicNotFoundError(
                f"topic {name} does not exist and namespace {name.namespace_name} does not allow "
                "auto-creation (create it with the admin API)"
            )
        if not name.persistent:
            topic: PersistentTopic | NonPersistentTopic = NonPersistentTopic(name)
            self.topics[str(name)] = topic
            log.info("topic %s loaded (non-persistent)", name)
            return topic
        c = self.config
        ml_config = ManagedLedgerConfig(
            ensemble_size=c.ensemble_size,
            write_quorum=c.write_quorum,
            ack_quorum=c.ack_quorum,
            max_entries_per_ledger=c.max_entries_per_ledger,
            max_unacked_ranges_in_metadata=c.managed_ledger_max_unacked_ranges_to_persist_in_metadata_store,
        )
        ml = await ManagedLedger.open(
            name.managed_ledger_name, self.ledger_client, self.store, ml_config
        )
        topic = PersistentTopic(
            name,
            ml,
            DispatchLimits(
                c.dispatch_batch,
                c.max_unacked_messages_per_consumer,
                c.max_unacked_messages_per_subscription,
                c.auto_skip_non_recoverable_data,
            ),
            self.metrics,
        )
        if policies.deduplication:
            topic.deduplication = await Deduplication.load(ml)
        self.topics[str(name)] = topic
        log.info("topic %s loaded", name)
        return topic
