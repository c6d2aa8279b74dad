"""Dispatchers of non-persistent subscriptions, one per mode: nothing is stored, so each
published message goes at once to the consumer the mode chooses, if that one can take it now
(permits, a draining connection); otherwise the subscription drops it and counts it.

The choice follows the persistent dispatchers' rules: exclusive and failover send to the active
consumer (``failover.active_consumer``), shared round-robins over the best priority level with
permits (``shared.next_by_priority``), key_shared sends to the owner of the key's hash
(``hash_assignment``)."""

from __future__ import annotations

import abc
import itertools
from typing import TYPE_CHECKING

from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.base import ConsumerBusyError
from magnetar.broker.topics.dispatchers.failover import active_consumer
from magnetar.broker.topics.dispatchers.hash_assignment import AssignmentConflict, HashAssignment
from magnetar.broker.topics.dispatchers.key_hash import key_hash
from magnetar.broker.topics.dispatchers.key_shared import sticky_key, sticky_ranges
from magnetar.broker.topics.dispatchers.shared import next_by_priority
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.model.topic_name import TopicName

Sub = pb.CommandSubscribe


class LiveDispatcher(abc.ABC):
    def __init__(self, topic: TopicName, subscription: str) -> None:
        self.topic = topic
        self.subscription = subscription
        self.consumers: list[Consumer] = []

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            consumer.closed = True

    def choose(self, stored: bytes, metadata: pb.MessageMetadata) -> Consumer | None:
        """Who gets this message now, or None (it is dropped for this subscription)."""
        chosen = self.select(stored, metadata)
        return chosen if chosen is not None and chosen.ready else None

    @abc.abstractmethod
    def select(self, stored: bytes, metadata: pb.MessageMetadata) -> Consumer | None:
        """The consumer the mode picks, ready or not."""


class LiveFailoverDispatcher(LiveDispatcher):
    def add_consumer(self, consumer: Consumer) -> None:
        super().add_consumer(consumer)
        self._announce_active()

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        self._announce_active()

    def _announce_active(self) -> None:
        active = active_consumer(self.consumers, self.topic)
        for consumer in self.consumers:
            consumer.connection.send(
                pb.CommandActiveConsumerChange(
                    consumer_id=consumer.consumer_id, is_active=consumer is active
                )
            )

    def select(self, stored: bytes, metadata: pb.MessageMetadata) -> Consumer | None:
        return active_consumer(self.consumers, self.topic)


class LiveExclusiveDispatcher(LiveDispatcher):
    def add_consumer(self, consumer: Consumer) -> None:
        if self.consumers:
            raise ConsumerBusyError(
                f"exclusive subscription {self.topic}/{self.subscription} already has a consumer"
            )
        super().add_consumer(consumer)

    def select(self, stored: bytes, metadata: pb.MessageMetadata) -> Consumer | None:
        return self.consumers[0] if self.consumers else None


class LiveSharedDispatcher(LiveDispatcher):
    def __init__(self, topic: TopicName, subscription: str) -> None:
        super().__init__(topic, subscription)
        self._turn = itertools.count()

    def select(self, stored: bytes, metadata: pb.MessageMetadata) -> Consumer | None:
        return next_by_priority(self.consumers, self._turn)


class LiveKeySharedDispatcher(LiveDispatcher):
    def __init__(self, topic: TopicName, subscription: str) -> None:
        super().__init__(topic, subscription)
        self.assignment: HashAssignment[Consumer] = HashAssignment()

    def add_consumer(self, consumer: Consumer) -> None:
        try:
            self.assignment.add(consumer, consumer.name, sticky_ranges(consumer))
        except AssignmentConflict as e:
            raise ConsumerBusyError(
                f"key_shared subscription {self.topic}/{self.subscription}: {e}"
            ) from e
        super().add_consumer(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.assignment.remove(consumer)
        super().remove_consumer(consumer)

    def select(self, stored: bytes, metadata: pb.MessageMetadata) -> Consumer | None:
        return self.assignment.select(key_hash(sticky_key(stored, metadata)))


_BY_MODE: dict[int, type[LiveDispatcher]] = {
    Sub.Exclusive: LiveExclusiveDispatcher,
    Sub.Failover: LiveFailoverDispatcher,
    Sub.Shared: LiveSharedDispatcher,
    Sub.Key_Shared: LiveKeySharedDispatcher,
}


def for_live_mode(sub_type: int, topic: TopicName, subscription: str) -> LiveDispatcher:
    kind = _BY_MODE.get(sub_type)
    if kind is None:
        raise NotImplementedError(
            f"subscription type {Sub.SubType.Name(sub_type)} is not served yet"
        )
    return kind(topic, subscription)
