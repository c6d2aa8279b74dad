"""A persistent topic: its managed ledger, its producers and its subscriptions."""

from __future__ import annotations

import asyncio
import logging

from magnetar.broker.consumer import Consumer
from magnetar.broker.managed_ledger import ManagedLedger, Position
from magnetar.broker.subscription import Subscription
from magnetar.broker.topic_name import TopicName
from magnetar.common.proto import pulsar_api_pb2 as pb

log = logging.getLogger(__name__)


class PersistentTopic:
    def __init__(self, name: TopicName, ml: ManagedLedger, dispatch_batch: int) -> None:
        self.name = name
        self.ml = ml
        self.dispatch_batch = dispatch_batch
        self.subscriptions: dict[str, Subscription] = {}
        self.producers: set[object] = set()
        self._subscribe_lock = asyncio.Lock()

    def publish(self, stored: bytes) -> asyncio.Future[Position]:
        """Append one entry (a producer's payload section); resolves once it is durable."""
        future = self.ml.add_entry_async(stored)
        future.add_done_callback(self._published)
        return future

    def _published(self, future: asyncio.Future[Position]) -> None:
        if not future.cancelled() and future.exception() is None:
            for subscription in self.subscriptions.values():
                subscription.dispatcher.wake()

    async def subscribe(
        self, consumer: Consumer, name: str, sub_type: int, initial_position: int
    ) -> Subscription:
        async with self._subscribe_lock:
            subscription = self.subscriptions.get(name)
            if subscription is None:
                initial = (
                    "earliest" if initial_position == pb.CommandSubscribe.Earliest else "latest"
                )
                cursor = await self.ml.open_cursor(name, initial)
                subscription = Subscription(self, name, cursor, sub_type, self.dispatch_batch)
                self.subscriptions[name] = subscription
            subscription.add_consumer(consumer, sub_type)
            return subscription

    async def unsubscribe(self, name: str) -> None:
        subscription = self.subscriptions.pop(name, None)
        if subscription is not None:
            await subscription.close()
        await self.ml.delete_cursor(name)

    async def close(self) -> None:
        for subscription in self.subscriptions.values():
            await subscription.close()
        await self.ml.close()
