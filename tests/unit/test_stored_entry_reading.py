"""Reading a topic's storage without a broker (issue 23): stored entries back into messages,
a topic's ledger list, and a standalone's metadata store opened read-only next to its owner."""

from __future__ import annotations

import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from magnetar.common.ledger.managed_ledger_keys import managed_ledger_key
from magnetar.common.ledger.managed_ledger_list import (
    LedgerInfo,
    LedgerListError,
    managed_ledger_name,
    parse_ledger_list,
    read_ledger_list,
)
from magnetar.common.metadata.local import LocalMetadataStore
from magnetar.common.metadata.readonly_local import ReadOnlyLocalStore, ReadOnlyStoreError
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol.codec import build_batch, encode_headers_and_payload
from magnetar.common.protocol.stored_entry import (
    StoredEntryError,
    entry_messages,
    schema_version,
    split_entry,
)


def metadata(**fields: object) -> pb.MessageMetadata:
    return pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1234, **fields)


def single(key: str, event: int = 0, **props: str) -> pb.SingleMessageMetadata:
    out = pb.SingleMessageMetadata(partition_key=key, payload_size=0)
    if event:
        out.event_time = event
    out.properties.extend(pb.KeyValue(key=k, value=v) for k, v in props.items())
    return out


def compress(kind: int, data: bytes) -> bytes:
    if kind == pb.NONE:
        return data
    if kind == pb.ZLIB:
        return zlib.compress(data)
    name = {pb.LZ4: "lz4_raw", pb.ZSTD: "zstd", pb.SNAPPY: "snappy"}[kind]
    return pa.Codec(name).compress(data, asbytes=True)


@pytest.mark.parametrize("kind", [pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY])
@pytest.mark.parametrize("checksum", [True, False])
def test_a_compressed_batch_reads_back_as_its_messages(kind: int, checksum: bool) -> None:
    payload = build_batch(
        [(single("a", 5, x="1"), b"one"), (single("", 0), b""), (single("c"), b"three" * 50)]
    )
    md = metadata(
        num_messages_in_batch=3,
        compression=kind,
        uncompressed_size=len(payload),
        schema_version=(7).to_bytes(8, "big"),
        event_time=99,
    )
    stored = encode_headers_and_payload(md, compress(kind, payload), checksum=checksum)
    messages = entry_messages(stored)
    assert [m.payload for m in messages] == [b"one", b"", b"three" * 50]
    assert [m.partition_key for m in messages] == ["a", None, "c"]
    assert [m.event_time for m in messages] == [5, 99, 99]
    assert messages[0].properties == {"x": "1"}
    assert [(m.batch_index, m.batch_size) for m in messages] == [(0, 3), (1, 3), (2, 3)]
    assert {(m.publish_time, m.schema_version) for m in messages} == {(1234, 7)}
    got, singles = split_entry(stored)
    assert got.publish_time == 1234 and schema_version(got) == 7
    assert [data for _, data in singles] == [b"one", b"", b"three" * 50]


def test_an_entry_that_is_not_a_batch_is_one_message() -> None:
    md = metadata(partition_key="k", event_time=3)
    md.properties.add(key="a", value="b")
    [message] = entry_messages(encode_headers_and_payload(md, b"payload"))
    assert (message.payload, message.partition_key, message.properties) == (
        b"payload",
        "k",
        {"a": "b"},
    )
    assert (message.batch_index, message.schema_version, message.event_time) == (-1, -1, 3)
    assert split_entry(encode_headers_and_payload(md, b"payload"))[1] == b"payload"


def test_damaged_entries_are_a_typed_error() -> None:
    batch = build_batch([(single("a"), b"one"), (single("b"), b"two")])
    whole = encode_headers_and_payload(metadata(num_messages_in_batch=2), batch)
    for damaged in (whole[:3], whole[:-2], whole + b"x", b"\x00\x00\x10\x00abc"):
        with pytest.raises(StoredEntryError):
            split_entry(damaged)
    too_many = encode_headers_and_payload(metadata(num_messages_in_batch=3), batch)
    with pytest.raises(StoredEntryError):
        split_entry(too_many)


def test_ledger_list_names_and_records() -> None:
    assert managed_ledger_name("persistent://t/ns/orders-partition-2") == (
        "t/ns/persistent/orders-partition-2"
    )
    with pytest.raises(ValueError):
        managed_ledger_name("orders")
    record = (
        b'{"name": "t/ns/persistent/x", "ledgers": [{"ledger_id": 7, "entries": 3, "size": 9,'
        b' "ctime_ms": 1, "closed": true}, {"ledger_id": 9, "entries": 0, "size": 0,'
        b' "ctime_ms": 2, "closed": false}], "properties": {}}'
    )
    assert parse_ledger_list(record) == (
        LedgerInfo(7, 3, 9, 1, True),
        LedgerInfo(9, 0, 0, 2, False),
    )
    with pytest.raises(LedgerListError):
        parse_ledger_list(b'{"ledgers": [{"ledger_id": 1}]}')


async def test_a_read_only_open_sees_the_owners_writes(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    owner = await LocalMetadataStore.open(path)
    try:
        key = managed_ledger_key(managed_ledger_name("persistent://t/ns/x"))
        await owner.put(
            key,
            b'{"ledgers": [{"ledger_id": 5, "entries": 2, "size": 4, "ctime_ms": 1,'
            b' "closed": true}]}',
        )
        reader = ReadOnlyLocalStore(path)
        try:
            assert await read_ledger_list(reader, "persistent://t/ns/x") == (
                LedgerInfo(5, 2, 4, 1, True),
            )
            assert await read_ledger_list(reader, "persistent://t/ns/y") is None
            await owner.put("/a/b/c", b"1")
            await owner.put("/a/d", b"2")
            assert (await reader.get("/a/d")).value == b"2"  # type: ignore[union-attr]
            assert await reader.children("/a") == ["b", "d"]
            assert sorted(await reader.scan("/a/")) == ["/a/b/c", "/a/d"]
            with pytest.raises(ReadOnlyStoreError):
                await reader.put("/a/e", b"3")
            with pytest.raises(ReadOnlyStoreError):
                await reader.delete("/a/d")
        finally:
            await reader.close()
    finally:
        await owner.close()
    with pytest.raises(ReadOnlyStoreError):
        ReadOnlyLocalStore(tmp_path / "absent.db")
