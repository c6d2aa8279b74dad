"""The load manager: placement, shedding and splitting of bundles, run by the elected leader.

The decisions are pure functions (:func:`select_broker`, :func:`bundles_to_shed`,
:func:`bundles_to_split`), tested without a store; :class:`LoadManager` feeds them from the
registry and the ownership cache and acts on them.

Rules:

- **Placement** (Pulsar's least-loaded choice): an unowned bundle goes to the broker with the
  fewest bundles, then the lowest message rate, then the smallest broker id (deterministic),
  leaving out brokers whose highest resource usage (CPU, memory, bandwidth; percent) is above
  ``load_balancer_broker_overloaded_threshold_percentage`` unless all are.
- **Shedding** (after Pulsar's ``ThresholdShedder``): a broker's load is the sum of its
  bundles' message rates (in + out), or its bundle count when the whole cluster is idle. A
  broker loaded more than ``threshold_pct`` percent above the cluster average
  (``load_balancer_broker_threshold_shedder_percentage``) sheds its
  hottest bundles until it is at the average, skipping a bundle that would take it more than
  ``threshold_pct`` below the average (it would only move the overload elsewhere), a bundle
  moved within the grace period, and its last bundle. Shed bundles are unloaded; the clients'
  next lookups place them on the least-loaded broker.
- **Splitting**: a bundle with more than ``max_topics`` topics or more than ``max_msg_rate``
  messages per second (0: no limit), holding at least two topics, is split in two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import NamedTuple

from magnetar.broker.cluster import bundles
from magnetar.broker.cluster.bundles import BundleRange
from magnetar.broker.cluster.ownership import OwnershipStore, ownership_key, read_unload_note
from magnetar.broker.cluster.registry import BrokerRegistry, BundleStats, LoadReport
from magnetar.broker.config import BrokerConfig
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.metadata import (
    NOT_EXISTS,
    BadVersionError,
    Expect,
    MetadataError,
    MetadataStore,
    SessionLostError,
    StoreClosedError,
)
from magnetar.common.metadata.election import cancel_and_wait

log = logging.getLogger(__name__)

ELECTION_NAME = "load-manager"
#: How long a placement counts toward its broker's bundles before its ownership key shows up,
#: so a burst of lookups spreads over the brokers instead of all picking the same one.
PENDING_PLACEMENT_SECONDS = 10.0

__all__ = [
    "BundleStats",
    "LoadManager",
    "NoBrokerAvailableError",
    "Shed",
    "bundles_to_shed",
    "bundles_to_split",
    "select_broker",
]


class NoBrokerAvailableError(Exception):
    """No active broker to place a bundle on."""


class Shed(NamedTuple):
    namespace: str
    bundle: BundleRange
    from_broker: str


# -- pure decisions -------------------------------------------------------------------------


def select_broker(
    candidates: Mapping[str, LoadReport],
    bundle_counts: Mapping[str, int],
    overloaded_threshold_pct: float = 100.0,
) -> str:
    """The least-loaded broker id: fewest bundles (``bundle_counts``, else the report's), then
    lowest message rate, then smallest id. A draining broker (shutting down) is chosen only when
    every candidate is draining: a bundle placed there would have to move again at once. A
    broker whose highest resource usage is above ``overloaded_threshold_pct`` (Pulsar's
    ``loadBalancerBrokerOverloadedThresholdPercentage``) is chosen only when every serving
    candidate is overloaded, as Pulsar's placement scores it out."""
    if not candidates:
        raise NoBrokerAvailableError("no active broker to place a bundle on")
    serving = {b: r for b, r in candidates.items() if not r.draining}
    candidates = serving or candidates
    roomy = {
        b: r for b, r in candidates.items() if r.max_resource_usage <= overloaded_threshold_pct
    }
    candidates = roomy or candidates
    return min(
        candidates,
        key=lambda b: (
            bundle_counts.get(b, candidates[b].bundles),
            candidates[b].msg_rate,
            b,
        ),
    )


def bundles_to_shed(
    reports: Mapping[str, LoadReport],
    owned: Mapping[str, Iterable[tuple[str, BundleRange, float, int]]],
    threshold_pct: float,
    recently_moved: Collection[tuple[str, BundleRange]] = (),
) -> list[Shed]:
    """Bundles to unload so no broker stays ``threshold_pct`` percent above the average load.

    ``reports``: the active brokers (their average is taken over all of them, idle ones
    included). ``owned``: per broker, its bundles as ``(namespace, bundle, msg_rate, topics)``.
    See the module docstring for the rule.
    """
    if not reports:
        return []
    holdings = {b: sorted(owned.get(b, ()), key=_hottest_first) for b in reports}
    by_rate = any(rate > 0 for items in holdings.values() for _, _, rate, _ in items)

    def weight(item: tuple[str, BundleRange, float, int]) -> float:
        return item[2] if by_rate else 1.0

    loads = {b: sum(weight(i) for i in items) for b, items in holdings.items()}
    average = sum(loads.values()) / len(loads)
    margin = average * threshold_pct / 100.0
    result: list[Shed] = []
    for broker in sorted(reports):
        load = loads[broker]
        if average <= 0 or load <= average + margin:
            continue
        remaining = len(holdings[broker])
        for item in holdings[broker]:
            if load <= average or remaining <= 1:
                break
            namespace, bundle = item[0], item[1]
            if (namespace, bundle) in recently_moved or load - weight(item) < average - margin:
                continue
            result.append(Shed(namespace, bundle, broker))
            load -= weight(item)
            remaining -= 1
    return result


def bundles_to_split(
    stats: Iterable[tuple[str, BundleRange, float, int]], max_topics: int, max_msg_rate: float
) -> list[tuple[str, BundleRange]]:
    """``(namespace, bundle)`` of each bundle past a limit (0: no limit) that can be split."""
    result = []
    for namespace, bundle, msg_rate, topics in stats:
        too_many = max_topics > 0 and topics > max_topics
        too_hot = max_msg_rate > 0 and msg_rate > max_msg_rate
        if (too_many or too_hot) and topics >= 2 and bundle.upper - bundle.lower >= 2:
            result.append((namespace, bundle))
    return sorted(result)


def _hottest_first(
    item: tuple[str, BundleRange, float, int],
) -> tuple[float, int, str, BundleRange]:
    namespace, bundle, rate, topics = item
    return (-rate, -topics, namespace, bundle)


# -- the leader's loop ----------------------------------------------------------------------

Unload = Callable[[BrokerInfo, str, BundleRange], Awaitable[None]]


class LoadManager:
    """Campaigns for leadership (``store.election("load-manager")``); while leader, places
    bundles on request and periodically sheds and splits.

    ``unload(owner, namespace, bundle)`` makes ``owner`` unload the bundle (the broker passes
    one that calls the owner's admin REST unload). ``split(owner, namespace, bundle)``, when
    given, makes the owner split it (Pulsar's admin split, the owner keeping both halves);
    without it the leader unloads the bundle and splits the stored document itself, on the
    condition that nobody owns the bundle by then.
    """

    def __init__(
        self,
        store: MetadataStore,
        registry: BrokerRegistry,
        ownership: OwnershipStore,
        config: BrokerConfig,
        unload: Unload,
        *,
        split: Unload | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.me = ownership.me
        self._store = store
        self._registry = registry
        self._ownership = ownership
        self._config = config
        self._unload = unload
        self._split = split
        self._clock = clock
        self._election = store.election(ELECTION_NAME)
        self._task: asyncio.Task[None] | None = None
        #: Bundles moved by shedding -> when; not moved again within the grace period.
        self._moved: dict[tuple[str, BundleRange], float] = {}
        #: Placements whose ownership key may not be visible yet -> (broker id, until).
        self._pending: dict[tuple[str, BundleRange], tuple[str, float]] = {}
        self._last_round: float | None = None
        #: This broker's decisions as leader, for metrics (Pulsar's pulsar_lb_*_total): bundles
        #: unloaded by shedding, brokers shed from, bundles split.
        self.bundles_unloaded = 0
        self.brokers_unloaded = 0
        self.bundles_split = 0

    @property
    def is_leader(self) -> bool:
        return self._election.is_leader

    async def leader_info(self) -> BrokerInfo | None:
        """The current leader (from the election's value), or None while there is none."""
        value = await self._election.leader()
        return BrokerInfo.from_json(value) if value is not None else None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="load-manager")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        with contextlib.suppress(MetadataError):
            await self._election.resign()

    # -- placement ------------------------------------------------------------------------

    async def select(self, namespace: str, bundle: BundleRange) -> BrokerInfo:
        """The broker that should own the unowned ``bundle`` (its owner if it has one).

        Meaningful on the leader only: it alone sees every recent placement.
        """
        owner = await self._ownership.owner(namespace, bundle)
        if owner is not None:
            return owner
        active = await self._registry.active()
        now = self._clock()
        counts = self._bundle_counts(now)
        note = await read_unload_note(self._store, namespace, bundle)
        left = note.source if note is not None else None
        if note is not None and note.to in active:  # handed over by its last owner
            return active[note.to][0]
        pending = self._pending.get((namespace, bundle))
        if pending is not None and pending[0] in active and pending[0] != left:
            return active[pending[0]][0]
        candidates = {b: report for b, (_, report) in active.items()}
        if left in candidates and len(candidates) > 1:
            del candidates[left]  # an unloaded (or shed) bundle moves to another broker
        chosen = select_broker(candidates, counts, self._overloaded_threshold())
        self._pending[(namespace, bundle)] = (chosen, now + PENDING_PLACEMENT_SECONDS)
        log.info("bundle %s/%s: placed on broker %s", namespace, bundle, chosen)
        return active[chosen][0]

    async def select_receiver(self, leaving: str) -> BrokerInfo | None:
        """Where a bundle that broker ``leaving`` unloads should go: the least loaded of the
        other brokers (None when there is no other)."""
        active = await self._registry.active()
        candidates = {b: report for b, (_, report) in active.items() if b != leaving}
        if not candidates:
            return None
        chosen = select_broker(
            candidates, self._bundle_counts(self._clock()), self._overloaded_threshold()
        )
        return active[chosen][0]

    def _overloaded_threshold(self) -> float:
        return self._config.load_balancer_broker_overloaded_threshold_percentage

    def _bundle_counts(self, now: float) -> dict[str, int]:
        owners = self._ownership.owners()
        counts: dict[str, int] = {}
        for info in owners.values():
            counts[info.broker_id] = counts.get(info.broker_id, 0) + 1
        for key, (broker, until) in list(self._pending.items()):
            if until < now or key in owners:
                del self._pending[key]
            else:
                counts[broker] = counts.get(broker, 0) + 1
        return counts

    # -- shedding and splitting -------------------------------------------------------------

    async def run_once(self) -> tuple[list[tuple[str, BundleRange]], list[Shed]]:
        """One round of splitting then shedding; returns what it split and shed."""
        active = await self._registry.active()
        owners = self._ownership.owners()
        owned = self._owned_by_broker(active, owners)
        split_done: list[tuple[str, BundleRange]] = []
        if self._config.load_balancer_auto_bundle_split_enabled:
            stats = [item for items in owned.values() for item in items]
            for namespace, bundle in bundles_to_split(
                stats,
                self._config.load_balancer_namespace_bundle_max_topics,
                self._config.load_balancer_namespace_bundle_max_msg_rate,
            ):
                owner = owners.get((namespace, bundle))
                if owner is not None and await self._split_bundle(owner, namespace, bundle):
                    split_done.append((namespace, bundle))
                    self.bundles_split += 1
        if split_done:
            return split_done, []  # loads change with the split: shed on the next round
        now = self._clock()
        grace = self._config.load_balancer_shedding_grace_period_seconds
        self._moved = {k: t for k, t in self._moved.items() if now - t < grace}
        shed = bundles_to_shed(
            {b: report for b, (_, report) in active.items()},
            owned,
            self._config.load_balancer_broker_threshold_shedder_percentage,
            self._moved.keys(),
        )
        shed_from: set[str] = set()
        for item in shed:
            log.info(
                "shedding bundle %s/%s from overloaded broker %s",
                item.namespace,
                item.bundle,
                item.from_broker,
            )
            try:
                await self._unload(active[item.from_broker][0], item.namespace, item.bundle)
            except Exception:
                log.exception("unloading bundle %s/%s failed", item.namespace, item.bundle)
                continue
            self._moved[(item.namespace, item.bundle)] = now
            self.bundles_unloaded += 1
            shed_from.add(item.from_broker)
        self.brokers_unloaded += len(shed_from)
        return split_done, shed

    @staticmethod
    def _owned_by_broker(
        active: Mapping[str, tuple[BrokerInfo, LoadReport]],
        owners: Mapping[tuple[str, BundleRange], BrokerInfo],
    ) -> dict[str, list[BundleStats]]:
        """Each active broker's bundles (per the ownership keys) with the load its report
        gives them (0 when it reported none yet)."""
        reported = {
            (s.namespace, s.bundle, broker): s
            for broker, (_, report) in active.items()
            for s in report.bundle_stats
        }
        owned: dict[str, list[BundleStats]] = {broker: [] for broker in active}
        for (namespace, bundle), info in owners.items():
            if info.broker_id not in owned:
                continue
            stats = reported.get((namespace, bundle, info.broker_id))
            owned[info.broker_id].append(stats or BundleStats(namespace, bundle, 0.0, 0))
        return owned

    async def _split_bundle(self, owner: BrokerInfo, namespace: str, bundle: BundleRange) -> bool:
        log.info("splitting bundle %s/%s (owner %s)", namespace, bundle, owner.broker_id)
        try:
            if self._split is not None:
                await self._split(owner, namespace, bundle)
                return True
            await self._unload(owner, namespace, bundle)
            await bundles.replace_with_split(
                self._store,
                namespace,
                bundle,
                bundles.split(bundle),
                conditions=[Expect(ownership_key(namespace, bundle), NOT_EXISTS)],
            )
            return True
        except BadVersionError:
            log.info(
                "bundle %s/%s was owned again before the split; retrying later", namespace, bundle
            )
        except Exception:
            log.exception("splitting bundle %s/%s failed", namespace, bundle)
        return False

    # -- leadership -----------------------------------------------------------------------

    async def _run(self) -> None:
        interval = self._config.load_balancer_shedding_interval_seconds
        while True:
            try:
                await self._election.campaign(self.me.to_json())
            except (SessionLostError, StoreClosedError) as e:
                log.error("load manager stops: the metadata session is gone (%s)", e)
                return
            except MetadataError as e:
                log.warning("load manager election failed (%s); campaigning again", e)
                await asyncio.sleep(1.0)
                continue
            log.info("broker %s is the load manager leader", self.me.broker_id)
            self._pending.clear()
            while self.is_leader:
                await asyncio.sleep(min(interval, 1.0))
                if not self._config.load_balancer_enabled or not self._due(interval):
                    continue
                try:
                    await self.run_once()
                except MetadataError as e:
                    log.warning("load manager round failed: %s", e)
            log.warning("broker %s is no longer the load manager leader", self.me.broker_id)

    def _due(self, interval: float) -> bool:
        now = self._clock()
        if self._last_round is None:
            self._last_round = now
            return False
        if now - self._last_round < interval:
            return False
        self._last_round = now
        return True
