"""Cluster membership of one broker: joining (ownership store, registry, load manager), the
load reports, the session watch, and what happens when the metadata session is lost.

The broker registers itself under its metadata session, campaigns for the load manager's
leadership, and owns a bundle while it holds the bundle's ownership key. It serves only while
its session surely still holds those keys (:meth:`Membership.may_serve`); once that is in doubt
it stops serving everything at once (another broker may own the bundles as soon as the keys
expire) and, when the metadata store is its own, joins again with a new session. A standalone
is a cluster of one through the same code.

The loaded topics are reached through :class:`ServedTopics` (the topics room implements it):
this room never imports the topics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from magnetar.broker.cluster.bundle_operations import BundleOperations
from magnetar.broker.cluster.bundles import BundleRange
from magnetar.broker.cluster.load_manager import LoadManager
from magnetar.broker.cluster.ownership import SESSION_SAFETY_MARGIN_S, OwnershipStore
from magnetar.broker.cluster.registry import BrokerRegistry, BundleStats, LoadReport, cpu_and_memory
from magnetar.broker.cluster.resource_usage import ResourceSampler, ResourceUsage
from magnetar.broker.config import BrokerConfig
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.metadata import MetadataStore
from magnetar.common.tasks import spawn_logged

log = logging.getLogger(__name__)

#: How often the broker checks that its session is still surely alive.
SESSION_CHECK_INTERVAL_S = 0.25


class ServedTopics(Protocol):
    """What membership needs of the loaded topics."""

    def counters(self) -> dict[str, tuple[int, int, int, int]]:
        """``(messages_in, bytes_in, messages_out, bytes_out)`` of every loaded topic, by
        topic name."""
        ...

    def topic_names_in(self, namespace: str, bundle: BundleRange) -> list[str]:
        """The names of the loaded topics of ``bundle``."""
        ...

    def stop_serving(self, reason: str) -> None:
        """Tell every client to go and close every topic, now."""
        ...

    def bundle_lost(self, namespace: str, bundle: BundleRange) -> None:
        """Our ownership key of ``bundle`` is gone: stop serving its topics now."""
        ...


class MembershipHost(Protocol):
    """The broker as membership sees it: who it is, its live metadata session, and (when the
    store is its own) how to replace a lost session with a new one."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def info(self) -> BrokerInfo: ...

    @property
    def store(self) -> MetadataStore | None: ...

    @property
    def owns_store(self) -> bool: ...

    async def close_session(self) -> None:
        """Close the lost metadata session (the store is None afterwards)."""
        ...

    async def open_session(self) -> None:
        """Open a new metadata session (and everything that lives on it)."""
        ...


