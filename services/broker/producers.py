"""Producer access modes of a topic (Pulsar's ProducerAccessMode):

- Shared: any number of producers, unless an exclusive one holds the topic (ProducerBusy).
- Exclusive: only when no other producer is attached (else ProducerBusy).
- WaitForExclusive: queues until the topic has no producer, then holds it exclusively.
- ExclusiveWithFencing: closes every other producer and takes the topic.

Each exclusive acquisition increments the topic epoch, returned to the producer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from magnetar.common.proto import pulsar_api_pb2 as pb

Mode = int
ProducerKey = tuple[int, int]  # (connection identity, producer id)


class ProducerBusyError(Exception):
    """The access mode does not allow this producer now."""


class ProducerFencedError(Exception):
    """The producer was fenced: the topic's epoch moved past the one it held. Pulsar's
    clients stop retrying on this answer."""


class ProducerSet:
    def __init__(self) -> None:
        self._producers: dict[
            ProducerKey, Callable[[str | None], None]
        ] = {}  # key -> how to fence it
        self._exclusive: ProducerKey | None = None
        self._released = asyncio.Event()
        self.topic_epoch = 0

    def __len__(self) -> int:
        return len(self._producers)

    async def add(
        self,
        key: ProducerKey,
        mode: Mode,
        fence: Callable[[str | None], None],
        epoch: int | None = None,
    ) -> int:
        """Attach a producer; returns the topic epoch. ``fence(url)`` closes it (telling the
        client to reconnect to ``url`` when that is known) if another producer takes the
        topic with ExclusiveWithFencing or the topic goes away. ``epoch``: the epoch an exclusive producer
        held before it reconnected; older than the topic's means it was fenced meanwhile."""
        if mode != pb.Shared and epoch is not None and epoch < self.topic_epoch:
            raise ProducerFencedError(
                f"the topic epoch moved on to {self.topic_epoch} (the producer held {epoch}): "
                "another exclusive producer took the topic"
            )
        if mode == pb.Shared:
            if self._exclusive is not None:
                raise ProducerBusyError("the topic has an exclusive producer")
        elif mode == pb.Exclusive:
            if self._producers:
                raise ProducerBusyError(f"the topic has {len(self._producers)} other producer(s)")
        elif mode == pb.WaitForExclusive:
            while self._producers:
                self._released.clear()
                await self._released.wait()
        elif mode == pb.ExclusiveWithFencing:
            for other, fence_other in list(self._producers.items()):
                self._producers.pop(other, None)
                fence_other(None)
            self._exclusive = None
        else:
            raise ProducerBusyError(f"unknown access mode {mode}")
        self._producers[key] = fence
        if mode != pb.Shared:
            self._exclusive = key
            self.topic_epoch += 1
        return self.topic_epoch

    def remove(self, key: ProducerKey) -> None:
        if self._producers.pop(key, None) is not None:
            if key == self._exclusive:
                self._exclusive = None
            if not self._producers:
                self._released.set()

    def close_all(self, assigned_url: str | None = None) -> None:
        """Close every producer (the topic is going away): each is told with CLOSE_PRODUCER,
        naming the broker to reconnect to when the topic is handed over."""
        producers, self._producers = self._producers, {}
        self._exclusive = None
        for fence in producers.values():
            fence(assigned_url)
        self._released.set()
