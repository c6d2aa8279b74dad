"""Exclusive subscriptions: one consumer; a second one is refused (ConsumerBusy). Messages go out
in order from the cursor's read position; a consumer that leaves, or asks for redelivery, makes
the cursor rewind to the first unacknowledged message."""

from __future__ import annotations

from magnetar.broker.consumer import Consumer
from magnetar.broker.dispatchers.base import ConsumerBusyError, Dispatcher
from magnetar.broker.managed_ledger import Position


class ExclusiveDispatcher(Dispatcher):
    def add_consumer(self, consumer: Consumer) -> None:
        if self.consumers:
            raise ConsumerBusyError(
                f"exclusive subscription {self.subscription} already has a consumer"
            )
        super().add_consumer(consumer)

    async def dispatch_round(self) -> bool:
        if not self.consumers:
            return False
        consumer = self.consumers[0]
        if consumer.permits <= 0 or not self.cursor.has_more_entries:
            return False
        entries = await self.cursor.read_entries(
            min(consumer.permits, self.subscription.dispatch_batch)
        )
        for position, stored in entries:
            if consumer.closed:
                break
            self.send(consumer, position, stored)
        return bool(entries)

    def release(self, consumer: Consumer) -> None:
        self._rewind(consumer)

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        # In order-preserving modes any redelivery request resends everything unacknowledged.
        self._rewind(consumer)
        self.wake()

    def _rewind(self, consumer: Consumer) -> None:
        for position in consumer.pending:
            self.redelivered(position)
        consumer.pending.clear()
        self.cursor.rewind()
