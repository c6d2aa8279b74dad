"""The persisted state of a cursor and its two encodings. Pure code, no I/O.

A cursor's state is its mark-delete position, the individually acknowledged ranges above it
and the acknowledged batch indexes of partly acknowledged entries (Pulsar's
``PositionInfo``). It is stored in one of two places:

* **The metadata store** (JSON, :func:`to_json`), when it is small: at most
  ``max_unacked_ranges_in_metadata`` ranges and as many partly acknowledged entries, and at
  most :data:`MAX_METADATA_BYTES` once encoded (etcd refuses values over 1.5 MiB).
* **An entry of the cursor's ledger** (binary, :func:`encode`), when it is not. The binary form
  is columnar and delta-coded, then zlib-compressed: a cursor that acknowledged every other
  entry of a long backlog stores a few bytes per hole.

Dropping acknowledgements is always safe (their messages are delivered again), recording an
unacknowledged position as acknowledged never is: :func:`bounded` and :func:`encode_within`
shrink a state only by dropping its highest ranges and batch acks, never by moving mark-delete.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from magnetar.broker.ledger.ack_ranges import AckRanges
from magnetar.broker.model.position import Position

#: Largest JSON value a cursor writes to the metadata store (etcd's limit is 1.5 MiB).
MAX_METADATA_BYTES = 256 * 1024

MAGIC = b"MCUR"
VERSION = 1
# magic, version, mark-delete ledger, mark-delete entry, ranges, batch-acked entries, indexes
_HEADER = struct.Struct("<4sBqqIII")


class CursorStateError(ValueError):
    """Bytes that are not an encoded cursor state (damaged, or written by something else)."""


@dataclass(slots=True, frozen=True)
class CursorState:
    mark_delete: Position
    #: Sorted, disjoint, non-adjacent (ledger id, first entry, last entry) triples.
    ranges: tuple[tuple[int, int, int], ...] = ()
    #: Sorted (position, sorted acknowledged batch indexes) of partly acknowledged entries.
    batch_acks: tuple[tuple[Position, tuple[int, ...]], ...] = ()

    @classmethod
    def of(
        cls, mark_delete: Position, acked: AckRanges, batch_acks: dict[Position, set[int]]
    ) -> CursorState:
        """A snapshot: later changes of ``acked`` and ``batch_acks`` do not show in it."""
        return cls(
            mark_delete,
            tuple(acked.ranges()),
            tuple((p, tuple(sorted(i))) for p, i in sorted(batch_acks.items())),
        )

    def acked(self) -> AckRanges:
        return AckRanges.from_sorted(self.ranges)

    def batch_ack_sets(self) -> dict[Position, set[int]]:
        return {p: set(indexes) for p, indexes in self.batch_acks}

    def above(self, mark_delete: Position) -> CursorState:
        """This state with a later mark-delete position (what is at or before it is dropped)."""
        if mark_delete <= self.mark_delete:
            return self
        acked = self.acked()
        acked.remove_through(mark_delete)
        return CursorState(
            mark_delete,
            tuple(acked.ranges()),
            tuple((p, i) for p, i in self.batch_acks if p > mark_delete),
        )

    def keep_ranges(self, count: int) -> CursorState:
        """Only the first ``count`` ranges and the batch acks below the first dropped range."""
        if count >= len(self.ranges):
            return self
        ledger_id, first, _ = self.ranges[count]
        cutoff = Position(ledger_id, first)
        return CursorState(
            self.mark_delete,
            self.ranges[:count],
            tuple((p, i) for p, i in self.batch_acks if p < cutoff),
        )


# -- metadata store (JSON) ---------------------------------------------------------------------


def to_json(state: CursorState) -> dict[str, Any]:
    """The fields of the cursor's metadata record that hold the state (the format stored
    before cursor ledgers existed, so old records load unchanged)."""
    return {
        "mark_delete": [state.mark_delete.ledger_id, state.mark_delete.entry_id],
        "acked": [list(r) for r in state.ranges],
        "batch_acks": [[p.ledger_id, p.entry_id, list(i)] for p, i in state.batch_acks],
    }


def from_json(doc: dict[str, Any]) -> CursorState:
    acked = AckRanges.from_json(doc.get("acked", []))
    batch = sorted(
        (Position(ledger_id, entry_id), tuple(sorted(set(indexes))))
        for ledger_id, entry_id, indexes in doc.get("batch_acks", [])
    )
    return CursorState(Position(*doc["mark_delete"]), tuple(acked.ranges()), tuple(batch))


@dataclass(slots=True, frozen=True)
class CursorRecord:
    """A durable cursor's record in the metadata store, the one place its format is known::

        {"name": ..., "epoch": <the owner's managed-ledger epoch>,
         "mark_delete": [ledger, entry],
         and either "acked" + "batch_acks" (the state, ``to_json``)
         or "cursor_ledger": <id> (the state is the last entry of that ledger)}

    ``epoch`` lets a newer owner's record win over an older owner's late write."""

    name: str
    epoch: int
    mark_delete: Position
    #: The state, when the record holds it; None when it is in ``cursor_ledger``.
    state: CursorState | None = None
    cursor_ledger: int | None = None

    @classmethod
    def holding(cls, name: str, epoch: int, state: CursorState) -> CursorRecord:
        return cls(name, epoch, state.mark_delete, state)

    @classmethod
    def naming(cls, name: str, epoch: int, mark_delete: Position, ledger_id: int) -> CursorRecord:
        return cls(name, epoch, mark_delete, None, ledger_id)

    def to_bytes(self) -> bytes:
        if self.state is not None:
            fields = to_json(self.state)
        else:
            md = self.mark_delete
            fields = {
                "mark_delete": [md.ledger_id, md.entry_id],
                "cursor_ledger": self.cursor_ledger,
            }
        return json.dumps({"name": self.name, "epoch": self.epoch, **fields}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CursorRecord:
        doc = json.loads(data)
        named = doc.get("cursor_ledger")
        epoch = int(doc.get("epoch", 0))
        if named is None:
            state = from_json(doc)
            return cls(doc.get("name", ""), epoch, state.mark_delete, state)
        return cls(doc.get("name", ""), epoch, Position(*doc["mark_delete"]), None, int(named))


def bounded(state: CursorState, max_ranges: int) -> tuple[CursorState, bool]:
    """The state cut to fit in the metadata store: at most ``max_ranges`` ranges, as many
    partly acknowledged entries, and :data:`MAX_METADATA_BYTES` of JSON. True if anything was
    dropped."""
    cut = state.keep_ranges(max_ranges)
    if len(cut.batch_acks) > max_ranges:
        cut = CursorState(cut.mark_delete, cut.ranges, cut.batch_acks[:max_ranges])
    while len(json.dumps(to_json(cut))) > MAX_METADATA_BYTES:
        if cut.batch_acks:
            cut = CursorState(
                cut.mark_delete, cut.ranges, cut.batch_acks[: len(cut.batch_acks) // 2]
            )
        else:
            cut = cut.keep_ranges(len(cut.ranges) // 2)
    return cut, cut != state


def fits_metadata(state: CursorState, max_ranges: int) -> bool:
    """Whether the whole state goes to the metadata store (else to the cursor ledger)."""
    if len(state.ranges) > max_ranges or len(state.batch_acks) > max_ranges:
        return False
    indexes = sum(len(i) for _, i in state.batch_acks)
    # JSON costs at most ~22 bytes per number; only measure when the bound could be near.
    if 22 * (3 * len(state.ranges) + 3 * len(state.batch_acks) + indexes) < MAX_METADATA_BYTES:
        return True
    return len(json.dumps(to_json(state))) <= MAX_METADATA_BYTES


# -- cursor ledger entry (binary) --------------------------------------------------------------


def _pack(values: Iterable[int]) -> bytes:
    column = array("q", values)
    if sys.byteorder == "big":
        column.byteswap()
    return column.tobytes()


def _unpack(data: memoryview, count: int, offset: int) -> tuple[list[int], int]:
    end = offset + 8 * count
    if end > len(data):
        raise CursorStateError("cursor state is shorter than its header says")
    column = array("q")
    column.frombytes(data[offset:end])
    if sys.byteorder == "big":
        column.byteswap()
    return column.tolist(), end


def encode(state: CursorState) -> bytes:
    """Header (magic, version, mark-delete, counts), then zlib of the columns: range ledger ids
    (delta from the previous range), range starts (delta from the previous range's end in the
    same ledger), range lengths minus one, batch-acked positions, their index counts, and all
    their indexes."""
    ledger_deltas, start_deltas, lengths = [], [], []
    previous_ledger, previous_last = 0, 0
    for ledger_id, first, last in state.ranges:
        if ledger_id != previous_ledger:
            previous_last = 0
        ledger_deltas.append(ledger_id - previous_ledger)
        start_deltas.append(first - previous_last)
        lengths.append(last - first)
        previous_ledger, previous_last = ledger_id, last
    indexes = [i for _, batch in state.batch_acks for i in batch]
    body = b"".join(
        (
            _pack(ledger_deltas),
            _pack(start_deltas),
            _pack(lengths),
            _pack(p.ledger_id for p, _ in state.batch_acks),
            _pack(p.entry_id for p, _ in state.batch_acks),
            _pack(len(batch) for _, batch in state.batch_acks),
            _pack(indexes),
        )
    )
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        state.mark_delete.ledger_id,
        state.mark_delete.entry_id,
        len(state.ranges),
        len(state.batch_acks),
        len(indexes),
    )
    return header + zlib.compress(body, 6)


def decode(data: bytes) -> CursorState:
    if len(data) < _HEADER.size:
        raise CursorStateError(f"cursor state of {len(data)} bytes is shorter than its header")
    magic, version, md_ledger, md_entry, n_ranges, n_batch, n_indexes = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CursorStateError(f"not a cursor state (magic {magic!r})")
    if version != VERSION:
        raise CursorStateError(f"cursor state version {version} is not known here")
    try:
        body = memoryview(zlib.decompress(data[_HEADER.size :]))
    except zlib.error as e:
        raise CursorStateError(f"cursor state body is damaged: {e}") from None
    expected = 8 * (3 * n_ranges + 3 * n_batch + n_indexes)
    if len(body) != expected:
        raise CursorStateError(f"cursor state body has {len(body)} bytes, expected {expected}")
    offset = 0
    ledger_deltas, offset = _unpack(body, n_ranges, offset)
    start_deltas, offset = _unpack(body, n_ranges, offset)
    lengths, offset = _unpack(body, n_ranges, offset)
    batch_ledgers, offset = _unpack(body, n_batch, offset)
    batch_entries, offset = _unpack(body, n_batch, offset)
    counts, offset = _unpack(body, n_batch, offset)
    indexes, offset = _unpack(body, n_indexes, offset)
    ranges = []
    ledger_id, previous_last = 0, 0
    for d_ledger, d_start, length in zip(ledger_deltas, start_deltas, lengths, strict=True):
        if d_ledger:
            ledger_id += d_ledger
            previous_last = 0
        first = previous_last + d_start
        previous_last = first + length
        ranges.append((ledger_id, first, previous_last))
    try:
        AckRanges.from_sorted(ranges)  # validates
    except ValueError as e:
        raise CursorStateError(f"cursor state ranges are damaged: {e}") from None
    if sum(counts) != n_indexes or any(c < 0 for c in counts):
        raise CursorStateError("cursor state batch index counts do not add up")
    batch: list[tuple[Position, tuple[int, ...]]] = []
    at = 0
    for ledger_id, entry_id, count in zip(batch_ledgers, batch_entries, counts, strict=True):
        batch.append((Position(ledger_id, entry_id), tuple(indexes[at : at + count])))
        at += count
    return CursorState(Position(md_ledger, md_entry), tuple(ranges), tuple(batch))


def encode_within(state: CursorState, limit: int) -> tuple[bytes, CursorState]:
    """The encoding of ``state``, or of the largest prefix of it (by ranges, then batch acks)
    that fits in ``limit`` bytes; also returns the state that was encoded."""
    data = encode(state)
    if len(data) <= limit:
        return data, state
    # Binary search on the ranges kept: encoded size grows with them.
    low, high = 0, len(state.ranges) - 1
    best: tuple[bytes, CursorState] | None = None
    while low <= high:
        middle = (low + high) // 2
        candidate = state.keep_ranges(middle)
        data = encode(candidate)
        if len(data) <= limit:
            best = data, candidate
            low = middle + 1
        else:
            high = middle - 1
    if best is not None:
        return best
    bare = CursorState(state.mark_delete)
    return encode(bare), bare


def describe_loss(full: CursorState, kept: CursorState) -> str:
    """What a restart would deliver again if only ``kept`` of ``full`` were stored."""
    return (
        f"{len(full.ranges) - len(kept.ranges)} of {len(full.ranges)} acknowledged ranges and "
        f"{len(full.batch_acks) - len(kept.batch_acks)} of {len(full.batch_acks)} partly "
        "acknowledged batches"
    )
