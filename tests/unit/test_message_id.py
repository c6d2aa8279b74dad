"""Message ids across the protocol boundary (services/broker/message_id.py): signed inside,
uint64 on the wire, round trip exact."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.model.message_id import EARLIEST, LATEST, from_wire, to_wire
from magnetar.broker.model.position import Position
from magnetar.common.proto import pulsar_api_pb2 as pb

signed64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(signed64, signed64)
def test_round_trip_through_serialized_bytes(ledger_id: int, entry_id: int) -> None:
    position = Position(ledger_id, entry_id)
    wire = pb.MessageIdData.FromString(to_wire(position).SerializeToString())
    assert from_wire(wire) == position


def test_entry_minus_one_is_what_the_client_sends_for_it() -> None:
    # (L, -1): a fresh subscription's mark-delete position. It must serialize (it used to raise
    # "Value out of range") and read back as -1.
    wire = to_wire(Position(7, -1))
    assert wire.entryId == 2**64 - 1
    assert from_wire(wire) == Position(7, -1)


def test_earliest_and_latest() -> None:
    assert to_wire(EARLIEST).ledgerId == 2**64 - 1
    assert from_wire(pb.MessageIdData(ledgerId=2**64 - 1, entryId=2**64 - 1)) == EARLIEST
    assert from_wire(to_wire(LATEST)) == LATEST


def test_partition_and_batch_index_only_when_given() -> None:
    plain = to_wire(Position(1, 2))
    assert not plain.HasField("partition") and not plain.HasField("batch_index")
    assert plain.partition == -1
    indexed = to_wire(Position(1, 2), partition=3, batch_index=9)
    assert (indexed.partition, indexed.batch_index) == (3, 9)
