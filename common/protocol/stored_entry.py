"""A topic's stored entry read back into its messages, without a broker: pure code, no I/O.

A managed ledger stores each entry as the producer's payload section, as it came in a SEND::

    [0x0e01 u16][CRC32C u32]   absent from old clients
    [metadataSize u32][MessageMetadata][payload]

The payload is one message, or (``num_messages_in_batch`` set) a batch: ``split_batch`` of
``codec`` splits it into ``[size u32][SingleMessageMetadata][message bytes]`` records, after
decompressing it when ``MessageMetadata.compression`` says so. A message of a batch takes its
key, properties and event time from its single-message metadata, and its publish time, schema
version and producer from the entry's, as Pulsar's clients do.

Decompression: ZLIB with the standard library; LZ4 (raw block, as Pulsar's clients write it),
ZSTD and SNAPPY with pyarrow's codecs when pyarrow is installed (it comes with
``magnetar[spark]``); a codec that is not available raises ``StoredEntryError`` naming it.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol.codec import MAGIC_CRC32C, BatchError, is_batch, split_batch

__all__ = [
    "StoredEntryError",
    "StoredMessage",
    "decompress",
    "entry_messages",
    "schema_version",
    "split_entry",
    "split_entry_columns",
    "split_stored_batch",
    "stored_batch_columns",
]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

#: Pulsar's compression types as pyarrow names its codecs.
_ARROW_CODECS = {pb.LZ4: "lz4_raw", pb.ZSTD: "zstd", pb.SNAPPY: "snappy"}


class StoredEntryError(ValueError):
    """A stored entry that cannot be read back into messages (truncated, a batch that does not
    split, a compression codec this process lacks)."""


@dataclass(slots=True, frozen=True)
class StoredMessage:
    """One message of a stored entry. ``batch_index`` and ``batch_size`` are -1 and 0 for an
    entry that is not a batch; ``event_time`` is 0 when unset; ``schema_version`` -1 when the
    entry has none (as the official client's ``int_schema_version``)."""

    payload: bytes
    partition_key: str | None
    properties: dict[str, str]
    publish_time: int
    event_time: int
    schema_version: int
    batch_index: int
    batch_size: int


def _metadata(stored: bytes) -> tuple[pb.MessageMetadata, memoryview]:
    view = memoryview(stored)
    offset = 6 if len(view) >= 2 and _U16.unpack_from(view, 0)[0] == MAGIC_CRC32C else 0
    if len(view) < offset + 4:
        raise StoredEntryError(f"entry of {len(view)} bytes ends before its metadata size")
    (size,) = _U32.unpack_from(view, offset)
    start = offset + 4
    if start + size > len(view):
        raise StoredEntryError(f"metadata of {size} bytes overruns the {len(view)}-byte entry")
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(view[start : start + size])
    except Exception as e:  # protobuf's DecodeError, or a missing required field
        raise StoredEntryError(f"metadata does not parse: {e}") from None
    return metadata, view[start + size :]


def decompress(metadata: pb.MessageMetadata, payload: bytes | memoryview) -> bytes | memoryview:
    """The payload as the producer built it before compressing."""
    kind = metadata.compression
    if kind == pb.NONE:
        return payload
    if kind == pb.ZLIB:
        return zlib.decompress(payload)
    name = _ARROW_CODECS.get(kind)
    try:
        import pyarrow as pa

        if name is None or not pa.Codec.is_available(name):
            raise ImportError(name)
        codec = pa.Codec(name)
    except ImportError:
        raise StoredEntryError(
            f"compression {pb.CompressionType.Name(kind)} needs pyarrow with its {name} codec"
        ) from None
    try:
        out = codec.decompress(payload, decompressed_size=metadata.uncompressed_size)
    except Exception as e:  # pyarrow raises OSError or ArrowException kinds
        raise StoredEntryError(f"{pb.CompressionType.Name(kind)} payload: {e}") from None
    return out.to_pybytes()


def _schema_version(metadata: pb.MessageMetadata) -> int:
    if not metadata.HasField("schema_version") or not metadata.schema_version:
        return -1
    return int.from_bytes(metadata.schema_version, "big", signed=True)


def split_stored_batch(
    payload: bytes | memoryview, count: int
) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    """``codec.split_batch`` for a batch a broker already stored: the same layout and the same
    bounds checks, without the check of each text field's UTF-8 that a broker needs before
    it stores what a producer sent (an invalid key or property still fails, when it is
    read)."""
    singles, payloads = stored_batch_columns(payload, count)
    return list(zip(singles, payloads, strict=True))


def stored_batch_columns(
    payload: bytes | memoryview, count: int
) -> tuple[list[pb.SingleMessageMetadata], list[bytes]]:
    """:func:`split_stored_batch` as two lists, the messages' metadata and their payloads:
    what a column-wise reader (the Spark source's storage path) takes whole. The read path's
    hot loop."""
    view = memoryview(payload)
    size = len(view)
    pos = 0
    parse = pb.SingleMessageMetadata.FromString
    unpack = _U32.unpack_from
    singles: list[pb.SingleMessageMetadata] = []
    payloads: list[bytes] = []
    try:
        for _ in range(count):
            (header,) = unpack(view, pos)
            pos += 4
            single = parse(view[pos : pos + header])
            pos += header
            length = single.payload_size
            if length < 0 or pos + length > size:
                raise StoredEntryError(
                    f"batch message {len(singles)} of {count} overruns the entry"
                )
            singles.append(single)
            payloads.append(view[pos : pos + length].tobytes())
            pos += length
    except (struct.error, ValueError, DecodeError) as e:
        if isinstance(e, StoredEntryError):
            raise
        raise StoredEntryError(f"batch of {count} messages: message {len(singles)}: {e}") from None
    if pos != size:
        raise StoredEntryError(f"{size - pos} bytes left over after {count} batch messages")
    return singles, payloads


def split_entry_columns(
    stored: bytes,
) -> tuple[pb.MessageMetadata, tuple[list[pb.SingleMessageMetadata], list[bytes]] | bytes]:
    """:func:`split_entry` with a batch as :func:`stored_batch_columns` gives it."""
    metadata, payload = _metadata(stored)
    if not is_batch(metadata):
        return metadata, bytes(decompress(metadata, payload))
    return metadata, stored_batch_columns(
        decompress(metadata, payload), metadata.num_messages_in_batch
    )


def split_entry(
    stored: bytes,
) -> tuple[pb.MessageMetadata, list[tuple[pb.SingleMessageMetadata, bytes]] | bytes]:
    """A stored entry's metadata and either its batch's (single-message metadata, payload)
    pairs or, for an entry that is not a batch, its one payload; decompressed."""
    metadata, content = split_entry_columns(stored)
    if isinstance(content, bytes):
        return metadata, content
    singles, payloads = content
    return metadata, list(zip(singles, payloads, strict=True))


def entry_messages(stored: bytes) -> list[StoredMessage]:
    """The messages of a stored entry, in batch order."""
    metadata, payload = _metadata(stored)
    publish, version = metadata.publish_time, _schema_version(metadata)
    if not is_batch(metadata):
        properties = {p.key: p.value for p in metadata.properties}
        key = metadata.partition_key or None
        data = bytes(decompress(metadata, payload))
        return [StoredMessage(data, key, properties, publish, metadata.event_time, version, -1, 0)]
    count = metadata.num_messages_in_batch
    try:
        singles = split_batch(decompress(metadata, payload), count)
    except BatchError as e:
        raise StoredEntryError(f"batch of {count} messages: {e}") from None
    return [
        StoredMessage(
            data,
            single.partition_key or None,
            {p.key: p.value for p in single.properties},
            publish,
            single.event_time if single.HasField("event_time") else metadata.event_time,
            version,
            index,
            count,
        )
        for index, (single, data) in enumerate(singles)
    ]


def schema_version(metadata: pb.MessageMetadata) -> int:
    """The entry's schema version as a number, -1 when it has none (the official client's
    ``int_schema_version``)."""
    return _schema_version(metadata)
