"""Unit and property tests for the sans-I/O Pulsar frame codec (magnetar.common.protocol.codec)."""

from __future__ import annotations

import itertools
import re
import struct

import crc32c
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

Type = pb.BaseCommand.Type
BASE = pb.BaseCommand.DESCRIPTOR
ALL_TYPES = [value.number for value in BASE.enum_types_by_name["Type"].values]

# Frames captured from the official client (pulsar-client 3.13.0, C++ client 4.2.0) talking to
# the scripted broker of tests/integration/test_pulsar_handshake.py.
CAPTURED_CONNECT = bytes.fromhex(
    "0000002900000025080212210a1150756c7361722d4350502d76342e322e3020142a046e6f6e65520408011001"
)
CAPTURED_PARTITIONED_METADATA = bytes.fromhex(
    "0000002b000000270815aa01220a1e70657273697374656e743a2f2f7075626c69632f64656661756c742f74311001"
)
CAPTURED_SEND = bytes.fromhex(
    "0000004d0000000808063204080010000e01a24313c5000000290a166d61676e657461722d746573742d70726f"
    "6475636572100018e7cadb8ea03422060a016b12017668656c6c6f2d6d61676e65746172"
)
CAPTURED_BATCH_SEND = bytes.fromhex(
    "000000590000000a080632060802100018030e01798a65bc000000230a166d61676e657461722d746573742d70"
    "726f6475636572100018eacadb8ea0345803000000041802400062300000000418024001623100000004180240"
    "026232"
)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def populate(message: Message, depth: int = 0) -> Message:
    """Set every field of `message` (two items for repeated ones), nesting up to two levels."""
    for fd in message.DESCRIPTOR.fields:
        if fd.type == fd.TYPE_MESSAGE:
            if depth >= 2 and not fd.is_required:
                continue
            if fd.is_repeated:
                for _ in range(2):
                    populate(getattr(message, fd.name).add(), depth + 1)
            else:
                populate(getattr(message, fd.name), depth + 1)
                getattr(message, fd.name).SetInParent()
            continue
        value = scalar_for(fd)
        if fd.is_repeated:
            getattr(message, fd.name).extend([value, value])
        else:
            setattr(message, fd.name, value)
    return message


def scalar_for(fd: FieldDescriptor) -> object:
    if fd.type == fd.TYPE_STRING:
        return f"{fd.name}-é"
    if fd.type == fd.TYPE_BYTES:
        return b"\x00\xff" + fd.name.encode()
    if fd.type == fd.TYPE_BOOL:
        return True
    if fd.type == fd.TYPE_ENUM:
        return fd.enum_type.values[-1].number
    if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        return 1.5
    if fd.type in (fd.TYPE_INT32, fd.TYPE_INT64, fd.TYPE_SINT32, fd.TYPE_SINT64):
        return -(fd.number + 1)
    return fd.number + 2**31  # unsigned: exercise the high bit


def full_command(type_number: int) -> pb.BaseCommand:
    command = pb.BaseCommand(type=type_number)
    body = getattr(command, BASE.fields_by_number[type_number].name)
    body.SetInParent()
    populate(body)
    return command


def minimal_metadata(**fields: object) -> pb.MessageMetadata:
    return pb.MessageMetadata(
        **{"producer_name": "p", "sequence_id": 1, "publish_time": 2, **fields}
    )


def frame_of(command_bytes: bytes, tail: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(command_bytes) + len(tail), len(command_bytes)) + (
        command_bytes + tail
    )


def decode_one(data: bytes) -> codec.Frame:
    frames = codec.FrameDecoder().feed(data)
    assert len(frames) == 1
    return frames[0]


def send_command(sequence_id: int = 5) -> pb.BaseCommand:
    return codec.make_command(pb.CommandSend(producer_id=3, sequence_id=sequence_id))


# --------------------------------------------------------------------------------------------
# The .proto itself
# --------------------------------------------------------------------------------------------


def test_every_type_has_a_body_field_with_the_same_number() -> None:
    bodies = set()
    for number in ALL_TYPES:
        fd = BASE.fields_by_number[number]
        assert fd.type == fd.TYPE_MESSAGE
        bodies.add(fd.message_type.full_name)
    assert len(bodies) == len(ALL_TYPES)  # make_command can infer the type from the body


