"""A durable subscription: a cursor on the topic's managed ledger and the dispatcher of its mode."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from magnetar.broker.errors import SubscriptionBusyError, SubscriptionNotFoundError
from magnetar.broker.ledger.cursor import ManagedCursor
from magnetar.broker.model.entry import entry_metadata
from magnetar.broker.model.message_id import from_wire
from magnetar.broker.model.position import Position
from magnetar.broker.topics import dispatchers
from magnetar.broker.topics.consumer import Consumer, acked_from_bit_set
from magnetar.broker.topics.dispatch_limits import DispatchLimits
from magnetar.broker.topics.dispatch_rate import RateLimiter
from magnetar.broker.topics.snapshot_cache import Snapshot, SnapshotCache
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.ledger.managed_ledger import ManagedLedger
    from magnetar.broker.topics.persistent import PersistentTopic


#: The largest batch an ack may name when the broker no longer knows the batch's size.
MAX_BATCH_SIZE = 100_000


_NO_LIMITERS: list[RateLimiter] = []  # never appended to
#: Asked of every ACK: a plain int, not an attribute of the enum wrapper.
_CUMULATIVE = pb.CommandAck.Cumulative


class SubscriptionExistsError(Exception):
    """The admin API asked to create a subscription the topic already has (409)."""


class SubscriptionTypeError(Exception):
    """A consumer asked for another mode than the subscription has."""


class _HasConsumers(Protocol):
    @property
    def consumers(self) -> Sequence[Consumer]: ...


def disconnect_for_delete(
    topic: object, name: str, subscription: _HasConsumers | None, *, force: bool
) -> None:
    """The admin delete of subscription ``name`` of ``topic`` may go on (Pulsar's rules, for
    persistent and non-persistent topics alike): unknown -> SubscriptionNotFoundError; with
    consumers -> SubscriptionBusyError, unless ``force``, which disconnects them first."""
    if subscription is None:
        raise SubscriptionNotFoundError(f"Subscription {name} not found on topic {topic}")
    consumers = list(subscription.consumers)
    if consumers and not force:
        raise SubscriptionBusyError(
            f"Subscription {name} of topic {topic} has {len(consumers)} active "
            "connected consumer(s); use force=true"
        )
    for consumer in consumers:
        consumer.connection.close_consumer(subscription, consumer)


def unacked_positions(cursor: ManagedCursor, limit: int) -> list[Position]:
    """Up to ``limit`` entries ``cursor`` has not acknowledged, from its mark-delete position
    on, without reading them (positions come from the ledger list)."""
    ml = cursor.ml
    found: list[Position] = []
    start = cursor.mark_delete_position
    position = ml.first_at_or_after(Position(start.ledger_id, start.entry_id + 1))
    while position is not None and len(found) < limit:
        if not cursor.is_acked(position):
            found.append(position)
        position = ml.first_at_or_after(Position(position.ledger_id, position.entry_id + 1))
    return found


def first_unacked(cursor: ManagedCursor) -> Position | None:
    """The oldest entry ``cursor`` has not acknowledged (None: none)."""
    found = unacked_positions(cursor, 1)
    return found[0] if found else None


class Subscription:
    """``sub_type`` None: recovered from its cursor when the topic loaded, with no consumer
    since. Its mode is not stored (Pulsar does not store it either): stats report it as
    ``None`` until a consumer comes, and the first consumer may use any mode."""

    def __init__(
        self,
        topic: PersistentTopic,
        name: str,
        cursor: ManagedCursor,
        sub_type: int | None,
        limits: DispatchLimits,
    ) -> None:
        self.topic = topic
        self.name = name
        self.cursor = cursor
        cursor.on_mark_delete_moved = self._mark_delete_moved
        self.sub_type = sub_type
        self.limits = limits
        self.dispatch_batch = limits.dispatch_batch
        #: Messages per entry, averaged over what was dispatched: reads are sized by it so a
        #: consumer is sent about its permits, not its permits in entries.
        self.messages_per_entry = 1.0
        self.redelivery_counts: dict[Position, int] = {}
        #: Messages per batch entry dispatched and not fully acknowledged (batch-index acks
        #: from the official client carry no batch size).
        self.batch_sizes: dict[Position, int] = {}
        self.durable = True  # False for a reader's subscription
        #: Its position follows across clusters (``replicated_subscriptions.py``).
        self.replicated = False
        #: The snapshots it may use once its mark-delete position reaches them.
        self.snapshots: SnapshotCache | None = None
        #: Messages and bytes dispatched (redeliveries included), for metrics.
        self.msg_out = 0
        self.bytes_out = 0
        #: Messages acknowledged and messages sent back for redelivery, for metrics.
        self.msg_acked = 0
        self.msg_redelivered = 0
        #: Entries expired (TTL or the admin's expireMessages), and when last (ms, 0: never).
        self.expired = 0
        self.last_expired_ms = 0
        self._rate_limiter: RateLimiter | None = None
        #: Times dispatch was held by a dispatch rate, by (``topic``|``subscription`` limit,
        #: ``messages``|``bytes``), for stats.
        self.throttled: Counter[tuple[str, str]] = Counter()
        #: When a consumer last came or went or acknowledged (subscription expiration).
        self.last_active = time.monotonic()
        # Without a mode yet, an idle dispatcher holds the place: with no consumer it never
        # reads, and the first consumer replaces it with its own mode's.
        self.dispatcher = dispatchers.for_mode(
            pb.CommandSubscribe.Exclusive if sub_type is None else sub_type, self
        )

    def __str__(self) -> str:
        return f"{self.topic.name}/{self.name}"

    def rate_limiters(self) -> list[RateLimiter]:
        """The dispatch rate limiters this subscription's dispatcher answers to: the topic's
        and its own (empty without dispatch rate policies)."""
        if self.topic.dispatch_limiter is None and self.topic.subscription_dispatch_rate is None:
            self._rate_limiter = None
            return _NO_LIMITERS  # no dispatch rate anywhere (asked per dispatched entry)
        found = []
        if self.topic.dispatch_limiter is not None:
            found.append(self.topic.dispatch_limiter)
        rate = self.topic.subscription_dispatch_rate
        if rate is None:
            self._rate_limiter = None
        else:
            if self._rate_limiter is None or self._rate_limiter.rate != rate:
                self._rate_limiter = RateLimiter(rate, publish_rates=self.topic.publish_rates)
            found.append(self._rate_limiter)
        return found

    @property
    def type_name(self) -> str:
        """The mode as Pulsar's stats name it; ``None`` before a consumer gave it one."""
        if self.sub_type is None:
            return "None"
        return pb.CommandSubscribe.SubType.Name(self.sub_type)

    def add_consumer(self, consumer: Consumer, sub_type: int) -> None:
        """Attach a consumer. A subscription without consumers takes the mode of the one that
        comes (as Pulsar does); with consumers, another mode is refused."""
        if sub_type != self.sub_type and not self.dispatcher.consumers:
            self.dispatcher.stop()
            self.sub_type = sub_type
            self.cursor.rewind()
            self.dispatcher = dispatchers.for_mode(sub_type, self)
        if sub_type != self.sub_type:
            raise SubscriptionTypeError(
                f"subscription {self} is {self.type_name}, "
                f"not {pb.CommandSubscribe.SubType.Name(sub_type)}"
            )
        self.dispatcher.add_consumer(consumer)
        self.last_active = time.monotonic()

    def remove_consumer(self, consumer: Consumer) -> None:
        self.dispatcher.remove_consumer(consumer)
        self.last_active = time.monotonic()

    @property
    def consumers(self) -> list[Consumer]:
        return self.dispatcher.consumers

    def wake(self) -> None:
        """Something a dispatch waits for changed (a connection became writable again)."""
        self.dispatcher.wake()

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.permits += permits
        self.dispatcher.wake()

    def add_snapshot(self, snapshot: Snapshot, max_cached: int) -> None:
        """A completed snapshot; one the mark-delete position has passed already (it went
        over the snapshot's markers while they were stored) is used at once."""
        if self.snapshots is None:
            self.snapshots = SnapshotCache(max_cached, self.topic.ml.entries_between)
        self.snapshots.add(snapshot)
        if snapshot.local <= self.cursor.mark_delete_position:
            self._mark_delete_moved(self.cursor.mark_delete_position)

    def _mark_delete_moved(self, mark_delete: Position) -> None:
        """The mark-delete position moved forward (the cursor tells): a replicated
        subscription that reached a snapshot tells the other clusters (Pulsar does it on
        every mark-delete)."""
        if self.snapshots is None:
            return
        snapshot = self.snapshots.advanced(mark_delete)
        controller = self.topic.replicated_subscriptions
        if snapshot is not None and controller is not None and self.replicated:
            controller.local_subscription_updated(self.name, snapshot)

    def ack_markers(self, positions: list[Position]) -> None:
        """Markers are acknowledged for every subscription instead of being delivered."""
        self.cursor.delete(positions)

    def follow(self, position: Position) -> None:
        """Another cluster's replicated subscription of this name moved: cumulative ack up to
        ``position`` (nothing happens if this one is past it already)."""
        self._cumulative(min(position, self.topic.ml.last_confirmed_position))
        self.dispatcher.wake()

    def ack(self, consumer: Consumer, ack_type: int, message_ids: list[pb.MessageIdData]) -> None:
        """Apply an ACK. Raises ValueError (nothing applied from that id on) for an id past the
        last stored entry (Pulsar: invalid mark-delete position) or a batch size the ack set
        cannot describe."""
        self._ack(consumer, ack_type, message_ids)

    def _ack(self, consumer: Consumer, ack_type: int, message_ids: list[pb.MessageIdData]) -> None:
        last = self.topic.ml.last_confirmed_position
        self.last_active = time.monotonic()
        # Whole-entry individual acks (the client groups them, hundreds per ACK) go to the
        # cursor at once: one range update and one advance of mark-delete per command.
        individual: list[Position] = []
        cumulative = ack_type == _CUMULATIVE
        try:
            for mid in message_ids:
                position = from_wire(mid)
                if position.ledger_id < 0:
                    continue  # MessageId.earliest: nothing to acknowledge
                if position > last:
                    raise ValueError(
                        f"subscription {self}: cannot acknowledge {position}, past the last "
                        f"stored entry {last} (invalid mark-delete position)"
                    )
                if not cumulative and not mid.ack_set:
                    individual.append(position)
                    continue
                if individual:  # in the order the client sent them
                    self._individual(consumer, individual)
                    individual = []
                self._ack_one(consumer, ack_type, mid, position)
        finally:
            if individual:
                self._individual(consumer, individual)
        self.dispatcher.wake()

    def _individual(self, consumer: Consumer, positions: list[Position]) -> None:
        self.cursor.delete(positions)
        count = consumer.acked_all(positions)
        for forget in (self.redelivery_counts, self.batch_sizes):
            if forget:
                for position in positions:
                    forget.pop(position, None)
        self.msg_acked += count

    def _ack_one(
        self, consumer: Consumer, ack_type: int, mid: pb.MessageIdData, position: Position
    ) -> None:
        """A cumulative ack, or an ack of some messages of a batch entry."""
        acked: list[int] = []
        size = 0
        if mid.ack_set:
            # Batch-index ack: ack_set holds the batch's still-unacknowledged indexes.
            size = self._batch_size(position, mid)
            if size > 0:
                acked = acked_from_bit_set(list(mid.ack_set), size)
        if ack_type == pb.CommandAck.Cumulative:
            # Everything before the entry; of the entry itself, what the ack set says (all
            # of it without one). (L, -1) means "everything before (L, 0)".
            through = (
                Position(position.ledger_id, position.entry_id - 1) if mid.ack_set else position
            )
            self._cumulative(through)
            if mid.ack_set and size > 0:
                self._batch_indexes(consumer, position, acked, size)
        elif size > 0:
            self._batch_indexes(consumer, position, acked, size)
        # else: not out on any consumer, nothing to match the bits against

    def _batch_size(self, position: Position, mid: pb.MessageIdData) -> int:
        """The size of the batch at ``position``: as dispatched when known, else as the ack
        says, bounded by what its ack set can describe."""
        dispatched = self.batch_sizes.get(position)
        if dispatched is not None:
            return dispatched
        if not mid.HasField("batch_size"):
            return 0
        bound = min(64 * len(mid.ack_set), MAX_BATCH_SIZE)
        if not 0 < mid.batch_size <= bound:
            raise ValueError(
                f"subscription {self}: batch size {mid.batch_size} of {position} is not "
                f"between 1 and {bound} (what its ack set can describe)"
            )
        return mid.batch_size

    def _cumulative(self, through: Position) -> None:
        self.cursor.mark_delete(through)
        for c in self.dispatcher.consumers:
            for p in [p for p in c.pending if p <= through]:
                self.msg_acked += c.acked(p)
        self._forget_through(through)

    def _batch_indexes(
        self, consumer: Consumer, position: Position, acked: list[int], size: int
    ) -> None:
        self.cursor.delete_batch_indexes(position, acked, size)
        if self.cursor.is_acked(position):
            self._forget(consumer, position)

    def _forget(self, consumer: Consumer, position: Position) -> None:
        self.msg_acked += consumer.acked(position)
        self.redelivery_counts.pop(position, None)
        self.batch_sizes.pop(position, None)

    def _forget_through(self, through: Position) -> None:
        """Per-position state of everything up to ``through``, now acknowledged."""
        for state in (self.redelivery_counts, self.batch_sizes):
            for p in [p for p in state if p <= through]:
                del state[p]

    async def expire_before(self, cutoff_ms: int, limit: int = 10_000) -> int:
        """Message TTL: acknowledge the unacknowledged messages published before ``cutoff_ms``
        (from the oldest on, stopping at the first younger one). Ledgers closed before the
        cutoff expire whole; in the rest at most ``limit`` entries are read per call. Returns
        how many entries expired."""
        ml = self.cursor.ml
        # Whole ledgers closed before the cutoff hold only older messages: no need to read them.
        last = ml.last_position_closed_before(cutoff_ms)
        if last is not None and last <= self.cursor.mark_delete_position:
            last = None
        position = ml.next_position(last or self.cursor.mark_delete_position)
        looked = 0
        while looked < limit:
            entries = await ml.read_entries(position, min(100, limit - looked))
            if not entries:
                break
            for found, stored in entries:
                if entry_metadata(stored).publish_time >= cutoff_ms:
                    looked = limit
                    break
                last = found
            else:
                looked += len(entries)
                position = ml.next_position(entries[-1][0])
        if last is None:
            return 0
        expired = ml.entries_after(self.cursor.mark_delete_position) - ml.entries_after(last)
        # Consumers keep what they hold as pending: their acks of it are harmless, and
        # key_shared must not hand its keys to another consumer while they hold them.
        self.cursor.mark_delete(last)
        self._forget_through(last)
        self.dispatcher.wake()
        self.expired += expired
        self.last_expired_ms = int(time.time() * 1000)
        return expired

    def redeliver(self, consumer: Consumer, message_ids: list[pb.MessageIdData] | None) -> None:
        positions = None if message_ids is None else [from_wire(m) for m in message_ids]
        self.dispatcher.redeliver(consumer, positions)

    async def seek(self, position: Position | None, publish_time_ms: int | None) -> list[Consumer]:
        """Reset the cursor to a message id or to the first message published at or after a
        time; returns the consumers, which the caller disconnects (clients reconnect and get
        messages from the new position, with nothing stale left in their queues)."""
        if position is None:
            position = await self._first_published_at(publish_time_ms or 0)
        view = self.topic.ml.compacted
        if not (self.cursor.read_compacted and view is not None and position <= view.horizon):
            position = max(position, self.topic.ml.first_position)  # else: in the compacted view
        self.cursor.reset(position)
        self.dispatcher.reset()
        if self.snapshots is not None:
            self.snapshots.clear()
        self.topic.ack_known_markers(self)
        consumers = list(self.dispatcher.consumers)
        for consumer in consumers:
            consumer.clear_pending()
            self.dispatcher.remove_consumer(consumer)
        self.redelivery_counts.clear()
        self.batch_sizes.clear()
        return consumers

    async def _first_published_at(self, publish_time_ms: int) -> Position:
        return await first_published_at(self.topic.ml, publish_time_ms)

    async def reset_cursor(self, position: Position | None, publish_time_ms: int | None) -> None:
        """Admin ``resetcursor``: a seek whose consumers are told to come back (as the
        protocol's SEEK does) and then receive from the new position."""
        for consumer in await self.seek(position, publish_time_ms):
            consumer.connection.reconnect_consumer(consumer)

    def unacked_positions(self, limit: int) -> list[Position]:
        """Up to ``limit`` unacknowledged entries from the mark-delete position on, without
        reading them (positions come from the ledger list)."""
        return unacked_positions(self.cursor, limit)

    def skip(self, entries: int) -> int:
        """Admin ``skip/{n}``: the next ``entries`` unacknowledged entries count as acknowledged
        (Pulsar skips entries, leaving individually acknowledged ones out of the count).
        Returns how many were skipped."""
        positions = self.unacked_positions(entries)
        if positions:
            self.cursor.delete(positions)
            for position in positions:
                self.batch_sizes.pop(position, None)
                self.redelivery_counts.pop(position, None)
            self.dispatcher.wake()
        return len(positions)

    def clear_backlog(self) -> int:
        """Admin ``skip_all`` (and a namespace's ``clearBacklog``): everything stored so far
        counts as acknowledged. Returns the entries that were in the backlog."""
        backlog = self.cursor.backlog
        last = self.cursor.ml.last_confirmed_position
        if last > self.cursor.mark_delete_position:
            self.cursor.mark_delete(last)
            self._forget_through(last)
            self.dispatcher.wake()
        return backlog

    async def peek(self, n: int) -> tuple[Position, bytes] | None:
        """Admin ``position/{n}``: the ``n``-th (from 1) unacknowledged entry, nothing moved."""
        positions = self.unacked_positions(n)
        if len(positions) < n or n < 1:
            return None
        entries = await self.cursor.ml.read_entries(positions[-1], 1)
        return entries[0] if entries and entries[0][0] == positions[-1] else None

    async def close(self) -> None:
        await self.dispatcher.close()


async def first_published_at(ml: ManagedLedger, publish_time_ms: int) -> Position:
    """The first entry published at or after ``publish_time_ms`` (the end of the log if none)."""
    position = ml.first_position
    while True:
        entries = await ml.read_entries(position, 500)
        if not entries:
            return ml.next_position(ml.last_confirmed_position)
        for found, stored in entries:
            if entry_metadata(stored).publish_time >= publish_time_ms:
                return found
        position = ml.next_position(entries[-1][0])
