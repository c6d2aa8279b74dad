"""Which consumer of a Key_Shared subscription owns a key hash (0..65535). Pure: no I/O.

Two ways, not mixed on one subscription:

- auto-split: consistent hashing. Each member puts ``POINTS_PER_MEMBER`` points on a ring over
  the hash space (point ``i`` is the key hash of ``f"{name}{i}"``); a hash belongs to the member
  of the first point at or after it, wrapping around. A member joining takes over only the arcs
  in front of its own points, so most of the space stays where it was.
- sticky: each member brings inclusive ranges ``start..end``; ranges may not overlap another
  member's. A hash in no range belongs to nobody (its messages wait).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from magnetar.broker.topics.dispatchers.key_hash import HASH_RANGE_SIZE, key_hash

M = TypeVar("M", bound=Hashable)

POINTS_PER_MEMBER = 100


class AssignmentConflict(Exception):
    """A member cannot join: overlapping sticky ranges, bad ranges or mixed modes."""


class HashAssignment(Generic[M]):
    def __init__(self) -> None:
        self._seq = itertools.count()
        #: Ring points, sorted: (point, insertion sequence, member).
        self._ring: list[tuple[int, int, M]] = []
        #: Sticky ranges, sorted by start: (start, end, member).
        self._ranges: list[tuple[int, int, M]] = []
        self._members: dict[M, str] = {}
        #: Among the members of one name, which one this is (0 for the first).
        self._twin: dict[M, int] = {}

    def __len__(self) -> int:
        return len(self._members)

    def add(self, member: M, name: str, ranges: Iterable[tuple[int, int]] | None = None) -> None:
        """Add ``member``; ``ranges`` given means sticky, None means auto-split."""
        if member in self._members:
            raise AssignmentConflict(f"{name} is already a member")
        if ranges is None:
            if self._ranges:
                raise AssignmentConflict(
                    f"consumer {name} asks for auto-split hashing, but the subscription's "
                    "consumers use sticky hash ranges"
                )
            seq = next(self._seq)
            # Consumers may share a name (replicas of one service): each one of them gets its
            # own points, or they would all land on the same arcs and only one would get keys.
            taken = {self._twin[m] for m, n in self._members.items() if n == name}
            twin = next(i for i in itertools.count() if i not in taken)
            label = name if twin == 0 else f"{name}#{twin}"
            for i in range(POINTS_PER_MEMBER):
                bisect.insort(self._ring, (key_hash(f"{label}{i}".encode()), seq, member))
            self._members[member] = name
            self._twin[member] = twin
            return
        wanted = sorted((int(s), int(e)) for s, e in ranges)
        if not wanted:
            raise AssignmentConflict(f"consumer {name} asks for sticky hashing without ranges")
        if self._ring:
            raise AssignmentConflict(
                f"consumer {name} asks for sticky hash ranges, but the subscription's "
                "consumers use auto-split hashing"
            )
        for start, end in wanted:
            if not 0 <= start <= end < HASH_RANGE_SIZE:
                raise AssignmentConflict(
                    f"consumer {name}: hash range [{start}, {end}] is not within "
                    f"[0, {HASH_RANGE_SIZE - 1}]"
                )
        for (s1, e1), (s2, e2) in itertools.pairwise(wanted):
            if s2 <= e1:
                raise AssignmentConflict(
                    f"consumer {name}: its hash ranges [{s1}, {e1}] and [{s2}, {e2}] overlap"
                )
        for start, end in wanted:
            for s, e, other in self._ranges:
                if start <= e and s <= end:
                    raise AssignmentConflict(
                        f"consumer {name}: hash range [{start}, {end}] overlaps "
                        f"[{s}, {e}] of consumer {self._members[other]}"
                    )
        for start, end in wanted:
            bisect.insort(self._ranges, (start, end, member), key=lambda r: (r[0], r[1]))
        self._members[member] = name
        self._twin[member] = 0

    def remove(self, member: M) -> None:
        if self._members.pop(member, None) is None:
            return
        self._twin.pop(member, None)
        self._ring = [p for p in self._ring if p[2] != member]
        self._ranges = [r for r in self._ranges if r[2] != member]

    def select(self, hash_: int) -> M | None:
        """The member that owns ``hash_``, or None."""
        if self._ranges:
            i = bisect.bisect_right(self._ranges, hash_, key=lambda r: r[0]) - 1
            if i >= 0 and self._ranges[i][0] <= hash_ <= self._ranges[i][1]:
                return self._ranges[i][2]
            return None
        if not self._ring:
            return None
        i = bisect.bisect_left(self._ring, hash_, key=lambda p: p[0])
        return self._ring[i % len(self._ring)][2]
