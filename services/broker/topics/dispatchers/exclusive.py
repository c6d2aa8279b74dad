"""Exclusive subscriptions: one consumer; a second one is refused (ConsumerBusy). Messages go out
in order from the cursor's read position; a consumer that leaves, or asks for redelivery, makes
the cursor rewind to the first unacknowledged message."""

from __future__ import annotations

from magnetar.broker.model.position import Position
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.base import ConsumerBusyError, Dispatcher


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
        return await self.dispatch_in_order(self.consumers[0])

    async def dispatch_in_order(self, consumer: Consumer) -> bool:
        """Send ``consumer`` the next entries from the read position, as far as its permits
        go; what it cannot take now stays unread."""
        if not consumer.ready or not self.cursor.has_more_entries:
            return False
        read = await self.cursor.read_entries(self.entries_to_read(consumer.permits))
        entries = self.without_markers(read)
        # Nothing awaits from here on: the consumer serving now serves the whole run.
        stop, _ = self.send_run(consumer, entries) if self.still_serves(consumer) else (0, False)
        if stop < len(entries):
            self.cursor.unread(entries[stop][0])
            return stop > 0
        return bool(read)

    def still_serves(self, consumer: Consumer) -> bool:
        """Whether ``consumer`` is still the one this subscription dispatches to."""
        return consumer in self.consumers

    def release(self, consumer: Consumer) -> None:
        self._rewind(consumer)

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        # In order-preserving modes any redelivery request resends everything unacknowledged.
        self._rewind(consumer)
        self.wake()

    def _rewind(self, consumer: Consumer) -> None:
        for position in consumer.pending:
            self.redelivered(position)
        consumer.clear_pending()
        self.cursor.rewind()
