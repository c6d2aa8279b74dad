"""A consumer attached to a subscription over one client connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from magnetar.broker.model.position import Position
from magnetar.broker.topics.rates import now_iso
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

if TYPE_CHECKING:
    from magnetar.broker.topics.nonpersistent import NonPersistentSubscription
    from magnetar.broker.topics.subscription import Subscription


class ConsumerChannel(Protocol):
    """What topics and dispatchers use of the client connection a consumer came on (the
    protocol room's ``ServerConnection`` provides it; topics never import it)."""

    #: False while the connection's outgoing buffer is above its high-water mark.
    writable: bool

    @property
    def understands_end_of_topic(self) -> bool:
        """Whether the client handles REACHED_END_OF_TOPIC."""

    def write(self, data: bytes) -> None:
        """Queue an encoded frame (a MESSAGE) for the peer."""

    def write_all(self, frames: list[bytes]) -> None:
        """Queue encoded frames (a run of MESSAGEs) for the peer."""

    def send(self, body: Any) -> None:
        """Queue a command (ACTIVE_CONSUMER_CHANGE, REACHED_END_OF_TOPIC, ...) for the peer."""

    def close_consumer(
        self,
        subscription: Subscription | NonPersistentSubscription,
        consumer: Consumer,
        assigned_url: str | None = None,
    ) -> None:
        """End ``consumer`` from the broker's side: CLOSE_CONSUMER, the client reconnects (to
        the broker at ``assigned_url`` when the topic was handed over)."""

    def reconnect_consumer(self, consumer: Consumer) -> None:
        """``consumer`` was taken off its subscription (a seek): forget it on this connection
        and send CLOSE_CONSUMER, so the client comes back at the new position."""

    def close(self) -> None:
        """Close the whole connection."""


@dataclass(eq=False)
class Consumer:
    consumer_id: int
    name: str
    connection: ConsumerChannel
    priority: int = 0
    #: key_shared only: the consumer's KeySharedMeta from SUBSCRIBE (mode, sticky ranges), or None.
    key_shared_meta: pb.KeySharedMeta | None = None
    permits: int = 0
    #: The partition index of the consumer's topic (-1: not a partition), put in message ids.
    partition: int = -1
    #: Dispatched and not yet acknowledged: position -> messages in that entry. Change it only
    #: through send / acked / clear_pending (and the dispatcher's ``send_run``, which is
    #: ``send`` over a run), which keep ``unacked`` (their sum) right.
    pending: dict[Position, int] = field(default_factory=dict)
    unacked: int = 0
    #: Shared and key_shared: stop sending while ``unacked`` is at this bound (0: no bound).
    max_unacked: int = 0
    closed: bool = False
    #: Messages and bytes sent to this consumer (redeliveries included), for its stats.
    msg_out: int = 0
    bytes_out: int = 0
    connected_since: str = field(default_factory=now_iso)
    #: Told REACHED_END_OF_TOPIC (its topic was terminated and it has everything).
    told_end_of_topic: bool = False

    @property
    def ready(self) -> bool:
        """May be sent a message now: permits left, its connection drains, under its bound."""
        return (
            self.permits > 0
            and not self.closed
            and self.connection.writable
            and (self.max_unacked <= 0 or self.unacked < self.max_unacked)
        )

    def send(
        self,
        position: Position,
        stored: bytes,
        count: int,
        redelivery_count: int = 0,
        acked_indexes: frozenset[int] = frozenset(),
    ) -> None:
        """Send the entry at ``position`` (``count`` messages: a batch's size, else 1)."""
        self.connection.write(
            codec.encode_message_frame(
                self.consumer_id,
                position.ledger_id,
                position.entry_id,
                stored,
                partition=self.partition,
                redelivery_count=redelivery_count,
                # The batch's messages still to acknowledge, as a bit set: the client skips
                # the rest.
                ack_set=unacked_bit_set(count, acked_indexes) if acked_indexes else None,
            )
        )
        self.permits -= count
        self.msg_out += count
        self.bytes_out += len(stored)
        self.unacked += count - self.pending.get(position, 0)
        self.pending[position] = count

    def acked(self, position: Position) -> int:
        """``position`` is acknowledged (or taken back for redelivery): the messages it held
        out on this consumer (0 when it was not out here)."""
        count = self.pending.pop(position, 0)
        self.unacked -= count
        return count

    def acked_all(self, positions: list[Position]) -> int:
        """``acked`` for many positions (an ACK command's): the messages they held out here."""
        pop = self.pending.pop
        count = 0
        for position in positions:
            count += pop(position, 0)
        self.unacked -= count
        return count

    def clear_pending(self) -> None:
        self.pending.clear()
        self.unacked = 0


def unacked_bit_set(batch_size: int, acked: frozenset[int]) -> list[int]:
    """Pulsar's ack set: bit ``i`` set while message ``i`` of the batch is unacknowledged, in
    64-bit words (signed, as protobuf's int64 carries them)."""
    bits = sum(1 << i for i in range(batch_size) if i not in acked)
    words = []
    for _ in range(max((batch_size + 63) // 64, 1)):
        word = bits & (2**64 - 1)
        words.append(word - 2**64 if word >= 2**63 else word)
        bits >>= 64
    return words


def acked_from_bit_set(words: list[int], batch_size: int) -> list[int]:
    """The acknowledged indexes of a batch of ``batch_size``, from an ack set (unset bits)."""
    bits = 0
    for i, word in enumerate(words):
        bits |= (word & (2**64 - 1)) << (64 * i)
    return [i for i in range(batch_size) if not bits >> i & 1]