def test_wire_facts_that_presence_depends_on() -> None:
    assert pb.BaseCommand.DESCRIPTOR.fields_by_name["type"].is_required
    message_id = pb.MessageIdData(ledgerId=1, entryId=2)
    assert (message_id.partition, message_id.batch_index) == (-1, -1)
    assert pb.CommandProducerSuccess().last_sequence_id == -1
    assert pb.CommandProducerSuccess().producer_ready is True
    assert pb.CommandSubscribe().durable is True
    assert pb.CommandPartitionedTopicMetadata().metadata_auto_creation_enabled is True
    assert pb.MessageMetadata().num_messages_in_batch == 1
    assert not pb.MessageMetadata().HasField("num_messages_in_batch")
    assert pb.ProtocolVersion.Value("v20") == 20
    assert codec.SERVER_PROTOCOL_VERSION == 21


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("type_number", ALL_TYPES, ids=codec.command_name)
def test_every_command_round_trips(type_number: int) -> None:
    command = full_command(type_number)
    if type_number in codec.PAYLOAD_COMMANDS:
        data = codec.encode_payload_command(command, minimal_metadata(), b"body")
    else:
        data = codec.encode_command(command)
    frame = decode_one(data)
    assert frame.command == command
    assert frame.type == type_number
    assert frame.name == codec.command_name(type_number)
    assert frame.body == getattr(command, BASE.fields_by_number[type_number].name)


@pytest.mark.parametrize("type_number", ALL_TYPES, ids=codec.command_name)
def test_make_command_wraps_every_body(type_number: int) -> None:
    body = getattr(full_command(type_number), BASE.fields_by_number[type_number].name)
    command = codec.make_command(body)
    assert command.type == type_number
    assert codec.command_body(command) == body


def test_empty_bodies_are_still_sent() -> None:
    assert codec.encode_command(pb.CommandPing()) == bytes.fromhex("00000009000000050812920100")
    assert decode_one(codec.encode_command(pb.CommandPong())).type == Type.PONG


def test_encoder_refuses_incomplete_commands() -> None:
    with pytest.raises(ValueError, match="body is not set"):
        codec.encode_command(pb.BaseCommand(type=Type.CONNECT))
    with pytest.raises(ValueError, match="client_version"):
        codec.encode_command(pb.CommandConnect(protocol_version=20))
    with pytest.raises(ValueError, match="without a type"):
        codec.encode_command(pb.BaseCommand())
    with pytest.raises(TypeError):
        codec.make_command(pb.KeyValue(key="a", value="b"))
    with pytest.raises(ValueError, match="producer_name"):
        codec.encode_payload_command(send_command(), pb.MessageMetadata(), b"")


def test_captured_client_frames_decode() -> None:
    decoder = codec.FrameDecoder()
    frames = decoder.feed(
        CAPTURED_CONNECT + CAPTURED_PARTITIONED_METADATA + CAPTURED_SEND + CAPTURED_BATCH_SEND
    )
    assert [frame.type for frame in frames] == [
        Type.CONNECT,
        Type.PARTITIONED_METADATA,
        Type.SEND,
        Type.SEND,
    ]
    connect = frames[0].command.connect
    assert connect.client_version == "Pulsar-CPP-v4.2.0"
    assert connect.protocol_version == 20
    assert connect.auth_method_name == "none"
    assert connect.feature_flags.supports_auth_refresh
    assert connect.feature_flags.supports_broker_entry_metadata
    assert frames[1].command.partitionMetadata.topic == "persistent://public/default/t1"

    single = frames[2]
    assert single.checksum is codec.ChecksumState.VALID
    assert single.payload == b"hello-magnetar"
    assert single.metadata is not None
    assert [(kv.key, kv.value) for kv in single.metadata.properties] == [("k", "v")]

    batch = frames[3]
    assert batch.metadata is not None and codec.is_batch(batch.metadata)
    items = codec.split_batch(batch.payload, batch.metadata.num_messages_in_batch)
    assert [(meta.sequence_id, data) for meta, data in items] == [
        (0, b"b0"),
        (1, b"b1"),
        (2, b"b2"),
    ]
    # Re-encoding the decoded parts reproduces the client's bytes exactly.
    assert codec.encode_payload_command(single.command, single.metadata, single.payload) == (
        CAPTURED_SEND
    )
    assert codec.build_batch(items) == batch.payload


# --------------------------------------------------------------------------------------------
# Payload frames
# --------------------------------------------------------------------------------------------


