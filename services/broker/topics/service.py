"""The loaded topics of one broker and their lifecycle (Pulsar's BrokerService): loading a topic
on first use (once, however many ask at the same time), deleting, unloading, listing, the
namespace policies applied to them, and the partition counts clients are told.

A topic is loaded only in a bundle this broker owns (``TopicsHost.check_owner``); commands for
other topics get ServiceNotReady, so the client looks the topic up again. The cluster room
reaches these topics through its own Protocols (``cluster.membership.ServedTopics``,
``cluster.bundle_operations.BundleTopics``), which :class:`TopicService` implements.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import TopicBusyError, TopicNotFoundError
from magnetar.broker.ledger.ledger_info import ManagedLedgerConfig
from magnetar.broker.ledger.managed_ledger import ManagedLedger
from magnetar.broker.model.keys import MANAGED_LEDGERS_PATH, decode_name, managed_ledger_key
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import (
    InactiveTopics,
    PartitionCountError,
    PartitionedMetadataError,
    PartitionedTopicRecord,
    Policies,
    check_partition_count,
)
from magnetar.broker.namespace.records import (
    NAMESPACES_PATH,
    namespace_document,
    namespace_policies,
    partitioned_key,
    partitioned_topics,
    read_partitioned,
    topic_documents,
    topic_effective,
    topic_policies,
)
from magnetar.broker.topics.deduplication import Deduplication
from magnetar.broker.topics.dispatch_limits import DispatchLimits
from magnetar.broker.topics.instruments import TopicInstruments
from magnetar.broker.topics.nonpersistent import NonPersistentTopic
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.broker.topics.replicator import ReplicationContext
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore
from magnetar.common.tasks import spawn_logged, wait_set

log = logging.getLogger(__name__)

#: Longest an unload waits for the receipts of sends in flight.
UNLOAD_DRAIN_TIMEOUT_S = 10.0

Topic = PersistentTopic | NonPersistentTopic


class TopicsHost(Protocol):
    """The broker as the topics see it: its configuration, its live metadata session and
    ledger client (both replaced when the session is), and whether it serves a topic now."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> MetadataStore | None: ...

    @property
    def configuration_store(self) -> MetadataStore:
        """Where namespaces and partitioned topics live (``namespace/records.py``)."""
        ...

    @property
    def ledger_client(self) -> LedgerClient | None: ...

    async def check_owner(self, name: TopicName) -> None:
        """Raise TopicNotOwnedError unless this broker serves ``name`` now."""
        ...


