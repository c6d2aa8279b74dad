"""Sans-I/O codec for Pulsar binary protocol frames.

Nothing here touches a socket. `FrameDecoder` turns received bytes into `Frame` objects and the
`encode_*` functions turn commands into bytes; the asyncio connection around them only moves bytes.

Frame layout (all integers big-endian)::

    simple command:  [totalSize u32][commandSize u32][BaseCommand]
    payload command: [totalSize u32][commandSize u32][BaseCommand]
                     ([0x0e02 u16][size u32][BrokerEntryMetadata])       broker -> consumer, optional
                     [0x0e01 u16][CRC32C u32]                            absent from old clients
                     [metadataSize u32][MessageMetadata][payload]

`totalSize` counts every byte after itself. The CRC32C covers everything after the checksum field
(metadata size, metadata and payload). SEND and MESSAGE are the only payload commands.

A batch is one payload whose metadata has `num_messages_in_batch`; its (uncompressed) payload is
that many repetitions of ``[size u32][SingleMessageMetadata][message bytes]``, where the message
length is the `payload_size` field of the single-message metadata.

Errors: every malformed input raises a subclass of `ProtocolError` and nothing else. A *fatal*
error (`ProtocolError.fatal`) means the byte stream can no longer be split into frames; the
decoder then stays failed. Any other error consumed exactly the bad frame, so decoding can go on:
the broker answers a `ChecksumError` with a SEND_ERROR for that message and keeps the connection.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Iterable
from typing import Any, NoReturn

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from magnetar.common.proto import pulsar_api_pb2 as pb

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FRAME_PADDING",
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "PAYLOAD_COMMANDS",
    "SERVER_PROTOCOL_VERSION",
    "BatchError",
    "ChecksumError",
    "ChecksumState",
    "CommandDecodeError",
    "Frame",
    "FrameDecoder",
    "FrameSizeError",
    "FrameTooLargeError",
    "MetadataDecodeError",
    "ProtocolError",
    "UnknownCommandError",
    "build_batch",
    "command_body",
    "command_name",
    "decode_frame",
    "encode_command",
    "encode_headers_and_payload",
    "encode_message_frame",
    "encode_payload_command",
    "encode_payload_command_raw",
    "encode_send_receipt",
    "is_batch",
    "make_command",
    "negotiate_protocol_version",
    "split_batch",
]

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02

# Pulsar's default maxMessageSize; the frame limit adds room for the command and metadata that
# travel with a payload of that size.
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
FRAME_PADDING = 10 * 1024
DEFAULT_MAX_FRAME_SIZE = DEFAULT_MAX_MESSAGE_SIZE + FRAME_PADDING

# Highest protocol version this codec can describe; a connection runs at min(client, this).
SERVER_PROTOCOL_VERSION: int = max(pb.ProtocolVersion.values())

PAYLOAD_COMMANDS: frozenset[int] = frozenset({pb.BaseCommand.SEND, pb.BaseCommand.MESSAGE})

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

_BASE = pb.BaseCommand.DESCRIPTOR
_TYPE_ENUM = _BASE.enum_types_by_name["Type"]
# The protocol keeps type number N and the body's field number N equal; the unit tests pin this.
_FIELD_BY_TYPE: dict[int, str] = {
    value.number: _BASE.fields_by_number[value.number].name for value in _TYPE_ENUM.values
}
_TYPE_BY_BODY: dict[str, int] = {
    _BASE.fields_by_number[number].message_type.full_name: number for number in _FIELD_BY_TYPE
}


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class ProtocolError(Exception):
    """Malformed protocol input.

    `fatal` is true when framing is lost (the decoder refuses further input). `command` is the
    decoded BaseCommand when the failure came after it was parsed (e.g. a SEND with a bad
    checksum), so the caller can answer that request. `frames` holds the frames that
    `FrameDecoder.feed` decoded in the same call before the error.
    """

    def __init__(
        self, message: str, *, fatal: bool = False, command: pb.BaseCommand | None = None
    ) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.command = command
        self.frames: list[Frame] = []


class FrameSizeError(ProtocolError):
    """A size field is impossible (totalSize < 4, commandSize beyond the frame)."""


class FrameTooLargeError(FrameSizeError):
    """The frame is larger than the decoder's `max_frame_size`."""


