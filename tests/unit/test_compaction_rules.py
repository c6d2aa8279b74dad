"""What compaction keeps of an entry (``ledger/compaction_rules.py``) and the compacted
ledger's entry format and record (``ledger/compacted_ledger.py``): pure code."""

from __future__ import annotations

import zlib

import pytest

from magnetar.broker.ledger.compacted_ledger import (
    CompactionRecord,
    decode_entry,
    encode_entry,
    referenced_ledgers,
)
from magnetar.broker.ledger.compaction_rules import WHOLE, KeyedMessage, keyed_messages, retain
from magnetar.broker.model.position import Position
from magnetar.common.ledger.managed_ledger_list import (
    LedgerInfo,
    ManagedLedgerRecord,
    referenced_ledger_ids,
)
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.stored_entry import StoredEntryError, entry_messages


def _metadata(**fields: object) -> pb.MessageMetadata:
    return pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=5, **fields)


def single(payload: bytes, key: str | None = None, **metadata: object) -> bytes:
    md = _metadata(**metadata)
    if key is not None:
        md.partition_key = key
    return codec.encode_headers_and_payload(md, payload)


def batch(messages: list[tuple[str | None, bytes]], compression: int = pb.NONE) -> bytes:
    singles = []
    for key, value in messages:
        header = pb.SingleMessageMetadata(payload_size=len(value))
        if key is not None:
            header.partition_key = key
        singles.append((header, value))
    payload = codec.build_batch(singles)
    md = _metadata(num_messages_in_batch=len(messages))
    if compression == pb.ZLIB:
        md.compression = pb.ZLIB
        md.uncompressed_size = len(payload)
        payload = zlib.compress(payload)
    return codec.encode_headers_and_payload(md, payload)


def test_a_message_is_judged_by_its_partition_key_and_payload() -> None:
    assert keyed_messages(single(b"v", "k")) == [KeyedMessage(WHOLE, "k", False)]
    assert keyed_messages(single(b"", "k")) == [KeyedMessage(WHOLE, "k", True)]
    assert keyed_messages(single(b"v", "k", null_value=True)) == [KeyedMessage(WHOLE, "k", True)]
    assert keyed_messages(single(b"v")) == [KeyedMessage(WHOLE, None, False)]


@pytest.mark.parametrize("compression", [pb.NONE, pb.ZLIB])
def test_a_batch_is_judged_per_message_and_rewritten_to_what_it_keeps(compression: int) -> None:
    stored = batch([("a", b"1"), (None, b"2"), ("b", b""), ("a", b"3")], compression)
    assert keyed_messages(stored) == [
        KeyedMessage(0, "a", False),
        KeyedMessage(1, None, False),
        KeyedMessage(2, "b", True),
        KeyedMessage(3, "a", False),
    ]
    assert retain(stored, set()) is None
    assert retain(stored, {0, 1, 2, 3}) == stored
    kept = retain(stored, {3})
    assert kept is not None
    assert [(m.partition_key, m.payload, m.batch_size) for m in entry_messages(kept)] == [
        ("a", b"3", 1)
    ]
    two = retain(stored, {0, 3})
    assert two is not None
    assert [m.payload for m in entry_messages(two)] == [b"1", b"3"]


def test_an_encrypted_batch_counts_as_one_message_of_the_entry_key() -> None:
    md = _metadata(num_messages_in_batch=2, partition_key="k")
    md.encryption_keys.add(key="key", value=b"x")
    stored = codec.encode_headers_and_payload(md, b"opaque-bytes")
    assert keyed_messages(stored) == [KeyedMessage(WHOLE, "k", False)]
    assert retain(stored, {WHOLE}) == stored


def test_a_batch_this_broker_cannot_read_fails_the_run() -> None:
    md = _metadata(num_messages_in_batch=2)
    stored = codec.encode_headers_and_payload(md, b"\x00\x00\x00\xffnot a batch")
    with pytest.raises(StoredEntryError):
        keyed_messages(stored)


def test_compacted_entry_round_trip_and_record() -> None:
    stored = single(b"value", "k")
    assert decode_entry(encode_entry(Position(7, 3), stored)) == (Position(7, 3), stored)
    with pytest.raises(ValueError):
        decode_entry(encode_entry(Position(7, 3), stored) + b"x")
    record = CompactionRecord(12, Position(7, 3))
    properties = {k: v for k, v in record.properties().items() if v is not None}
    assert CompactionRecord.of(properties) == record
    assert CompactionRecord.of({}) is None
    assert referenced_ledgers({**properties, "CompactionPendingLedger": "13"}) == [12, 13]


def test_the_gc_counts_a_topics_compacted_ledgers_as_its_own() -> None:
    record = ManagedLedgerRecord(
        "t",
        [LedgerInfo(4), LedgerInfo(7)],
        {"CompactedTopicLedger": "9", "CompactionPendingLedger": "11", "other": "x"},
    )
    assert referenced_ledger_ids(record.to_bytes()) == {4, 7, 9, 11}
