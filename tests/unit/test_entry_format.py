"""The stored entry format: header fields, CRC32C digest over header and payload."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.ledger.entry import (
    HEADER_SIZE,
    DigestMismatchError,
    EntryFormatError,
    check_entry,
    decode_header,
    encode_entry,
    entry_payload,
    verify_entry,
)

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
payloads = st.binary(max_size=2048)


def test_header_layout_is_big_endian_ids_lac_length_digest() -> None:
    entry = encode_entry(1, 2, 3, 4, b"xyz")
    assert HEADER_SIZE == 36
    assert struct.unpack(">qqqq", entry[:32]) == (1, 2, 3, 4)
    assert entry[HEADER_SIZE:] == b"xyz"
    assert len(entry) == HEADER_SIZE + 3


@given(ledger_id=int64, entry_id=int64, lac=int64, length=int64, payload=payloads)
def test_round_trip(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> None:
    entry = encode_entry(ledger_id, entry_id, lac, length, payload)
    header = verify_entry(entry)
    assert (header.ledger_id, header.entry_id, header.lac, header.length) == (
        ledger_id,
        entry_id,
        lac,
        length,
    )
    assert decode_header(entry) == header
    assert check_entry(entry) == (ledger_id, entry_id, lac)
    assert entry_payload(entry) == payload
    assert verify_entry(memoryview(entry)) == header


@given(
    ledger_id=int64,
    entry_id=int64,
    lac=int64,
    payload=payloads,
    data=st.data(),
)
def test_any_flipped_bit_is_detected(
    ledger_id: int, entry_id: int, lac: int, payload: bytes, data: st.DataObject
) -> None:
    entry = bytearray(encode_entry(ledger_id, entry_id, lac, len(payload), payload))
    bit = data.draw(st.integers(min_value=0, max_value=len(entry) * 8 - 1), label="bit")
    entry[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(DigestMismatchError):
        verify_entry(bytes(entry))
    with pytest.raises(DigestMismatchError):
        check_entry(bytes(entry))


@given(payload=st.binary(min_size=1, max_size=512), data=st.data())
def test_truncated_or_extended_entry_is_detected(payload: bytes, data: st.DataObject) -> None:
    entry = encode_entry(7, 8, 7, 100, payload)
    cut = data.draw(st.integers(min_value=HEADER_SIZE, max_value=len(entry) - 1), label="cut")
    with pytest.raises(DigestMismatchError):
        check_entry(entry[:cut])
    extra = data.draw(st.binary(min_size=1, max_size=16), label="extra")
    with pytest.raises(DigestMismatchError):
        check_entry(entry + extra)


@pytest.mark.parametrize("size", [0, 1, HEADER_SIZE - 1])
def test_entry_shorter_than_header_is_a_format_error(size: int) -> None:
    short = encode_entry(1, 1, 0, 0, b"")[:size]
    with pytest.raises(EntryFormatError, match="shorter than"):
        check_entry(short)
    with pytest.raises(EntryFormatError):
        verify_entry(short)
    with pytest.raises(EntryFormatError):
        decode_header(short)


def test_errors_name_the_entry() -> None:
    entry = bytearray(encode_entry(42, 17, 16, 5, b"hello"))
    entry[-1] ^= 0xFF
    with pytest.raises(DigestMismatchError, match="ledger 42 entry 17"):
        verify_entry(bytes(entry))