class CommandDecodeError(ProtocolError):
    """The BaseCommand bytes do not parse, or its body is invalid (missing required fields,
    invalid UTF-8 text, unexpected bytes after a command that carries no payload)."""


class UnknownCommandError(CommandDecodeError):
    """The command type is unset or unknown to us, or the body matching the type is missing.

    `type_number` is the raw type number when one was present on the wire.
    """

    def __init__(
        self,
        message: str,
        *,
        type_number: int | None = None,
        command: pb.BaseCommand | None = None,
    ) -> None:
        super().__init__(message, command=command)
        self.type_number = type_number


class ChecksumError(ProtocolError):
    """The CRC32C of a payload command does not match; `command` identifies the message."""

    def __init__(self, message: str, *, command: pb.BaseCommand, expected: int, actual: int):
        super().__init__(message, command=command)
        self.expected = expected
        self.actual = actual


class MetadataDecodeError(ProtocolError):
    """The payload section of a SEND/MESSAGE is truncated or its MessageMetadata is invalid."""


class BatchError(ProtocolError):
    """A batch payload does not split into the announced single messages."""


# --------------------------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------------------------


class ChecksumState(enum.Enum):
    ABSENT = "absent"  # payload sent without magic + CRC32C (old clients); nothing verified
    VALID = "valid"  # CRC32C present and verified


class Frame:
    """One decoded frame.

    For SEND/MESSAGE, `metadata` and `payload` are set and `checksum` tells whether a CRC32C was
    present (a wrong one raises `ChecksumError` instead). `headers_and_payload` are the exact
    bytes from the checksum magic (or the metadata size when there is none) to the end: what a
    broker stores as the entry and later sends back after a MESSAGE command. A decoded frame
    makes its metadata object and copies its payload out of `headers_and_payload` only when
    asked for them (a broker storing a plain SEND never is; the metadata was checked already).
    """

    __slots__ = (
        "_command",
        "_metadata",
        "_metadata_at",
        "_payload",
        "_payload_at",
        "body",
        "broker_entry_metadata",
        "checksum",
        "headers_and_payload",
        "type",
    )

    def __init__(
        self,
        command: pb.BaseCommand | None,
        metadata: pb.MessageMetadata | None = None,
        payload: bytes = b"",
        checksum: ChecksumState | None = None,
        broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
        headers_and_payload: bytes = b"",
        payload_at: int = -1,
        body: Message | None = None,
        metadata_at: int = -1,
    ) -> None:
        #: None for a SEND decoded without one (``_quick_send``): made from the body if asked.
        self._command = command
        #: The command's type and its body (e.g. ``command.send`` for SEND), read once here:
        #: every frame is asked for them more than once.
        if command is None:
            assert body is not None
            self.type: int = _SEND
            self.body: Message = body
        else:
            self.type = command.type
            self.body = command_body(command) if body is None else body
        self._metadata = metadata
        #: Where the (checked) metadata starts in ``headers_and_payload``, up to the payload
        #: (-1: ``metadata`` is given).
        self._metadata_at = metadata_at
        self._payload: bytes | None = payload if payload_at < 0 else None
        #: Where the payload starts in ``headers_and_payload`` (-1: ``payload`` is given).
        self._payload_at = payload_at
        self.checksum = checksum
        self.broker_entry_metadata = broker_entry_metadata
        self.headers_and_payload = headers_and_payload

    def __repr__(self) -> str:
        return f"Frame({self.name}, {len(self.headers_and_payload)} bytes of payload section)"

    @property
    def command(self) -> pb.BaseCommand:
        if self._command is None:
            self._command = make_command(self.body)
        return self._command

    @property
    def metadata(self) -> pb.MessageMetadata | None:
        if self._metadata is None and self._metadata_at >= 0:
            self._metadata = pb.MessageMetadata.FromString(
                self.headers_and_payload[self._metadata_at : self._payload_at]
            )
        return self._metadata

    @property
    def payload(self) -> bytes:
        if self._payload is None:
            self._payload = self.headers_and_payload[self._payload_at :]
        return self._payload

    @property
    def name(self) -> str:
        return command_name(self.type)

    @property
    def checksum_present(self) -> bool:
        return self.checksum is ChecksumState.VALID


_TYPE_NAMES: dict[int, str] = {v.number: v.name for v in _TYPE_ENUM.values}