def test_payload_with_checksum() -> None:
    metadata = minimal_metadata(partition_key="key", event_time=9)
    data = codec.encode_payload_command(send_command(), metadata, b"payload")
    frame = decode_one(data)
    assert frame.checksum is codec.ChecksumState.VALID and frame.checksum_present
    assert frame.metadata == metadata
    assert frame.payload == b"payload"
    # The CRC32C covers metadata size + metadata + payload, i.e. everything after it.
    head = frame.headers_and_payload
    assert struct.unpack(">H", head[:2])[0] == codec.MAGIC_CRC32C
    assert struct.unpack(">I", head[2:6])[0] == crc32c.crc32c(head[6:])


def test_payload_without_checksum_from_old_clients() -> None:
    metadata = minimal_metadata()
    data = codec.encode_payload_command(send_command(), metadata, b"old", checksum=False)
    frame = decode_one(data)
    assert frame.checksum is codec.ChecksumState.ABSENT and not frame.checksum_present
    assert (frame.metadata, frame.payload) == (metadata, b"old")


def test_empty_payload() -> None:
    frame = decode_one(codec.encode_payload_command(send_command(), minimal_metadata(), b""))
    assert frame.payload == b""


def test_message_with_broker_entry_metadata_and_stored_entry_reuse() -> None:
    stored = codec.encode_payload_command(send_command(), minimal_metadata(), b"entry")
    entry = decode_one(stored).headers_and_payload
    message = pb.CommandMessage(consumer_id=4, message_id=pb.MessageIdData(ledgerId=1, entryId=2))
    entry_metadata = pb.BrokerEntryMetadata(broker_timestamp=123, index=77)
    data = codec.encode_payload_command_raw(message, entry, broker_entry_metadata=entry_metadata)
    frame = decode_one(data)
    assert frame.broker_entry_metadata == entry_metadata
    assert frame.headers_and_payload == entry
    assert (frame.payload, frame.checksum) == (b"entry", codec.ChecksumState.VALID)


def test_bad_checksum_is_its_own_recoverable_error() -> None:
    good = codec.encode_payload_command(send_command(1), minimal_metadata(), b"first")
    bad = bytearray(codec.encode_payload_command(send_command(2), minimal_metadata(), b"second"))
    bad[-1] ^= 0x01
    decoder = codec.FrameDecoder()
    with pytest.raises(codec.ChecksumError) as caught:
        decoder.feed(good + bytes(bad) + codec.encode_command(pb.CommandPing()))
    error = caught.value
    assert not error.fatal
    assert error.command is not None
    assert (error.command.send.producer_id, error.command.send.sequence_id) == (3, 2)
    assert error.expected != error.actual
    assert [frame.payload for frame in error.frames] == [b"first"]
    # The bad frame was consumed; the connection can answer SEND_ERROR and go on.
    assert [frame.type for frame in decoder.feed(b"")] == [Type.PING]


# --------------------------------------------------------------------------------------------
# Malformed input
# --------------------------------------------------------------------------------------------


def command_bytes(command: pb.BaseCommand) -> bytes:
    return command.SerializePartialToString()


@pytest.mark.parametrize("total_size", [0, 1, 3])
def test_total_size_below_four_is_fatal(total_size: int) -> None:
    decoder = codec.FrameDecoder()
    with pytest.raises(codec.FrameSizeError) as caught:
        decoder.feed(struct.pack(">I", total_size) + b"\x00" * 8)
    assert caught.value.fatal and decoder.failed
    with pytest.raises(codec.FrameSizeError):
        decoder.feed(codec.encode_command(pb.CommandPing()))


def test_oversized_frame_is_rejected_from_its_header() -> None:
    decoder = codec.FrameDecoder()
    with pytest.raises(codec.FrameTooLargeError) as caught:
        decoder.feed(struct.pack(">I", codec.DEFAULT_MAX_FRAME_SIZE))  # 4 bytes over the limit
    assert caught.value.fatal
    assert isinstance(caught.value, codec.FrameSizeError)


def test_default_limit_admits_a_maximum_size_message() -> None:
    payload = b"x" * codec.DEFAULT_MAX_MESSAGE_SIZE
    data = codec.encode_payload_command(send_command(), minimal_metadata(), payload)
    assert decode_one(data).payload == payload


def test_small_limit_is_configurable() -> None:
    decoder = codec.FrameDecoder(max_frame_size=64)
    decoder.feed(codec.encode_command(pb.CommandPing()))
    with pytest.raises(codec.FrameTooLargeError):
        decoder.feed(codec.encode_payload_command(send_command(), minimal_metadata(), b"y" * 64))


