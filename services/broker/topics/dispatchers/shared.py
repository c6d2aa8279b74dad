"""Shared subscriptions: messages go round-robin to the consumers that have permits, those of
the best priority level first. Unacked messages of a consumer that leaves (or asks for
redelivery, or negatively acks) are put in a replay set and sent to the others before new
messages. Only individual acks. Messages with a delivery time still ahead are held
(``delayed.py``) and join the replay set when it comes."""

from __future__ import annotations

import itertools

from magnetar.broker.model.entry import dispatch_facts
from magnetar.broker.model.position import Position
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.base import ReplayingDispatcher


class SharedDispatcher(ReplayingDispatcher):
    def __init__(self, subscription) -> None:  # type: ignore[no-untyped-def]
        super().__init__(subscription)
        self._turn = itertools.count()

    def _next_consumer(self) -> Consumer | None:
        return next_by_priority(self.consumers, self._turn)

    async def dispatch_round(self) -> bool:
        self.release_due()
        budget = sum(c.permits for c in self.consumers if c.ready)
        if budget <= 0:
            return False
        entries = [
            (position, stored, *dispatch_facts(stored))
            for position, stored in await self._replay_entries(self.entries_to_read(budget))
        ]
        replayed = bool(entries)
        if not entries and self.cursor.has_more_entries and not self.subscription_full():
            read = await self.cursor.read_entries(self.entries_to_read(budget))
            entries = self.without_markers(read)
            if read and not entries:
                return True  # only markers: read on
        if len(self.consumers) == 1:  # the usual case: the whole round goes to one consumer
            stop, sent = self.send_run(
                self.consumers[0], entries, None if replayed else self.hold_until
            )
            if stop < len(entries):
                self._leave(entries[stop:], replayed)
            return sent
        sent = False
        for i, (position, stored, count, deliver_at) in enumerate(entries):
            if not replayed and deliver_at and self.hold_until(position, deliver_at):
                continue
            consumer = self._next_consumer()
            if consumer is None:  # permits ran out (batches count more than one)
                self._leave(entries[i:], replayed)
                break
            self.send(consumer, position, stored, count)
            sent = True
        return sent

    def _leave(self, rest: list[tuple[Position, bytes, int, int]], replayed: bool) -> None:
        """Entries no consumer had permits for: back to the replay set, or left unread."""
        if replayed:
            self.replay.update(entry[0] for entry in rest)
        else:
            self.cursor.unread(rest[0][0])

    async def _replay_entries(self, limit: int) -> list[tuple[Position, bytes]]:
        entries = []
        for position in sorted(self.replay)[:limit]:
            self.replay.discard(position)
            if self.cursor.is_acked(position):
                continue
            found = await self.cursor.ml.read_entries(position, 1)
            if found and found[0][0] == position:
                entries.append(found[0])
        # An ack may have come while a read waited.
        return [(p, stored) for p, stored in entries if not self.cursor.is_acked(p)]


def next_by_priority(consumers: list[Consumer], turn: itertools.count[int]) -> Consumer | None:
    """Round robin among the ready consumers of the best priority level (0 is the best): a
    lower level gets messages only while every consumer above it has no permits."""
    if len(consumers) == 1:  # the usual case: no list to build
        return consumers[0] if consumers[0].ready else None
    ready = [c for c in consumers if c.ready]
    if len(ready) <= 1:
        return ready[0] if ready else None
    best = min(c.priority for c in ready)
    level = [c for c in ready if c.priority == best]
    return level[next(turn) % len(level)]
