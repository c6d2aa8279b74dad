"""Prometheus metrics of one broker, in a registry of its own (a standalone process holds a
bookie's registry too).

Two kinds live here. :class:`BrokerMetrics` holds the broker's own ``magnetar_broker_*``
counters. Once bound to a broker (:meth:`BrokerMetrics.bind`), a :class:`PulsarCollector` in
the same registry yields Pulsar's metric families at scrape time, computed from the plain
counters the topics and subscriptions keep (``messages_in``, ``bytes_in``, ``msg_out``,
``bytes_out``): nothing is added per message beyond those integer increments, and the rates are
counter deltas between scrapes (:class:`CounterRates`).

Names and labels follow Pulsar's reference (``exposeTopicLevelMetricsInPrometheus=true``, its
default): topic families carry ``cluster``, ``namespace``, ``topic``; subscription families add
``subscription``; ``pulsar_topics_count`` is per namespace; ``pulsar_broker_*`` per cluster;
bundle families (``pulsar_bundle_*``) carry ``cluster``, ``broker``, ``bundle``; the load
manager's decisions are ``pulsar_lb_*_total`` with Pulsar's ``metric`` label. With topic-level
metrics off, the topic families are summed per namespace (labels ``cluster``, ``namespace``)
and subscription families are left out, as Pulsar does. Ownership and leadership, which
Pulsar has no family for, are ``magnetar_broker_owned_bundles`` and
``magnetar_load_manager_leader``. See docs/operations.md, "Broker metrics".
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Protocol, cast

from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from magnetar.broker.ledger.entry_cache import EntryCache
from magnetar.broker.ledger.ml_stats import (
    ENTRY_SIZE_BOUNDS,
    LATENCY_BOUNDS_MS,
    Buckets,
    ManagedLedgerStats,
)
from magnetar.broker.model.counts import ConnectionCounts, LookupCounts
from magnetar.broker.model.topic_name import TopicName
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.metrics import service_registry

#: Rates are recomputed at most this often, so scrapes close together (two Prometheus servers,
#: a person with curl) do not make them noisy: a scrape sooner gets the previous rates.
MIN_RATE_WINDOW_S = 1.0


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = r = service_registry()
        # Set when scraped, from the loaded topics' own counters (nothing extra per message).
        self.entries_in = Gauge(
            "magnetar_broker_in_entries",
            "Entries (producer batches) stored by the loaded topics since they were loaded",
            registry=r,
        )
        self.bytes_in = Gauge(
            "magnetar_broker_in_bytes",
            "Bytes stored by the loaded topics since they were loaded",
            registry=r,
        )
        self.send_errors = Counter(
            "magnetar_broker_send_errors", "Sends answered with SEND_ERROR", ["error"], registry=r
        )
        self.dispatch_failures = Counter(
            "magnetar_broker_dispatch_failures",
            "Dispatch rounds that failed and were retried",
            registry=r,
        )
        self.unreadable_entries = Counter(
            "magnetar_broker_unreadable_entries",
            "Reads of entries with no intact copy on any bookie",
            registry=r,
        )
        self.skipped_entries = Counter(
            "magnetar_broker_skipped_unreadable_entries",
            "Unreadable entries skipped (auto_skip_non_recoverable_data)",
            registry=r,
        )
        self.topics = Gauge("magnetar_broker_topics", "Topics loaded", registry=r)
        self.connections = Gauge(
            "magnetar_broker_connections", "Client connections open", registry=r
        )
        #: Counted by the protocol room; read when scraped (pulsar_connection_*, lookups).
        self.connection_counts = ConnectionCounts()
        self.lookup_counts = LookupCounts()
        self.collector: PulsarCollector | None = None

    def bind(self, broker: MetricsSource, *, topic_level: bool = True) -> PulsarCollector:
        """Expose Pulsar's families for ``broker`` in this registry (once; later calls return
        the collector already bound)."""
        if self.collector is None:
            self.collector = PulsarCollector(
                broker,
                topic_level=topic_level,
                connections=self.connection_counts,
                lookups=self.lookup_counts,
            )
            self.registry.register(self.collector)
        return self.collector


# -- rates from counters ----------------------------------------------------------------------


class CounterRates:
    """Per-second rates of counters that only grow, from their deltas between scrapes.

    Keyed by the counting object itself (a topic or subscription): one unloaded and loaded
    again is a new object whose counters start at 0, so no delta ever spans two lives. The
    first time an object is seen its rate is the average since ``since`` (when it was loaded).
    Rates are recomputed once at least ``min_window_s`` passed since the last computation.
    """

    def __init__(
        self, min_window_s: float = MIN_RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._min_window_s = min_window_s
        self._clock = clock
        #: key -> (when, counters then, rates and deltas computed then)
        self._last: dict[
            Hashable, tuple[float, tuple[int, ...], tuple[float, ...], tuple[int, ...]]
        ] = {}
        self._seen: set[Hashable] = set()

    def rates(self, key: Hashable, counters: tuple[int, ...], since: float) -> tuple[float, ...]:
        return self.window(key, counters, since)[0]

    def deltas(self, key: Hashable, counters: tuple[int, ...], since: float) -> tuple[int, ...]:
        """How much each counter grew in the last window (the first: since ``since``), for
        Pulsar's per-period bucket counts."""
        return self.window(key, counters, since)[1]

    def window(
        self, key: Hashable, counters: tuple[int, ...], since: float
    ) -> tuple[tuple[float, ...], tuple[int, ...]]:
        now = self._clock()
        self._seen.add(key)
        last = self._last.get(key)
        if last is not None and now - last[0] < self._min_window_s:
            return last[2], last[3]
        then, before = (since, (0,) * len(counters)) if last is None else last[:2]
        elapsed = max(now - then, 1e-3)
        deltas = tuple(max(c - b, 0) for c, b in zip(counters, before, strict=True))
        rates = tuple(d / elapsed for d in deltas)
        self._last[key] = (now, counters, rates, deltas)
        return rates, deltas

    def forget_unseen(self) -> None:
        """Drop what was not asked about since the previous call (unloaded topics, removed
        subscriptions), so their objects are not kept alive here."""
        for key in self._last.keys() - self._seen:
            del self._last[key]
        self._seen.clear()