def test_command_size_beyond_frame() -> None:
    data = struct.pack(">II", 6, 3) + b"\x08\x12"
    with pytest.raises(codec.FrameSizeError) as caught:
        codec.FrameDecoder().feed(data)
    assert not caught.value.fatal


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"\xff\xff\xff", codec.CommandDecodeError),  # truncated varint
        (b"\x0a\x05ab", codec.CommandDecodeError),  # length overruns
        (b"", codec.UnknownCommandError),  # no type
        (b"\x08\x46", codec.UnknownCommandError),  # type 70: not known to us
        (b"\x08\x12", codec.UnknownCommandError),  # PING without its body
        (b"\x08\x02\x12\x00", codec.CommandDecodeError),  # CONNECT missing client_version
        (b"\x08\x02\x12\x04\x0a\x02\xc3\x28", codec.CommandDecodeError),  # invalid UTF-8
    ],
)
def test_bad_commands(raw: bytes, error: type[codec.ProtocolError]) -> None:
    with pytest.raises(error) as caught:
        codec.FrameDecoder().feed(frame_of(raw))
    assert not caught.value.fatal


def test_unknown_type_number_is_reported() -> None:
    with pytest.raises(codec.UnknownCommandError) as caught:
        codec.decode_frame(frame_of(b"\x08\x46")[4:])
    assert caught.value.type_number == 70


def test_invalid_utf8_deep_inside_a_body() -> None:
    producer = pb.CommandProducer(topic="t", producer_id=1, request_id=2)
    producer.metadata.add(key="k", value="v")
    good = command_bytes(codec.make_command(producer))
    bad = good.replace(b"\x12\x01v", b"\x12\x01\xff")
    assert bad != good
    with pytest.raises(codec.CommandDecodeError, match="UTF-8"):
        codec.decode_frame(frame_of(bad)[4:])


def test_trailing_bytes_after_a_simple_command() -> None:
    with pytest.raises(codec.CommandDecodeError, match="unexpected"):
        codec.FrameDecoder().feed(
            frame_of(command_bytes(codec.make_command(pb.CommandPing())), b"x")
        )


@pytest.mark.parametrize(
    "tail",
    [
        b"",  # SEND with no metadata at all
        b"\x0e\x01\x00",  # truncated checksum
        b"\x00\x00",  # truncated metadata size
        b"\x00\x00\x00\x10\x0a\x01",  # metadata size overruns the frame
        b"\x00\x00\x00\x00",  # empty metadata: required fields missing
        b"\x00\x00\x00\x02\xff\xff",  # unparseable metadata
        b"\x0e\x02\x00\x00\x00\x09",  # broker entry metadata overruns
        b"\x0e\x02\x00",  # truncated broker entry metadata size
    ],
)
def test_truncated_or_bad_metadata(tail: bytes) -> None:
    data = frame_of(command_bytes(send_command()), tail)
    with pytest.raises(codec.MetadataDecodeError) as caught:
        codec.FrameDecoder().feed(data)
    assert caught.value.command is not None and caught.value.command.type == Type.SEND
    assert not caught.value.fatal


def _field(number: int, value: bytes | int) -> bytes:
    """One protobuf field, written by hand (so a string may hold bytes that are not UTF-8)."""
    if isinstance(value, int):
        return bytes([number << 3]) + codec._varint(value)
    tag = codec._varint(number << 3 | 2)
    return tag + codec._varint(len(value)) + value


