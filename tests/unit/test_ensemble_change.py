"""The one ensemble-change routine: planning (placement) and applying a change to metadata."""

from __future__ import annotations

import random

import pytest

from magnetar.common.ledger.bookies import BookieRegistration
from magnetar.common.ledger.ensemble import EnsembleChange, plan_change
from magnetar.common.ledger.metadata import Fragment, LedgerMetadata, LedgerState
from magnetar.common.ledger.placement import NotEnoughBookiesError, RandomPlacement


def registrations(*addresses: str, read_only: tuple[str, ...] = ()) -> list[BookieRegistration]:
    return [BookieRegistration(a, "", a in read_only, 0, 0) for a in addresses]


def metadata(*fragments: Fragment, state: LedgerState = LedgerState.OPEN) -> LedgerMetadata:
    return LedgerMetadata(3, 2, 2, fragments, state=state)


def test_plan_replaces_only_the_given_positions_with_bookies_outside_the_ensemble() -> None:
    change = plan_change(
        ("a", "b", "c"),
        10,
        [1],
        registrations("a", "b", "c", "d", "e", read_only=("e",)),
        RandomPlacement(random.Random(1)),
        exclude={"x"},
    )
    assert change == EnsembleChange(10, ("a", "b", "c"), ("a", "d", "c"))
    assert change.positions == [1]
    assert change.replaced == {"b": "d"}


def test_plan_never_picks_an_excluded_bookie() -> None:
    with pytest.raises(NotEnoughBookiesError):
        plan_change(
            ("a", "b", "c"),
            0,
            [0, 2],
            registrations("a", "b", "c", "d", "lost"),
            RandomPlacement(),
            exclude={"lost"},
        )


def test_a_writer_change_appends_a_fragment() -> None:
    before = metadata(Fragment(0, ("a", "b", "c")))
    after = EnsembleChange(7, ("a", "b", "c"), ("a", "d", "c")).apply(before)
    assert after.fragments == (Fragment(0, ("a", "b", "c")), Fragment(7, ("a", "d", "c")))


def test_a_replication_change_replaces_one_fragment_and_keeps_later_ones() -> None:
    before = metadata(
        Fragment(0, ("a", "b", "c")), Fragment(5, ("a", "e", "c")), Fragment(9, ("f", "e", "c"))
    )
    change = EnsembleChange(5, ("a", "e", "c"), ("a", "e", "g"))
    assert change.applies_to(before)
    after = change.apply(before)
    assert after.fragments == (
        Fragment(0, ("a", "b", "c")),
        Fragment(5, ("a", "e", "g")),
        Fragment(9, ("f", "e", "c")),
    )
    assert not change.applies_to(after)  # done once: a second worker's copy conflicts


def test_a_change_inside_a_fragment_splits_it() -> None:
    before = metadata(Fragment(0, ("a", "b", "c")), Fragment(9, ("d", "b", "c")))
    after = EnsembleChange(4, ("a", "b", "c"), ("a", "b", "e")).apply(before)
    assert [f.first_entry_id for f in after.fragments] == [0, 4, 9]
    assert after.fragment_for(5).bookies == ("a", "b", "e")
    assert after.fragment_for(9).bookies == ("d", "b", "c")
