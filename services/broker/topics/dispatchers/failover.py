"""Failover subscriptions: many consumers, one active. Consumers are ordered by priority level,
then name; for partition ``p`` of a partitioned topic the active one is ``p mod n`` (0 for a
non-partitioned topic), which spreads partitions over consumers. Every consumer is told whether
it is active (ACTIVE_CONSUMER_CHANGE). When the active consumer changes, the cursor rewinds so
the new one gets every unacknowledged message."""

from __future__ import annotations

from magnetar.broker.model.position import Position
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.exclusive import ExclusiveDispatcher
from magnetar.common.proto import pulsar_api_pb2 as pb


class FailoverDispatcher(ExclusiveDispatcher):
    def __init__(self, subscription) -> None:  # type: ignore[no-untyped-def]
        super().__init__(subscription)
        self.active: Consumer | None = None

    def add_consumer(self, consumer: Consumer) -> None:
        super(ExclusiveDispatcher, self).add_consumer(consumer)  # no ConsumerBusy here
        self._elect()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            consumer.closed = True
            if consumer is self.active:
                self._rewind(consumer)
                self.active = None
            self._elect()
            self.wake()

    def _elect(self) -> None:
        if not self.consumers:
            self.active = None
            return
        chosen = active_consumer(self.consumers, self.subscription.topic.name)
        if chosen is not self.active:
            if self.active is not None:
                self._rewind(self.active)
            self.active = chosen
        for consumer in self.consumers:
            consumer.connection.send(
                pb.CommandActiveConsumerChange(
                    consumer_id=consumer.consumer_id, is_active=consumer is chosen
                )
            )
        self.wake()

    async def dispatch_round(self) -> bool:
        if self.active is None:
            return False
        return await self.dispatch_in_order(self.active)

    def still_serves(self, consumer: Consumer) -> bool:
        return consumer is self.active

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        if consumer is self.active:
            super().redeliver(consumer, positions)


def active_consumer(consumers: list[Consumer], topic: TopicName) -> Consumer | None:
    """The active consumer: ordered by priority level then name, number ``p mod n`` for
    partition ``p`` (0 for a topic that is not a partition)."""
    if not consumers:
        return None
    ordered = sorted(consumers, key=lambda c: (c.priority, c.name))
    return ordered[max(topic.partition_index, 0) % len(ordered)]
