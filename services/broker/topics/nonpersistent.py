"""Non-persistent topics (``non-persistent://...``): nothing is stored. A published message is
acknowledged at once and handed to each subscription's consumer that can take it now (one with
permits, chosen by the subscription's mode); when there is none, it is dropped for that
subscription and counted. Acks, redelivery requests and seeks have nothing to act on.

Message ids are ``(0, n)`` with ``n`` counting the topic's published entries from 0 since it
was loaded (they are not durable and not comparable across broker restarts).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from magnetar.broker.errors import TopicBusyError
from magnetar.broker.model.entry import entry_metadata, message_count
from magnetar.broker.model.position import Position
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import TopicLimits
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.live import LiveDispatcher, for_live_mode
from magnetar.broker.topics.limits import check_consumers
from magnetar.broker.topics.producers import ProducerSet
from magnetar.broker.topics.publish_rate import PublishThrottle
from magnetar.broker.topics.stats import TopicRates, nonpersistent_stats
from magnetar.broker.topics.subscription import SubscriptionTypeError, disconnect_for_delete
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.namespace.policies import Policies

log = logging.getLogger(__name__)

Sub = pb.CommandSubscribe


class NonPersistentSubscription:
    durable = False

    def __init__(self, topic: NonPersistentTopic, name: str, sub_type: int) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.dispatcher: LiveDispatcher = for_live_mode(sub_type, topic.name, name)
        self.dropped = 0
        #: Messages and bytes sent to consumers, for metrics.
        self.msg_out = 0
        self.bytes_out = 0

    def __str__(self) -> str:
        return f"{self.topic.name}/{self.name}"

    @property
    def consumers(self) -> list[Consumer]:
        return self.dispatcher.consumers

    def add_consumer(self, consumer: Consumer, sub_type: int) -> None:
        if sub_type != self.sub_type and not self.consumers:
            self.sub_type = sub_type  # no consumers: the subscription takes the new mode
            self.dispatcher = for_live_mode(sub_type, self.topic.name, self.name)
        if sub_type != self.sub_type:
            raise SubscriptionTypeError(
                f"subscription {self} is {Sub.SubType.Name(self.sub_type)}, "
                f"not {Sub.SubType.Name(sub_type)}"
            )
        self.dispatcher.add_consumer(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        self.dispatcher.remove_consumer(consumer)

    def deliver(
        self, position: Position, stored: bytes, metadata: pb.MessageMetadata, count: int
    ) -> None:
        consumer = self.dispatcher.choose(stored, metadata)
        if consumer is None:
            self.dropped += count
            return
        consumer.send(position, stored, count)
        consumer.clear_pending()  # nothing to acknowledge on a non-persistent topic
        self.msg_out += count
        self.bytes_out += len(stored)
        self.topic.msg_out += count
        self.topic.bytes_out += len(stored)

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.permits += permits

    def wake(self) -> None:
        pass  # live delivery: nothing waits to be sent

    def ack(self, consumer: Consumer, ack_type: int, message_ids: list[pb.MessageIdData]) -> None:
        pass  # nothing is kept, so nothing to mark

    def redeliver(self, consumer: Consumer, message_ids: list[pb.MessageIdData] | None) -> None:
        pass  # nothing is kept to send again

    async def close(self) -> None:
        for consumer in list(self.consumers):
            self.remove_consumer(consumer)


class NonPersistentTopic:
    persistent = False

    def __init__(self, name: TopicName) -> None:
        self.name = name
        self.subscriptions: dict[str, NonPersistentSubscription] = {}
        self.producers = ProducerSet()
        self.deduplication = None  # not for a topic that stores nothing
        self.loaded_at = time.monotonic()
        #: When a message was last published or a client last seen (inactive-topic deletion).
        self.last_active = self.loaded_at
        #: Counters as PersistentTopic's (entries, bytes, messages in; messages, bytes out).
        self.msg_in = 0
        self.bytes_in = 0
        self.messages_in = 0
        self.msg_out = 0
        self.bytes_out = 0
        self._entry_ids = itertools.count()
        self.rates = TopicRates()
        self.client_limits = TopicLimits()
        self.publish_throttle = PublishThrottle()

    def admit_producer(self) -> None:
        """Nothing keeps a producer off a non-persistent topic (it cannot be terminated and
        has no backlog for a quota to hold)."""

    def takes_runs(self) -> bool:
        """Each entry goes on its own here (``publish``); runs are a persistent topic's."""
        return False

    def publish(
        self,
        stored: bytes,
        producer_name: str = "",
        sequence_id: int = -1,
        highest: int = -1,
        messages: int | None = None,
        *,
        marker: bool = False,
        deduplicate: bool = True,  # nothing is deduplicated on a non-persistent topic
        on_stored: Callable[[asyncio.Future[Position | None]], None] | None = None,
    ) -> asyncio.Future[Position | None]:
        """Deliver one entry to each subscription's chosen consumer now (``messages``: taken
        from the entry's metadata, which is decoded here anyway). ``marker`` is accepted as
        the persistent topic's ``publish`` takes it; markers come only through persistent
        topics' replication."""
        position = Position(0, next(self._entry_ids))
        metadata = entry_metadata(stored)  # once, for every subscription
        count = message_count(metadata)
        self.msg_in += 1
        self.bytes_in += len(stored)
        self.messages_in += count
        self.last_active = time.monotonic()
        self.producers.count(producer_name, count, len(stored))
        for subscription in list(self.subscriptions.values()):
            subscription.deliver(position, stored, metadata, count)
        done: asyncio.Future[Position | None] = asyncio.get_running_loop().create_future()
        if on_stored is not None:
            done.add_done_callback(on_stored)
        done.set_result(position)
        return done

    async def subscribe(
        self,
        consumer: Consumer,
        name: str,
        sub_type: int,
        initial_position: int,
        start_message_id: pb.MessageIdData | None = None,
        *,
        replicated: bool = False,  # nothing to replicate: nothing is stored
    ) -> NonPersistentSubscription:
        check_consumers(self.client_limits, self.subscriptions, name)
        subscription = self.subscriptions.get(name)
        if subscription is None:
            subscription = self.subscriptions[name] = NonPersistentSubscription(
                self, name, sub_type
            )
        subscription.add_consumer(consumer, sub_type)
        return subscription

    async def remove_subscription_if_unused(self, subscription: NonPersistentSubscription) -> None:
        if not subscription.consumers and self.subscriptions.get(subscription.name) is subscription:
            del self.subscriptions[subscription.name]

    async def unsubscribe(self, name: str) -> None:
        self.subscriptions.pop(name, None)

    async def delete_subscription(self, name: str, *, force: bool) -> None:
        """Admin ``DELETE .../subscription/{name}``, as for a persistent topic."""
        subscription = self.subscriptions.get(name)
        disconnect_for_delete(self.name, name, subscription, force=force)
        assert subscription is not None
        if self.subscriptions.get(name) is subscription:
            del self.subscriptions[name]
        await subscription.close()

    def is_inactive(self, mode: str) -> bool:
        """No producer and no consumer (a non-persistent subscription lives with its consumers)."""
        return not len(self.producers) and not any(s.consumers for s in self.subscriptions.values())

    def apply_limits(self, limits: TopicLimits) -> None:
        """The namespace's limits on producers and consumers."""
        self.client_limits = limits
        self.producers.max_producers = limits.max_producers_per_topic

    def apply_settings(self, policies: Policies) -> None:
        """The policies that only set how the topic runs (when loaded, and in each round)."""
        self.apply_limits(policies.limits)
        self.publish_throttle.apply(policies.publish_rate)

    async def apply_policies(self, policies: Policies) -> None:
        # Retention, TTL and deduplication concern stored messages only.
        self.apply_settings(policies)

    def stats(self) -> dict[str, object]:
        """Topic stats in the shape of Pulsar's ``NonPersistentTopicStats``."""
        return nonpersistent_stats(self, self.rates)

    async def stop_publishing(self) -> None:
        pass  # a send is acknowledged at once: nothing is ever in flight

    async def store_epoch(self, epoch: int) -> None:
        pass  # nothing outlives a non-persistent topic's owner

    def disconnect_clients(self, assigned_url: str | None = None) -> None:
        """Unloading: producers and consumers are told to reconnect (to the owner; the
        broker at ``assigned_url`` when the topic is handed over)."""
        self.producers.close_all(assigned_url)
        for subscription in self.subscriptions.values():
            for consumer in list(subscription.consumers):
                consumer.connection.close_consumer(subscription, consumer, assigned_url)

    async def delete(self, *, force: bool) -> None:
        busy = len(self.producers) + sum(len(s.consumers) for s in self.subscriptions.values())
        if busy and not force:
            raise TopicBusyError(
                f"topic {self.name} has {busy} producer(s)/consumer(s); use force=true"
            )
        self.producers.close_all()
        for subscription in self.subscriptions.values():
            for consumer in list(subscription.consumers):
                consumer.connection.close()
        self.subscriptions.clear()

    async def close(self) -> None:
        for subscription in self.subscriptions.values():
            await subscription.close()
