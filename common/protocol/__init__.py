"""The Pulsar binary protocol, without I/O: frame encoding and decoding (`codec`)."""

from magnetar.common.protocol.codec import (
    ChecksumError,
    Frame,
    FrameDecoder,
    ProtocolError,
    decode_frame,
    encode_command,
    encode_payload_command,
    make_command,
)

__all__ = [
    "ChecksumError",
    "Frame",
    "FrameDecoder",
    "ProtocolError",
    "decode_frame",
    "encode_command",
    "encode_payload_command",
    "make_command",
]
