"""What a topic stores per entry: a producer's payload section, as it came in a SEND.

That is ``[magic 0x0e01][crc32c][metadata size][MessageMetadata][payload]`` (or the same without
magic and CRC from old clients), so a MESSAGE to a consumer is the MESSAGE command followed by
the stored bytes unchanged: no re-encoding on the dispatch path.
"""

from __future__ import annotations

import struct

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.codec import MAGIC_CRC32C

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _metadata_span(stored: bytes) -> tuple[int, int]:
    """Where the MessageMetadata of a stored entry starts and ends."""
    offset = 6 if len(stored) >= 2 and _U16.unpack_from(stored, 0)[0] == MAGIC_CRC32C else 0
    (size,) = _U32.unpack_from(stored, offset)
    return offset + 4, offset + 4 + size


def entry_metadata(stored: bytes) -> pb.MessageMetadata:
    """The MessageMetadata of a stored entry (already validated when it was published)."""
    start, end = _metadata_span(stored)
    return pb.MessageMetadata.FromString(stored[start:end])


def is_marker_entry(stored: bytes) -> bool:
    """Whether the entry is a marker (its metadata has ``marker_type``): ``entry_facts``."""
    return entry_facts(stored)[2]


def dispatch_facts(stored: bytes) -> tuple[int, int]:
    """What a dispatcher needs of an entry's metadata: its message count (a batch's size, else
    1) and its delivery time (ms, 0 when it has none): ``entry_facts``."""
    count, deliver_at, _ = entry_facts(stored)
    return count, deliver_at


#: The tags of MessageMetadata.num_messages_in_batch (field 11), deliver_at_time (field 19)
#: and marker_type (field 20), all varints, as they are encoded.
_BATCH_SIZE_TAG = b"\x58"
_DELIVER_AT_TAG = b"\x98\x01"
_MARKER_TYPE_TAG = b"\xa0\x01"
#: ``entry_facts`` of an entry whose metadata holds none of those tags.
_PLAIN_FACTS = (1, 0, False)


def entry_facts(stored: bytes) -> tuple[int, int, bool]:
    """(messages, delivery time in ms or 0, whether it is a marker) of a stored entry: what
    dispatch asks of every entry. The encoded tags are looked for first: metadata holding none
    (a plain message) is not decoded; bytes that only look like one (inside another field's
    value) cost a decode, never a wrong answer."""
    start, end = _metadata_span(stored)
    find = stored.find
    if (
        find(_BATCH_SIZE_TAG, start, end) < 0
        and find(_DELIVER_AT_TAG, start, end) < 0
        and find(_MARKER_TYPE_TAG, start, end) < 0
    ):
        return _PLAIN_FACTS
    metadata = pb.MessageMetadata.FromString(stored[start:end])
    return message_count(metadata), metadata.deliver_at_time, metadata.HasField("marker_type")


def entry_payload(stored: bytes) -> bytes:
    """The payload after the metadata (a batch's messages, or the one message)."""
    return stored[_metadata_span(stored)[1] :]


def message_count(stored: bytes | pb.MessageMetadata) -> int:
    """Messages in the entry (or of its metadata): a batch counts each of its messages (each
    needs a permit)."""
    metadata = entry_metadata(stored) if isinstance(stored, bytes) else stored
    return metadata.num_messages_in_batch if codec.is_batch(metadata) else 1