def command_name(type_number: int) -> str:
    """`BaseCommand.Type` name for a number, or ``TYPE_<n>`` for one we do not know."""
    name = _TYPE_NAMES.get(type_number)
    return name if name is not None else f"TYPE_{type_number}"


def command_body(command: pb.BaseCommand) -> Message:
    """The sub-message that carries the command's fields (e.g. `command.connect` for CONNECT)."""
    return getattr(command, _FIELD_BY_TYPE[command.type])


def make_command(body: Message) -> pb.BaseCommand:
    """Wrap a command body (e.g. `CommandPing()`) in a BaseCommand with the matching type."""
    if isinstance(body, pb.BaseCommand):
        return body
    type_number = _TYPE_BY_BODY.get(body.DESCRIPTOR.full_name)
    if type_number is None:
        raise TypeError(f"{body.DESCRIPTOR.full_name} is not a BaseCommand body")
    command = pb.BaseCommand(type=type_number)
    field = getattr(command, _FIELD_BY_TYPE[type_number])
    field.SetInParent()  # empty bodies (PING, PONG) must still be present on the wire
    field.CopyFrom(body)
    return command


def negotiate_protocol_version(
    client_version: int, server_version: int = SERVER_PROTOCOL_VERSION
) -> int:
    """Protocol version for a connection: the lower of what each side speaks."""
    return max(0, min(client_version, server_version))


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _serialize(message: Message, what: str) -> bytes:
    missing = message.FindInitializationErrors()
    if missing:
        raise ValueError(f"cannot encode {what}: required fields not set: {', '.join(missing)}")
    return message.SerializeToString()


def _serialize_command(command: pb.BaseCommand | Message) -> bytes:
    command = make_command(command)
    if not command.HasField("type"):
        raise ValueError("cannot encode a BaseCommand without a type")
    field = _FIELD_BY_TYPE.get(command.type)
    if field is None or not command.HasField(field):
        raise ValueError(f"cannot encode {command_name(command.type)}: its body is not set")
    return _serialize(command, command_name(command.type))


def encode_command(command: pb.BaseCommand | Message) -> bytes:
    """Frame a simple command. Accepts a BaseCommand or a bare body such as `CommandPong()`."""
    data = _serialize_command(command)
    return _U32.pack(4 + len(data)) + _U32.pack(len(data)) + data


def _broker_entry_prefix(broker_entry_metadata: pb.BrokerEntryMetadata | None) -> bytes:
    if broker_entry_metadata is None:
        return b""
    data = _serialize(broker_entry_metadata, "BrokerEntryMetadata")
    return _U16.pack(MAGIC_BROKER_ENTRY_METADATA) + _U32.pack(len(data)) + data


def encode_headers_and_payload(
    metadata: pb.MessageMetadata, payload: bytes, *, checksum: bool = True
) -> bytes:
    """The payload section of a SEND/MESSAGE: optional magic + CRC32C, metadata, payload."""
    md = _serialize(metadata, "MessageMetadata")
    section = _U32.pack(len(md)) + md + bytes(payload)
    if not checksum:
        return section
    return _U16.pack(MAGIC_CRC32C) + _U32.pack(crc32c.crc32c(section)) + section


def encode_payload_command_raw(
    command: pb.BaseCommand | Message,
    headers_and_payload: bytes,
    *,
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
) -> bytes:
    """Frame a SEND/MESSAGE around an already encoded payload section (e.g. a stored entry)."""
    data = _serialize_command(command)
    tail = _broker_entry_prefix(broker_entry_metadata) + bytes(headers_and_payload)
    return _U32.pack(4 + len(data) + len(tail)) + _U32.pack(len(data)) + data + tail


def encode_payload_command(
    command: pb.BaseCommand | Message,
    metadata: pb.MessageMetadata,
    payload: bytes,
    *,
    checksum: bool = True,
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
) -> bytes:
    """Frame a SEND or MESSAGE with its metadata and payload (CRC32C unless `checksum=False`)."""
    section = encode_headers_and_payload(metadata, payload, checksum=checksum)
    return encode_payload_command_raw(command, section, broker_entry_metadata=broker_entry_metadata)


# --------------------------------------------------------------------------------------------
# Hot paths: the two frames a broker sends per message, encoded by hand
# --------------------------------------------------------------------------------------------
#
# SEND_RECEIPT and MESSAGE go out once per message; building a BaseCommand object for each cost
# more than the rest of the send path. These write the same bytes protobuf writes (fields in
# number order, varints, signed int32/int64 as ten-byte varints); tests compare them with
# protobuf's own serialization.

