"""The scale-down rule (services/bookie/decommission.py): a bookie may leave only when every
fragment it holds can get a writable replacement outside its ensemble, and new ledgers still
find an ensemble."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.bookie.decommission import (
    BookieState,
    check_scale_down,
    leaving_on_scale_down,
    statefulset_ordinal,
)
from magnetar.common.ledger.metadata import Fragment, LedgerMetadata, LedgerState


def ledger(*fragments: tuple[int, tuple[str, ...]], e: int = 3, qw: int = 2, closed_at=None):
    return LedgerMetadata(
        e,
        qw,
        min(qw, 2),
        tuple(Fragment(first, bookies) for first, bookies in fragments),
        state=LedgerState.CLOSED if closed_at is not None else LedgerState.OPEN,
        last_entry_id=closed_at if closed_at is not None else -1,
    )


def alive(*addresses: str, read_only: tuple[str, ...] = ()) -> list[BookieState]:
    return [BookieState(a, True, a in read_only) for a in addresses]


def test_one_of_four_may_leave_an_ensemble_of_three() -> None:
    check = check_scale_down(
        alive("a", "b", "c", "d"), ["d"], {1: ledger((0, ("b", "c", "d")))}, ensemble_size=3
    )
    assert check.allowed, check.refusal()
    assert check.remaining_writable == ("a", "b", "c")
    assert check.ledgers_to_move == 1
    assert check.refusal() == ""


def test_below_the_ensemble_new_ledgers_need_is_refused() -> None:
    check = check_scale_down(alive("a", "b", "c"), ["c"], {}, ensemble_size=3)
    assert not check.allowed
    assert "new ledgers need an ensemble of 3 bookies" in check.refusal()
    assert "would leave 2 writable bookie(s)" in check.refusal()


def test_a_fragment_without_a_replacement_is_refused_and_named() -> None:
    # Four bookies, ensemble 4: d's copies could go nowhere outside the ensemble.
    check = check_scale_down(
        alive("a", "b", "c", "d"),
        ["d"],
        {7: ledger((0, ("a", "b", "c", "d")), e=4, qw=3)},
        ensemble_size=1,
    )
    assert not check.allowed
    [stranded] = check.stranded
    assert (stranded.ledger_id, stranded.to_replace, stranded.candidates) == (7, ("d",), 0)
    assert "ledger 7" in check.refusal() and "write quorum 3" in check.refusal()


def test_read_only_and_dead_bookies_are_no_replacements() -> None:
    ledgers = {1: ledger((0, ("a", "b", "c")))}
    # e is read-only (full disk or being decommissioned itself): no candidate for c's place.
    refused = check_scale_down(alive("a", "b", "c", "e", read_only=("e",)), ["c"], ledgers, 0)
    assert not refused.allowed
    # A fragment bookie that is gone needs a replacement too, from the same candidates.
    two_lost = check_scale_down(alive("a", "c", "e"), ["c"], ledgers, 0)
    assert [f.to_replace for f in two_lost.stranded] == [("b", "c")]


def test_fragments_past_a_closed_ledgers_end_hold_nothing() -> None:
    # The second fragment starts after the last entry: nothing of it needs a copy.
    metadata = ledger((0, ("a", "b", "c")), (5, ("b", "c", "d")), closed_at=4)
    check = check_scale_down(alive("a", "b", "c", "d"), ["d"], {1: metadata}, ensemble_size=3)
    assert check.allowed and check.ledgers_to_move == 0


def test_default_ensemble_is_the_largest_open_ledgers() -> None:
    ledgers = {1: ledger((0, ("a", "b", "c")), e=3), 2: ledger((0, ("a", "b")), e=2, closed_at=9)}
    assert check_scale_down(alive("a", "b", "c", "d"), [], ledgers).ensemble_size == 3


def test_statefulset_ordinals_from_stable_pod_names() -> None:
    assert statefulset_ordinal("bookie-3.bookie.magnetar.svc.cluster.local:3181") == ("bookie", 3)
    assert statefulset_ordinal("my-bookie-12.x:3181") == ("my-bookie", 12)
    assert statefulset_ordinal("127.0.0.1:3181") is None
    assert statefulset_ordinal("bookie.x:3181") is None
    addresses = [f"bookie-{i}.bookie.ns.svc.cluster.local:3181" for i in range(5)]
    assert leaving_on_scale_down([*addresses, "other-4.x:1"], "bookie", 3) == addresses[3:]


@given(
    bookies=st.integers(min_value=1, max_value=7),
    ensemble=st.integers(min_value=1, max_value=5),
    leave=st.integers(min_value=0, max_value=3),
    data=st.data(),
)
def test_allowed_means_every_leaving_copy_has_a_place(
    bookies: int, ensemble: int, leave: int, data: st.DataObject
) -> None:
    names = [f"b{i}" for i in range(bookies)]
    ensembles = data.draw(
        st.lists(
            st.permutations(names).map(lambda p: tuple(p[: min(ensemble, bookies)])),
            max_size=4,
        )
    )
    ledgers = {i: ledger((0, e), e=len(e), qw=len(e)) for i, e in enumerate(ensembles)}
    leaving = names[: min(leave, bookies)]
    check = check_scale_down(alive(*names), leaving, ledgers, ensemble_size=0)
    remaining = set(names) - set(leaving)
    for e in ensembles:
        gone = [b for b in e if b in leaving]
        places = remaining - set(e)
        if gone and len(places) < len(gone):
            assert not check.allowed
    if check.allowed:
        assert all(
            len(remaining - set(e)) >= len([b for b in e if b in leaving]) for e in ensembles
        )