# -- what the collector reads -----------------------------------------------------------------


class CountedConsumer(Protocol):
    """What a consumer exposes to metrics: the messages it holds unacknowledged."""

    @property
    def unacked(self) -> int: ...


class CountedSubscription(Protocol):
    """What a subscription (persistent or not) exposes to metrics."""

    name: str
    msg_out: int
    bytes_out: int

    @property
    def consumers(self) -> Sequence[CountedConsumer]: ...


class Backlogged(Protocol):
    """A durable subscription's cursor: its backlog (entries)."""

    @property
    def backlog(self) -> int: ...


class StoredSubscription(CountedSubscription, Protocol):
    """A persistent topic's subscription: it has a cursor (and so a backlog)."""

    cursor: Backlogged


class CountedTopic(Protocol):
    """What a topic (persistent or not) exposes to metrics."""

    name: TopicName
    loaded_at: float
    msg_in: int
    bytes_in: int
    messages_in: int
    msg_out: int
    bytes_out: int

    @property
    def producers(self) -> Sized: ...

    @property
    def subscriptions(self) -> Mapping[str, CountedSubscription]: ...


class ReadSide(Protocol):
    """A managed ledger's reader: its cache of recent entries."""

    cache: EntryCache


class LedgerSettings(Protocol):
    @property
    def write_quorum(self) -> int: ...


class StoredLedger(Protocol):
    """A persistent topic's managed ledger: the bytes of its ledgers (one copy), its
    counters and entry cache, and what the backlog size is estimated from."""

    stats: ManagedLedgerStats
    reader: ReadSide
    config: LedgerSettings

    @property
    def total_size(self) -> int: ...

    @property
    def number_of_entries(self) -> int: ...

    def slowest_mark_delete(self) -> Any: ...

    def entries_after(self, position: Any) -> int: ...


class StoredTopic(CountedTopic, Protocol):
    """A persistent topic (``name.persistent``): its managed ledger, cursored subscriptions."""

    ml: StoredLedger

    @property
    def subscriptions(self) -> Mapping[str, StoredSubscription]: ...


class Owned(Protocol):
    """The ownership store as metrics read it: the bundles this broker owns."""

    def owned(self) -> set[tuple[str, BundleRange]]: ...


class Balancing(Protocol):
    """The load manager as metrics read it: leadership and its decisions' counts."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def bundles_unloaded(self) -> int: ...

    @property
    def brokers_unloaded(self) -> int: ...

    @property
    def bundles_split(self) -> int: ...


class Authenticating(Protocol):
    """What the authentication service counts (``common/auth/service.py``)."""

    successes: Mapping[tuple[str, str], int]
    refusals: Mapping[tuple[str, str], int]


class Named(Protocol):
    """The broker's configuration as metrics read it."""

    @property
    def cluster_name(self) -> str: ...


class Usage(Protocol):
    """Resource usage in percent (cluster/resource_usage.py)."""

    @property
    def cpu(self) -> float: ...

    @property
    def memory(self) -> float: ...

    @property
    def bandwidth_in(self) -> float: ...

    @property
    def bandwidth_out(self) -> float: ...


class MetricsSource(Protocol):
    """The live objects the collector reads when scraped (the broker, wired by broker.py)."""

    @property
    def config(self) -> Named: ...

    @property
    def topics(self) -> Mapping[str, CountedTopic]: ...

    @property
    def info(self) -> BrokerInfo: ...

    @property
    def ownership(self) -> Owned | None: ...

    @property
    def load_manager(self) -> Balancing | None: ...

    @property
    def authentication(self) -> Authenticating: ...

    @property
    def resource_usage(self) -> Usage: ...

    @property
    def topic_loads_pending(self) -> int: ...


# -- the collector ----------------------------------------------------------------------------