_VARINT_1 = [bytes((i,)) for i in range(128)]
_U64_MASK = (1 << 64) - 1
_U32_PAIR = struct.Struct(">II")


def _varint(value: int) -> bytes:
    """Protobuf varint of ``value`` (a negative one as its 64-bit two's complement)."""
    if 0 <= value < 0x80:
        return _VARINT_1[value]
    if 0 < value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if 0 < value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    if 0 < value < 0x10000000:
        return bytes(
            (
                (value & 0x7F) | 0x80,
                ((value >> 7) & 0x7F) | 0x80,
                ((value >> 14) & 0x7F) | 0x80,
                value >> 21,
            )
        )
    value &= _U64_MASK
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


#: Varints of 0 to 65,535, made once (2.3 MB): producer and consumer ids, entry ids within a
#: ledger and most sequence ids are below, and a lookup here costs a fifth of a call of
#: ``_varint`` (six per message: three in its receipt, three in its MESSAGE frame).
_SMALL_VARINTS = 1 << 16
_VARINTS = [_varint(i) for i in range(_SMALL_VARINTS)]


@functools.lru_cache(maxsize=1024)
def _ledger_id_prefix(ledger_id: int) -> bytes:
    """MessageIdData's ledgerId field and the entryId tag: ledger ids are large (a seven-byte
    varint, worked out bit by bit) and the same for thousands of messages in a row."""
    return b"\x08" + _varint(ledger_id) + b"\x10"


def encode_send_receipt(
    producer_id: int,
    sequence_id: int,
    ledger_id: int,
    entry_id: int,
    highest_sequence_id: int | None = None,
) -> bytes:
    """The framed SEND_RECEIPT for a stored message (ids signed: -1 travels as 2**64 - 1).
    Its message id (at most 22 bytes) and body (at most 57) have one-byte lengths."""
    small = _SMALL_VARINTS
    message_id = _ledger_id_prefix(ledger_id) + (
        _VARINTS[entry_id] if 0 <= entry_id < small else _varint(entry_id)
    )
    body = b"".join(
        (
            b"\x08",
            _VARINTS[producer_id] if 0 <= producer_id < small else _varint(producer_id),
            b"\x10",
            _VARINTS[sequence_id] if 0 <= sequence_id < small else _varint(sequence_id),
            b"\x1a",
            _VARINT_1[len(message_id)],
            message_id,
        )
    )
    if highest_sequence_id is not None:
        body += b"\x20" + _varint(highest_sequence_id)
    size = len(body) + 4  # the command: type (2 bytes), field 7's tag, body length, body
    return _RECEIPT_HEAD.pack(size + 4, size, 0x08, 0x07, 0x3A, len(body)) + body


#: A SEND_RECEIPT's two frame sizes, then its command's type (SEND_RECEIPT), field 7's tag and
#: the body's length.
_RECEIPT_HEAD = struct.Struct(">IIBBBB")


def encode_message_frame(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    headers_and_payload: bytes,
    *,
    partition: int = -1,
    redelivery_count: int = 0,
    ack_set: list[int] | None = None,
) -> bytes:
    """The framed MESSAGE carrying a stored entry to a consumer."""
    small = _SMALL_VARINTS
    message_id = _ledger_id_prefix(ledger_id) + (
        _VARINTS[entry_id] if 0 <= entry_id < small else _varint(entry_id)
    )
    if partition >= 0:
        message_id += b"\x18" + (_VARINTS[partition] if partition < small else _varint(partition))
    body = (
        b"\x08"
        + (_VARINTS[consumer_id] if 0 <= consumer_id < small else _varint(consumer_id))
        + b"\x12"
        + _VARINT_1[len(message_id)]
        + message_id
    )
    if redelivery_count:
        body += b"\x18" + _varint(redelivery_count)
    if ack_set:
        body += b"".join(b"\x20" + _varint(word) for word in ack_set)
    size = len(body)
    command = (  # type MESSAGE, field 9
        b"\x08\x09\x4a" + (_VARINTS[size] if size < small else _varint(size)) + body
    )
    return b"".join(
        (
            _U32_PAIR.pack(4 + len(command) + len(headers_and_payload), len(command)),
            command,
            headers_and_payload,
        )
    )


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def _invalid_text_field(message: Message) -> str | None:
    """Name of the first string field holding invalid UTF-8, searching nested messages.

    proto2 parsing does not validate UTF-8; the Python runtime then hands back `bytes` where a
    `str` is declared, which would surface as a TypeError far from the codec. Only the fields
    that are set and can hold text are looked at (which ones can is worked out once per
    message type): this runs for every message a producer sends.
    """
    kinds = _text_kinds(message.DESCRIPTOR)
    if not kinds:
        return None
    for field, value in message.ListFields():
        kind = kinds.get(field.name)
        if kind is None:
            continue
        if kind is _TextKind.STRING:
            if isinstance(value, bytes):
                return f"{message.DESCRIPTOR.full_name}.{field.name}"
        elif kind is _TextKind.STRINGS:
            if bytes in map(type, value):
                return f"{message.DESCRIPTOR.full_name}.{field.name}"
        else:
            for item in value if kind is _TextKind.MESSAGES else (value,):
                found = _invalid_text_field(item)
                if found is not None:
                    return found
    return None


