"""The stored entry format, shared by writers (ledger client) and bookies.

Layout (big-endian)::

    ledger_id  int64
    entry_id   int64
    lac        int64   last add confirmed when this entry was sent (-1: none yet)
    length     int64   ledger length in bytes up to and including this entry
    digest     uint32  CRC32C over the 32 header bytes above and the payload
    payload    bytes

The digest travels with the entry from writer to bookie to reader, so corruption anywhere on
that path is caught by whoever reads the entry next.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

_HEAD = struct.Struct(">qqqq")
_DIGEST = struct.Struct(">I")
_FULL = struct.Struct(">qqqqI")
HEADER_SIZE = _FULL.size


class EntryFormatError(ValueError):
    """The bytes are too short to be an entry."""


class DigestMismatchError(ValueError):
    """The entry's CRC32C digest does not match its contents."""


@dataclass(slots=True, frozen=True)
class EntryHeader:
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    digest: int


def encode_entry(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
    head = _HEAD.pack(ledger_id, entry_id, lac, length)
    digest = crc32c.crc32c(payload, crc32c.crc32c(head))
    return b"".join((head, _DIGEST.pack(digest), payload))


def decode_header(entry: bytes | memoryview) -> EntryHeader:
    if len(entry) < HEADER_SIZE:
        raise EntryFormatError(
            f"entry of {len(entry)} bytes is shorter than its {HEADER_SIZE}-byte header"
        )
    return EntryHeader(*_FULL.unpack_from(entry, 0))


_IDS = struct.Struct(">qqq")


def entry_ids(entry: bytes) -> tuple[int, int, int]:
    """(ledger id, entry id, lac) from an entry's header, its digest not checked."""
    if len(entry) < HEADER_SIZE:
        raise EntryFormatError(
            f"entry of {len(entry)} bytes is shorter than its {HEADER_SIZE}-byte header"
        )
    return _IDS.unpack_from(entry, 0)  # type: ignore[return-value]


def check_entry(entry: bytes) -> tuple[int, int, int]:
    """(ledger id, entry id, lac) of an entry whose digest holds; the hot-path form of
    verify_entry (no header object). Raises EntryFormatError or DigestMismatchError."""
    ledger_id, entry_id, lac = entry_ids(entry)
    (digest,) = _DIGEST.unpack_from(entry, _HEAD.size)
    view = memoryview(entry)
    actual = crc32c.crc32c(view[HEADER_SIZE:], crc32c.crc32c(view[: _HEAD.size]))
    if actual != digest:
        raise DigestMismatchError(
            f"ledger {ledger_id} entry {entry_id}: digest {actual:#010x} "
            f"computed, {digest:#010x} stored"
        )
    return ledger_id, entry_id, lac


def verify_entry(entry: bytes | memoryview) -> EntryHeader:
    """Decode the header and check the digest; raise DigestMismatchError if it does not hold."""
    check_entry(bytes(entry) if isinstance(entry, memoryview) else entry)
    return decode_header(entry)


def entry_payload(entry: bytes) -> bytes:
    return entry[HEADER_SIZE:]
