"""A namespace's limits on a topic's clients (Pulsar's maxProducersPerTopic,
maxConsumersPerTopic, maxConsumersPerSubscription, maxUnackedMessagesPerConsumer and
-PerSubscription), checked where producers and consumers attach, with Pulsar's refusals:
ProducerBusy "Topic reached max producers limit", ConsumerBusy "Topic reached max consumers
limit" / "Subscription reached max consumers limit"."""

from __future__ import annotations

from collections.abc import Mapping, Sized
from dataclasses import replace
from typing import Protocol

from magnetar.broker.namespace.policies import TopicLimits
from magnetar.broker.topics.dispatch_limits import DispatchLimits
from magnetar.broker.topics.dispatchers.base import ConsumerBusyError

TOPIC_PRODUCERS = "Topic reached max producers limit"
TOPIC_CONSUMERS = "Topic reached max consumers limit"
SUBSCRIPTION_CONSUMERS = "Subscription reached max consumers limit"


class _HasConsumers(Protocol):
    @property
    def consumers(self) -> Sized: ...


def check_consumers(
    limits: TopicLimits, subscriptions: Mapping[str, _HasConsumers], name: str
) -> None:
    """Raises ConsumerBusyError if one more consumer on subscription ``name`` is over a limit."""
    if limits.max_consumers_per_topic > 0:
        attached = sum(len(s.consumers) for s in subscriptions.values())
        if attached >= limits.max_consumers_per_topic:
            raise ConsumerBusyError(TOPIC_CONSUMERS)
    subscription = subscriptions.get(name)
    if (
        subscription is not None
        and limits.max_consumers_per_subscription > 0
        and len(subscription.consumers) >= limits.max_consumers_per_subscription
    ):
        raise ConsumerBusyError(SUBSCRIPTION_CONSUMERS)


def dispatch_limits(base: DispatchLimits, limits: TopicLimits) -> DispatchLimits:
    """The broker's dispatch limits with the namespace's unacked bounds over them."""
    changed = {}
    if limits.max_unacked_per_consumer is not None:
        changed["max_unacked_per_consumer"] = limits.max_unacked_per_consumer
    if limits.max_unacked_per_subscription is not None:
        changed["max_unacked_per_subscription"] = limits.max_unacked_per_subscription
    return replace(base, **changed) if changed else base
