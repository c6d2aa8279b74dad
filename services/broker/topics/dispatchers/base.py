"""What every dispatcher shares: its consumers, and a task that dispatches whenever something
changes (permits, new entries, acks, consumers joining or leaving, a connection draining).

The task never dies quietly: a failed round is logged with the subscription and retried with
backoff, and any wake-up (FLOW, an ack, a new entry) restarts a task that ended anyway.
Reads are sized in messages, not entries: a round reads about as many entries as the permits
cover at the subscription's average messages per entry, and what a consumer had no permits for
is left unread, so no consumer is sent more than its permits plus one entry."""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from magnetar.broker.ledger.errors import ManagedLedgerError, UnreadableEntryError
from magnetar.broker.model.entry import dispatch_facts, entry_facts
from magnetar.broker.model.position import Position
from magnetar.broker.topics.consumer import Consumer, unacked_bit_set
from magnetar.broker.topics.dispatchers.delayed import DelayedDeliveryTracker
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.tasks import wait_set

if TYPE_CHECKING:
    from magnetar.broker.topics.subscription import Subscription

log = logging.getLogger(__name__)

#: Backoff of a failed dispatch round: first wait, doubled up to the last.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0


class ConsumerBusyError(Exception):
    """The subscription does not take another consumer (exclusive mode)."""