class _TextKind(enum.Enum):
    STRING = 1
    STRINGS = 2
    MESSAGE = 3  # a message type that can hold text
    MESSAGES = 4


_TEXT_KINDS: dict[str, dict[str, _TextKind]] = {}


def _text_kinds(descriptor: Any) -> dict[str, _TextKind]:
    """Field name -> kind, for the fields of ``descriptor`` that hold text themselves or in a
    nested message."""
    found = _TEXT_KINDS.get(descriptor.full_name)
    if found is None:
        found = _TEXT_KINDS[descriptor.full_name] = {}  # guard for self-nesting types
        for field in descriptor.fields:
            repeated = field.is_repeated
            if field.type == field.TYPE_STRING:
                found[field.name] = _TextKind.STRINGS if repeated else _TextKind.STRING
            elif field.type == field.TYPE_MESSAGE and _text_kinds(field.message_type):
                found[field.name] = _TextKind.MESSAGES if repeated else _TextKind.MESSAGE
    return found


def _parse(message: Message, data: bytes | memoryview) -> str | None:
    """Parse into `message`; return a description of the problem, or None if it is valid."""
    try:
        message.ParseFromString(data)
    except Exception as exc:  # DecodeError, RecursionError: all mean "not this message"
        return f"unparseable {message.DESCRIPTOR.name}: {exc}"
    return _check(message)


def _check(message: Message) -> str | None:
    """What is wrong with a parsed message (a required field missing, text that is not
    UTF-8), or None."""
    missing = message.FindInitializationErrors()
    if missing:
        return f"{message.DESCRIPTOR.name} lacks required fields: {', '.join(missing)}"
    bad_text = _invalid_text_field(message)
    if bad_text is not None:
        return f"{message.DESCRIPTOR.name} has invalid UTF-8 in {bad_text}"
    return None


def _checked_copy(message_type: Any) -> Any:
    """``message_type`` once more, built from its own descriptor in a pool of its own, with every
    string field (nested ones too) declared checked as UTF-8 when parsed (protobuf editions):
    a parse into it that does not raise, then ``IsInitialized``, is what ``_check`` finds, done
    in C without reading a field. Nothing is written by hand, so it cannot drift from the
    schema."""
    source = message_type.DESCRIPTOR.file
    package = f"{source.package}.checked"
    copy = descriptor_pb2.FileDescriptorProto()
    source.CopyToProto(copy)
    copy.name = f"checked/{source.name}"
    copy.package = package
    copy.ClearField("service")
    copy.syntax = "editions"
    copy.edition = descriptor_pb2.EDITION_2023  # its default: strings are checked when parsed
    features = copy.options.features
    features.enum_type = descriptor_pb2.FeatureSet.CLOSED  # proto2's enums
    features.repeated_field_encoding = descriptor_pb2.FeatureSet.EXPANDED  # proto2's default

    def as_editions(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            if field.label == field.LABEL_REQUIRED:
                field.label = field.LABEL_OPTIONAL
                field.options.features.field_presence = descriptor_pb2.FeatureSet.LEGACY_REQUIRED
            if field.options.HasField("packed"):
                if field.options.packed:
                    field.options.features.repeated_field_encoding = (
                        descriptor_pb2.FeatureSet.PACKED
                    )
                field.options.ClearField("packed")
            if field.type_name.startswith(f".{source.package}."):
                field.type_name = f".{package}.{field.type_name[len(source.package) + 2 :]}"
        for nested in message.nested_type:
            as_editions(nested)

    for message in copy.message_type:
        as_editions(message)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(copy)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{package}.{message_type.DESCRIPTOR.name}")
    )