#: Topic families: (name, help, is_counter). Values per topic in this order (see _topic_values).
TOPIC_FAMILIES: tuple[tuple[str, str, bool], ...] = (
    ("pulsar_subscriptions_count", "Subscriptions of the topic on this broker", False),
    ("pulsar_producers_count", "Producers of the topic connected to this broker", False),
    ("pulsar_consumers_count", "Consumers of the topic connected to this broker", False),
    ("pulsar_rate_in", "Messages per second coming into the topic", False),
    ("pulsar_rate_out", "Messages per second dispatched from the topic", False),
    ("pulsar_throughput_in", "Bytes per second coming into the topic", False),
    ("pulsar_throughput_out", "Bytes per second dispatched from the topic", False),
    ("pulsar_storage_size", "Bytes of the topic's ledgers (one copy)", False),
    (
        "pulsar_msg_backlog",
        "Backlog of the topic: the sum of its subscriptions' backlogs (entries)",
        False,
    ),
    ("pulsar_storage_write_rate", "Entries per second written to storage", False),
    ("pulsar_in_bytes", "Bytes received for the topic since it was loaded", True),
    ("pulsar_in_messages", "Messages received for the topic since it was loaded", True),
    ("pulsar_out_bytes", "Bytes dispatched from the topic since it was loaded", True),
    ("pulsar_out_messages", "Messages dispatched from the topic since it was loaded", True),
    (
        "pulsar_storage_backlog_size",
        "Bytes of the topic's backlog: the entries after its slowest subscription's "
        "mark-delete position, at the topic's average entry size (estimated, one copy)",
        False,
    ),
    ("pulsar_storage_read_rate", "Entries per second read from storage (cache included)", False),
    ("pulsar_average_msg_size", "Average size of the messages coming in (bytes)", False),
)
#: Topic families that mean nothing summed over a namespace (Pulsar leaves them out there).
TOPIC_ONLY = frozenset({"pulsar_average_msg_size"})

#: Broker-wide sums (label ``cluster``): Pulsar's pulsar_broker_* of the topic families above.
BROKER_FAMILIES: tuple[tuple[str, int], ...] = (
    ("pulsar_broker_subscriptions_count", 0),
    ("pulsar_broker_producers_count", 1),
    ("pulsar_broker_consumers_count", 2),
    ("pulsar_broker_rate_in", 3),
    ("pulsar_broker_rate_out", 4),
    ("pulsar_broker_throughput_in", 5),
    ("pulsar_broker_throughput_out", 6),
    ("pulsar_broker_storage_size", 7),
    ("pulsar_broker_msg_backlog", 8),
    ("pulsar_broker_storage_write_rate", 9),
    ("pulsar_broker_storage_read_rate", 15),
)

#: Pulsar's names of the write latency buckets (ms bounds of ml_stats.LATENCY_BOUNDS_MS, then
#: the overflow) and of the entry size buckets (ENTRY_SIZE_BOUNDS, then the overflow).
WRITE_LATENCY_NAMES: tuple[str, ...] = (
    *tuple(
        f"pulsar_storage_write_latency_le_{b}" for b in ("0_5", 1, 5, 10, 20, 50, 100, 200, 1000)
    ),
    "pulsar_storage_write_latency_overflow",
)
ENTRY_SIZE_NAMES: tuple[str, ...] = tuple(
    f"pulsar_entry_size_le_{b}"
    for b in ("128", "512", "1_kb", "2_kb", "4_kb", "16_kb", "100_kb", "1_mb", "overflow")
)
assert len(WRITE_LATENCY_NAMES) == len(LATENCY_BOUNDS_MS) + 1
assert len(ENTRY_SIZE_NAMES) == len(ENTRY_SIZE_BOUNDS) + 1

SUBSCRIPTION_FAMILIES: tuple[tuple[str, str], ...] = (
    ("pulsar_subscription_back_log", "Backlog of the subscription (entries)"),
    ("pulsar_subscription_unacked_messages", "Messages dispatched and not yet acknowledged"),
    ("pulsar_subscription_msg_rate_out", "Messages per second dispatched to the subscription"),
    ("pulsar_subscription_msg_throughput_out", "Bytes per second dispatched to it"),
    ("pulsar_subscription_consumers_count", "Consumers of the subscription"),
    ("pulsar_subscription_delayed", "Messages held for delayed delivery (entries)"),
    (
        "pulsar_subscription_msg_rate_redeliver",
        "Messages per second sent back for redelivery (negative acks, redelivery requests, "
        "ack timeouts, consumers leaving)",
    ),
    ("pulsar_subscription_msg_ack_rate", "Messages per second acknowledged"),
    (
        "pulsar_subscription_blocked_on_unacked_messages",
        "1 while the subscription is at its bound of unacknowledged messages, else 0",
    ),
    ("pulsar_subscription_msg_rate_expired", "Entries per second expired by TTL"),
    ("pulsar_subscription_total_msg_expired", "Entries expired since the topic was loaded"),
)

BUNDLE_FAMILIES: tuple[tuple[str, str], ...] = (
    ("pulsar_bundle_msg_rate_in", "Messages per second into the bundle's topics"),
    ("pulsar_bundle_msg_rate_out", "Messages per second out of the bundle's topics"),
    ("pulsar_bundle_msg_throughput_in", "Bytes per second into the bundle's topics"),
    ("pulsar_bundle_msg_throughput_out", "Bytes per second out of the bundle's topics"),
    ("pulsar_bundle_topics_count", "Topics of the bundle loaded on this broker"),
    ("pulsar_bundle_producer_count", "Producers of the bundle's topics"),
    ("pulsar_bundle_consumer_count", "Consumers of the bundle's topics"),
)


