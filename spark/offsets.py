"""Offsets of the Pulsar source: per topic-partition entry positions, pure arithmetic, no I/O.

An offset of one topic-partition is the position ``(ledger, entry)`` of the last *entry* a
micro-batch has read, everything at or before it included. A batch of messages is one entry,
so offsets never split one: a restarted query reads whole entries again or not at all, which
is what makes the read side exactly once.

``EARLIEST`` (ledger -1, entry -1) stands before every stored entry. ``(ledger, -1)`` stands
just before the first entry of ``ledger``; the source moves an offset to it when the offset is
the last entry of a closed ledger, so that retention deleting that fully read ledger is not
mistaken for lost data.

The topic's ledgers (``LedgerExtent``: id and entry count, oldest first, the last one open) come
from the broker's ``internalStats``; counting and advancing by entries walk them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Offsets as Spark checkpoints them: topic-partition name -> {"ledger": L, "entry": E}.
OffsetMap = dict[str, dict[str, int]]


@dataclass(slots=True, frozen=True, order=True)
class EntryPosition:
    """An entry of a topic-partition's managed ledger; ordered as the log is."""

    ledger: int
    entry: int

    def to_json(self) -> dict[str, int]:
        return {"ledger": self.ledger, "entry": self.entry}

    @classmethod
    def from_json(cls, value: Mapping[str, int]) -> EntryPosition:
        return cls(int(value["ledger"]), int(value["entry"]))


EARLIEST = EntryPosition(-1, -1)


@dataclass(slots=True, frozen=True)
class LedgerExtent:
    """One ledger of a topic: its id, how many entries it holds and their stored bytes (0:
    unknown)."""

    ledger: int
    entries: int
    size: int = 0


class OffsetError(ValueError):
    """An offset option that cannot be understood."""


class DataLossError(RuntimeError):
    """Entries the query still needed are gone (retention, or the topic deleted)."""


def last_position(ledgers: Sequence[LedgerExtent]) -> EntryPosition:
    """The last stored entry; ``EARLIEST`` when the topic holds none."""
    for extent in reversed(ledgers):
        if extent.entries > 0:
            return EntryPosition(extent.ledger, extent.entries - 1)
    return EARLIEST


def normalize(position: EntryPosition, ledgers: Sequence[LedgerExtent]) -> EntryPosition:
    """``position`` moved past the end of its ledger when that ledger is closed and read to
    its last entry: then nothing of it is still needed, and retention may delete it."""
    for i, extent in enumerate(ledgers[:-1]):  # the last ledger is the open one
        if extent.ledger == position.ledger and position.entry >= extent.entries - 1:
            return EntryPosition(ledgers[i + 1].ledger, -1)
    return position


def entry_at_or_before(position: EntryPosition, ledgers: Sequence[LedgerExtent]) -> EntryPosition:
    """The last stored entry at or before ``position``: itself, or for ``(ledger, -1)`` (before
    a ledger's first entry, where ``normalize`` puts offsets) the last entry of the ledgers
    before it. A reader that must stop at an entry it will meet stops there."""
    if position.entry >= 0:
        return position
    before = [e for e in ledgers if e.ledger < position.ledger]
    found = last_position(before)
    return found if found != EARLIEST else position


def is_lost(start: EntryPosition, ledgers: Sequence[LedgerExtent]) -> bool:
    """Whether entries after ``start`` may have been deleted before they were read: the ledger
    ``start`` points into is no longer one of the topic's. Retention deletes whole ledgers, and
    a topic deleted and created again has new ledgers only, so both cases are caught."""
    if start == EARLIEST:
        return False
    return all(extent.ledger != start.ledger for extent in ledgers)


def entries_after(start: EntryPosition, ledgers: Sequence[LedgerExtent]) -> int:
    """How many stored entries come after ``start``."""
    count = 0
    for extent in ledgers:
        if extent.ledger > start.ledger:
            count += extent.entries
        elif extent.ledger == start.ledger:
            count += max(0, extent.entries - 1 - start.entry)
    return count


def advance(start: EntryPosition, count: int, ledgers: Sequence[LedgerExtent]) -> EntryPosition:
    """The position ``count`` stored entries after ``start`` (at most the last entry)."""
    position = start
    for extent in ledgers:
        if count <= 0:
            break
        if extent.ledger < start.ledger or extent.entries == 0:
            continue
        first = start.entry + 1 if extent.ledger == start.ledger else 0
        available = extent.entries - first
        if available <= 0:
            continue
        take = min(available, count)
        position = EntryPosition(extent.ledger, first + take - 1)
        count -= take
    return position


def split_range(
    begin: EntryPosition, stop: EntryPosition, ledgers: Sequence[LedgerExtent], size: int
) -> list[tuple[EntryPosition, EntryPosition]]:
    """``(begin, stop]`` cut into consecutive ranges of at most ``size`` stored entries each
    (the last may be shorter); one range when it holds ``size`` entries or fewer."""
    count = entries_after(begin, ledgers) - entries_after(stop, ledgers)
    out = []
    start = begin
    while count > size:
        end = advance(start, size, ledgers)
        out.append((start, end))
        start = end
        count -= size
    out.append((start, stop))
    return out


def share_limit(limit: int, available: Mapping[str, int]) -> dict[str, int]:
    """Split a budget of ``limit`` entries over topic-partitions in proportion to what each has
    available, never more than it has; the rounding remainder goes to the largest backlogs, so
    the whole budget is used when there is that much to read."""
    total = sum(available.values())
    if total <= limit:
        return dict(available)
    shares = {name: limit * n // total for name, n in available.items()}
    left = limit - sum(shares.values())
    for name in sorted(available, key=lambda n: (-(available[n] - shares[n]), n)):
        if left == 0:
            break
        if shares[name] < available[name]:
            shares[name] += 1
            left -= 1
    return shares


def parse_starting(text: str, names: Sequence[str]) -> dict[str, EntryPosition | str]:
    """``startingOffsets``/``endingOffsets``: ``earliest``, ``latest``, or JSON mapping a
    topic-partition to ``{"ledger": L, "entry": E}`` (that entry and those before it are not
    read), ``"earliest"`` or ``"latest"``. Topic-partitions the JSON leaves out start earliest."""
    text = text.strip()
    if text in ("earliest", "latest"):
        return dict.fromkeys(names, text)
    try:
        given = json.loads(text)
    except json.JSONDecodeError as e:
        raise OffsetError(f"offsets must be earliest, latest or JSON: {e}") from None
    if not isinstance(given, dict):
        raise OffsetError("offsets JSON must be an object keyed by topic-partition")
    out: dict[str, EntryPosition | str] = dict.fromkeys(names, "earliest")
    for name, value in given.items():
        if value in ("earliest", "latest"):
            out[name] = value
        elif isinstance(value, dict) and {"ledger", "entry"} <= value.keys():
            out[name] = EntryPosition.from_json(value)
        else:
            raise OffsetError(
                f"offset of {name}: expected {{'ledger': L, 'entry': E}}, 'earliest' or "
                f"'latest', got {value!r}"
            )
    return out