_NAME, _SEQUENCE, _TIME = _field(1, b"p-1"), _field(2, 7), _field(3, 1_795_000_000_000)
_BAD = b"\xc3\x28"  # not UTF-8


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        (_SEQUENCE + _TIME, "lacks required fields: producer_name"),
        (_NAME + _TIME, "lacks required fields: sequence_id"),
        (_NAME + _SEQUENCE, "lacks required fields: publish_time"),
        (
            _field(1, _BAD) + _SEQUENCE + _TIME,
            "invalid UTF-8 in magnetar.pulsar.MessageMetadata.producer_name",
        ),
        (_NAME + _SEQUENCE + _TIME + _field(6, _BAD), "MessageMetadata.partition_key"),
        (_NAME + _SEQUENCE + _TIME + _field(7, b"ok") + _field(7, _BAD), "replicate_to"),
        (
            _NAME + _SEQUENCE + _TIME + _field(4, _field(1, b"k") + _field(2, _BAD)),
            "KeyValue.value",
        ),
        (_NAME + _SEQUENCE + _TIME + _field(26, _BAD), "MessageMetadata.uuid"),
    ],
)
def test_send_metadata_is_checked(metadata: bytes, problem: str) -> None:
    """Every SEND's metadata: required fields present, text UTF-8 wherever it may be (in
    lists and nested messages too), whatever the order the checks take for speed."""
    tail = struct.pack(">I", len(metadata)) + metadata + b"payload"
    with pytest.raises(codec.MetadataDecodeError, match=re.escape(problem)):
        codec.FrameDecoder().feed(frame_of(command_bytes(send_command()), tail))


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        (_SEQUENCE + _TIME, "lacks required fields: producer_name"),
        (_NAME + _SEQUENCE + _TIME + _field(6, _BAD), "MessageMetadata.partition_key"),
        (
            _NAME + _SEQUENCE + _TIME + _field(4, _field(1, b"k") + _field(2, _BAD)),
            "KeyValue.value",
        ),
        (_NAME + _SEQUENCE + _TIME + _field(4, _field(1, b"k")), "lacks required fields"),
        (_NAME + _SEQUENCE + _TIME + b"\xff", "unparseable MessageMetadata"),
    ],
)
def test_send_metadata_is_checked_with_or_without_a_checksum(
    metadata: bytes, problem: str, checksum: bool
) -> None:
    """A SEND with a checksum is checked by the quick path (a parse into the schema's copy
    with checked strings, no metadata object made); its refusals are the same."""
    section = struct.pack(">I", len(metadata)) + metadata + b"payload"
    if checksum:
        section = struct.pack(">HI", codec.MAGIC_CRC32C, crc32c.crc32c(section)) + section
    with pytest.raises(codec.MetadataDecodeError, match=re.escape(problem)):
        codec.FrameDecoder().feed(frame_of(command_bytes(send_command()), section))


_TEXT = st.sampled_from([b"", b"p-1", "vé".encode(), _BAD, b"\xed\xa0\x80"])  # last: a surrogate
_METADATA_FIELDS = st.one_of(
    st.tuples(st.sampled_from([1, 5, 6, 7, 26]), _TEXT).map(lambda f: _field(*f)),
    st.tuples(st.sampled_from([2, 3, 11]), st.integers(0, 2**40)).map(lambda f: _field(*f)),
    st.tuples(st.booleans(), _TEXT, st.booleans(), _TEXT).map(
        lambda kv: _field(
            4, (_field(1, kv[1]) if kv[0] else b"") + (_field(2, kv[3]) if kv[2] else b"")
        )
    ),
    st.binary(max_size=6),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_METADATA_FIELDS, max_size=8))
def test_the_quick_metadata_check_never_takes_what_the_full_one_refuses(
    fields: list[bytes],
) -> None:
    """The quick check may refuse more (a string that is not UTF-8 and then set again: the
    parse stops at the first), never less; what it refuses the full check decides, so a SEND
    is taken exactly when the full check takes its metadata."""
    data = b"".join(fields)
    full = codec._parse(pb.MessageMetadata(), memoryview(data)) is None
    if codec._metadata_valid(memoryview(data)):
        assert full
    section = struct.pack(">I", len(data)) + data + b"payload"
    section = struct.pack(">HI", codec.MAGIC_CRC32C, crc32c.crc32c(section)) + section
    try:
        codec.FrameDecoder().feed(frame_of(command_bytes(send_command()), section))
        taken = True
    except codec.MetadataDecodeError:
        taken = False
    assert taken == full


def test_a_checked_sends_metadata_is_made_when_asked_for() -> None:
    metadata = minimal_metadata(partition_key="k", properties=[pb.KeyValue(key="a", value="b")])
    frame = decode_one(
        codec.encode_payload_command(pb.CommandSend(producer_id=1, sequence_id=2), metadata, b"x")
    )
    assert frame.checksum_present
    assert frame.metadata == metadata  # a MessageMetadata of its own, equal to the one sent
    assert type(frame.metadata) is pb.MessageMetadata
    assert frame.payload == b"x"


_SENDS = st.builds(
    pb.CommandSend,
    producer_id=st.integers(0, 2**64 - 1),
    sequence_id=st.integers(0, 2**64 - 1),
    num_messages=st.integers(0, 1000),
    highest_sequence_id=st.integers(0, 2**64 - 1),
    is_chunk=st.booleans(),
    txnid_least_bits=st.integers(0, 2**64 - 1),
)


