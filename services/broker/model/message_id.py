"""Message ids at the protocol boundary: the one place that builds and reads ``MessageIdData``.

Pulsar's ids are Java longs, signed; the protocol declares ``ledgerId`` and ``entryId`` as
uint64, so -1 (earliest, "before the first entry") travels as 2**64 - 1. Inside the broker a
``Position`` is always signed; ``to_wire`` and ``from_wire`` convert in both directions. The two
per-message frames (SEND_RECEIPT, MESSAGE) are written by hand in the codec
(``encode_send_receipt``, ``encode_message_frame``) from the same signed ids, with the same
rule."""

from __future__ import annotations

from magnetar.broker.model.position import Position, position_of
from magnetar.common.proto import pulsar_api_pb2 as pb

_U64 = 2**64
_SIGN = 2**63

#: Pulsar's MessageId.earliest and MessageId.latest as signed positions.
EARLIEST = Position(-1, -1)
LATEST = Position(2**63 - 1, 2**63 - 1)


def to_unsigned(value: int) -> int:
    """A signed 64-bit id as protobuf's uint64 carries it."""
    return value + _U64 if value < 0 else value


def to_signed(value: int) -> int:
    """A uint64 from the wire as the signed id it stands for."""
    return value - _U64 if value >= 2**63 else value


def to_wire(position: Position, partition: int = -1, batch_index: int = -1) -> pb.MessageIdData:
    """The ``MessageIdData`` for ``position`` (``partition``: the topic's partition index, or
    -1 when it is not a partition)."""
    message_id = pb.MessageIdData(
        ledgerId=to_unsigned(position.ledger_id), entryId=to_unsigned(position.entry_id)
    )
    if partition >= 0:
        message_id.partition = partition
    if batch_index >= 0:
        message_id.batch_index = batch_index
    return message_id


def from_wire(message_id: pb.MessageIdData) -> Position:
    """The signed position a ``MessageIdData`` names (its batch index is read separately).
    ``to_signed`` written out, and the tuple made in C: every acknowledged message comes
    through here."""
    ledger_id, entry_id = message_id.ledgerId, message_id.entryId
    return position_of(
        (
            ledger_id - _U64 if ledger_id >= _SIGN else ledger_id,
            entry_id - _U64 if entry_id >= _SIGN else entry_id,
        )
    )
