"""The broker: accepts Pulsar-protocol connections and serves the topics of the namespace
bundles it owns.

Cluster membership (``ownership.py``, ``registry.py``, ``load_manager.py``): the broker registers
itself under its metadata session, campaigns for the load manager's leadership, and owns a
bundle while it holds the bundle's ownership key. It loads a topic only in a bundle it owns
(``lookup.py`` decides who owns what); commands for other topics get ServiceNotReady, so the
client looks the topic up again. Unloading a bundle disconnects its topics' clients, closes the
topics (cursors persisted) and releases the key; the next owner opens each topic's last ledger
with recovery, which fences this broker out for good. If the session is lost, the broker stops
serving everything at once (another broker may own the bundles as soon as the keys expire) and
joins again with a new session. A standalone is a cluster of one through the same code.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from magnetar.broker.admin.app import build_app
from magnetar.broker.cluster.bundles import (
    BUNDLES_ROOT,
    BundleRange,
    bundle_for,
    load_or_create,
    replace_with_split,
    split,
    topic_hash,
)
from magnetar.broker.cluster.load_manager import LoadManager
from magnetar.broker.cluster.lookup import LookupKind, lookup
from magnetar.broker.cluster.ownership import OwnershipStore
from magnetar.broker.cluster.registry import BrokerRegistry, BundleStats, LoadReport, cpu_and_memory
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import NamespaceNotFoundError, TopicNotFoundError, TopicNotOwnedError
from magnetar.broker.ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from magnetar.broker.metrics import BrokerMetrics
from magnetar.broker.model.broker_info import BrokerInfo
from magnetar.broker.model.keys import MANAGED_LEDGERS_PATH, decode_name, managed_ledger_key
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import (
    PartitionCountError,
    PartitionedMetadataError,
    PartitionedTopicRecord,
    Policies,
    check_partition_count,
    effective,
    parse_document,
)
from magnetar.broker.namespace.records import (
    NAMESPACES_PATH,
    ensure_default_namespace,
    partitioned_key,
    partitioned_topics,
    read_partitioned,
)
from magnetar.broker.protocol.connection import ServerConnection
from magnetar.broker.topics.deduplication import Deduplication
from magnetar.broker.topics.dispatch_limits import DispatchLimits
from magnetar.broker.topics.nonpersistent import NonPersistentTopic
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore, open_store
from magnetar.common.net import AddressInUseError, listen_error
from magnetar.common.tasks import spawn_logged

log = logging.getLogger(__name__)

#: A broker stops serving this long before its metadata session could expire.
SESSION_SAFETY_MARGIN_S = 1.0
#: Longest an unload waits for the receipts of sends in flight.
UNLOAD_DRAIN_TIMEOUT_S = 10.0
#: How often the broker checks that its session is still surely alive.
SESSION_CHECK_INTERVAL_S = 0.25


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
        #: Topics being deleted from their stored records (not loaded): not loaded meanwhile;
        #: set when that delete is over.
        self._deleting: dict[str, asyncio.Event] = {}
        self.connections: set[ServerConnection] = set()
        self.metrics = BrokerMetrics()
        self.metrics.bind(self)  # Pulsar's families, computed from the topics when scraped
        #: Advertised listener names a client may ask for in a lookup (none are configured yet).
        self.listener_names: frozenset[str] = frozenset()
        self._server: asyncio.AbstractServer | None = None
        self._http: web.AppRunner | None = None
        self.port = config.port
        self.http_port = config.http_port
        self._policy_task: asyncio.Task[None] | None = None
        self._policy_wake = asyncio.Event()
        self.info = BrokerInfo("", "", "")
        self.ownership: OwnershipStore | None = None
        self.registry: BrokerRegistry | None = None
        self.load_manager: LoadManager | None = None
        self._bundles: dict[str, list[BundleRange]] = {}
        #: Bundles being unloaded: their topics are not loaded again meanwhile.
        self._unloading: set[tuple[str, BundleRange]] = set()
        self._report_task: asyncio.Task[None] | None = None
        self._bundles_watch: asyncio.Task[None] | None = None
        self._session_watch: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_report: tuple[float, dict[str, tuple[int, int]]] = (time.monotonic(), {})

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.config.advertised_address}:{self.port}"

    async def start(self) -> None:
        if self.store is None:
            self.store = await open_store(self.config.metadata_url, **self._store_options())
        self.ledger_client = LedgerClient(self.store)
        for address, client in self.local_bookies.items():
            self.ledger_client.add_local_bookie(address, client)
        await ensure_default_namespace(self.store)
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
        advertised = self.config.advertised_address
        self.info = BrokerInfo(
            broker_id=f"{advertised}:{self.http_port}",
            service_url=self.service_url,
            http_url=f"http://{advertised}:{self.http_port}",
        )
        await self._join_cluster()
        self._policy_task = loop.create_task(self._policy_loop(), name="namespace-policies")
        log.info(
            "broker serving %s (admin http://%s:%d)",
            self.service_url,
            self.config.advertised_address,
            self.http_port,
        )

    async def stop(self) -> None:
        """Unload everything (clients told to reconnect elsewhere, cursors persisted, bundles
        released), then close."""
        if self._policy_task is not None:
            self._policy_task.cancel()
            await asyncio.gather(self._policy_task, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        if self.load_manager is not None:
            await self.load_manager.close()
        if self.ownership is not None and self.store is not None and not self.store.session_lost:
            for namespace, bundle in sorted(self.ownership.owned()):
                try:
                    await self.unload_bundle(namespace, bundle)
                except Exception as e:
                    log.warning("bundle %s/%s did not unload cleanly: %s", namespace, bundle, e)
        await self._leave_cluster()
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

    # -- cluster membership ----------------------------------------------------------------------

    def _store_options(self) -> dict[str, object]:
        if self.config.metadata_url.startswith("etcd://"):
            return {"session_ttl": self.config.broker_session_ttl_seconds}
        return {}

    async def _join_cluster(self) -> None:
        assert self.store is not None
        self.ownership = OwnershipStore(self.store, self.info)
        self.ownership.add_lost_listener(self._session_lost)
        self.ownership.add_bundle_lost_listener(self._bundle_lost)
        await self.ownership.start()
        self.registry = BrokerRegistry(self.store, self.info)
        await self.registry.start()
        await self.registry.register(self.load_report())
        self.load_manager = LoadManager(
            self.store,
            self.registry,
            self.ownership,
            self.config,
            self.request_unload,
            split=self.request_split,
        )
        self.load_manager.start()
        self._report_task = asyncio.get_running_loop().create_task(
            self._report_loop(), name="load-report"
        )
        self._bundles_watch = asyncio.get_running_loop().create_task(
            self._follow_bundles(self.store), name="bundles-watch"
        )
        self._session_watch = asyncio.get_running_loop().create_task(
            self._watch_session(), name="session-watch"
        )

    async def _follow_bundles(self, store: MetadataStore) -> None:
        """Forget a namespace's cached bundles as soon as they change (a split anywhere)."""
        try:
            async for event in store.watch(BUNDLES_ROOT + "/", prefix=True):
                namespace = event.key[len(BUNDLES_ROOT) + 1 :]
                self._bundles.pop(namespace, None)
        except Exception as e:  # the session ended: rejoining starts a new watch
            log.info("bundles watch ended: %s", e)
            self._bundles.clear()

    async def _leave_cluster(self) -> None:
        for task in (self._session_watch,):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._bundles_watch is not None:
            self._bundles_watch.cancel()
            await asyncio.gather(self._bundles_watch, return_exceptions=True)
        if self._report_task is not None:
            self._report_task.cancel()
            await asyncio.gather(self._report_task, return_exceptions=True)
        if self.load_manager is not None:
            await self.load_manager.close()
        if self.registry is not None:
            await self.registry.close()
        if self.ownership is not None:
            await self.ownership.close()

    def load_report(self) -> LoadReport:
        """Rates since the previous report, from the topics' own counters, per owned bundle."""
        now = time.monotonic()
        elapsed = max(now - self._last_report[0], 1e-3)
        previous = self._last_report[1]
        counters = {key: (t.messages_in, t.bytes_in) for key, t in self.topics.items()}
        self._last_report = (now, counters)

        def delta(key: str, index: int) -> float:
            before = previous.get(key, (0, 0))[index]
            return max(counters[key][index] - before, 0) / elapsed

        owned = self.ownership.owned() if self.ownership is not None else set()
        bundle_stats = []
        for namespace, bundle in sorted(owned):
            topics = [str(t.name) for t in self.topics_in(namespace, bundle)]
            rate = sum(delta(key, 0) for key in topics)
            bundle_stats.append(BundleStats(namespace, bundle, rate, len(topics)))
        cpu, memory = cpu_and_memory()
        return LoadReport(
            msg_rate_in=sum(delta(key, 0) for key in counters),
            msg_rate_out=0.0,
            throughput_in=sum(delta(key, 1) for key in counters),
            throughput_out=0.0,
            topics=len(counters),
            bundles=len(owned),
            cpu_percent=cpu,
            memory_mb=memory,
            timestamp_ms=int(time.time() * 1000),
            bundle_stats=tuple(bundle_stats),
        )

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.load_balancer_report_update_interval_seconds)
            try:
                assert self.registry is not None
                await self.registry.update(self.load_report())
            except Exception as e:
                log.warning("load report not written: %s", e)

    def may_serve(self) -> bool:
        """Whether this broker's session surely still holds its ownership keys: until the last
        keepalive's deadline, less a margin. After a pause (SIGSTOP, a frozen VM) this turns
        false before the metadata client has even noticed, so nothing is served meanwhile."""
        store = self.store
        return (
            store is not None
            and time.monotonic() < store.session_valid_until - SESSION_SAFETY_MARGIN_S
        )

    def _stop_serving(self, reason: str) -> None:
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

    async def _close_topics(self, topics: list[PersistentTopic | NonPersistentTopic]) -> None:
        for topic in topics:
            try:
                await topic.close()
            except Exception as e:
                log.warning("topic %s closed after losing the session: %s", topic.name, e)

    async def _watch_session(self) -> None:
        while True:
            await asyncio.sleep(SESSION_CHECK_INTERVAL_S)
            if not self.may_serve():
                self._stop_serving("the metadata session may have expired (no keepalive in time)")

    def _session_lost(self) -> None:
        """The metadata session is gone: stop serving at once, then join again under a new
        session."""
        self._stop_serving("metadata session lost")
        log.error("metadata session lost: joining the cluster again")
        self._spawn(self._rejoin())

    async def _rejoin(self) -> None:
        await self._leave_cluster()
        if not self._owns_store:
            return  # a store we were given (tests, standalone) is not ours to reopen
        assert self.store is not None
        old, self.store = self.store, None
        try:
            await old.close()
        except Exception as e:
            log.warning("closing the lost metadata session: %s", e)
        while True:
            try:
                self.store = await open_store(self.config.metadata_url, **self._store_options())
                if self.ledger_client is not None:
                    await self.ledger_client.close()
                self.ledger_client = LedgerClient(self.store)
                await self._join_cluster()
                log.info("joined the cluster again with a new metadata session")
                return
            except Exception as e:
                log.error("joining the cluster again failed (%s); retrying in 2 s", e)
                await asyncio.sleep(2)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        spawn_logged(coro, log, "broker task", tracked=self._tasks, level=logging.ERROR)

    async def request_unload(self, owner: BrokerInfo, namespace: str, bundle: BundleRange) -> None:
        """The load manager sheds a bundle: its owner unloads it (through its admin API)."""
        if owner.broker_id == self.info.broker_id:
            await self.unload_bundle(namespace, bundle)
            return
        url = f"{owner.http_url}/admin/v2/namespaces/{namespace}/{bundle}/unload"
        await self._owner_call(url, f"unload of {namespace}/{bundle}", owner)

    async def request_split(self, owner: BrokerInfo, namespace: str, bundle: BundleRange) -> None:
        """The load manager splits a hot bundle: its owner splits it, keeps both halves in the
        same transaction, then unloads them (so they can move) through its admin API."""
        if owner.broker_id == self.info.broker_id:
            await self.split_bundle(namespace, bundle, "range_equally_divide", unload=True)
            return
        url = (
            f"{owner.http_url}/admin/v2/namespaces/{namespace}/{bundle}/split"
            "?unload=true&splitAlgorithmName=range_equally_divide"
        )
        await self._owner_call(url, f"split of {namespace}/{bundle}", owner)

    async def _owner_call(self, url: str, what: str, owner: BrokerInfo) -> None:
        async with ClientSession(timeout=ClientTimeout(total=30)) as session:
            async with session.put(url) as response:
                if response.status >= 300:
                    raise RuntimeError(f"{what} at {owner.broker_id}: HTTP {response.status}")

    # -- bundles -----------------------------------------------------------------------------

    async def namespace_bundles(self, namespace: str) -> list[BundleRange]:
        ranges = self._bundles.get(namespace)
        if ranges is None:
            assert self.store is not None
            ranges = await load_or_create(
                self.store, namespace, self.config.default_number_of_namespace_bundles
            )
            self._bundles[namespace] = ranges
        return ranges

    def forget_bundles(self, namespace: str) -> None:
        """The namespace's bundles changed (split): read them again."""
        self._bundles.pop(namespace, None)

    async def bundle_of(self, name: TopicName) -> BundleRange:
        return bundle_for(await self.namespace_bundles(name.namespace_name), str(name))

    async def check_owner(self, name: TopicName) -> None:
        """Raise TopicNotOwnedError unless this broker serves ``name`` now (taking the bundle
        if the load manager gives it to this broker)."""
        if self.ownership is None:
            raise TopicNotOwnedError(f"broker {self.info.broker_id} is not in the cluster yet")
        namespace = name.namespace_name
        bundle = await self.bundle_of(name)
        if (namespace, bundle) in self._unloading:
            raise TopicNotOwnedError(
                f"its bundle {namespace}/{bundle} is unloading from this broker"
            )
        if self.ownership.owns(namespace, bundle):
            return
        answer = await lookup(self, name)
        if answer.kind is LookupKind.CONNECT and answer.broker.broker_id == self.info.broker_id:
            return
        raise TopicNotOwnedError(
            f"topic {name} is served by {answer.broker.broker_id}, not {self.info.broker_id}",
            answer.broker,
        )

    def topics_in(
        self, namespace: str, bundle: BundleRange
    ) -> list[PersistentTopic | NonPersistentTopic]:
        """The loaded topics of ``bundle``."""
        return [
            topic
            for key, topic in self.topics.items()
            if topic.name.namespace_name == namespace and bundle.contains(topic_hash(key))
        ]

    async def unload_bundle(
        self, namespace: str, bundle: BundleRange, receiver: BrokerInfo | None = None
    ) -> int:
        """Unload a bundle and hand it to ``receiver`` (default: the least loaded other broker,
        if any). The hand-over is noted first; then each topic's clients are told to reconnect
        to the receiver (CLOSE_PRODUCER / CLOSE_CONSUMER with its URL), the topic closes
        (cursors persisted, ledgers closed); last the ownership key is released, and the
        receiver, which was waiting for that, takes the bundle. Returns the topics."""
        assert self.ownership is not None and self.load_manager is not None
        key = (namespace, bundle)
        self._unloading.add(key)
        handed = False
        try:
            if receiver is None:
                receiver = await self.load_manager.select_receiver(self.info.broker_id)
            if receiver is not None:
                await self.ownership.hand_over(namespace, bundle, receiver.broker_id)
                handed = True
            topics = self.topics_in(namespace, bundle)
            for topic in topics:
                await self.unload_topic(topic, receiver)
            to = receiver.broker_id if receiver is not None else None
            await self.ownership.release(namespace, bundle, to)
            handed = False
            log.info(
                "bundle %s/%s unloaded (%d topics)%s",
                namespace,
                bundle,
                len(topics),
                f", handed to {to}" if to else "",
            )
            return len(topics)
        finally:
            self._unloading.discard(key)
            if handed:  # failed before the release: the note must not send clients away
                await self.ownership.release_note(namespace, bundle)

    async def split_bundle(
        self, namespace: str, bundle: BundleRange, algorithm: str, *, unload: bool
    ) -> tuple[BundleRange, BundleRange]:
        """Split a bundle in two (Pulsar's split algorithms). Owned here: both halves stay ours
        in the same transaction as the split (then unloaded if asked); owned by nobody: only
        the namespace's bundles change."""
        assert self.store is not None and self.ownership is not None
        hashes = [
            topic_hash(name)
            for name in await self.list_topics(namespace, ("persistent", "non-persistent"))
            if bundle.contains(topic_hash(name))
        ]
        pair = split(bundle, algorithm=algorithm, topic_hashes=hashes)  # type: ignore[arg-type]
        if self.ownership.owns(namespace, bundle):
            await self.ownership.split(namespace, bundle, pair)
        else:
            await replace_with_split(self.store, namespace, bundle, pair)
        self.forget_bundles(namespace)
        log.info("bundle %s/%s split into %s and %s", namespace, bundle, *pair)
        if unload:
            for half in pair:
                if self.ownership.owns(namespace, half):
                    await self.unload_bundle(namespace, half)
        return pair

    async def unload_topic(
        self, topic: PersistentTopic | NonPersistentTopic, receiver: BrokerInfo | None = None
    ) -> None:
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

    def topic_fenced(self, topic: PersistentTopic | NonPersistentTopic) -> None:
        """Another broker took the topic's ledger (recovery fenced it): stop serving it here."""
        if self.topics.get(str(topic.name)) is topic:
            del self.topics[str(topic.name)]  # at once: the other failed sends find it gone
            log.warning("topic %s: fenced by another broker; unloading it here", topic.name)
            self._spawn(self.unload_topic(topic))

    def _bundle_lost(self, namespace: str, bundle: BundleRange) -> None:
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

    async def get_topic(
        self, name: TopicName, *, auto: bool = False
    ) -> PersistentTopic | NonPersistentTopic:
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
        record = await read_partitioned(self.store, parent)
        if record is not None and record.deleted:
            raise TopicNotFoundError(
                f"topic {name}: partitioned topic {parent} is being deleted (a delete that was "
                "interrupted is finished by the next DELETE of it)"
            )
        if record is not None and name.partition_index < record.partitions:
            return
        assert self.store is not None
        if str(name) in self.topics or (
            name.persistent
            and await self.store.get(managed_ledger_key(name.managed_ledger_name)) is not None
        ):
            return
        raise TopicNotFoundError(
            f"topic {name} is not a partition of partitioned topic {parent} "
            f"({record.partitions if record else 0} partitions): a partition is created with its "
            "partitioned topic (create or grow that with the admin API)"
        )

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
            await self.check_owner(name)
            if key in self.topics or key in self._loading or key in self._deleting:
                continue  # loaded, or being deleted, while the owner was checked
            assert self.ledger_client is not None and self.store is not None
            done = self._deleting[key] = asyncio.Event()
            try:
                if await ManagedLedger.delete_stored(
                    name.managed_ledger_name, self.ledger_client, self.store
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
        if index < 0:
            return False
        record = await read_partitioned(self.store, name.partitioned_topic_name)
        # A partition not stored yet of a topic being deleted is not created again.
        return record is not None and not record.deleted and index < record.partitions

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
            for partitioned in await partitioned_topics(
                self.store, tenant, local_namespace, domain
            ):
                name = TopicName.parse(partitioned)
                try:
                    record = await read_partitioned(self.store, name)
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
        limit = self.config.max_num_partitions_per_partitioned_topic
        record = await read_partitioned(self.store, name)
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
            assert self.store is not None
            check_partition_count(auto.default_partitions, limit)
            document = PartitionedTopicRecord(auto.default_partitions).to_bytes()
            try:
                await self.store.put(partitioned_key(name), document, NOT_EXISTS)
                log.info("partitioned topic %s auto-created (%d)", name, auto.default_partitions)
            except BadVersionError:
                pass  # created meanwhile
            return await self.partitions_for_client(name)
        return 0

    async def _load(self, name: TopicName, auto: bool) -> PersistentTopic | NonPersistentTopic:
        await self.check_owner(name)
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
