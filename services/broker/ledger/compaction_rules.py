"""What compaction keeps of a stored entry (Pulsar's TwoPhaseCompactor and RawBatchConverter
rules), pure code:

- a message's key is its partition key; a message without one is not in the compacted view;
- the latest message of a key wins; one with an empty payload (or ``null_value``) deletes the
  key, and is not kept itself;
- a batch is judged message by message: a batch whose every message is kept is kept as it is;
  one with some kept is rewritten to those (uncompressed, in their order, each message's
  metadata as it was), with the entry's metadata otherwise unchanged; one with none is dropped;
- an encrypted entry counts as one message with the entry's key (its batch cannot be read);
- a compressed batch is decompressed (ZLIB always, LZ4/ZSTD/SNAPPY with pyarrow): an entry this
  broker cannot read raises ``StoredEntryError`` naming why, which fails the run (the previous
  compacted view stays) rather than dropping its messages from the view.
"""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.broker.model.entry import entry_metadata, entry_payload
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.stored_entry import decompress, split_entry, stored_batch_columns

#: The batch index of a message that is not in a batch.
WHOLE = -1


@dataclass(slots=True, frozen=True)
class KeyedMessage:
    """One message of an entry as compaction sees it."""

    index: int  # in its batch, or WHOLE
    key: str | None
    deletes: bool  # an empty payload or a null value: the key's tombstone


def _whole(metadata: pb.MessageMetadata, payload_size: int) -> KeyedMessage:
    key = metadata.partition_key if metadata.HasField("partition_key") else None
    return KeyedMessage(WHOLE, key, metadata.null_value or payload_size == 0)


def keyed_messages(stored: bytes) -> list[KeyedMessage]:
    """The entry's messages with their keys, in batch order."""
    metadata = entry_metadata(stored)
    if metadata.encryption_keys or not codec.is_batch(metadata):
        compressed = metadata.compression != pb.NONE
        size = metadata.uncompressed_size if compressed else len(entry_payload(stored))
        return [_whole(metadata, size)]
    # The metadata decoded above serves for the batch too (split_entry would decode it again).
    payload = decompress(metadata, entry_payload(stored))
    singles, _ = stored_batch_columns(payload, metadata.num_messages_in_batch)
    return [
        KeyedMessage(
            index,
            single.partition_key if single.HasField("partition_key") else None,
            single.null_value or single.payload_size == 0,
        )
        for index, single in enumerate(singles)
        if not single.compacted_out
    ]


def retain(stored: bytes, keep: set[int]) -> bytes | None:
    """The entry with only the messages at ``keep`` (batch indexes, or WHOLE); None when it
    keeps nothing."""
    if not keep:
        return None
    if WHOLE in keep:
        return stored
    metadata, body = split_entry(stored)
    assert not isinstance(body, bytes)
    if len(keep) == len(body):
        return stored
    kept = [body[i] for i in sorted(keep)]
    metadata.num_messages_in_batch = len(kept)
    metadata.compression = pb.NONE
    metadata.ClearField("uncompressed_size")
    return codec.encode_headers_and_payload(metadata, codec.build_batch(kept))