@settings(max_examples=200)
@given(_SENDS, st.booleans(), st.binary(max_size=40))
def test_a_send_decodes_the_same_on_the_quick_path(
    send: pb.CommandSend, checksum: bool, payload: bytes
) -> None:
    """``decode_frame`` of a SEND as clients encode it skips the BaseCommand (``_quick_send``);
    a memoryview takes the general path: both give the same frame, and the frame encodes back
    to its own bytes (what the proxy forwards)."""
    metadata = minimal_metadata(partition_key="k")
    data = codec.encode_payload_command(send, metadata, payload, checksum=checksum)
    quick, general = codec.decode_frame(data[4:]), codec.decode_frame(memoryview(data)[4:])
    for frame in (quick, general):
        assert (frame.type, frame.name, frame.body) == (pb.BaseCommand.SEND, "SEND", send)
        assert frame.command == pb.BaseCommand(type=pb.BaseCommand.SEND, send=send)
        assert frame.metadata == metadata and frame.payload == payload
        assert frame.checksum_present == checksum
        assert codec.encode_payload_command_raw(frame.command, frame.headers_and_payload) == data


def test_a_send_the_quick_path_refuses_is_answered_by_the_general_one() -> None:
    metadata = minimal_metadata()
    command = b"\x08\x06\x32\x02\x08\x01"  # SEND, its body holding producer_id only
    incomplete = frame_of(command, codec.encode_headers_and_payload(metadata, b"x"))
    with pytest.raises(codec.CommandDecodeError, match="lacks required fields: sequence_id"):
        codec.decode_frame(incomplete[4:])
    damaged = bytearray(codec.encode_payload_command(send_command().send, metadata, b"x"))
    damaged[-1] ^= 1
    with pytest.raises(codec.ChecksumError) as caught:
        codec.decode_frame(bytes(damaged[4:]))
    assert caught.value.command.send.sequence_id == 5


def test_send_metadata_with_text_in_lists_and_nested_fields_is_taken() -> None:
    metadata = (
        _NAME
        + _SEQUENCE
        + _TIME
        + _field(4, _field(1, b"k") + _field(2, "vé".encode()))
        + _field(6, b"key")
        + _field(7, b"east")
        + _field(26, b"u-1")
    )
    tail = struct.pack(">I", len(metadata)) + metadata + b"payload"
    frame = decode_one(frame_of(command_bytes(send_command()), tail))
    assert frame.metadata is not None
    assert frame.metadata.properties[0].value == "vé"
    assert list(frame.metadata.replicate_to) == ["east"]
    assert frame.payload == b"payload"


def test_error_keeps_frames_decoded_before_it() -> None:
    data = codec.encode_command(pb.CommandPing()) + frame_of(b"\x08\x12")
    with pytest.raises(codec.UnknownCommandError) as caught:
        codec.FrameDecoder().feed(data)
    assert [frame.type for frame in caught.value.frames] == [Type.PING]


def test_partial_frames_are_buffered() -> None:
    data = codec.encode_command(pb.CommandFlow(consumer_id=1, messagePermits=10))
    decoder = codec.FrameDecoder()
    for byte in data[:-1]:
        assert decoder.feed(bytes([byte])) == []
    assert decoder.buffered == len(data) - 1
    assert decoder.next_frame() is None
    assert [frame.command.flow.messagePermits for frame in decoder.feed(data[-1:])] == [10]
    assert decoder.buffered == 0


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


def test_batch_round_trip_sets_payload_sizes() -> None:
    items = [
        (pb.SingleMessageMetadata(partition_key="a", payload_size=999), b"one"),
        (pb.SingleMessageMetadata(properties=[pb.KeyValue(key="k", value="v")]), b""),
        (pb.SingleMessageMetadata(null_value=True), b"three"),
    ]
    payload = codec.build_batch(items)
    split = codec.split_batch(payload, 3)
    assert [data for _, data in split] == [b"one", b"", b"three"]
    assert [meta.payload_size for meta, _ in split] == [3, 0, 5]
    assert split[0][0].partition_key == "a"
    assert split[2][0].null_value
    # A batch travels as one SEND with num_messages_in_batch in the metadata.
    metadata = minimal_metadata(num_messages_in_batch=3)
    frame = decode_one(codec.encode_payload_command(send_command(), metadata, payload))
    assert frame.metadata is not None and codec.is_batch(frame.metadata)
    assert codec.split_batch(frame.payload, frame.metadata.num_messages_in_batch) == split
    assert not codec.is_batch(minimal_metadata())


