"""HashAssignment: consistent hashing (auto-split) and sticky ranges of a Key_Shared
subscription."""

from __future__ import annotations

from collections import Counter

import pytest

from magnetar.broker.topics.dispatchers.hash_assignment import AssignmentConflict, HashAssignment
from magnetar.broker.topics.dispatchers.key_hash import HASH_RANGE_SIZE

ALL = range(HASH_RANGE_SIZE)


def mapping(a: HashAssignment[str]) -> list[str | None]:
    return [a.select(h) for h in ALL]


def test_nobody_owns_anything_without_members() -> None:
    a: HashAssignment[str] = HashAssignment()
    assert a.select(0) is None and a.select(HASH_RANGE_SIZE - 1) is None


def test_auto_split_covers_the_space_and_spreads_it() -> None:
    a: HashAssignment[str] = HashAssignment()
    for name in ("c1", "c2", "c3", "c4"):
        a.add(name, name)
    shares = Counter(mapping(a))
    assert set(shares) == {"c1", "c2", "c3", "c4"}
    for share in shares.values():
        assert HASH_RANGE_SIZE / 4 / 2 < share < HASH_RANGE_SIZE / 4 * 2


def test_a_joining_member_takes_only_part_of_the_space_and_leaving_gives_it_back() -> None:
    a: HashAssignment[str] = HashAssignment()
    for name in ("c1", "c2", "c3"):
        a.add(name, name)
    before = mapping(a)
    a.add("c4", "c4")
    after = mapping(a)
    moved = [h for h in ALL if before[h] != after[h]]
    assert moved, "the new member gets something"
    assert all(after[h] == "c4" for h in moved), "hashes move only to the new member"
    assert len(moved) < HASH_RANGE_SIZE / 2
    a.remove("c4")
    assert mapping(a) == before


def test_the_same_members_give_the_same_mapping() -> None:
    a: HashAssignment[str] = HashAssignment()
    b: HashAssignment[str] = HashAssignment()
    for name in ("x", "y"):
        a.add(name, name)
    for name in ("y", "x"):
        b.add(name, name)
    assert mapping(a) == mapping(b)


def test_sticky_ranges_and_uncovered_hashes() -> None:
    a: HashAssignment[str] = HashAssignment()
    a.add("low", "low", [(0, 99), (1000, 1999)])
    a.add("high", "high", [(32768, 65535)])
    assert a.select(0) == "low" and a.select(99) == "low"
    assert a.select(100) is None and a.select(999) is None
    assert a.select(1000) == "low" and a.select(1999) == "low" and a.select(2000) is None
    assert a.select(32767) is None and a.select(32768) == "high"
    assert a.select(65535) == "high"
    a.remove("low")
    assert a.select(50) is None and a.select(40000) == "high"
    a.add("again", "again", [(0, 32767)])
    assert a.select(50) == "again"


@pytest.mark.parametrize(
    "ranges",
    [
        [(32767, 40000)],  # overlaps the end of the existing range
        [(0, 0)],
        [(100, 200), (30000, 32768)],
        [(0, 65535)],
    ],
)
def test_overlapping_sticky_ranges_are_refused(ranges: list[tuple[int, int]]) -> None:
    a: HashAssignment[str] = HashAssignment()
    a.add("first", "first", [(0, 32767)])
    with pytest.raises(AssignmentConflict, match="overlaps"):
        a.add("second", "second", ranges)
    assert a.select(40000) is None  # nothing of the refused member stayed
    a.add("third", "third", [(32768, 65535)])
    assert a.select(40000) == "third"


@pytest.mark.parametrize("ranges", [[(5, 4)], [(-1, 10)], [(0, 65536)], [(0, 10), (10, 20)], []])
def test_invalid_sticky_ranges_are_refused(ranges: list[tuple[int, int]]) -> None:
    a: HashAssignment[str] = HashAssignment()
    with pytest.raises(AssignmentConflict):
        a.add("c", "c", ranges)
    assert len(a) == 0


def test_sticky_and_auto_split_do_not_mix() -> None:
    a: HashAssignment[str] = HashAssignment()
    a.add("auto", "auto")
    with pytest.raises(AssignmentConflict, match="auto-split"):
        a.add("sticky", "sticky", [(0, 10)])
    b: HashAssignment[str] = HashAssignment()
    b.add("sticky", "sticky", [(0, 10)])
    with pytest.raises(AssignmentConflict, match="sticky"):
        b.add("auto", "auto")


def test_members_with_the_same_name_each_get_a_share() -> None:
    assignment: HashAssignment[int] = HashAssignment()
    for member in (1, 2, 3):
        assignment.add(member, "worker")  # replicas of one service, one consumer name
    owners = Counter(assignment.select(h) for h in range(0, 65536, 7))
    assert set(owners) == {1, 2, 3}
    assert min(owners.values()) > len(range(0, 65536, 7)) / 10
    assignment.remove(2)
    assignment.add(4, "worker")  # takes the free twin slot: still three distinct shares
    assert set(assignment.select(h) for h in range(0, 65536, 7)) == {1, 3, 4}