class Dispatcher(abc.ABC):
    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.cursor = subscription.cursor
        self.consumers: list[Consumer] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            consumer.closed = True
            self.release(consumer)
            self.wake()

    def wake(self) -> None:
        self._wake.set()
        if self.consumers and not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"dispatch-{self.subscription}"
            )

    def stop(self) -> None:
        """Stop dispatching for good (the subscription changes mode); it has no consumers."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        self.stop()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        backoff = RETRY_FIRST_S
        while self.consumers:
            self._wake.clear()
            throttled = self._throttled()
            if throttled > 0:  # over a dispatch rate: the next window
                await asyncio.sleep(throttled)
                continue
            try:
                progressed = await self.dispatch_round()
            except asyncio.CancelledError:
                raise
            except UnreadableEntryError as e:
                if self._skip_unreadable(e):
                    continue
                self._failed(e, backoff)
                await self._backoff(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            except Exception as e:
                level = logging.WARNING if isinstance(e, ManagedLedgerError) else logging.ERROR
                log.log(
                    level,
                    "subscription %s: dispatch failed, retrying in %.1f s: %s",
                    self.subscription,
                    backoff,
                    e,
                    exc_info=level == logging.ERROR,
                )
                self.subscription.topic.metrics.dispatch_failures.inc()
                await self._backoff(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            backoff = RETRY_FIRST_S
            if not progressed:
                self._tell_end_of_topic()
                await self._wake.wait()

    def _tell_end_of_topic(self) -> None:
        """Pulsar's REACHED_END_OF_TOPIC: once the topic is terminated and the subscription has
        acknowledged everything in it, each consumer is told (once) that nothing more will
        come; a client that has no handler for the command is not sent it."""
        if self.subscription.topic.ml.terminated_at is None or self.cursor.backlog > 0:
            return
        for consumer in self.consumers:
            if not consumer.told_end_of_topic and consumer.connection.understands_end_of_topic:
                consumer.told_end_of_topic = True
                consumer.connection.send(
                    pb.CommandReachedEndOfTopic(consumer_id=consumer.consumer_id)
                )

    def _failed(self, error: UnreadableEntryError, backoff: float) -> None:
        self.subscription.topic.metrics.unreadable_entries.inc()
        log.warning(
            "subscription %s: entry %s has no intact copy; delivery waits at it (retry in %.1f s; "
            "auto_skip_non_recoverable_data skips such entries)",
            self.subscription,
            error.position,
            backoff,
        )

    async def _backoff(self, seconds: float) -> None:
        await wait_set(self._wake, seconds)

    def _skip_unreadable(self, error: UnreadableEntryError) -> bool:
        """Pulsar's autoSkipNonRecoverableData: acknowledge an entry no bookie can give back,
        so the subscription goes on without it. Off by default: then it waits at the entry."""
        if not self.subscription.limits.auto_skip_non_recoverable_data:
            return False
        self.subscription.topic.metrics.skipped_entries.inc()
        log.error(
            "subscription %s: skipping unreadable entry %s (auto_skip_non_recoverable_data)",
            self.subscription,
            error.position,
        )
        self.cursor.delete([error.position])
        self.cursor.skip_past(error.position)
        if isinstance(self, ReplayingDispatcher):
            self.replay.discard(error.position)
        return True

    def _throttled(self) -> float:
        """Seconds to wait before dispatching more (0: now), by the dispatch rate limits; each
        hold is counted for the subscription's stats (Pulsar's dispatchThrottled*Events*)."""
        sub = self.subscription
        wait = 0.0
        for limiter in sub.rate_limiters():
            delay, messages, size = limiter.hold()
            if delay > 0:
                wait = max(wait, delay)
                by = "topic" if limiter is sub.topic.dispatch_limiter else "subscription"
                sub.throttled[(by, "messages")] += messages
                sub.throttled[(by, "bytes")] += size
        return wait

    def entries_to_read(self, permits: int) -> int:
        """Entries to read for ``permits`` messages, at the average batch size seen so far
        (fewer when a dispatch rate allows fewer)."""
        for limiter in self.subscription.rate_limiters():
            allowed = limiter.available()
            if allowed is not None:
                permits = min(permits, max(allowed, 1))
        per_entry = max(self.subscription.messages_per_entry, 1.0)
        return max(1, min(math.ceil(permits / per_entry), self.subscription.dispatch_batch))

    def without_markers(
        self, entries: list[tuple[Position, bytes]]
    ) -> list[tuple[Position, bytes, int, int]]:
        """Entries read from the cursor, less the markers: those are acknowledged, never sent
        (Pulsar's dispatchers do the same for every subscription). Each kept entry comes with
        its message count and delivery time (``entry_facts``), worked out here once."""
        kept = []
        found = []
        for position, stored in entries:
            count, deliver_at, marker = entry_facts(stored)
            if marker:
                found.append(position)
            else:
                kept.append((position, stored, count, deliver_at))
        if found:
            self.subscription.ack_markers(found)
        return kept

    def send(
        self, consumer: Consumer, position: Position, stored: bytes, count: int | None = None
    ) -> None:
        """Dispatch one entry, with its redelivery count and the batch indexes already acked
        (``count``: its messages, when the caller knows them already), to a consumer the caller
        found ready. ``send_run`` is this and ``Consumer.send`` over a run, unrolled."""
        if count is None:
            count = dispatch_facts(stored)[0]
        sub = self.subscription
        acked_indexes: frozenset[int] = frozenset()
        if count > 1:  # a batch: it may have some messages acknowledged already
            sub.batch_sizes[position] = count
            acked_indexes = self.cursor.acked_batch_indexes(position)
        sub.messages_per_entry += (count - sub.messages_per_entry) * 0.1
        self._count_out(count, len(stored))
        redeliveries = sub.redelivery_counts
        consumer.send(
            position,
            stored,
            count,
            redeliveries.get(position, 0) if redeliveries else 0,
            acked_indexes,
        )

    def send_run(
        self,
        consumer: Consumer,
        entries: list[tuple[Position, bytes, int, int]],
        hold: Callable[[Position, int], bool] | None = None,
    ) -> tuple[int, bool]:
        """Dispatch ``entries`` (position, stored entry, its messages, its delivery time) in
        order to ``consumer`` while it may take them (``Consumer.ready``: permits left, under
        its unacked bound, its connection open and draining), each with its redelivery count
        and the batch indexes already acked. An entry with a delivery time is offered to
        ``hold`` first and skipped if held. Returns the index of the first entry neither sent
        nor held (``len(entries)`` when none is left) and whether any was sent. The run's
        frames are written, and its messages counted, once."""
        sub = self.subscription
        redeliveries = sub.redelivery_counts
        pending = consumer.pending
        permits = consumer.permits
        unacked = consumer.unacked
        bound = consumer.max_unacked
        takes = not consumer.closed and consumer.connection.writable
        consumer_id, partition = consumer.consumer_id, consumer.partition
        per_entry = sub.messages_per_entry
        frames = []
        messages = size = 0
        stop = len(entries)
        for i, (position, stored, count, deliver_at) in enumerate(entries):
            if deliver_at and hold is not None and hold(position, deliver_at):
                continue
            # Consumer.ready, with the permits and unacked count this run has used so far.
            if not takes or permits <= 0 or (bound > 0 and unacked >= bound):
                stop = i
                break
            ack_set = None
            if count > 1:  # a batch: it may have some messages acknowledged already
                sub.batch_sizes[position] = count
                acked_indexes = self.cursor.acked_batch_indexes(position)
                if acked_indexes:
                    # The batch's messages still to acknowledge: the client skips the rest.
                    ack_set = unacked_bit_set(count, acked_indexes)
            frames.append(
                codec.encode_message_frame(
                    consumer_id,
                    position.ledger_id,
                    position.entry_id,
                    stored,
                    partition=partition,
                    redelivery_count=redeliveries.get(position, 0) if redeliveries else 0,
                    ack_set=ack_set,
                )
            )
            per_entry += (count - per_entry) * 0.1
            permits -= count
            unacked += count - pending.get(position, 0)
            pending[position] = count
            messages += count
            size += len(stored)
        if not frames:
            return stop, False
        consumer.connection.write_all(frames)
        consumer.permits = permits
        consumer.unacked = unacked
        consumer.msg_out += messages
        consumer.bytes_out += size
        sub.messages_per_entry = per_entry
        self._count_out(messages, size)
        return stop, True

    def _count_out(self, messages: int, size: int) -> None:
        """Messages dispatched: the subscription's and topic's counters and the dispatch rate
        limiters."""
        sub = self.subscription
        sub.msg_out += messages
        sub.bytes_out += size
        topic = sub.topic
        topic.msg_out += messages
        topic.bytes_out += size
        for limiter in sub.rate_limiters():
            limiter.consume(messages, size)

    def redelivered(self, position: Position) -> None:
        subscription = self.subscription
        counts = subscription.redelivery_counts
        counts[position] = counts.get(position, 0) + 1
        subscription.msg_redelivered += subscription.batch_sizes.get(position, 1)

    def reset(self) -> None:  # noqa: B027 - in-order modes keep nothing to forget
        """The cursor was reset (seek): forget positions held in memory."""

    @abc.abstractmethod
    async def dispatch_round(self) -> bool:
        """Send what can be sent now; False when there is nothing to do until woken."""

    @abc.abstractmethod
    def release(self, consumer: Consumer) -> None:
        """A consumer left: its unacknowledged messages must go out again."""

    @abc.abstractmethod
    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        """Send these (or all) unacknowledged messages of ``consumer`` again."""


class ReplayingDispatcher(Dispatcher):
    """Shared and key_shared: the unacknowledged messages of a consumer that leaves (or asks for
    redelivery) go into ``replay``, to be sent again (to whichever consumer may take them)
    before new messages."""

    def __init__(self, subscription: Subscription) -> None:
        super().__init__(subscription)
        self.replay: set[Position] = set()
        self.delayed = DelayedDeliveryTracker()
        self._delay_timer: asyncio.TimerHandle | None = None

    def hold_until(self, position: Position, deliver_at: int) -> bool:
        """Keep the message at ``position`` until ``deliver_at`` (ms; 0: none) if that is
        still ahead; True if it was kept."""
        if not deliver_at or deliver_at <= time.time() * 1000:
            return False
        self.delayed.hold(position, deliver_at)
        self._arm_delay_timer()
        return True

    def release_due(self) -> None:
        """Messages whose delivery time came go out first, with the redeliveries."""
        for position in self.delayed.due(int(time.time() * 1000)):
            if not self.cursor.is_acked(position):
                self.replay.add(position)
        self._arm_delay_timer()

    def _arm_delay_timer(self) -> None:
        at = self.delayed.next_deliver_at()
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        if at is not None:
            loop = asyncio.get_running_loop()
            delay = max(at / 1000 - time.time(), 0.0)
            self._delay_timer = loop.call_later(delay, self.wake)

    def stop(self) -> None:
        if self._delay_timer is not None:
            self._delay_timer.cancel()
        super().stop()

    def reset(self) -> None:
        self.replay.clear()
        self.delayed.clear()

    def add_consumer(self, consumer: Consumer) -> None:
        consumer.max_unacked = self.subscription.limits.max_unacked_per_consumer
        super().add_consumer(consumer)

    def subscription_full(self) -> bool:
        """At the subscription's bound of unacknowledged messages: read nothing new."""
        limit = self.subscription.limits.max_unacked_per_subscription
        return limit > 0 and sum(c.unacked for c in self.consumers) >= limit

    def release(self, consumer: Consumer) -> None:
        for position in consumer.pending:
            self.redelivered(position)
            self.replay.add(position)
        consumer.clear_pending()

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        chosen = (
            list(consumer.pending)
            if positions is None
            else [p for p in positions if p in consumer.pending]
        )
        for position in chosen:
            consumer.acked(position)
            self.redelivered(position)
            self.replay.add(position)
        self.wake()
