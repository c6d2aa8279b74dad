"""Key_Shared subscriptions: the 16-bit key-hash space is split among the consumers (consistent
hashing, or sticky ranges the consumers bring; see ``hash_assignment``), so all messages of a key
go to one consumer, in order.

Invariant: a key hash is never unacknowledged on two consumers at once. When the space moves (a
consumer joins or leaves), a hash whose messages are still pending on its previous consumer is
"draining": its messages wait until those are acknowledged (or replayed after that consumer
leaves), while every other hash keeps flowing.

Messages that cannot go out yet (no owner, owner without permits, draining hash) and messages to
send again (a consumer left, redelivery requests) wait in one set of positions. Each round
looks at them first, in position order, then at new entries from the cursor; once a message of a
hash waits, later messages of that hash in the round wait too, which keeps per-key order
(including replays before newer messages).

A consumer that subscribes with ``allowOutOfOrderDelivery`` is not held back by draining hashes:
it may get a key's newer messages while older ones are still unacknowledged elsewhere."""

from __future__ import annotations

import base64

from magnetar.broker.model.entry import entry_metadata, entry_payload
from magnetar.broker.model.position import Position
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.base import ConsumerBusyError, ReplayingDispatcher
from magnetar.broker.topics.dispatchers.hash_assignment import AssignmentConflict, HashAssignment
from magnetar.broker.topics.dispatchers.key_hash import NONE_KEY, key_hash
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

#: At most this many waiting positions; beyond it no new entries are read until some go out.
MAX_WAITING = 10_000


def _key_of(metadata: pb.MessageMetadata | pb.SingleMessageMetadata) -> bytes | None:
    if metadata.HasField("ordering_key") and metadata.ordering_key:
        return metadata.ordering_key
    if metadata.HasField("partition_key") and metadata.partition_key:
        if metadata.partition_key_b64_encoded:
            try:
                return base64.b64decode(metadata.partition_key)
            except ValueError:
                pass
        return metadata.partition_key.encode()
    return None


def sticky_key(stored: bytes, metadata: pb.MessageMetadata | None = None) -> bytes:
    """The key an entry is routed by: ordering key, else partition key, else ``NONE_KEY``.

    A batch whose own metadata has no key is routed by its first message's key (key-based
    batching puts one key per batch); a compressed one cannot be looked into and has none.
    ``metadata``: the entry's, when the caller decoded it already."""
    if metadata is None:
        metadata = entry_metadata(stored)
    key = _key_of(metadata)
    if key is None and codec.is_batch(metadata) and metadata.compression == pb.NONE:
        try:
            first = codec.split_batch(entry_payload(stored), metadata.num_messages_in_batch)[0][0]
        except (codec.BatchError, IndexError):
            first = None
        if first is not None:
            key = _key_of(first)
    return NONE_KEY if key is None else key


def sticky_ranges(consumer: Consumer) -> list[tuple[int, int]] | None:
    meta = consumer.key_shared_meta
    if meta is None or meta.keySharedMode != pb.KeySharedMode.STICKY:
        return None
    return [(r.start, r.end) for r in meta.hashRanges]


def _out_of_order_ok(consumer: Consumer) -> bool:
    """The consumer asked for allowOutOfOrderDelivery: it need not wait for draining hashes."""
    meta = consumer.key_shared_meta
    return meta is not None and meta.allowOutOfOrderDelivery


class KeySharedDispatcher(ReplayingDispatcher):
    def __init__(self, subscription) -> None:  # type: ignore[no-untyped-def]
        super().__init__(subscription)
        self.assignment: HashAssignment[Consumer] = HashAssignment()
        # ``replay`` (from the base) also holds what the cursor read past but could not send
        # yet (held back).
        #: Key hash of every position that is waiting or was dispatched.
        self._hash_of: dict[Position, int] = {}

    # -- consumers -----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        try:
            self.assignment.add(consumer, consumer.name, sticky_ranges(consumer))
        except AssignmentConflict as e:
            raise ConsumerBusyError(f"key_shared subscription {self.subscription}: {e}") from e
        super().add_consumer(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.assignment.remove(consumer)
        super().remove_consumer(consumer)
        if not self.consumers:
            # Nobody left: forget in-memory state and start again from the first unacked entry
            # (also what a seek needs: the cursor was reset before its consumers were removed).
            self.replay.clear()
            self.delayed.clear()
            self._hash_of.clear()
            self.cursor.rewind()

    # -- dispatching ---------------------------------------------------------------------------

    def _owners(self) -> dict[int, Consumer]:
        """Key hash -> the consumer that has messages of it pending."""
        owners: dict[int, Consumer] = {}
        for consumer in self.consumers:
            for position in consumer.pending:
                h = self._hash_of.get(position)
                if h is not None:
                    owners.setdefault(h, consumer)
        return owners

    def _target(self, h: int, owners: dict[int, Consumer], blocked: set[int]) -> Consumer | None:
        """Who gets a message of hash ``h`` now, or None if it has to wait."""
        if h in blocked:
            return None
        consumer = self.assignment.select(h)
        if consumer is None or not consumer.ready:
            return None
        owner = owners.get(h)
        if owner is not None and owner is not consumer and not _out_of_order_ok(consumer):
            return None  # draining: pending on its previous consumer
        return consumer

    async def dispatch_round(self) -> bool:
        self.release_due()
        if not any(c.ready for c in self.consumers):
            return False
        self._forget_stale_hashes()
        owners = self._owners()
        blocked: set[int] = set()
        sent = False
        # Waiting messages first, in position order.
        for position in sorted(self.replay):
            if position not in self.replay:
                continue
            if self.cursor.is_acked(position):
                self.replay.discard(position)
                continue
            h = self._hash_of.get(position)
            if h is not None and self._target(h, owners, blocked) is None:
                blocked.add(h)
                continue
            found = await self.cursor.ml.read_entries(position, 1)
            if not found or found[0][0] != position or self.cursor.is_acked(position):
                self.replay.discard(position)  # trimmed away, or acked while it was read
                continue
            stored = found[0][1]
            if h is None:
                h = self._hash_of[position] = key_hash(sticky_key(stored))
            # Consumers may have come or gone while reading: decide again.
            consumer = self._target(h, owners, blocked)
            if consumer is None or position not in self.replay:
                blocked.add(h)
                continue
            self.replay.discard(position)
            self.send(consumer, position, stored)
            owners[h] = consumer
            sent = True
        # Then new entries.
        budget = sum(c.permits for c in self.consumers if c.ready)
        if (
            budget <= 0
            or len(self.replay) >= MAX_WAITING
            or not self.cursor.has_more_entries
            or self.subscription_full()
        ):
            return sent
        read = await self.cursor.read_entries(self.entries_to_read(budget))
        entries = self.without_markers(read)
        for position, stored, count, deliver_at in entries:
            if self.hold_until(position, deliver_at):
                continue
            metadata = entry_metadata(stored)
            h = self._hash_of[position] = key_hash(sticky_key(stored, metadata))
            consumer = self._target(h, owners, blocked)
            if consumer is None:
                blocked.add(h)
                self.replay.add(position)
                continue
            self.send(consumer, position, stored, count)
            owners[h] = consumer
        return sent or bool(read)

    def _forget_stale_hashes(self) -> None:
        live = len(self.replay) + sum(len(c.pending) for c in self.consumers)
        if len(self._hash_of) <= 2 * live + 1000:
            return
        keep = set(self.replay)
        for consumer in self.consumers:
            keep.update(consumer.pending)
        self._hash_of = {p: h for p, h in self._hash_of.items() if p in keep}