class Membership:
    """This broker's place in the cluster (see the module docstring)."""

    def __init__(
        self, host: MembershipHost, topics: ServedTopics, bundles: BundleOperations
    ) -> None:
        self._host = host
        self._topics = topics
        self._bundles = bundles
        self.ownership: OwnershipStore | None = None
        self.registry: BrokerRegistry | None = None
        self.load_manager: LoadManager | None = None
        self._report_task: asyncio.Task[None] | None = None
        self._bundles_watch: asyncio.Task[None] | None = None
        self._session_watch: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_report: tuple[float, dict[str, tuple[int, int, int, int]]] = (
            time.monotonic(),
            {},
        )
        self._resources = ResourceSampler(
            host.config.load_balancer_override_broker_nic_speed_gbps or None
        )
        #: The usage of the last load report (``pulsar_lb_*_usage``).
        self.resource_usage = ResourceUsage()
        #: Shutting down (:meth:`drain`): reported, so the load manager places nothing here.
        self.draining = False

    async def join(self) -> None:
        store = self._host.store
        assert store is not None
        config, info = self._host.config, self._host.info
        self.ownership = OwnershipStore(store, info)
        self.ownership.add_lost_listener(self._session_lost)
        self.ownership.add_bundle_lost_listener(self._topics.bundle_lost)
        await self.ownership.start()
        self.registry = BrokerRegistry(store, info)
        await self.registry.start()
        await self.registry.register(self.load_report())
        self.load_manager = LoadManager(
            store,
            self.registry,
            self.ownership,
            config,
            self._bundles.request_unload,
            split=self._bundles.request_split,
        )
        self.load_manager.start()
        loop = asyncio.get_running_loop()
        self._report_task = loop.create_task(self._report_loop(), name="load-report")
        self._bundles_watch = loop.create_task(self._bundles.follow(store), name="bundles-watch")
        self._session_watch = loop.create_task(self._watch_session(), name="session-watch")

    async def leave(self) -> None:
        for task in (self._session_watch, self._bundles_watch, self._report_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.load_manager is not None:
            await self.load_manager.close()
        if self.registry is not None:
            await self.registry.close()
        if self.ownership is not None:
            await self.ownership.close()

    @property
    def registered(self) -> bool:
        """Whether this broker's registration is written (it can be given bundles)."""
        return self.registry is not None and self.registry.registered

    async def drain(self) -> None:
        """Take no new bundles: the next placement goes elsewhere (the report says draining,
        written now rather than at the next report interval). Bundles owned are unloaded by
        the caller; the registration stays until :meth:`leave`."""
        self.draining = True
        if self.registry is not None and self.registered:
            try:
                await self.registry.update(self.load_report())
            except Exception as e:
                log.warning("draining not reported (%s): new bundles may still come here", e)

    # -- load reports ----------------------------------------------------------------------------

    def load_report(self) -> LoadReport:
        """Rates since the previous report, from the topics' own counters, per owned bundle."""
        now = time.monotonic()
        elapsed = max(now - self._last_report[0], 1e-3)
        previous = self._last_report[1]
        counters = self._topics.counters()
        self._last_report = (now, counters)

        def delta(key: str, index: int) -> float:
            before = previous.get(key, (0, 0, 0, 0))[index]
            return max(counters[key][index] - before, 0) / elapsed

        owned = self.ownership.owned() if self.ownership is not None else set()
        bundle_stats = []
        for namespace, bundle in sorted(owned):
            topics = self._topics.topic_names_in(namespace, bundle)
            rate = sum(delta(key, 0) for key in topics)
            bundle_stats.append(BundleStats(namespace, bundle, rate, len(topics)))
        cpu, memory = cpu_and_memory()
        throughput_in = sum(delta(key, 1) for key in counters)
        throughput_out = sum(delta(key, 3) for key in counters)
        usage = self.resource_usage = self._resources.sample(
            cpu, memory, throughput_in, throughput_out
        )
        return LoadReport(
            msg_rate_in=sum(delta(key, 0) for key in counters),
            msg_rate_out=sum(delta(key, 2) for key in counters),
            throughput_in=throughput_in,
            throughput_out=throughput_out,
            topics=len(counters),
            bundles=len(owned),
            cpu_percent=cpu,
            memory_mb=memory,
            cpu_usage=usage.cpu,
            memory_usage=usage.memory,
            bandwidth_in_usage=usage.bandwidth_in,
            bandwidth_out_usage=usage.bandwidth_out,
            timestamp_ms=int(time.time() * 1000),
            bundle_stats=tuple(bundle_stats),
            draining=self.draining,
        )

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self._host.config.load_balancer_report_update_interval_seconds)
            try:
                assert self.registry is not None
                await self.registry.update(self.load_report())
            except Exception as e:
                log.warning("load report not written: %s", e)

    # -- the session -----------------------------------------------------------------------------

    def may_serve(self) -> bool:
        """Whether this broker's session surely still holds its ownership keys: until the last
        keepalive's deadline, less a margin. After a pause (SIGSTOP, a frozen VM) this turns
        false before the metadata client has even noticed, so nothing is served meanwhile."""
        store = self._host.store
        return (
            store is not None
            and time.monotonic() < store.session_valid_until - SESSION_SAFETY_MARGIN_S
        )

    async def _watch_session(self) -> None:
        while True:
            await asyncio.sleep(SESSION_CHECK_INTERVAL_S)
            if not self.may_serve():
                self._topics.stop_serving(
                    "the metadata session may have expired (no keepalive in time)"
                )

    def _session_lost(self) -> None:
        """The metadata session is gone: stop serving at once, then join again under a new
        session."""
        self._topics.stop_serving("metadata session lost")
        log.error("metadata session lost: joining the cluster again")
        self._spawn(self._rejoin())

    async def _rejoin(self) -> None:
        await self.leave()
        if not self._host.owns_store:
            return  # a store we were given (tests, standalone) is not ours to reopen
        await self._host.close_session()
        while True:
            try:
                await self._host.open_session()
                await self.join()
                log.info("joined the cluster again with a new metadata session")
                return
            except Exception as e:
                log.error("joining the cluster again failed (%s); retrying in 2 s", e)
                await asyncio.sleep(2)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        spawn_logged(coro, log, "broker task", tracked=self._tasks, level=logging.ERROR)