class PulsarCollector(Collector):
    """Pulsar's families for one broker, computed when scraped (see the module docstring)."""

    def __init__(
        self,
        broker: MetricsSource,
        *,
        topic_level: bool = True,
        connections: ConnectionCounts | None = None,
        lookups: LookupCounts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._broker = broker
        self.topic_level = topic_level
        self._connections = ConnectionCounts() if connections is None else connections
        self._lookups = LookupCounts() if lookups is None else lookups
        self._rates = CounterRates(clock=clock)

    def describe(self) -> Iterable[Metric]:
        return []  # families depend on what is loaded; describing them would mean scraping

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        cluster = broker.config.cluster_name
        topics: list[CountedTopic] = list(broker.topics.values())
        ledgers = {id(t): self._ledger_view(t) for t in topics if t.name.persistent}
        values = {id(t): self._topic_values(t, ledgers.get(id(t))) for t in topics}
        yield from self._topic_families(cluster, topics, values)
        yield from self._histogram_families(cluster, topics, ledgers)
        yield from self._broker_families(cluster, topics, values)
        if self.topic_level:
            yield from self._subscription_families(cluster, topics)
        yield from self._managed_ledger_families(cluster, topics, ledgers)
        yield from self._connection_families(cluster)
        yield from self._lookup_families(cluster)
        yield from self._usage_families(cluster)
        yield from self._bundle_families(cluster, topics, values)
        yield from self._replication_families(cluster, topics)
        yield from self._load_manager_families(cluster)
        yield from self._authentication_families(cluster)
        self._rates.forget_unseen()

    # -- topics --------------------------------------------------------------------------------

    def _ledger_view(self, topic: CountedTopic) -> LedgerView:
        """A persistent topic's managed-ledger counters over the last window: rates of
        :meth:`ManagedLedgerStats.counters` and the failures, bucket counts grown."""
        ml = cast(StoredTopic, topic).ml
        stats = ml.stats
        counters = (*stats.counters(), stats.adds_failed, stats.reads_failed)
        rates, deltas = self._rates.window((topic, "ml"), counters, topic.loaded_at)
        buckets = {
            name: self._rates.deltas((topic, name), _snapshot(b), topic.loaded_at)
            for name, b in (
                ("add", stats.add_latency),
                ("ledger_add", stats.ledger_add_latency),
                ("switch", stats.ledger_switch_latency),
                ("size", stats.entry_size),
            )
        }
        return LedgerView(ml, rates, deltas, buckets)

    def _topic_values(self, topic: CountedTopic, ledger: LedgerView | None) -> list[float]:
        rate_in, throughput_in, rate_out, throughput_out, write_rate = self._rates.rates(
            topic,
            (topic.messages_in, topic.bytes_in, topic.msg_out, topic.bytes_out, topic.msg_in),
            topic.loaded_at,
        )
        subscriptions = list(topic.subscriptions.values())
        stored = cast(StoredTopic, topic) if topic.name.persistent else None
        return [
            len(subscriptions),
            len(topic.producers),
            sum(len(s.consumers) for s in subscriptions),
            rate_in,
            rate_out,
            throughput_in,
            throughput_out,
            stored.ml.total_size if stored is not None else 0,
            _backlog(stored),
            write_rate,
            topic.bytes_in,
            topic.messages_in,
            topic.bytes_out,
            topic.msg_out,
            _backlog_size(stored),
            ledger.rates[2] if ledger is not None else 0.0,
            throughput_in / rate_in if rate_in > 0 else 0.0,
        ]

    def _topic_families(
        self, cluster: str, topics: list[CountedTopic], values: dict[int, list[float]]
    ) -> Iterator[Metric]:
        per_namespace: dict[str, list[float]] = {}
        topics_count: dict[str, int] = {}
        for topic in topics:
            namespace = topic.name.namespace_name
            topics_count[namespace] = topics_count.get(namespace, 0) + 1
            sums = per_namespace.setdefault(namespace, [0.0] * len(TOPIC_FAMILIES))
            for i, v in enumerate(values[id(topic)]):
                sums[i] += v
        count = GaugeMetricFamily(
            "pulsar_topics_count", "Topics of the namespace on this broker", labels=_NS_LABELS
        )
        for namespace, n in sorted(topics_count.items()):
            count.add_metric([cluster, namespace], n)
        yield count
        labels = _TOPIC_LABELS if self.topic_level else _NS_LABELS
        for i, (name, documentation, is_counter) in enumerate(TOPIC_FAMILIES):
            if not self.topic_level and name in TOPIC_ONLY:
                continue
            family = _family(name, documentation, is_counter, labels)
            if self.topic_level:
                for topic in topics:
                    family.add_metric(
                        [cluster, topic.name.namespace_name, str(topic.name)], values[id(topic)][i]
                    )
            else:
                for namespace, sums in sorted(per_namespace.items()):
                    family.add_metric([cluster, namespace], sums[i])
            yield family

    def _broker_families(
        self, cluster: str, topics: list[CountedTopic], values: dict[int, list[float]]
    ) -> Iterator[Metric]:
        topics_count = GaugeMetricFamily(
            "pulsar_broker_topics_count", "Topics loaded on this broker", labels=["cluster"]
        )
        topics_count.add_metric([cluster], len(topics))
        yield topics_count
        for name, index in BROKER_FAMILIES:
            family = GaugeMetricFamily(
                name, f"This broker's sum of {TOPIC_FAMILIES[index][0]}", labels=["cluster"]
            )
            family.add_metric([cluster], sum(values[id(t)][index] for t in topics))
            yield family

    # -- subscriptions -------------------------------------------------------------------------

    def _subscription_families(self, cluster: str, topics: list[CountedTopic]) -> Iterator[Metric]:
        families = [
            GaugeMetricFamily(name, documentation, labels=_SUBSCRIPTION_LABELS)
            for name, documentation in SUBSCRIPTION_FAMILIES
        ]
        (
            back_log,
            unacked,
            rate_out,
            throughput_out,
            consumers,
            delayed,
            rate_redeliver,
            ack_rate,
            blocked,
            rate_expired,
            total_expired,
        ) = families
        for topic in topics:
            labels_of_topic = [cluster, topic.name.namespace_name, str(topic.name)]
            for subscription in topic.subscriptions.values():
                labels = [*labels_of_topic, subscription.name]
                expired = getattr(subscription, "expired", 0)
                rate, throughput, acks, redeliveries, expiries = self._rates.rates(
                    subscription,
                    (
                        subscription.msg_out,
                        subscription.bytes_out,
                        getattr(subscription, "msg_acked", 0),
                        getattr(subscription, "msg_redelivered", 0),
                        expired,
                    ),
                    topic.loaded_at,
                )
                dispatcher = getattr(subscription, "dispatcher", None)
                if topic.name.persistent:
                    back_log.add_metric(
                        labels, cast(StoredSubscription, subscription).cursor.backlog
                    )
                    unacked.add_metric(labels, sum(c.unacked for c in subscription.consumers))
                    held = getattr(dispatcher, "delayed", ())
                    delayed.add_metric(labels, len(held))
                    full = getattr(dispatcher, "subscription_full", None)
                    blocked.add_metric(labels, 1 if full is not None and full() else 0)
                    rate_expired.add_metric(labels, expiries)
                    total_expired.add_metric(labels, expired)
                    rate_redeliver.add_metric(labels, redeliveries)
                    ack_rate.add_metric(labels, acks)
                rate_out.add_metric(labels, rate)
                throughput_out.add_metric(labels, throughput)
                consumers.add_metric(labels, len(subscription.consumers))
        yield from families

    # -- storage: latency and entry size buckets, the managed ledgers -----------------------------

    def _histogram_families(
        self, cluster: str, topics: list[CountedTopic], ledgers: dict[int, LedgerView]
    ) -> Iterator[Metric]:
        """Pulsar's ``pulsar_storage_write_latency_*`` and ``pulsar_entry_size_*``: per
        bucket, the entries of the last window (between scrapes) whose add latency or size
        fell in it, with ``_count`` and ``_sum`` (µs, bytes); gauges, as Pulsar types them."""
        labels = _TOPIC_LABELS if self.topic_level else _NS_LABELS
        for prefix, names, key in (
            ("pulsar_storage_write_latency", WRITE_LATENCY_NAMES, "add"),
            ("pulsar_entry_size", ENTRY_SIZE_NAMES, "size"),
        ):
            all_names = (*names, f"{prefix}_count", f"{prefix}_sum")
            rows: dict[tuple[str, ...], list[float]] = {}
            for topic in topics:
                view = ledgers.get(id(topic))
                if view is None:
                    continue
                key_labels: tuple[str, ...] = (cluster, topic.name.namespace_name)
                if self.topic_level:
                    key_labels = (*key_labels, str(topic.name))
                row = rows.setdefault(key_labels, [0.0] * len(all_names))
                for i, value in enumerate(view.buckets[key]):
                    row[i] += value
            for i, name in enumerate(all_names):
                family = GaugeMetricFamily(name, _HISTOGRAM_HELP[prefix], labels=labels)
                for key_labels, row in sorted(rows.items()):
                    family.add_metric(list(key_labels), row[i])
                yield family

    def _managed_ledger_families(
        self, cluster: str, topics: list[CountedTopic], ledgers: dict[int, LedgerView]
    ) -> Iterator[Metric]:
        """Pulsar's ``pulsar_ml_*``: per namespace (label ``namespace="tenant/ns/persistent"``,
        as Pulsar names a managed ledger's namespace) and the entry cache's per broker."""
        per_namespace: dict[str, list[LedgerView]] = {}
        for topic in topics:
            view = ledgers.get(id(topic))
            if view is not None:
                per_namespace.setdefault(f"{topic.name.namespace_name}/persistent", []).append(view)
        labels = _NS_LABELS
        scalar = [GaugeMetricFamily(n, d, labels=labels) for n, d, _ in ML_FAMILIES]
        bucketed = [
            (
                GaugeMetricFamily(n, d, labels=[*labels, "quantile"]),
                GaugeMetricFamily(f"{n}_OVERFLOW", f"{d}: above the last bound", labels=labels),
                key,
                quantiles,
            )
            for n, d, key, quantiles in ML_BUCKET_FAMILIES
        ]
        for namespace, views in sorted(per_namespace.items()):
            for family, (_, _, value_of) in zip(scalar, ML_FAMILIES, strict=True):
                family.add_metric([cluster, namespace], sum(value_of(v) for v in views))
            for family, overflow, key, quantiles in bucketed:
                counts = [sum(v.buckets[key][i] for v in views) for i in range(len(quantiles) + 1)]
                for quantile, count in zip(quantiles, counts, strict=False):
                    family.add_metric([cluster, namespace, quantile], count)
                overflow.add_metric([cluster, namespace], counts[len(quantiles)])
        yield from scalar
        for family, overflow, _, _ in bucketed:
            yield family
            yield overflow
        views = list(ledgers.values())
        caches = [v.ml.reader.cache for v in views]
        for name, documentation, value in (
            ("pulsar_ml_count", "Managed ledgers open on this broker", len(views)),
            (
                "pulsar_ml_cache_used_size",
                "Bytes of entries in the managed ledgers' caches",
                sum(c.size for c in caches),
            ),
            (
                "pulsar_ml_cache_entries",
                "Entries in the managed ledgers' caches",
                sum(len(c.entries) for c in caches),
            ),
            (
                "pulsar_ml_cache_hits_rate",
                "Entries per second read from the caches",
                sum(v.rates[4] for v in views),
            ),
            (
                "pulsar_ml_cache_hits_throughput",
                "Bytes per second read from the caches",
                sum(v.rates[5] for v in views),
            ),
            (
                "pulsar_ml_cache_misses_rate",
                "Entries per second read from the bookies (not in a cache)",
                sum(v.rates[6] for v in views),
            ),
            (
                "pulsar_ml_cache_misses_throughput",
                "Bytes per second read from the bookies (not in a cache)",
                sum(v.rates[7] for v in views),
            ),
            (
                "pulsar_ml_cache_inserted_entries_total",
                "Entries put in the caches of the open managed ledgers",
                sum(c.inserted for c in caches),
            ),
            (
                "pulsar_ml_cache_evicted_entries_total",
                "Entries evicted from the caches of the open managed ledgers",
                sum(c.evicted for c in caches),
            ),
        ):
            family = GaugeMetricFamily(name, documentation, labels=["cluster"])
            family.add_metric([cluster], value)
            yield family

    # -- connections, lookups, resource usage ---------------------------------------------------

    def _connection_families(self, cluster: str) -> Iterator[Metric]:
        """Pulsar's connection gauges (counts since the broker started), labels ``cluster``,
        ``broker`` and ``metric="broker_connection"``."""
        counts = self._connections
        labels = [cluster, self._broker.info.broker_id, "broker_connection"]
        for name, documentation, value in (
            (
                "pulsar_active_connections",
                "Client connections open",
                counts.created - counts.closed,
            ),
            ("pulsar_connection_created_total_count", "Connections accepted", counts.created),
            (
                "pulsar_connection_create_success_count",
                "Connections whose CONNECT was accepted",
                counts.succeeded,
            ),
            (
                "pulsar_connection_create_fail_count",
                "Connections whose CONNECT was refused",
                counts.failed,
            ),
            ("pulsar_connection_closed_total_count", "Connections closed", counts.closed),
        ):
            family = GaugeMetricFamily(name, documentation, labels=["cluster", "broker", "metric"])
            family.add_metric(labels, value)
            yield family

    def _lookup_families(self, cluster: str) -> Iterator[Metric]:
        """Pulsar's lookup metrics: ``pulsar_broker_lookup`` (a summary of lookup times in
        ms, binary and HTTP, quantiles of the last 1024), answers, redirects, failures and
        pending, and the topics being loaded."""
        counts = self._lookups
        summary = Metric("pulsar_broker_lookup", "Time to answer a LOOKUP (ms)", "summary")
        for q in LOOKUP_QUANTILES:
            summary.add_sample(
                "pulsar_broker_lookup",
                {"cluster": cluster, "quantile": repr(q)},
                counts.quantile(q),
            )
        summary.add_sample("pulsar_broker_lookup_count", {"cluster": cluster}, counts.count)
        summary.add_sample("pulsar_broker_lookup_sum", {"cluster": cluster}, counts.sum_ms)
        yield summary
        for name, documentation, value in (
            ("pulsar_broker_lookup_answers", "LOOKUPs answered by this broker", counts.answers),
            (
                "pulsar_broker_lookup_redirects",
                "LOOKUPs redirected to another broker",
                counts.redirects,
            ),
            ("pulsar_broker_lookup_failures", "LOOKUPs that failed", counts.failures),
        ):
            family = CounterMetricFamily(name, documentation, labels=["cluster"])
            family.add_metric([cluster], value)
            yield family
        pending = GaugeMetricFamily(
            "pulsar_broker_lookup_pending_requests", "LOOKUPs in progress", labels=["cluster"]
        )
        pending.add_metric([cluster], counts.pending)
        yield pending
        loads = GaugeMetricFamily(
            "pulsar_broker_topic_load_pending_requests",
            "Topics being loaded",
            labels=["cluster"],
        )
        loads.add_metric([cluster], self._broker.topic_loads_pending)
        yield loads

    def _usage_families(self, cluster: str) -> Iterator[Metric]:
        """Pulsar's ``pulsar_lb_*_usage`` (percent), as of this broker's last load report."""
        usage = self._broker.resource_usage
        labels = [cluster, self._broker.info.broker_id, "loadBalancing"]
        for name, documentation, value in (
            ("pulsar_lb_cpu_usage", "CPU used, in percent of the CPUs allowed", usage.cpu),
            ("pulsar_lb_memory_usage", "Memory used, in percent of the limit", usage.memory),
            (
                "pulsar_lb_bandwidth_in_usage",
                "Bytes in, in percent of the NIC speed",
                usage.bandwidth_in,
            ),
            (
                "pulsar_lb_bandwidth_out_usage",
                "Bytes out, in percent of the NIC speed",
                usage.bandwidth_out,
            ),
        ):
            family = GaugeMetricFamily(name, documentation, labels=["cluster", "broker", "metric"])
            family.add_metric(labels, value)
            yield family

    # -- geo-replication ------------------------------------------------------------------------

    def _replication_families(self, cluster: str, topics: list[CountedTopic]) -> Iterator[Metric]:
        """Pulsar's ``pulsar_replication_*`` per remote cluster (``remote_cluster``), by topic
        when topic-level metrics are on, else summed per namespace."""
        labels = [*(_TOPIC_LABELS if self.topic_level else _NS_LABELS), "remote_cluster"]
        families = [
            GaugeMetricFamily(name, documentation, labels=labels)
            for name, documentation in REPLICATION_FAMILIES
        ]
        sums: dict[tuple[str, ...], list[float]] = {}
        for topic in topics:
            for remote, replicator in sorted(getattr(topic, "replicators", {}).items()):
                stats = replicator.stats()
                key: tuple[str, ...] = (cluster, topic.name.namespace_name)
                if self.topic_level:
                    key = (*key, str(topic.name))
                row = sums.setdefault((*key, remote), [0.0] * len(REPLICATION_FAMILIES))
                row[0] += stats["replicationBacklog"]
                row[1] += 1 if stats["connected"] else 0
                row[2] += stats["msgRateOut"]
                row[3] += stats["msgThroughputOut"]
                row[4] = max(row[4], stats["replicationDelayInSeconds"])
        for key, row in sorted(sums.items()):
            for family, value in zip(families, row, strict=True):
                family.add_metric(list(key), value)
        yield from families
        pending = GaugeMetricFamily(
            "pulsar_replicated_subscriptions_pending_snapshots",
            "Snapshots of replicated subscriptions started and not complete yet",
            labels=["cluster"],
        )
        controllers = [getattr(t, "replicated_subscriptions", None) for t in topics]
        pending.add_metric([cluster], sum(len(c.pending) for c in controllers if c is not None))
        yield pending

    # -- bundles and the load manager ------------------------------------------------------------

    def _bundle_families(
        self, cluster: str, topics: list[CountedTopic], values: dict[int, list[float]]
    ) -> Iterator[Metric]:
        broker = self._broker
        me = broker.info.broker_id
        owned = sorted(broker.ownership.owned()) if broker.ownership is not None else []
        owned_gauge = GaugeMetricFamily(
            "magnetar_broker_owned_bundles",
            "Namespace bundles this broker owns (holds the ownership key of)",
            labels=["cluster", "broker"],
        )
        owned_gauge.add_metric([cluster, me], len(owned))
        yield owned_gauge
        # rate in, rate out, throughput in, throughput out, topics, producers, consumers
        per_bundle: dict[tuple[str, BundleRange], list[float]] = {b: [0.0] * 7 for b in owned}
        by_namespace: dict[str, list[BundleRange]] = {}
        for namespace, bundle in owned:
            by_namespace.setdefault(namespace, []).append(bundle)
        for topic in topics:
            ranges = by_namespace.get(topic.name.namespace_name, ())
            h = topic_hash(str(topic.name))
            bundle = next((b for b in ranges if b.contains(h)), None)
            if bundle is None:
                continue
            v = values[id(topic)]
            sums = per_bundle[(topic.name.namespace_name, bundle)]
            for i, x in enumerate((v[3], v[4], v[5], v[6], 1, v[1], v[2])):
                sums[i] += x
        families = [
            GaugeMetricFamily(name, documentation, labels=["cluster", "broker", "bundle"])
            for name, documentation in BUNDLE_FAMILIES
        ]
        for (namespace, bundle), sums in per_bundle.items():
            for family, x in zip(families, sums, strict=True):
                family.add_metric([cluster, me, f"{namespace}/{bundle}"], x)
        yield from families

    def _authentication_families(self, cluster: str) -> Iterator[Metric]:
        """Pulsar's authentication counters: accepted and refused credentials per provider
        and method (never anything of the credentials themselves)."""
        service = self._broker.authentication
        for name, documentation, counts in (
            (
                "pulsar_authentication_success",
                "Credentials accepted, per provider and method",
                service.successes,
            ),
            (
                "pulsar_authentication_failures",
                "Credentials refused, per provider and method",
                service.refusals,
            ),
        ):
            family = CounterMetricFamily(
                name, documentation, labels=["cluster", "provider_name", "auth_method"]
            )
            for (provider, method), count in sorted(counts.items()):
                family.add_metric([cluster, provider, method], count)
            yield family

    def _load_manager_families(self, cluster: str) -> Iterator[Metric]:
        broker = self._broker
        manager = broker.load_manager
        leader = GaugeMetricFamily(
            "magnetar_load_manager_leader",
            "1 while this broker is the elected load manager leader, else 0",
            labels=["cluster", "broker"],
        )
        leader.add_metric(
            [cluster, broker.info.broker_id],
            1 if manager is not None and manager.is_leader else 0,
        )
        yield leader
        unloading = ["cluster", "metric"]
        counts = (
            (manager.bundles_unloaded, manager.brokers_unloaded, manager.bundles_split)
            if manager is not None
            else (0, 0, 0)
        )
        for name, documentation, metric, value in (
            (
                "pulsar_lb_unload_bundle",
                "Bundles this broker unloaded by shedding while leader",
                "bundleUnloading",
                counts[0],
            ),
            (
                "pulsar_lb_unload_broker",
                "Brokers this broker shed bundles from, per shedding round, while leader",
                "bundleUnloading",
                counts[1],
            ),
            (
                "pulsar_lb_bundles_split",
                "Bundles this broker split while leader",
                "bundlesSplit",
                counts[2],
            ),
        ):
            family = CounterMetricFamily(name, documentation, labels=unloading)
            family.add_metric([cluster, metric], value)
            yield family


_NS_LABELS = ["cluster", "namespace"]
REPLICATION_FAMILIES = [
    ("pulsar_replication_backlog", "Entries not yet acknowledged by the remote cluster"),
    ("pulsar_replication_connected_count", "Replicators connected to the remote cluster"),
    ("pulsar_replication_rate_out", "Messages per second sent to the remote cluster"),
    ("pulsar_replication_throughput_out", "Bytes per second sent to the remote cluster"),
    (
        "pulsar_replication_delay_in_seconds",
        "Age of the oldest message not yet acknowledged by the remote cluster",
    ),
]
_TOPIC_LABELS = ["cluster", "namespace", "topic"]
_SUBSCRIPTION_LABELS = ["cluster", "namespace", "topic", "subscription"]


def _family(
    name: str, documentation: str, is_counter: bool, labels: list[str]
) -> GaugeMetricFamily | CounterMetricFamily:
    if is_counter:
        return CounterMetricFamily(name, documentation, labels=labels)
    return GaugeMetricFamily(name, documentation, labels=labels)


@dataclass(slots=True, frozen=True)
class LedgerView:
    """One managed ledger as a scrape sees it: rates and growth of its counters over the last
    window (order of :meth:`ManagedLedgerStats.counters`, then adds failed, reads failed),
    and its buckets' growth (counts, then number, then sum)."""

    ml: StoredLedger
    rates: tuple[float, ...]
    deltas: tuple[int, ...]
    buckets: dict[str, tuple[int, ...]]


def _snapshot(buckets: Buckets) -> tuple[int, ...]:
    return (*buckets.snapshot(), int(buckets.sum))


def _quantiles(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """Pulsar's ``quantile`` labels of bucket ranges: ``0.0_0.5``, ``0.5_1.0``, ..."""
    edges = (0.0, *bounds)
    return tuple(f"{float(a)}_{float(b)}" for a, b in itertools.pairwise(edges))


LOOKUP_QUANTILES = (0.5, 0.99, 0.999, 1.0)

#: Per-namespace managed-ledger gauges: (name, help, value from one LedgerView).
ML_FAMILIES: tuple[tuple[str, str, Callable[[LedgerView], float]], ...] = (
    ("pulsar_ml_AddEntryBytesRate", "Bytes per second added", lambda v: v.rates[1]),
    (
        "pulsar_ml_AddEntryWithReplicasBytesRate",
        "Bytes per second added, times the write quorum",
        lambda v: v.rates[1] * v.ml.config.write_quorum,
    ),
    ("pulsar_ml_AddEntryMessagesRate", "Entries per second added", lambda v: v.rates[0]),
    ("pulsar_ml_AddEntrySucceed", "Adds acknowledged in the last window", lambda v: v.deltas[0]),
    ("pulsar_ml_AddEntryErrors", "Adds failed in the last window", lambda v: v.deltas[9]),
    ("pulsar_ml_ReadEntriesRate", "Entries per second read", lambda v: v.rates[2]),
    ("pulsar_ml_ReadEntriesBytesRate", "Bytes per second read", lambda v: v.rates[3]),
    (
        "pulsar_ml_ReadEntriesSucceeded",
        "Entries read in the last window",
        lambda v: v.deltas[2],
    ),
    ("pulsar_ml_ReadEntriesErrors", "Reads failed in the last window", lambda v: v.deltas[10]),
    (
        "pulsar_ml_MarkDeleteRate",
        "Acknowledgements per second moving cursors",
        lambda v: v.rates[8],
    ),
    (
        "pulsar_ml_NumberOfMessagesInBacklog",
        "Entries after the slowest cursor's mark-delete position",
        lambda v: _ledger_backlog(v.ml),
    ),
    (
        "pulsar_ml_StoredMessagesSize",
        "Bytes of the ledgers, times the write quorum",
        lambda v: v.ml.total_size * v.ml.config.write_quorum,
    ),
)

#: Per-namespace bucket gauges (label ``quantile``) and their ``_OVERFLOW``.
ML_BUCKET_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "pulsar_ml_AddEntryLatencyBuckets",
        "Adds of the last window by latency (ms), queueing included",
        "add",
        _quantiles(LATENCY_BOUNDS_MS),
    ),
    (
        "pulsar_ml_LedgerAddEntryLatencyBuckets",
        "Adds of the last window by latency at the bookies (ms)",
        "ledger_add",
        _quantiles(LATENCY_BOUNDS_MS),
    ),
    (
        "pulsar_ml_LedgerSwitchLatencyBuckets",
        "Ledger rollovers of the last window by latency (ms)",
        "switch",
        _quantiles(LATENCY_BOUNDS_MS),
    ),
    (
        "pulsar_ml_EntrySizeBuckets",
        "Adds of the last window by entry size (bytes)",
        "size",
        _quantiles(tuple(float(b) for b in ENTRY_SIZE_BOUNDS)),
    ),
)

_HISTOGRAM_HELP = {
    "pulsar_storage_write_latency": "Entries of the last window by add latency (ms; sum in µs)",
    "pulsar_entry_size": "Entries of the last window by size (bytes)",
}


def _ledger_backlog(ml: StoredLedger) -> int:
    slowest = ml.slowest_mark_delete()
    return 0 if slowest is None else ml.entries_after(slowest)


def _backlog_size(topic: StoredTopic | None) -> float:
    """Pulsar's estimated backlog size: the entries after the slowest subscription's
    mark-delete position at the ledger's average entry size (bytes, one copy)."""
    if topic is None:
        return 0.0
    ml = topic.ml
    entries = ml.number_of_entries
    if entries <= 0:
        return 0.0
    return _ledger_backlog(ml) * ml.total_size / entries


def _backlog(topic: StoredTopic | None) -> int:
    """A topic's backlog as Pulsar sums it: over all its subscriptions (0 when nothing is
    stored)."""
    if topic is None:
        return 0
    return sum(s.cursor.backlog for s in topic.subscriptions.values())
