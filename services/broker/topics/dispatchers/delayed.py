"""Delayed delivery for shared and key_shared subscriptions (Pulsar's in-memory delayed
delivery tracker): a message whose ``deliver_at_time`` is still ahead when the dispatcher reads
it is held here and handed back when its time comes.

The index lives in memory only. It rebuilds itself after a restart or a move: the cursor reads
again from the first unacknowledged message, and every delayed one is held again on the way.
Exclusive and failover subscriptions deliver at once, as Pulsar does.
"""

from __future__ import annotations

import heapq

from magnetar.broker.model.position import Position


class DelayedDeliveryTracker:
    def __init__(self) -> None:
        self._heap: list[tuple[int, Position]] = []
        self._held: set[Position] = set()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, position: Position) -> bool:
        return position in self._held

    def hold(self, position: Position, deliver_at_ms: int) -> None:
        if position not in self._held:
            self._held.add(position)
            heapq.heappush(self._heap, (deliver_at_ms, position))

    def due(self, now_ms: int) -> list[Position]:
        """Positions whose time has come, now released."""
        released = []
        while self._heap and self._heap[0][0] <= now_ms:
            _, position = heapq.heappop(self._heap)
            if position in self._held:
                self._held.discard(position)
                released.append(position)
        return released

    def next_deliver_at(self) -> int | None:
        while self._heap and self._heap[0][1] not in self._held:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def forget(self, position: Position) -> None:
        """Acknowledged (or trimmed) before its time: nothing to deliver."""
        self._held.discard(position)

    def clear(self) -> None:
        self._heap.clear()
        self._held.clear()