_CheckedMetadata = _checked_copy(pb.MessageMetadata)


def _metadata_valid(data: memoryview) -> bool:
    """Whether ``data`` is a valid MessageMetadata (``_parse`` finds no problem), with no
    MessageMetadata made: the usual SEND's check."""
    checked = _CheckedMetadata()
    try:
        checked.ParseFromString(data)
    except Exception:  # unparseable, or text that is not UTF-8: _parse says which
        return False
    return checked.IsInitialized()


def _raw_type_number(command: pb.BaseCommand) -> int | None:
    """The wire value of field 1 when the runtime kept it aside as an unknown enum value."""
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet

        for item in UnknownFieldSet(command):
            if item.field_number == 1 and isinstance(item.data, int):
                return item.data
    except Exception:  # purely diagnostic; never let it mask the real error
        return None
    return None


#: The BaseCommand fields whose body type can hold text (the rest need no UTF-8 check).
_BODIES_WITH_TEXT: frozenset[str] = frozenset(
    field
    for field in _FIELD_BY_TYPE.values()
    if _text_kinds(_BASE.fields_by_name[field].message_type)
)


def _parse_command(data: memoryview) -> tuple[pb.BaseCommand, Message]:
    """The command and its body, checked: a type we know, its body present with its required
    fields, valid UTF-8 wherever it holds text."""
    command = pb.BaseCommand()
    try:
        command.ParseFromString(data)
    except Exception as exc:
        raise CommandDecodeError(f"unparseable BaseCommand: {exc}") from exc
    if not command.HasField("type"):
        number = _raw_type_number(command)
        if number is None:
            raise UnknownCommandError("BaseCommand without a type")
        raise UnknownCommandError(f"unknown command type {number}", type_number=number)
    type_number = command.type
    field = _FIELD_BY_TYPE[type_number]
    if not command.HasField(field):
        raise UnknownCommandError(
            f"{command_name(type_number)} command without its '{field}' body",
            type_number=type_number,
            command=command,
        )
    body = getattr(command, field)
    missing = body.FindInitializationErrors()
    if missing:
        raise CommandDecodeError(
            f"{command_name(type_number)} command lacks required fields: {', '.join(missing)}",
            command=command,
        )
    if field in _BODIES_WITH_TEXT:  # not SEND, FLOW, PING, ...: nothing to look at
        bad_text = _invalid_text_field(body)
        if bad_text is not None:
            raise CommandDecodeError(
                f"{command_name(type_number)} command has invalid UTF-8 in {bad_text}",
                command=command,
            )
    return command, body


#: The start of the usual payload section: checksum magic, CRC32C, metadata size.
_CHECKED_HEAD = struct.Struct(">HII")


def _quick_section(command: pb.BaseCommand | None, body: Message, view: memoryview) -> Frame | None:
    """The frame of the usual payload section (checksum, then metadata: both hold), read with
    few calls and no metadata object made; None for anything else, or any problem, which
    ``_decode_payload_section`` reads and answers."""
    size = len(view)
    if size < 10:
        return None
    magic, expected, metadata_size = _CHECKED_HEAD.unpack_from(view, 0)
    if (
        magic != MAGIC_CRC32C
        or metadata_size > size - 10
        or crc32c.crc32c(view[6:]) != expected
        or not _metadata_valid(view[10 : 10 + metadata_size])
    ):
        return None
    return Frame(
        command, None, b"", ChecksumState.VALID, None, bytes(view), 10 + metadata_size, body, 10
    )


_SEND = pb.BaseCommand.SEND
if "send" in _BODIES_WITH_TEXT:
    raise RuntimeError("_quick_send relies on CommandSend holding no text to check")
#: A SEND's command as clients encode it: its type (field 1), then its body (field 6) and the
#: body's length, one byte for a body under 128 bytes (every SEND's: a few ids).
_SEND_HEAD = b"\x08\x06\x32"


