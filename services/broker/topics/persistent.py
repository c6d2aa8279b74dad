"""A persistent topic: its managed ledger, its producers and its subscriptions."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable

from magnetar.broker.errors import (
    ProducerHeldByQuotaError,
    ProducerRefusedByQuotaError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    TopicBusyError,
    TopicTerminatedError,
    TopicUnloadingError,
)
from magnetar.broker.ledger.compactor import COMPACTION_CURSOR
from magnetar.broker.ledger.cursor import ManagedCursor, NonDurableCursor
from magnetar.broker.ledger.managed_ledger import ManagedLedger, StoredListener
from magnetar.broker.model.entry import entry_metadata, is_marker_entry, message_count
from magnetar.broker.model.message_id import LATEST, from_wire, to_wire
from magnetar.broker.model.position import Position
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import (
    PRODUCER_QUOTA_POLICIES,
    BacklogQuota,
    Policies,
    TopicLimits,
)
from magnetar.broker.topics.backlog import estimated_backlog_size
from magnetar.broker.topics.compaction import ReadCompactedNotAllowedError, TopicCompaction
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.deduplication import Deduplication, DuplicateStatus
from magnetar.broker.topics.dispatch_limits import DispatchLimits
from magnetar.broker.topics.dispatch_rate import DispatchRate, RateLimiter
from magnetar.broker.topics.instruments import UNCOUNTED, TopicInstruments
from magnetar.broker.topics.limits import check_consumers, dispatch_limits
from magnetar.broker.topics.producers import ProducerSet
from magnetar.broker.topics.publish_rate import PublishThrottle
from magnetar.broker.topics.replicated_subscriptions import ReplicatedSubscriptionsController
from magnetar.broker.topics.replicator import (
    REPLICATOR_PREFIX,
    ReplicationContext,
    Replicator,
    is_replicator_cursor,
)
from magnetar.broker.topics.stats import TopicRates, internal_stats, persistent_stats
from magnetar.broker.topics.subscription import (
    Subscription,
    SubscriptionExistsError,
    disconnect_for_delete,
    first_published_at,
    first_unacked,
)
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.tasks import spawn_logged

log = logging.getLogger(__name__)


#: Managed-ledger property holding the topic epoch (exclusive producer generations).
TOPIC_EPOCH_PROPERTY = "topic-epoch"

MAX_KNOWN_MARKERS = 10_000

#: Managed-ledger property ``<prefix><subscription>`` present for each replicated subscription
#: (Pulsar keeps the flag in the cursor's properties as ``pulsar.replicated.subscription``).
REPLICATED_SUBSCRIPTION_PREFIX = "pulsar.replicated.subscription/"


class DuplicateInFlightError(Exception):
    """Deduplication cannot tell yet whether a resent message is a duplicate: its first copy
    is still being stored (Pulsar's MessageDupUnknown). The client sends it again."""


class PersistentTopic:
    """A persistent topic. Every durable cursor of its managed ledger is a subscription from
    the moment the topic loads, consumers or not (Pulsar's PersistentTopic makes one per
    cursor it recovers): listed, in stats, in metrics, expired by TTL and removable. Pulsar
    leaves out its internal cursors (deduplication's, replicators'); so does Magnetar: its
    deduplication state lives in the managed ledger's properties, readers' cursors are never
    stored, and replicators' cursors (``pulsar.repl.<remote>``) belong to ``replicators``."""

    def __init__(
        self,
        name: TopicName,
        ml: ManagedLedger,
        limits: DispatchLimits | None = None,
        metrics: TopicInstruments = UNCOUNTED,
    ) -> None:
        self.name = name
        self.ml = ml
        ml.on_added = self._entry_added
        self._wake_due = False  # a _wake_dispatchers is scheduled
        self.limits = limits or DispatchLimits()
        self.metrics = metrics
        self.subscriptions: dict[str, Subscription] = {
            name: Subscription(self, name, cursor, None, self.limits)
            for name, cursor in ml.cursors.items()
            if not is_replicator_cursor(name)
        }
        for subscription in self.subscriptions.values():
            subscription.replicated = REPLICATED_SUBSCRIPTION_PREFIX + subscription.name in (
                ml.properties
            )
        #: One per remote cluster of the namespace's replication list (``apply_replication``).
        self.replicators: dict[str, Replicator] = {}
        #: Set while the topic replicates (``apply_replication``): answers the remotes'
        #: snapshot markers and, with a replicated subscription, takes snapshots.
        self.replicated_subscriptions: ReplicatedSubscriptionsController | None = None
        #: When a data message (not a marker) was last stored (monotonic; 0: not since loaded).
        self.last_data_at = 0.0
        #: Markers stored since the topic loaded (the latest ``MAX_KNOWN_MARKERS``): a
        #: subscription created (or reset) before them acknowledges them at once, so markers
        #: never show in a backlog.
        self.known_markers: list[Position] = []
        self.producers = ProducerSet()
        self.producers.topic_epoch = int(ml.properties.get(TOPIC_EPOCH_PROPERTY, "0"))
        self.loaded_at = time.monotonic()
        #: When a message was last published or a client last seen (inactive-topic deletion).
        self.last_active = self.loaded_at
        #: Plain counters since the topic was loaded (metrics and load reports take rates from
        #: their deltas): entries and bytes stored, messages stored (a batch counts each of its
        #: messages), messages and bytes dispatched to consumers (redeliveries included).
        self.msg_in = 0
        self.bytes_in = 0
        self.messages_in = 0
        self.msg_out = 0
        self.bytes_out = 0
        self.deduplication: Deduplication | None = None  # set by the broker when enabled
        self.rates = TopicRates()
        self.base_limits = self.limits
        self.publish_throttle = PublishThrottle()
        self.client_limits = TopicLimits()
        #: The namespace's (or topic's) dispatch rates: the topic's limiter, shared by its
        #: subscriptions, and the rate each subscription gets a limiter of its own for.
        self.dispatch_limiter: RateLimiter | None = None
        self.subscription_dispatch_rate: DispatchRate | None = None
        self._subscribe_lock = asyncio.Lock()
        #: The backlog quota in force (None: none), and whether the oldest unacknowledged
        #: message was over its age limit at the last policy round.
        self.backlog_quota: BacklogQuota | None = None
        #: Idle subscriptions older than this are deleted (0: never), from the policies.
        self.subscription_expiration_s = 0.0
        self._age_quota_exceeded = False
        self.compaction = TopicCompaction(self)
        #: Unloading: new sends are refused while those in flight get their receipts.
        self.unloading = False
        self._last_publish: asyncio.Future[Position] | None = None

    def publish(
        self,
        stored: bytes,
        producer_name: str = "",
        sequence_id: int = -1,
        highest: int = -1,
        messages: int | None = None,
        *,
        marker: bool = False,
        deduplicate: bool = True,
        on_stored: Callable[[asyncio.Future[Position | None]], None] | None = None,
    ) -> asyncio.Future[Position | None]:
        """Append one entry (a producer's payload section); resolves once it is durable, to
        None for a duplicate that deduplication dropped. ``messages``: the entry's messages when
        the caller knows them (SEND's ``num_messages``); else they are read from its metadata.
        ``marker``: a marker (written here, or one a remote's replicator sent): not
        deduplicated, not counted, acknowledged for every subscription once stored.
        ``deduplicate`` False (a chunk before its message's last): stored without a look at
        deduplication, and not recorded there.
        ``on_stored`` is called with the future once it is done (with no wait for a turn of the
        event loop when the entry was stored: ``ManagedLedger.add_entry_async``)."""
        if self.unloading:
            refused: asyncio.Future[Position | None] = asyncio.get_running_loop().create_future()
            if on_stored is not None:
                refused.add_done_callback(on_stored)
            refused.set_exception(TopicUnloadingError(f"topic {self.name} is being unloaded"))
            return refused
        if marker:
            stored_marker = self._publish_marker(stored, None)
            if on_stored is not None:
                stored_marker.add_done_callback(on_stored)
            return stored_marker
        dedup = self.deduplication if deduplicate else None
        if dedup is not None:
            status = dedup.check(producer_name, sequence_id, highest)
            if status is not DuplicateStatus.NEW:
                done: asyncio.Future[Position | None] = asyncio.get_running_loop().create_future()
                if on_stored is not None:
                    done.add_done_callback(on_stored)
                if status is DuplicateStatus.DUPLICATE:
                    done.set_result(None)
                else:
                    done.set_exception(
                        DuplicateInFlightError(
                            f"topic {self.name}: message {sequence_id} of {producer_name} is "
                            "still being stored; send it again"
                        )
                    )
                return done
        future = self.ml.add_entry_async(stored, on_stored)  # type: ignore[arg-type]
        self._last_publish = future
        self.last_active = self.last_data_at = time.monotonic()
        self.msg_in += 1
        self.bytes_in += len(stored)
        count = message_count(stored) if messages is None else messages
        self.messages_in += count
        self.producers.count(producer_name, count, len(stored))
        if dedup is not None:
            last = max(sequence_id, highest)
            future.add_done_callback(lambda f: self._persisted(f, producer_name, last))
        return future  # type: ignore[return-value]

    def takes_runs(self) -> bool:
        """Whether a producer's SENDs may come as runs (``publish_run``) now: not while
        deduplication looks at every entry, a publish rate is checked after each SEND (so that
        reading stops at the one that went over), or the topic unloads."""
        return (
            not self.unloading
            and self.deduplication is None
            and self.publish_throttle.limiter is None
        )

    def publish_run(
        self,
        producer_name: str,
        run: list[tuple[bytes, StoredListener]],
        messages: int,
        size: int,
    ) -> None:
        """``publish`` of one producer's plain entries (not markers, not chunks) that arrived
        together, in their order, ``(stored, on_stored)`` each, counted once: ``messages`` and
        ``size`` in all. Only while the topic ``takes_runs`` (the caller asked in the same turn
        of the event loop, so nothing changed it since)."""
        self._last_publish = self.ml.add_run_async(run)  # type: ignore[arg-type]
        self.last_active = self.last_data_at = time.monotonic()
        self.msg_in += len(run)
        self.bytes_in += size
        self.messages_in += messages
        self.producers.count(producer_name, messages, size)

    @property
    def terminated(self) -> bool:
        return self.ml.terminated_at is not None

    async def terminate(self) -> Position:
        """Pulsar's terminate: the topic takes no more messages, ever (kept in its managed
        ledger's record, so it holds on any owner after a restart or a move). Its producers are
        closed (they reconnect and are refused with TopicTerminatedError); each subscription's
        consumers are told they reached the end once they acknowledged everything. Returns the
        last message's position."""
        last = await self.ml.terminate()
        self.producers.close_all()
        for subscription in self.subscriptions.values():
            subscription.dispatcher.wake()
        log.info("topic %s terminated at %s", self.name, last)
        return last

    def admit_producer(self) -> None:
        """Raise why a new producer may not attach now: the topic is terminated, or its backlog
        is over a quota whose policy holds producers back (Pulsar's checks before a producer is
        added)."""
        if self.terminated:
            raise TopicTerminatedError(f"Topic {self.name} was already terminated")
        quota = self.backlog_quota
        if quota is not None and quota.policy in PRODUCER_QUOTA_POLICIES:
            if self.backlog_quota_exceeded(quota):
                refusal = (
                    ProducerHeldByQuotaError
                    if quota.policy == "producer_request_hold"
                    else ProducerRefusedByQuotaError
                )
                raise refusal(
                    f"Cannot create producer on topic {self.name} with backlog quota exceeded "
                    f"({quota.policy})"
                )

    def _quota_cursors(self) -> list[ManagedCursor]:
        """The durable cursors a backlog quota counts (``topics/backlog.py``): durable
        subscriptions' and geo-replicators'."""
        cursors = [s.cursor for s in self.subscriptions.values() if s.durable]
        cursors += [r.cursor for r in self.replicators.values() if r.cursor is not None]
        return cursors

    def backlog_size(self) -> int:
        """Pulsar's estimated backlog size, what a size quota is compared with and stats call
        ``backlogSize``: the slowest durable cursor's backlog (a subscription's or a
        geo-replicator's) in bytes, at the topic's average entry size."""
        return estimated_backlog_size(
            (c.backlog for c in self._quota_cursors()),
            self.ml.total_size,
            self.ml.number_of_entries,
        )

    def backlog_quota_exceeded(self, quota: BacklogQuota) -> bool:
        """Over the size limit now, or over the age limit at the last policy round."""
        if quota.limit_size >= 0 and self.backlog_size() > quota.limit_size:
            return True
        return quota.limit_time >= 0 and self._age_quota_exceeded

    async def _oldest_unacked_older_than(self, seconds: int) -> bool:
        """Whether a durable cursor's (a subscription's or a geo-replicator's) oldest
        unacknowledged message was published more than ``seconds`` ago (one entry read per
        cursor that has a backlog)."""
        cutoff_ms = int(time.time() * 1000) - seconds * 1000
        for cursor in self._quota_cursors():
            if cursor.backlog == 0:
                continue
            position = first_unacked(cursor)
            if position is None:
                continue
            entries = await self.ml.read_entries(position, 1)
            if entries and entry_metadata(entries[0][1]).publish_time < cutoff_ms:
                return True
        return False

    async def enforce_producer_quota(self, quota: BacklogQuota) -> None:
        """Pulsar's producer_request_hold and producer_exception: while the backlog is over the
        quota, the producers are disconnected (they reconnect and are refused until the
        subscriptions drain under it)."""
        self._age_quota_exceeded = quota.limit_time >= 0 and (
            await self._oldest_unacked_older_than(quota.limit_time)
        )
        if len(self.producers) and self.backlog_quota_exceeded(quota):
            log.info(
                "topic %s: backlog over its quota (%s): disconnecting %d producer(s)",
                self.name,
                quota,
                len(self.producers),
            )
            self.producers.close_all()

    def write_marker(
        self, stored: bytes, on_stored: Callable[[Position], None] | None = None
    ) -> None:
        """Store a marker of our own; ``on_stored`` runs with its position before the
        subscriptions acknowledge it."""
        self._publish_marker(stored, on_stored)

    def _publish_marker(
        self, stored: bytes, on_stored: Callable[[Position], None] | None
    ) -> asyncio.Future[Position | None]:
        if self.unloading:
            refused: asyncio.Future[Position | None] = asyncio.get_running_loop().create_future()
            refused.set_exception(TopicUnloadingError(f"topic {self.name} is being unloaded"))
            return refused
        future = self.ml.add_entry_async(stored)
        self._last_publish = future
        future.add_done_callback(lambda f: self._marker_stored(f, on_stored))
        return future  # type: ignore[return-value]

    def _marker_stored(
        self, future: asyncio.Future[Position], on_stored: Callable[[Position], None] | None
    ) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            log.info("topic %s: a marker was not stored: %s", self.name, error)
            return
        position = future.result()
        self.known_markers.append(position)
        if len(self.known_markers) > MAX_KNOWN_MARKERS:
            del self.known_markers[: MAX_KNOWN_MARKERS // 2]
        if on_stored is not None:
            on_stored(position)
        for subscription in list(self.subscriptions.values()):
            subscription.ack_markers([position])

    def ack_known_markers(self, subscription: Subscription) -> None:
        """A new (or reset) subscription acknowledges the markers after its position."""
        start = subscription.cursor.mark_delete_position
        after = self.known_markers[bisect.bisect_right(self.known_markers, start) :]
        if after:
            subscription.ack_markers(after)

    def _persisted(
        self, future: asyncio.Future[Position], producer_name: str, sequence_id: int
    ) -> None:
        if future.cancelled() or self.deduplication is None:
            return
        if future.exception() is not None:
            self.deduplication.failed(producer_name)
            return
        if self.deduplication.persisted_up_to(producer_name, sequence_id):
            spawn_logged(
                self.deduplication.snapshot(), log, f"topic {self.name}: deduplication snapshot"
            )

    def _entry_added(self) -> None:
        """A new entry is stored. The adds a bookie acknowledged together complete in one
        turn: the dispatchers are woken once, after them."""
        if not self._wake_due:
            self._wake_due = True
            asyncio.get_running_loop().call_soon(self._wake_dispatchers)

    def _wake_dispatchers(self) -> None:
        """Every subscription (and replicator) may have something to send."""
        self._wake_due = False
        for subscription in self.subscriptions.values():
            subscription.dispatcher.wake()
        for replicator in self.replicators.values():
            replicator.wake()

    async def apply_replication(
        self, clusters: tuple[str, ...], context: ReplicationContext
    ) -> None:
        """One replicator per cluster of the replication list other than the local one;
        those of clusters no longer listed stop and drop their cursors."""
        wanted = (
            {c for c in clusters if c != context.local_cluster} if self.name.persistent else set()
        )
        if self.unloading:
            return
        for remote in list(self.replicators):
            if remote not in wanted:
                await self.replicators.pop(remote).remove()
                log.info("topic %s: replication to %s stopped", self.name, remote)
        if self.unloading:
            return  # it began unloading meanwhile: start nothing on a topic being closed
        for remote in sorted(wanted - set(self.replicators)):
            replicator = Replicator(self, remote, context)
            self.replicators[remote] = replicator
            replicator.start()
            log.info("topic %s: replicating to cluster %s", self.name, remote)
        if wanted and self.replicated_subscriptions is None:
            self.replicated_subscriptions = ReplicatedSubscriptionsController(
                self, context.local_cluster, context.replicated_subscriptions
            )
        elif not wanted and self.replicated_subscriptions is not None:
            await self.replicated_subscriptions.stop_snapshots()
            self.replicated_subscriptions = None
        self._check_snapshots()

    def _check_snapshots(self) -> None:
        """Snapshots are taken while the topic replicates and has a replicated subscription
        (Pulsar writes no marker otherwise)."""
        controller = self.replicated_subscriptions
        if controller is None:
            return
        wanted = bool(self.replicators) and any(s.replicated for s in self.subscriptions.values())
        if wanted and not controller.snapshotting:
            controller.start_snapshots()
        elif not wanted and controller.snapshotting:
            spawn_logged(controller.stop_snapshots(), log, f"{controller}: stopping")

    async def stop_replicators(self) -> None:
        if self.replicated_subscriptions is not None:
            await self.replicated_subscriptions.stop_snapshots()
            self.replicated_subscriptions = None
        for replicator in list(self.replicators.values()):
            await replicator.stop()
        self.replicators.clear()

    async def received_marker(
        self, position: Position, metadata: pb.MessageMetadata, payload: bytes
    ) -> None:
        """A marker a remote cluster wrote, read here by our replicator to that cluster."""
        if self.replicated_subscriptions is not None:
            await self.replicated_subscriptions.received_marker(position, metadata, payload)

    async def set_replicated(self, subscription: Subscription, enabled: bool) -> None:
        """Make a durable subscription replicated or not (admin ``replicatedSubscriptionStatus``
        and consumers' ``replicate_subscription_state``)."""
        key = REPLICATED_SUBSCRIPTION_PREFIX + subscription.name
        subscription.replicated = enabled
        if enabled and key not in self.ml.properties:
            await self.ml.set_property(key, "true")
        elif not enabled:
            subscription.snapshots = None
            if key in self.ml.properties:
                await self.ml.update_properties({key: None})
        log.info(
            "topic %s: subscription %s is %sreplicated",
            self.name,
            subscription.name,
            "" if enabled else "no longer ",
        )
        self._check_snapshots()

    async def follow_replicated_subscription(self, name: str, position: Position) -> None:
        """Another cluster's replicated subscription ``name`` moved: ours moves to
        ``position`` of this topic, created there if missing (and replicated either way)."""
        if not name or is_replicator_cursor(name):
            return
        async with self._subscribe_lock:
            subscription = self.subscriptions.get(name)
            if subscription is None:
                cursor = await self.ml.open_cursor(name, "latest")
                target = min(position, self.ml.last_confirmed_position)
                if target != cursor.mark_delete_position:
                    cursor.reset(self.ml.next_position(target))
                subscription = Subscription(self, name, cursor, None, self.limits)
                self.subscriptions[name] = subscription
                self.ack_known_markers(subscription)
                log.info(
                    "topic %s: subscription %s created at %s by a replicated subscription update",
                    self.name,
                    name,
                    target,
                )
            elif not subscription.durable:
                return
            else:
                subscription.follow(position)
            if not subscription.replicated:
                await self.set_replicated(subscription, True)

    async def subscribe(
        self,
        consumer: Consumer,
        name: str,
        sub_type: int,
        initial_position: int,
        start_message_id: pb.MessageIdData | None = None,
        read_compacted: bool = False,
        *,
        replicated: bool = False,
    ) -> Subscription:
        """Attach a consumer. ``start_message_id`` makes a non-durable subscription (a reader)
        starting at that message, or at the earliest/latest one for Pulsar's special ids.
        ``read_compacted``: the consumer reads the compacted view (exclusive and failover
        subscriptions only, as in Pulsar). ``replicated`` (the consumer's
        ``replicate_subscription_state``) makes a durable subscription replicated; a consumer
        without it leaves the subscription as it is."""
        if read_compacted and sub_type not in (
            pb.CommandSubscribe.Exclusive,
            pb.CommandSubscribe.Failover,
        ):
            raise ReadCompactedNotAllowedError(
                "readCompacted only allowed on failover or exclusive subscriptions"
            )
        async with self._subscribe_lock:
            check_consumers(self.client_limits, self.subscriptions, name)
            subscription = self.subscriptions.get(name)
            if subscription is None and start_message_id is not None:
                start = self.position_for(start_message_id, compacted=read_compacted)
                cursor = NonDurableCursor(self.ml, name, start)
                subscription = Subscription(self, name, cursor, sub_type, self.limits)
                subscription.durable = False
                self.subscriptions[name] = subscription
                self.ack_known_markers(subscription)
            elif subscription is None:
                initial = (
                    "earliest" if initial_position == pb.CommandSubscribe.Earliest else "latest"
                )
                cursor = await self.ml.open_cursor(name, initial)
                subscription = Subscription(self, name, cursor, sub_type, self.limits)
                self.subscriptions[name] = subscription
                self.ack_known_markers(subscription)
            if subscription.cursor.read_compacted != read_compacted:
                subscription.cursor.read_compacted = read_compacted
                if not subscription.consumers:
                    subscription.cursor.rewind()
            subscription.add_consumer(consumer, sub_type)
            if replicated and subscription.durable and not subscription.replicated:
                await self.set_replicated(subscription, True)
            return subscription

    def adopt_cursor(self, name: str) -> None:
        """A durable cursor the broker made itself (the compactor's) is a subscription too."""
        cursor = self.ml.cursors.get(name)
        if cursor is not None and name not in self.subscriptions:
            self.subscriptions[name] = Subscription(self, name, cursor, None, self.limits)

    def position_for(self, message_id: pb.MessageIdData, *, compacted: bool = False) -> Position:
        """Where a message id points: Pulsar's earliest/latest ids mean the first entry and the
        end of the log; any other id at most as early as the first entry still stored. For a
        reader of the compacted view, the compacted ledger's entries count as stored."""
        position = from_wire(message_id)
        view = self.ml.compacted if compacted else None
        if position.ledger_id < 0:  # MessageId.earliest
            return Position(-1, 0) if view is not None else self.ml.first_position
        if position.ledger_id >= LATEST.ledger_id:  # MessageId.latest
            return self.ml.next_position(self.ml.last_confirmed_position)
        if view is not None and position <= view.horizon:
            return position
        return max(position, self.ml.first_position)

    async def last_message_id(self, *, compacted: bool = False) -> pb.MessageIdData:
        """The last stored message (for GET_LAST_MESSAGE_ID); entry -1 when there is none. For
        a batch, the id of its last message, as Pulsar answers: a reader that has read part of
        the last batch still sees messages available. For a reader of the compacted view with
        nothing after the horizon, the compacted ledger's last message: a key deleted last is
        not a message that reader will ever get. Markers are never delivered, so the last
        entry that is not one counts (Pulsar's getLastDispatchablePosition), else a reader
        would wait for a marker forever."""
        last = self.ml.last_confirmed_position
        view = self.ml.compacted if compacted else None
        found: tuple[Position, bytes] | None = None
        if view is not None and last <= view.horizon:
            found = await view.last()
            if found is None:
                return to_wire(Position(last.ledger_id, -1), self.name.partition_index)
        else:
            at: Position | None = last
            while at is not None and at.entry_id >= 0:
                entries = await self.ml.read_entries(at, 1)
                if not entries or entries[0][0] != at:
                    break
                if not is_marker_entry(entries[0][1]):
                    found = entries[0]
                    break
                at = self.ml.previous_position(at)
            if at is None:  # only markers: before the first entry
                first = self.ml.first_position
                last = Position(first.ledger_id, first.entry_id - 1)
            elif found is None:
                last = at
        batch_index = -1
        if found is not None:
            last = found[0]
            metadata = entry_metadata(found[1])
            count = message_count(metadata)
            if count > 1 or codec.is_batch(metadata):
                batch_index = count - 1
        return to_wire(last, self.name.partition_index, batch_index)

    def remove_subscription_later(self, subscription: Subscription, delay_s: float) -> None:
        """Remove a reader's subscription after ``delay_s`` if no reader attached again."""

        def remove() -> None:
            spawn_logged(
                self.remove_subscription_if_unused(subscription),
                log,
                f"topic {self.name}: removing {subscription}",
            )

        asyncio.get_running_loop().call_later(delay_s, remove)

    async def remove_subscription_if_unused(self, subscription: Subscription) -> None:
        """Readers' subscriptions go away with their last consumer."""
        if not subscription.durable and not subscription.dispatcher.consumers:
            if self.subscriptions.get(subscription.name) is subscription:
                del self.subscriptions[subscription.name]
            await subscription.close()

    def stats(self) -> dict[str, object]:
        """Topic stats in the shape of Pulsar's ``TopicStats`` (``stats.persistent_stats``)."""
        stats = persistent_stats(self, self.rates)
        replication = {r: rep.stats() for r, rep in sorted(self.replicators.items())}
        # What comes in from each remote: its replicator's producer here (Pulsar's rule: shown
        # on the remote's entry, when this topic replicates to it too).
        for publisher in stats["publishers"]:  # type: ignore[attr-defined]
            name = publisher.get("producerName") or ""
            entry = replication.get(name.removeprefix(REPLICATOR_PREFIX))
            if name.startswith(REPLICATOR_PREFIX) and entry is not None:
                entry["msgRateIn"] = publisher.get("msgRateIn", 0.0)
                entry["msgThroughputIn"] = publisher.get("msgThroughputIn", 0.0)
                entry["inboundConnection"] = publisher.get("address")
                entry["inboundConnectedSince"] = publisher.get("connectedSince")
        stats["replication"] = replication
        return stats

    def internal_stats(self) -> dict[str, object]:
        """Storage view in the shape of Pulsar's PersistentTopicInternalStats
        (``stats.internal_stats``)."""
        return internal_stats(self)

    async def stop_publishing(self) -> None:
        """Refuse new sends and wait until those in flight are stored (or failed), so every
        receipt leaves before the producers are told to go. Adds complete in order, so the
        last one is enough to wait for."""
        self.unloading = True
        if self._last_publish is not None:
            await asyncio.gather(self._last_publish, return_exceptions=True)

    async def store_epoch(self, epoch: int) -> None:
        """Keep the topic epoch with the managed ledger, so it survives a move: a producer
        fenced here stays fenced on the next owner."""
        if int(self.ml.properties.get(TOPIC_EPOCH_PROPERTY, "0")) < epoch:
            await self.ml.set_property(TOPIC_EPOCH_PROPERTY, str(epoch))

    def disconnect_clients(self, assigned_url: str | None = None) -> None:
        """Unloading: every producer and consumer is told to go (CLOSE_PRODUCER /
        CLOSE_CONSUMER); the clients look the topic up again and reconnect to its owner
        (the broker at ``assigned_url`` when the topic is handed over)."""
        self.producers.close_all(assigned_url)
        for subscription in self.subscriptions.values():
            for consumer in list(subscription.consumers):
                consumer.connection.close_consumer(subscription, consumer, assigned_url)

    async def delete(self, *, force: bool) -> None:
        busy = len(self.producers) + sum(
            len(s.dispatcher.consumers) for s in self.subscriptions.values()
        )
        if busy and not force:
            raise TopicBusyError(
                f"topic {self.name} has {busy} producer(s)/consumer(s); use force=true"
            )
        self.producers.close_all()
        await self.stop_replicators()
        await self.compaction.stop()
        for subscription in self.subscriptions.values():
            for consumer in list(subscription.dispatcher.consumers):
                consumer.connection.close()
            await subscription.close()
        await self.ml.delete()

    def apply_limits(self, limits: TopicLimits) -> None:
        """The namespace's limits on producers, consumers and unacked messages (at load and
        whenever policies change); consumers attached before keep their unacked bound."""
        self.client_limits = limits
        self.producers.max_producers = limits.max_producers_per_topic
        self.limits = dispatch_limits(self.base_limits, limits)
        for subscription in self.subscriptions.values():
            subscription.limits = self.limits

    def publish_rates(self) -> tuple[float, float]:
        """Messages and bytes published a second, over the last stats interval (for dispatch
        rates relative to the publish rate)."""
        rate_in, throughput_in, _, _ = self.rates.topic.rates(
            (self.messages_in, self.bytes_in, self.msg_out, self.bytes_out)
        )
        return rate_in, throughput_in

    def apply_dispatch_rates(self, policies: Policies) -> None:
        """The dispatch rates in force; a limiter is kept while its rate is unchanged."""
        rate = DispatchRate(*policies.dispatch_rate) if policies.dispatch_rate else None
        if rate is None:
            self.dispatch_limiter = None
        elif self.dispatch_limiter is None or self.dispatch_limiter.rate != rate:
            self.dispatch_limiter = RateLimiter(rate, publish_rates=self.publish_rates)
        per_subscription = policies.subscription_dispatch_rate
        self.subscription_dispatch_rate = (
            DispatchRate(*per_subscription) if per_subscription else None
        )
        for subscription in self.subscriptions.values():
            subscription.dispatcher.wake()

    def apply_settings(self, policies: Policies) -> None:
        """The policies that only set how the topic runs (when loaded, and in each round)."""
        self.apply_limits(policies.limits)
        self.apply_dispatch_rates(policies)
        self.backlog_quota = policies.backlog_quota
        self.compaction.threshold = policies.compaction_threshold
        self.publish_throttle.apply(policies.publish_rate)
        self.subscription_expiration_s = policies.subscription_expiration_minutes * 60

    async def apply_policies(self, policies: Policies) -> None:
        """Bring the topic in line with its namespace's policies (run periodically)."""
        self.apply_settings(policies)
        if policies.deduplication and self.deduplication is None:
            self.deduplication = await Deduplication.load(self.ml)
        elif not policies.deduplication:
            self.deduplication = None
        if policies.message_ttl_seconds > 0:
            cutoff_ms = int(time.time() * 1000) - policies.message_ttl_seconds * 1000
            for subscription in list(self.subscriptions.values()):
                if subscription.durable:
                    expired = await subscription.expire_before(cutoff_ms)
                    if expired:
                        log.info(
                            "topic %s: %d entries expired for subscription %s (TTL %d s)",
                            self.name,
                            expired,
                            subscription.name,
                            policies.message_ttl_seconds,
                        )
        if policies.backlog_quota is not None:
            if policies.backlog_quota.policy in PRODUCER_QUOTA_POLICIES:
                await self.enforce_producer_quota(policies.backlog_quota)
            else:
                await self.evict_backlog(policies.backlog_quota)
        retention = policies.retention
        await self.ml.trim_retained(retention.time_minutes, retention.size_mb)

    async def evict_backlog(self, quota: BacklogQuota) -> None:
        """Pulsar's consumer_backlog_eviction: a subscription over the quota loses its oldest
        messages, by age (``limit_time``) and then by size (``limit_size``, the backlog's bytes
        estimated at the topic's average entry size). The other policies act on producers
        (``enforce_producer_quota``)."""
        if quota.policy != "consumer_backlog_eviction":
            return
        entry_size = (
            self.ml.total_size / self.ml.number_of_entries if self.ml.number_of_entries else 0
        )
        for subscription in list(self.subscriptions.values()):
            if not subscription.durable:
                continue
            evicted = 0
            if quota.limit_time >= 0:
                cutoff_ms = int(time.time() * 1000) - quota.limit_time * 1000
                evicted += await subscription.expire_before(cutoff_ms)
            if quota.limit_size >= 0 and entry_size > 0:
                excess = subscription.cursor.backlog - int(quota.limit_size // entry_size)
                if excess > 0:
                    evicted += subscription.skip(excess)
            if evicted:
                log.info(
                    "topic %s: %d entries evicted from subscription %s (backlog quota %s)",
                    self.name,
                    evicted,
                    subscription.name,
                    quota,
                )

    async def expire_subscriptions(self, idle_seconds: float) -> None:
        """Pulsar's subscription expiration: a durable subscription with no consumer and no
        activity (a consumer coming or going, an acknowledgement) for ``idle_seconds`` is
        deleted. Replicated subscriptions and the compaction cursor are left alone, as Pulsar
        leaves them (replicators' cursors are not subscriptions here)."""
        now = time.monotonic()
        for subscription in list(self.subscriptions.values()):
            if (
                not subscription.durable
                or subscription.consumers
                or subscription.replicated
                or subscription.name == COMPACTION_CURSOR
                or now - subscription.last_active <= idle_seconds
            ):
                continue
            try:
                await self.delete_subscription(subscription.name, force=False)
            except (SubscriptionBusyError, SubscriptionNotFoundError):
                continue  # a consumer came, or it went, meanwhile
            log.info(
                "topic %s: subscription %s deleted: no consumer and no activity for %.0f s "
                "(subscription expiration)",
                self.name,
                subscription.name,
                now - subscription.last_active,
            )

    async def truncate(self) -> list[int]:
        """Admin ``truncate`` (Pulsar's): every subscription moves to the end of the topic and
        every closed ledger is deleted; the ledger being written stays. Returns the deleted
        ledgers' ids."""
        for subscription in list(self.subscriptions.values()):
            subscription.clear_backlog()
        deleted = await self.ml.trim(self.ml.next_position(self.ml.last_confirmed_position))
        log.info("topic %s truncated: ledgers %s deleted", self.name, deleted)
        return deleted

    def is_inactive(self, mode: str) -> bool:
        """No producer, no consumer, and (by Pulsar's InactiveTopicDeleteMode) no subscription
        or every subscription caught up."""
        if len(self.producers) or any(s.consumers for s in self.subscriptions.values()):
            return False
        if any(r.backlog for r in self.replicators.values()):
            return False  # not deleted before the remote clusters have everything
        if mode == "delete_when_no_subscriptions":
            return not self.subscriptions
        return all(s.cursor.backlog == 0 for s in self.subscriptions.values())

    async def create_subscription(self, name: str, start: pb.MessageIdData | None) -> None:
        """Admin ``PUT .../subscription/{name}``: a durable subscription with no consumer,
        starting at ``start`` (Pulsar's default: the latest message). Refused if it exists."""
        async with self._subscribe_lock:
            if name in self.subscriptions:
                raise SubscriptionExistsError(f"Subscription already exists for topic {self.name}")
            cursor = await self.ml.open_cursor(name, "latest")
            if start is not None:
                position = self.position_for(start)
                if position != self.ml.next_position(self.ml.last_confirmed_position):
                    cursor.reset(position)
            self.subscriptions[name] = Subscription(self, name, cursor, None, self.limits)
            self.ack_known_markers(self.subscriptions[name])
        log.info("topic %s: subscription %s created by the admin API", self.name, name)

    async def message_at(self, position: Position) -> tuple[Position, bytes] | None:
        """The stored entry at ``position``, if it exists."""
        if self.ml.first_at_or_after(position) != position:
            return None
        entries = await self.ml.read_entries(position, 1)
        return entries[0] if entries and entries[0][0] == position else None

    async def message_id_at(self, publish_time_ms: int) -> Position | None:
        """The first entry published at or after ``publish_time_ms`` (None: none is)."""
        found = await first_published_at(self.ml, publish_time_ms)
        return found if self.ml.first_at_or_after(found) == found else None

    async def unsubscribe(self, name: str) -> None:
        """Remove the subscription and its cursor (UNSUBSCRIBE from its last consumer)."""
        async with self._subscribe_lock:
            await self._remove_subscription(name)

    async def delete_subscription(self, name: str, *, force: bool) -> None:
        """Admin ``DELETE .../subscription/{name}``: refused while it has consumers unless
        ``force``, which disconnects them first (as Pulsar does)."""
        async with self._subscribe_lock:
            disconnect_for_delete(self.name, name, self.subscriptions.get(name), force=force)
            await self._remove_subscription(name)
        log.info("topic %s: subscription %s deleted", self.name, name)

    async def _remove_subscription(self, name: str) -> None:
        subscription = self.subscriptions.pop(name, None)
        if subscription is not None:
            await subscription.close()
        await self.ml.delete_cursor(name)
        if REPLICATED_SUBSCRIPTION_PREFIX + name in self.ml.properties:
            await self.ml.update_properties({REPLICATED_SUBSCRIPTION_PREFIX + name: None})
            self._check_snapshots()

    async def close(self) -> None:
        await self.stop_replicators()
        await self.compaction.stop()
        for subscription in self.subscriptions.values():
            await subscription.close()
        if self.deduplication is not None:
            try:
                await self.deduplication.snapshot()
            except Exception as e:
                log.warning("topic %s: final deduplication snapshot failed: %s", self.name, e)
        await self.ml.close()
