"""Producer access modes of a topic (Pulsar's ProducerAccessMode), with the answers Pulsar gives
(AbstractTopic.incrementTopicEpochIfNeeded, then internalAddProducer for the name):

- Shared: any number of producers, unless an exclusive producer holds the topic or waits for it
  (ProducerBusy).
- Exclusive: only when no other producer is attached or waiting. An exclusive producer holding
  or awaiting the topic, or shared producers on it, answer ProducerFenced, as does a reconnecting
  producer whose topic epoch is older than the topic's.
- WaitForExclusive: queues until the topic has no producer, then holds it exclusively.
- ExclusiveWithFencing: closes every other producer and takes the topic.

A producer name is attached once per topic: a second producer of the same name is ProducerBusy.
Each exclusive acquisition increments the topic epoch, returned to the producer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from magnetar.broker.topics.rates import now_iso
from magnetar.common.proto import pulsar_api_pb2 as pb

Mode = int
ProducerKey = tuple[int, int]  # (connection identity, producer id)
Fence = Callable[[str | None], None]


class ProducerBusyError(Exception):
    """The access mode does not allow this producer now, or its name is taken (ProducerBusy)."""


class ProducerFencedError(Exception):
    """An exclusive producer cannot have the topic: another one holds it or waits for it, shared
    producers are on it, or the topic's epoch moved past the one it held. Pulsar's clients stop
    retrying on this answer (ProducerFenced)."""


#: Pulsar's names of the access modes, as its publisher stats show them.
ACCESS_MODES = {
    pb.Shared: "Shared",
    pb.Exclusive: "Exclusive",
    pb.WaitForExclusive: "WaitForExclusive",
    pb.ExclusiveWithFencing: "ExclusiveWithFencing",
}


@dataclass(slots=True)
class _Attached:
    name: str
    fence: Fence  # closes the producer, naming the broker to reconnect to when that is known
    producer_id: int = -1
    mode: Mode = pb.Shared
    connected_since: str = field(default_factory=now_iso)
    #: Messages and bytes this producer had stored (its publisher stats).
    messages: int = 0
    bytes: int = 0


@dataclass(slots=True, frozen=True)
class PublisherView:
    """One attached producer as the topic's stats show it."""

    producer_id: int
    name: str
    access_mode: str
    connected_since: str
    messages: int
    bytes: int


class ProducerSet:
    def __init__(self) -> None:
        self._producers: dict[ProducerKey, _Attached] = {}
        self._by_name: dict[str, ProducerKey] = {}
        self._exclusive: ProducerKey | None = None
        self._waiting = 0  # WaitForExclusive producers queued for the topic
        self._released = asyncio.Event()
        self.topic_epoch = 0
        #: The namespace's maxProducersPerTopic (0: no limit).
        self.max_producers = 0

    def __len__(self) -> int:
        return len(self._producers)

    async def add(
        self,
        key: ProducerKey,
        mode: Mode,
        fence: Fence,
        epoch: int | None = None,
        *,
        name: str,
    ) -> int:
        """Attach producer ``name``; returns the topic epoch. ``fence(url)`` closes it (telling
        the client to reconnect to ``url`` when that is known) if another producer takes the
        topic with ExclusiveWithFencing or the topic goes away. ``epoch``: the epoch an
        exclusive producer held before it reconnected; older than the topic's means it was
        fenced meanwhile."""
        if self.max_producers > 0 and len(self._producers) >= self.max_producers:
            raise ProducerBusyError("Topic reached max producers limit")
        if mode == pb.Shared:
            if self._exclusive is not None or self._waiting:
                raise ProducerBusyError(
                    f"the topic has an existing exclusive producer: {self._exclusive_name()}"
                )
        elif mode == pb.Exclusive:
            if self._exclusive is not None or self._waiting:
                raise ProducerFencedError(
                    f"the topic has an existing exclusive producer: {self._exclusive_name()}"
                )
            if self._producers:
                raise ProducerFencedError(
                    f"the topic has existing shared producers ({len(self._producers)})"
                )
            self._check_epoch(epoch)
        elif mode == pb.WaitForExclusive:
            self._check_epoch(epoch)
            self._waiting += 1
            try:
                while self._producers:
                    self._released.clear()
                    await self._released.wait()
            finally:
                self._waiting -= 1
        elif mode == pb.ExclusiveWithFencing:
            self._check_epoch(epoch)
            for other in list(self._producers):
                self._pop(other).fence(None)
        else:
            raise ProducerBusyError(f"unknown access mode {mode}")
        if name in self._by_name:
            raise ProducerBusyError(f"a producer named {name!r} is already connected to the topic")
        self._producers[key] = _Attached(name, fence, key[1], mode)
        self._by_name[name] = key
        if mode != pb.Shared:
            self._exclusive = key
            self.topic_epoch += 1
        return self.topic_epoch

    def count(self, name: str, messages: int, size: int) -> None:
        """Producer ``name`` stored ``messages`` messages in ``size`` bytes."""
        key = self._by_name.get(name)
        attached = None if key is None else self._producers.get(key)
        if attached is not None:
            attached.messages += messages
            attached.bytes += size

    def attached(self) -> list[PublisherView]:
        return [
            PublisherView(
                a.producer_id,
                a.name,
                ACCESS_MODES.get(a.mode, "Shared"),
                a.connected_since,
                a.messages,
                a.bytes,
            )
            for a in self._producers.values()
        ]

    def _check_epoch(self, epoch: int | None) -> None:
        if epoch is not None and epoch < self.topic_epoch:
            raise ProducerFencedError(
                f"the topic epoch moved on to {self.topic_epoch} (the producer held {epoch}): "
                "another exclusive producer took the topic"
            )

    def _exclusive_name(self) -> str:
        attached = None if self._exclusive is None else self._producers.get(self._exclusive)
        return attached.name if attached else "(one waiting for the topic)"

    def _pop(self, key: ProducerKey) -> _Attached:
        attached = self._producers.pop(key)
        if self._by_name.get(attached.name) == key:
            del self._by_name[attached.name]
        if key == self._exclusive:
            self._exclusive = None
        return attached

    def remove(self, key: ProducerKey) -> None:
        if key in self._producers:
            self._pop(key)
            if not self._producers:
                self._released.set()

    def close_all(self, assigned_url: str | None = None) -> None:
        """Close every producer (the topic is going away): each is told with CLOSE_PRODUCER,
        naming the broker to reconnect to when the topic is handed over."""
        producers, self._producers, self._by_name = self._producers, {}, {}
        self._exclusive = None
        for attached in producers.values():
            attached.fence(assigned_url)
        self._released.set()
