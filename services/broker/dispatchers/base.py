"""What every dispatcher shares: its consumers, and a task that dispatches whenever something
changes (permits, new entries, acks, consumers joining or leaving)."""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import TYPE_CHECKING

from magnetar.broker.consumer import Consumer
from magnetar.broker.entry import message_count
from magnetar.broker.managed_ledger import ManagedLedgerError, Position

if TYPE_CHECKING:
    from magnetar.broker.subscription import Subscription

log = logging.getLogger(__name__)


class ConsumerBusyError(Exception):
    """The subscription does not take another consumer (exclusive mode)."""


class Dispatcher(abc.ABC):
    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.cursor = subscription.cursor
        self.consumers: list[Consumer] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"dispatch-{self.subscription}"
            )
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            consumer.closed = True
            self.release(consumer)
            self.wake()

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while self.consumers:
            self._wake.clear()
            try:
                progressed = await self.dispatch_round()
            except ManagedLedgerError as e:
                log.warning("subscription %s: cannot read entries: %s", self.subscription, e)
                progressed = False
                await asyncio.sleep(0.5)
            if not progressed:
                await self._wake.wait()

    def send(
        self, consumer: Consumer, position: Position, stored: bytes, count: int | None = None
    ) -> None:
        """Dispatch one entry, with its redelivery count and the batch indexes already acked
        (``count``: its messages, when the caller knows them already)."""
        if count is None:
            count = message_count(stored)
        if count > 1:
            self.subscription.batch_sizes[position] = count
        consumer.send(
            position,
            stored,
            count,
            self.subscription.redelivery_counts.get(position, 0),
            self.cursor.acked_batch_indexes(position),
        )

    def redelivered(self, position: Position) -> None:
        counts = self.subscription.redelivery_counts
        counts[position] = counts.get(position, 0) + 1

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

    def release(self, consumer: Consumer) -> None:
        for position in consumer.pending:
            self.redelivered(position)
            self.replay.add(position)
        consumer.pending.clear()

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        chosen = (
            list(consumer.pending)
            if positions is None
            else [p for p in positions if p in consumer.pending]
        )
        for position in chosen:
            consumer.pending.pop(position, None)
            self.redelivered(position)
            self.replay.add(position)
        self.wake()
