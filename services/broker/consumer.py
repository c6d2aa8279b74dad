"""A consumer attached to a subscription over one client connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from magnetar.broker.entry import message_count
from magnetar.broker.managed_ledger import Position
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

if TYPE_CHECKING:
    from magnetar.broker.connection import ServerConnection


@dataclass(eq=False)
class Consumer:
    consumer_id: int
    name: str
    connection: ServerConnection
    priority: int = 0
    #: key_shared only: the consumer's KeySharedMeta from SUBSCRIBE (mode, sticky ranges), or None.
    key_shared_meta: pb.KeySharedMeta | None = None
    permits: int = 0
    #: Dispatched and not yet acknowledged: position -> messages in that entry.
    pending: dict[Position, int] = field(default_factory=dict)
    closed: bool = False

    def send(self, position: Position, stored: bytes, redelivery_count: int = 0) -> None:
        count = message_count(stored)
        message = pb.CommandMessage(
            consumer_id=self.consumer_id,
            message_id=pb.MessageIdData(ledgerId=position.ledger_id, entryId=position.entry_id),
            redelivery_count=redelivery_count,
        )
        self.connection.write(codec.encode_payload_command_raw(message, stored))
        self.permits -= count
        self.pending[position] = count

    def acked(self, position: Position) -> None:
        self.pending.pop(position, None)