class TopicService:
    """The loaded topics of one broker (see the module docstring)."""

    def __init__(self, host: TopicsHost, instruments: TopicInstruments) -> None:
        self._host = host
        self._instruments = instruments
        #: Geo-replication (set by the broker): replicators run for replicated namespaces.
        self.replication: ReplicationContext | None = None
        self.topics: dict[str, Topic] = {}
        self._loading: dict[str, asyncio.Task[Topic]] = {}
        #: Topics being deleted from their stored records (not loaded): not loaded meanwhile;
        #: set when that delete is over.
        self._deleting: dict[str, asyncio.Event] = {}
        self._policy_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._compaction_task: asyncio.Task[None] | None = None
        self._expiry_task: asyncio.Task[None] | None = None
        self._policy_wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def _store(self) -> MetadataStore:
        store = self._host.store
        assert store is not None
        return store

    @property
    def _configuration(self) -> MetadataStore:
        return self._host.configuration_store

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._policy_task = loop.create_task(self._policy_loop(), name="namespace-policies")
        self._watch_task = loop.create_task(self._watch_namespaces(), name="namespace-watch")
        self._compaction_task = loop.create_task(
            self._compaction_monitor(), name="compaction-monitor"
        )
        self._expiry_task = loop.create_task(self._expiry_loop(), name="subscription-expiry")

    async def stop_policies(self) -> None:
        for task in (
            self._policy_task,
            self._watch_task,
            self._compaction_task,
            self._expiry_task,
        ):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _compaction_monitor(self) -> None:
        """Pulsar's compaction monitor: every
        ``broker_service_compaction_monitor_interval_in_seconds``, a topic whose compaction
        backlog passed its ``compactionThreshold`` is compacted."""
        while True:
            await asyncio.sleep(
                self._host.config.broker_service_compaction_monitor_interval_in_seconds
            )
            for topic in list(self.topics.values()):
                if isinstance(topic, PersistentTopic) and not topic.unloading:
                    try:
                        topic.compaction.check_threshold()
                    except Exception as e:
                        log.warning("topic %s: compaction not started: %s", topic.name, e)

    async def close(self) -> None:
        """Close every loaded topic (the broker is stopping)."""
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception as e:
                log.warning("topic %s did not close cleanly: %s", topic.name, e)
        self.topics.clear()

    # -- loading ---------------------------------------------------------------------------------

    @property
    def loads_pending(self) -> int:
        """Topics being loaded right now (Pulsar's ``pulsar_broker_topic_load_pending_requests``)."""
        return sum(1 for task in self._loading.values() if not task.done())

    async def get_topic(self, name: TopicName, *, auto: bool = False) -> Topic:
        """The loaded topic, loading it (and recovering its last ledger) on first use.

        ``auto``: a client asked for it (PRODUCER, SUBSCRIBE), so a topic that does not exist
        yet is created only if the namespace allows auto-creation, and a partition only as a
        partition (``check_partition``); otherwise (admin) it is created."""
        key = str(name)
        partition = auto and name.partition_index >= 0
        if partition:
            await self.check_partition(name)
        if key in self._deleting:
            raise TopicNotFoundError(f"topic {name} is being deleted")
        topic = self.topics.get(key)
        if topic is not None:
            return topic
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(
                self._load(name, auto)
            )
        try:
            topic = await asyncio.shield(task)
        finally:
            if task.done():
                self._loading.pop(key, None)
        if partition:  # its partitioned topic's delete may have started while it loaded
            await self.check_partition(name)
        return topic

    async def _load(self, name: TopicName, auto: bool) -> Topic:
        await self._host.check_owner(name)
        ledger_client, store = self._host.ledger_client, self._host.store
        assert ledger_client is not None and store is not None
        policies = await topic_policies(self._configuration, self._store, name, self._host.config)
        if auto and not policies.auto_topic_creation.allow and not await self.topic_exists(name):
            raise TopicNotFoundError(
                f"topic {name} does not exist and namespace {name.namespace_name} does not allow "
                "auto-creation (create it with the admin API)"
            )
        if not name.persistent:
            topic: Topic = NonPersistentTopic(name)
            topic.apply_settings(policies)
            self.topics[str(name)] = topic
            log.info("topic %s loaded (non-persistent)", name)
            return topic
        c = self._host.config
        ml_config = ManagedLedgerConfig(
            ensemble_size=c.ensemble_size,
            write_quorum=c.write_quorum,
            ack_quorum=c.ack_quorum,
            max_entries_per_ledger=c.max_entries_per_ledger,
            max_unacked_ranges_in_metadata=c.managed_ledger_max_unacked_ranges_to_persist_in_metadata_store,
        )
        ml = await ManagedLedger.open(name.managed_ledger_name, ledger_client, store, ml_config)
        topic = PersistentTopic(
            name,
            ml,
            DispatchLimits(
                c.dispatch_batch,
                c.max_unacked_messages_per_consumer,
                c.max_unacked_messages_per_subscription,
                c.auto_skip_non_recoverable_data,
            ),
            self._instruments,
        )
        topic.apply_settings(policies)
        if policies.deduplication:
            topic.deduplication = await Deduplication.load(ml)
        self.topics[str(name)] = topic
        if self.replication is not None:
            await topic.apply_replication(policies.replication_clusters, self.replication)
        log.info("topic %s loaded", name)
        return topic

    async def check_partition(self, name: TopicName) -> None:
        """A client gets partition ``name`` only while it is one: its partitioned topic exists,
        is not being deleted (``PartitionedTopicRecord.deleted``, as Pulsar refuses to create
        partitions then), and counts it. Else TopicNotFoundError, except for a topic of that
        name that is stored or loaded while its partitioned topic is not being deleted (a
        non-partitioned topic named so, created by the admin API).

        So a partition never outlives its parent through a client: not while a delete runs,
        not after it (a producer the delete closed comes back and is refused), not after a
        crash in between (the record stays marked until a DELETE finishes). Unlike Pulsar,
        which lets a client auto-create a non-partitioned ``t-partition-i`` once ``t`` is gone.
        """
        parent = name.partitioned_topic_name
        record = await read_partitioned(self._configuration, parent)
        if record is not None and record.deleted:
            raise TopicNotFoundError(
                f"topic {name}: partitioned topic {parent} is being deleted (a delete that was "
                "interrupted is finished by the next DELETE of it)"
            )
        if record is not None and name.partition_index < record.partitions:
            return
        store = self._store
        if str(name) in self.topics or (
            name.persistent
            and await store.get(managed_ledger_key(name.managed_ledger_name)) is not None
        ):
            return
        raise TopicNotFoundError(
            f"topic {name} is not a partition of partitioned topic {parent} "
            f"({record.partitions if record else 0} partitions): a partition is created with its "
            "partitioned topic (create or grow that with the admin API)"
        )

    async def topic_exists(self, name: TopicName) -> bool:
        """Stored (or loaded) already, or a partition of an existing partitioned topic."""
        store = self._store
        if str(name) in self.topics:
            return True
        if await store.get(managed_ledger_key(name.managed_ledger_name)) is not None:
            return True
        index = name.partition_index
        if index < 0:
            return False
        record = await read_partitioned(self._configuration, name.partitioned_topic_name)
        # A partition not stored yet of a topic being deleted is not created again.
        return record is not None and not record.deleted and index < record.partitions

    # -- deleting and unloading ------------------------------------------------------------------

    async def delete_topic(self, name: TopicName, *, force: bool) -> None:
        """Delete a topic's data (ledgers, cursors) and unload it; only its owner does
        (TopicNotOwnedError otherwise). A loaded topic refuses with TopicBusyError while it has
        producers or consumers, unless ``force``. A persistent topic that is not loaded has no
        clients and is deleted from its stored record without being opened: no ledger is
        created on the way, and a delete cut short (a crash) is finished by the next."""
        key = str(name)
        while name.persistent and key not in self.topics and key not in self._loading:
            running = self._deleting.get(key)
            if running is not None:
                await running.wait()
                continue
            await self._host.check_owner(name)
            if key in self.topics or key in self._loading or key in self._deleting:
                continue  # loaded, or being deleted, while the owner was checked
            ledger_client, store = self._host.ledger_client, self._host.store
            assert ledger_client is not None and store is not None
            done = self._deleting[key] = asyncio.Event()
            try:
                if await ManagedLedger.delete_stored(
                    name.managed_ledger_name, ledger_client, store
                ):
                    log.info("topic %s deleted", name)
            finally:
                del self._deleting[key]
                done.set()
            return
        topic = await self.get_topic(name)
        await topic.delete(force=force)
        self.topics.pop(str(name), None)
        log.info("topic %s deleted", name)

    async def unload_topic(self, topic: Topic, receiver: BrokerInfo | None = None) -> None:
        """Stop serving ``topic``: drain the sends in flight, tell its clients to go (to
        ``receiver`` if the topic is handed there), close it."""
        if self.topics.get(str(topic.name)) is topic:
            del self.topics[str(topic.name)]
        try:
            await asyncio.wait_for(topic.stop_publishing(), UNLOAD_DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.warning("topic %s: sends still in flight at unload; closing anyway", topic.name)
        topic.disconnect_clients(receiver.service_url if receiver is not None else None)
        try:
            await topic.close()
        except Exception as e:
            log.warning("topic %s did not close cleanly while unloading: %s", topic.name, e)

    def topic_fenced(self, topic: Topic) -> None:
        """Another broker took the topic's ledger (recovery fenced it): stop serving it here."""
        if self.topics.get(str(topic.name)) is topic:
            del self.topics[str(topic.name)]  # at once: the other failed sends find it gone
            log.warning("topic %s: fenced by another broker; unloading it here", topic.name)
            self._spawn(self.unload_topic(topic))

    # -- what the cluster room asks (ServedTopics, BundleTopics) ---------------------------------

    def topics_in(self, namespace: str, bundle: BundleRange) -> list[Topic]:
        """The loaded topics of ``bundle``."""
        return [
            topic
            for key, topic in self.topics.items()
            if topic.name.namespace_name == namespace and bundle.contains(topic_hash(key))
        ]

    def topic_names_in(self, namespace: str, bundle: BundleRange) -> list[str]:
        return [str(topic.name) for topic in self.topics_in(namespace, bundle)]

    def counters(self) -> dict[str, tuple[int, int, int, int]]:
        return {
            key: (t.messages_in, t.bytes_in, t.msg_out, t.bytes_out)
            for key, t in self.topics.items()
        }

    def bundle_lost(self, namespace: str, bundle: BundleRange) -> None:
        """Our ownership key of ``bundle`` was deleted or taken: stop serving its topics now."""
        doomed = self.topics_in(namespace, bundle)
        for topic in doomed:
            del self.topics[str(topic.name)]
            topic.disconnect_clients()
        if doomed:
            log.warning(
                "bundle %s/%s is no longer ours: %d topics unloaded", namespace, bundle, len(doomed)
            )
            self._spawn(self._close_topics(doomed))

    def stop_serving(self, reason: str) -> None:
        """Another broker may own our bundles any moment: every client is told to go, every
        topic closes; ownership keys are not touched (they are, or are about to be, gone)."""
        if not self.topics:
            return
        log.error("%s: stopping to serve every topic at once", reason)
        topics = list(self.topics.values())
        self.topics.clear()
        for topic in topics:
            topic.disconnect_clients()
        self._spawn(self._close_topics(topics))

    async def _close_topics(self, topics: list[Topic]) -> None:
        for topic in topics:
            try:
                await topic.close()
            except Exception as e:
                log.warning("topic %s closed after losing the session: %s", topic.name, e)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        spawn_logged(coro, log, "broker task", tracked=self._tasks, level=logging.ERROR)

    # -- namespace policies ----------------------------------------------------------------------

    async def namespace_policies(self, namespace: str) -> Policies:
        """The policies in force for ``namespace`` (its own over the broker's defaults)."""
        return await namespace_policies(self._configuration, namespace, self._host.config)

    def policies_changed(self) -> None:
        """A namespace policy was set: apply it to the loaded topics now."""
        self._policy_wake.set()

    async def _watch_namespaces(self) -> None:
        """Apply a namespace's new policies as soon as its record changes in the configuration
        store, whichever broker of whichever cluster wrote it (as Pulsar's brokers watch the
        configuration store); ``policy_check_interval_seconds`` rounds catch anything missed
        while the watch is re-established (a lost session, the store unreachable)."""
        while True:
            try:
                watch = self._configuration.watch(NAMESPACES_PATH + "/", prefix=True)
                async for _event in watch:
                    self._policy_wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.info("namespace policies watch ended (%s); watching again", e)
            await asyncio.sleep(1.0)

    async def _policy_loop(self) -> None:
        while True:
            await wait_set(self._policy_wake, self._host.config.policy_check_interval_seconds)
            self._policy_wake.clear()
            await self.apply_policies()

    async def apply_policies(self) -> None:
        """Retention, TTL, deduplication, limits, quotas and inactivity of every loaded topic,
        by its policies: its own over its namespace's over the broker's."""
        found: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]] | None] = {}
        for topic in list(self.topics.values()):
            namespace = topic.name.namespace_name
            if namespace not in found:
                try:
                    found[namespace] = (
                        await namespace_document(self._configuration, namespace),
                        await topic_documents(self._store, namespace),
                    )
                except Exception as e:  # a deleted namespace, a store hiccup: next round
                    log.warning("namespace %s: policies not read: %s", namespace, e)
                    found[namespace] = None
            documents = found[namespace]
            if documents is None or self.topics.get(str(topic.name)) is not topic:
                continue
            namespace_doc, topic_docs = documents
            own = topic_docs.get(str(topic.name.partitioned_topic_name))
            policies = topic_effective(namespace_doc, own, self._host.config)
            try:
                await topic.apply_policies(policies)
                if self.replication is not None and isinstance(topic, PersistentTopic):
                    await topic.apply_replication(policies.replication_clusters, self.replication)
                if policies.inactive_topics is not None:
                    await self._delete_if_inactive(topic, policies.inactive_topics)
            except Exception as e:
                log.warning("topic %s: policies not applied: %s", topic.name, e)

    async def _expiry_loop(self) -> None:
        """Pulsar's subscription expiry check, every ``subscription_expiry_check_interval_in_
        minutes``: subscriptions idle for longer than their namespace's (or the broker's)
        expiration time are deleted."""
        while True:
            await asyncio.sleep(
                self._host.config.subscription_expiry_check_interval_in_minutes * 60
            )
            await self.expire_subscriptions()

    async def expire_subscriptions(self) -> None:
        for topic in list(self.topics.values()):
            if (
                not isinstance(topic, PersistentTopic)
                or self.topics.get(str(topic.name)) is not topic
            ):
                continue
            try:
                if topic.subscription_expiration_s > 0:  # as the last policy round set it
                    await topic.expire_subscriptions(topic.subscription_expiration_s)
            except Exception as e:  # a store hiccup: next round
                log.warning("topic %s: subscriptions not checked for expiry: %s", topic.name, e)

    async def _delete_if_inactive(self, topic: Topic, inactive: InactiveTopics) -> None:
        """Pulsar's inactive-topic deletion: a non-partitioned topic inactive (``is_inactive``)
        with nothing published for ``max_inactive_seconds`` is deleted (its data too). Activity
        is seen by publishes and by this check finding clients."""
        now = time.monotonic()
        if not topic.is_inactive(inactive.mode):
            topic.last_active = now
            return
        if not inactive.delete_while_inactive or topic.name.partition_index >= 0:
            return
        if now - topic.last_active < inactive.max_inactive_seconds:
            return
        try:
            await self.delete_topic(topic.name, force=False)
        except TopicBusyError:
            return  # a client came meanwhile
        log.info(
            "topic %s deleted: inactive for %d s (%s)",
            topic.name,
            inactive.max_inactive_seconds,
            inactive.mode,
        )

    # -- what clients and the admin API are told -------------------------------------------------

    async def list_topics(self, namespace: str, domains: tuple[str, ...]) -> list[str]:
        """Topics of ``tenant/namespace`` in these domains: stored ones, loaded ones (the
        non-persistent ones live only there) and the partitions of partitioned topics."""
        store = self._store
        names: set[str] = set()
        tenant, local_namespace = namespace.split("/", 1)
        for segment in await store.children(MANAGED_LEDGERS_PATH):
            parts = decode_name(segment).split("/", 3)  # tenant/namespace/domain/topic
            if len(parts) == 4 and f"{parts[0]}/{parts[1]}" == namespace and parts[2] in domains:
                names.add(f"{parts[2]}://{namespace}/{parts[3]}")
        for key, topic in self.topics.items():
            if topic.name.namespace_name == namespace and topic.name.domain in domains:
                names.add(key)
        limit = self._host.config.max_num_partitions_per_partitioned_topic
        for domain in domains:
            configuration = self._configuration
            for partitioned in await partitioned_topics(
                configuration, tenant, local_namespace, domain
            ):
                name = TopicName.parse(partitioned)
                try:
                    record = await read_partitioned(configuration, name)
                except PartitionedMetadataError as e:
                    log.warning("listing %s: %s", namespace, e)
                    continue
                if record is None or record.deleted:
                    continue  # being deleted: only its partitions still stored are listed
                count = record.partitions
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
        limit = self._host.config.max_num_partitions_per_partitioned_topic
        record = await read_partitioned(self._configuration, name)
        if record is not None and record.deleted:
            raise TopicNotFoundError(
                f"partitioned topic {name} is being deleted (a delete that was interrupted is "
                "finished by the next DELETE of it)"
            )
        count = record.partitions if record is not None else 0
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
            check_partition_count(auto.default_partitions, limit)
            document = PartitionedTopicRecord(auto.default_partitions).to_bytes()
            try:
                await self._configuration.put(partitioned_key(name), document, NOT_EXISTS)
                log.info("partitioned topic %s auto-created (%d)", name, auto.default_partitions)
            except BadVersionError:
                pass  # created meanwhile
            return await self.partitions_for_client(name)
        return 0