@pytest.mark.parametrize(
    ("payload", "count"),
    [
        (b"", 1),  # ends before the first message
        (b"\x00\x00\x00\x09\x18\x01", 1),  # header overruns
        (b"\x00\x00\x00\x02\x18\x05ab", 1),  # message overruns
        (b"\x00\x00\x00\x00", 1),  # header lacks payload_size
        (b"\x00\x00\x00\x02\x18\x00extra", 1),  # bytes left over
        (b"\x00\x00\x00\x02\x18\x7f", 1),  # payload_size 127, nothing there
        (b"", -1),
    ],
)
def test_bad_batches(payload: bytes, count: int) -> None:
    with pytest.raises(codec.BatchError):
        codec.split_batch(payload, count)


@given(
    st.lists(
        st.tuples(st.text(max_size=8), st.binary(max_size=40), st.integers(0, 2**63)), max_size=8
    )
)
def test_batch_round_trip_property(items: list[tuple[str, bytes, int]]) -> None:
    built = [
        (pb.SingleMessageMetadata(partition_key=key, sequence_id=seq), data)
        for key, data, seq in items
    ]
    split = codec.split_batch(codec.build_batch(built), len(built))
    assert [(meta.partition_key, data, meta.sequence_id) for meta, data in split] == items


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 20))
def test_split_batch_fuzz(payload: bytes, count: int) -> None:
    try:
        codec.split_batch(payload, count)
    except codec.BatchError:
        pass


# --------------------------------------------------------------------------------------------
# Fuzzing the decoder: it returns frames or raises ProtocolError, nothing else, and terminates
# --------------------------------------------------------------------------------------------


def simple_frames() -> st.SearchStrategy[bytes]:
    return st.sampled_from(ALL_TYPES).map(
        lambda number: (
            codec.encode_command(full_command(number))
            if number not in codec.PAYLOAD_COMMANDS
            else codec.encode_payload_command(full_command(number), minimal_metadata(), b"p")
        )
    )


@st.composite
def payload_frames(draw: st.DrawFn) -> bytes:
    metadata = minimal_metadata(
        partition_key=draw(st.text(max_size=10)),
        sequence_id=draw(st.integers(0, 2**64 - 1)),
    )
    batch = draw(st.booleans())
    if batch:
        items = draw(st.lists(st.binary(max_size=20), max_size=4))
        metadata.num_messages_in_batch = len(items)
        payload = codec.build_batch((pb.SingleMessageMetadata(), item) for item in items)
    else:
        payload = draw(st.binary(max_size=64))
    entry_metadata = draw(st.none() | st.just(pb.BrokerEntryMetadata(index=5)))
    command = (
        pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=2))
        if entry_metadata is not None
        else pb.CommandSend(producer_id=1, sequence_id=metadata.sequence_id)
    )
    return codec.encode_payload_command(
        command,
        metadata,
        payload,
        checksum=draw(st.booleans()),
        broker_entry_metadata=entry_metadata,
    )