def _quick_send(frame: bytes | bytearray, command_size: int) -> Frame | None:
    """A SEND as clients encode it, with the usual payload section, decoded without its
    BaseCommand (made only if asked for: ``Frame.command``); None for any other frame, or
    any problem, which the general path reads and answers."""
    try:
        body = pb.CommandSend.FromString(frame[8 : 4 + command_size])
    except Exception:
        return None
    if not body.IsInitialized():
        return None
    return _quick_section(None, body, memoryview(frame)[4 + command_size :])


def _decode_payload_section(command: pb.BaseCommand, body: Message, view: memoryview) -> Frame:
    quick = _quick_section(command, body, view)
    if quick is not None:
        return quick
    size = len(view)
    name = command_name(command.type)
    pos = 0

    broker_entry_metadata = None
    if size >= 2 and _U16.unpack_from(view, 0)[0] == MAGIC_BROKER_ENTRY_METADATA:
        if size < 6:
            raise MetadataDecodeError(f"{name}: truncated broker entry metadata", command=command)
        entry_size = _U32.unpack_from(view, 2)[0]
        pos = 6
        if entry_size > size - pos:
            raise MetadataDecodeError(
                f"{name}: broker entry metadata of {entry_size} bytes overruns the frame",
                command=command,
            )
        broker_entry_metadata = pb.BrokerEntryMetadata()
        problem = _parse(broker_entry_metadata, view[pos : pos + entry_size])
        if problem is not None:
            raise MetadataDecodeError(f"{name}: {problem}", command=command)
        pos += entry_size

    headers_start = pos
    checksum = ChecksumState.ABSENT
    # A metadata size starting with 0x0e01 would exceed any frame limit, so the magic is
    # unambiguous.
    if size - pos >= 2 and _U16.unpack_from(view, pos)[0] == MAGIC_CRC32C:
        if size - pos < 6:
            raise MetadataDecodeError(f"{name}: truncated checksum", command=command)
        expected = _U32.unpack_from(view, pos + 2)[0]
        pos += 6
        actual = crc32c.crc32c(view[pos:])
        if actual != expected:
            raise ChecksumError(
                f"{name}: CRC32C mismatch (frame says {expected:#010x}, computed {actual:#010x})",
                command=command,
                expected=expected,
                actual=actual,
            )
        checksum = ChecksumState.VALID

    if size - pos < 4:
        raise MetadataDecodeError(f"{name}: frame ends before the metadata size", command=command)
    metadata_size = _U32.unpack_from(view, pos)[0]
    pos += 4
    if metadata_size > size - pos:
        raise MetadataDecodeError(
            f"{name}: metadata of {metadata_size} bytes overruns the frame "
            f"({size - pos} bytes left)",
            command=command,
        )
    metadata = pb.MessageMetadata()
    problem = _parse(metadata, view[pos : pos + metadata_size])
    if problem is not None:
        raise MetadataDecodeError(f"{name}: {problem}", command=command)
    pos += metadata_size
    return Frame(
        command,
        metadata,
        b"",
        checksum,
        broker_entry_metadata,
        bytes(view[headers_start:]),
        pos - headers_start,
        body,
    )


def decode_frame(frame: bytes | bytearray | memoryview) -> Frame:
    """Decode one frame given the bytes after its totalSize field (exactly totalSize bytes)."""
    view = memoryview(frame)
    total_size = len(view)
    if total_size < 4:
        raise FrameSizeError(f"frame of {total_size} bytes cannot hold a command size")
    command_size = _U32.unpack_from(view, 0)[0]
    if command_size > total_size - 4:
        raise FrameSizeError(
            f"command size {command_size} exceeds the {total_size - 4} bytes left in the frame"
        )
    if (
        command_size > 4
        and not isinstance(frame, memoryview)
        and frame.startswith(_SEND_HEAD, 4)
        and frame[7] == command_size - 4
    ):
        quick = _quick_send(frame, command_size)
        if quick is not None:
            return quick
    command, body = _parse_command(view[4 : 4 + command_size])
    rest = view[4 + command_size :]
    if command.type in PAYLOAD_COMMANDS:
        return _decode_payload_section(command, body, rest)
    if len(rest):
        raise CommandDecodeError(
            f"{len(rest)} unexpected bytes after a {command_name(command.type)} command",
            command=command,
        )
    return Frame(command, body=body)


class FrameDecoder:
    """Incremental frame decoder: buffer what arrives, hand out complete frames.

    `receive_data` buffers, `next_frame` returns one frame or None when more bytes are needed,
    and `feed` does both and returns every complete frame. A size that breaks framing (totalSize
    below 4 or above `max_frame_size`) is detected from the first 4 bytes, before the body is
    buffered, and leaves the decoder failed: every later call raises the same error. Other errors
    drop only the offending frame.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must allow at least a size and an empty command")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._pos = 0
        self._failure: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer) - self._pos

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._failure is None:
            self._buffer += data

    def next_frame(self) -> Frame | None:
        if self._failure is not None:
            raise self._failure
        available = len(self._buffer) - self._pos
        if available < 4:
            self._compact()
            return None
        total_size = _U32.unpack_from(self._buffer, self._pos)[0]
        if total_size < 4:
            self._fail(FrameSizeError(f"total size {total_size} is below the minimum of 4"))
        if total_size + 4 > self.max_frame_size:
            self._fail(
                FrameTooLargeError(
                    f"frame of {total_size + 4} bytes exceeds the limit of {self.max_frame_size}"
                )
            )
        if available < total_size + 4:
            self._compact()
            return None
        start = self._pos + 4
        body = self._buffer[start : start + total_size]  # one copy; the buffer moves on
        self._pos = start + total_size
        if self._pos > 65536:  # else compacted when the buffer is used up (returns None)
            self._compact()
        return decode_frame(body)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Buffer `data` and return all frames now complete.

        On a malformed frame the error is raised; frames decoded before it in this call are on
        the error's `frames` attribute so none are lost.
        """
        self.receive_data(data)
        frames: list[Frame] = []
        while True:
            try:
                frame = self.next_frame()
            except ProtocolError as exc:
                exc.frames = frames
                raise
            if frame is None:
                return frames
            frames.append(frame)

    def _fail(self, error: ProtocolError) -> NoReturn:
        error.fatal = True
        self._failure = error
        self._buffer = bytearray()
        self._pos = 0
        raise error

    def _compact(self) -> None:
        # Drop consumed bytes once they dominate the buffer, keeping appends amortized O(1).
        if self._pos and (self._pos >= len(self._buffer) or self._pos > 65536):
            del self._buffer[: self._pos]
            self._pos = 0


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


def is_batch(metadata: pb.MessageMetadata) -> bool:
    """Whether a payload is a batch: the producer set `num_messages_in_batch` explicitly."""
    return metadata.HasField("num_messages_in_batch")


def split_batch(
    payload: bytes | memoryview, count: int
) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    """Split an uncompressed batch payload into its `count` (metadata, message bytes) pairs.

    Decompress first when `MessageMetadata.compression` is not NONE.
    """
    if count < 0:
        raise BatchError(f"negative batch size {count}")
    view = memoryview(payload)
    size = len(view)
    pos = 0
    messages: list[tuple[pb.SingleMessageMetadata, bytes]] = []
    for index in range(count):
        if size - pos < 4:
            raise BatchError(f"batch ends before message {index} of {count}")
        header_size = _U32.unpack_from(view, pos)[0]
        pos += 4
        if header_size > size - pos:
            raise BatchError(f"metadata of batch message {index} overruns the payload")
        single = pb.SingleMessageMetadata()
        problem = _parse(single, view[pos : pos + header_size])
        if problem is not None:
            raise BatchError(f"batch message {index}: {problem}")
        pos += header_size
        length = single.payload_size
        if length < 0 or length > size - pos:
            raise BatchError(f"batch message {index} claims {length} bytes, {size - pos} left")
        messages.append((single, bytes(view[pos : pos + length])))
        pos += length
    if pos != size:
        raise BatchError(f"{size - pos} bytes left over after {count} batch messages")
    return messages


def build_batch(messages: Iterable[tuple[pb.SingleMessageMetadata, bytes]]) -> bytes:
    """Encode a batch payload; each `payload_size` is set from the message bytes."""
    parts: list[bytes] = []
    for single, data in messages:
        header = pb.SingleMessageMetadata()
        header.CopyFrom(single)
        header.payload_size = len(data)
        encoded = _serialize(header, "SingleMessageMetadata")
        parts.append(_U32.pack(len(encoded)))
        parts.append(encoded)
        parts.append(bytes(data))
    return b"".join(parts)