frames_strategy = st.lists(simple_frames() | payload_frames(), min_size=1, max_size=6)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def drain(decoder: codec.FrameDecoder, chunks: list[bytes]) -> list[codec.Frame]:
    """Feed chunk by chunk like a connection would, skipping frames the codec rejects."""
    frames: list[codec.Frame] = []
    for chunk in chunks:
        try:
            frames.extend(decoder.feed(chunk))
        except codec.ProtocolError as error:
            frames.extend(error.frames)
            if error.fatal:
                break
            # Keep draining what is already buffered after a recoverable error.
            while True:
                try:
                    frame = decoder.next_frame()
                except codec.ProtocolError as again:
                    if again.fatal:
                        return frames
                    continue
                if frame is None:
                    break
                frames.append(frame)
    for frame in frames:
        assert isinstance(frame, codec.Frame)
    return frames


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames_strategy, st.lists(st.integers(0, 10_000), max_size=12))
def test_valid_frames_survive_any_chunking(encoded: list[bytes], cuts: list[int]) -> None:
    data = b"".join(encoded)
    frames = drain(codec.FrameDecoder(), chunked(data, cuts))
    assert [decode_one(item).command for item in encoded] == [f.command for f in frames]
    assert (
        b"".join(
            codec.encode_payload_command_raw(
                frame.command,
                frame.headers_and_payload,
                broker_entry_metadata=frame.broker_entry_metadata,
            )
            if frame.type in codec.PAYLOAD_COMMANDS
            else codec.encode_command(frame.command)
            for frame in frames
        )
        == data
    )


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=8))
def test_random_bytes_only_raise_protocol_errors(data: bytes, cuts: list[int]) -> None:
    drain(codec.FrameDecoder(max_frame_size=1024), chunked(data, cuts))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(b"".join(draw(frames_strategy)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
    return bytes(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), st.lists(st.integers(0, 10_000), max_size=10))
def test_mutated_frames_only_raise_protocol_errors(data: bytes, cuts: list[int]) -> None:
    drain(codec.FrameDecoder(max_frame_size=4096), chunked(data, cuts))


@settings(max_examples=500, deadline=None)
@given(
    st.binary(max_size=60),
    st.sampled_from([b"", b"\x0e\x01", b"\x0e\x02", b"\x00\x00"]),
    st.binary(max_size=60),
)
def test_decode_frame_fuzz(command: bytes, magic: bytes, tail: bytes) -> None:
    """Random protobuf bytes behind valid sizes, so the parsers themselves get fuzzed."""
    for data in (command, b"\x08\x06\x32" + bytes([len(command) & 0x7F]) + command):
        try:
            frame = codec.decode_frame(frame_of(data, magic + tail)[4:])
        except codec.ProtocolError:
            continue
        assert isinstance(frame, codec.Frame)


@pytest.mark.parametrize("client_version", [0, 6, 20, 21, 99])
def test_negotiated_version_is_the_lower_one(client_version: int) -> None:
    assert codec.negotiate_protocol_version(client_version) == min(
        client_version, codec.SERVER_PROTOCOL_VERSION
    )


# -- hand-encoded hot-path frames ------------------------------------------------------------

_signed64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_unsigned64 = st.integers(min_value=0, max_value=2**64 - 1)


@given(_unsigned64, _unsigned64, _signed64, _signed64, st.none() | _unsigned64)
# Either side of the varint table (0-65,535) and a duplicate's (-1, -1).
@example(1, 65535, 7, 65535, None)
@example(127, 65536, 2**40, 65536, 65536)
@example(65535, 0, -1, -1, None)
def test_send_receipt_bytes_are_protobufs(
    producer_id: int, sequence_id: int, ledger_id: int, entry_id: int, highest: int | None
) -> None:
    receipt = pb.CommandSendReceipt(
        producer_id=producer_id,
        sequence_id=sequence_id,
        message_id=pb.MessageIdData(ledgerId=ledger_id % 2**64, entryId=entry_id % 2**64),
    )
    if highest is not None:
        receipt.highest_sequence_id = highest
    assert codec.encode_send_receipt(
        producer_id, sequence_id, ledger_id, entry_id, highest
    ) == codec.encode_command(receipt)


@given(
    _unsigned64,
    _signed64,
    _signed64,
    st.binary(max_size=64),
    st.integers(min_value=-1, max_value=2**31 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.lists(_signed64, max_size=4),
)
@example(65535, 7, 65535, b"x", -1, 0, [])
@example(65536, 2**40, 65536, b"", 3, 1, [-1])
@example(0, -1, -1, b"y" * 64, 65536, 2**32 - 1, [2**63 - 1] * 4)
def test_message_frame_bytes_are_protobufs(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    partition: int,
    redelivery_count: int,
    ack_set: list[int],
) -> None:
    message = pb.CommandMessage(
        consumer_id=consumer_id,
        message_id=pb.MessageIdData(ledgerId=ledger_id % 2**64, entryId=entry_id % 2**64),
        redelivery_count=redelivery_count,
    )
    if partition >= 0:
        message.message_id.partition = partition
    message.ack_set.extend(ack_set)
    expected = codec.encode_payload_command_raw(message, payload)
    if redelivery_count == 0:  # protobuf writes an explicitly set zero; the hand encoder omits it
        expected = codec.encode_payload_command_raw(
            pb.CommandMessage(
                consumer_id=consumer_id,
                message_id=message.message_id,
                ack_set=ack_set,
            ),
            payload,
        )
    assert (
        codec.encode_message_frame(
            consumer_id,
            ledger_id,
            entry_id,
            payload,
            partition=partition,
            redelivery_count=redelivery_count,
            ack_set=ack_set,
        )
        == expected
    )
