"""Striping and quorum arithmetic (``Quorum``, ``AckSet``) against brute-force definitions.

The rules are those of ARCHITECTURE.md "Storage layer": entry ``i`` goes to ensemble positions
``(i + k) mod E`` for k < Qw; an add succeeds at Qa acks and has failed once more than
Qw - Qa of its write set failed; fencing holds once every write quorum has Qw - Qa + 1
answers; an entry is absent once Qw - Qa + 1 of its write set say so. Each property is
checked against a definition written out here from first principles, not against the code.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.ledger.distribution import AckSet, Quorum, QuorumConfigError

MAX_E = 8


@st.composite
def quorums(draw: st.DrawFn) -> Quorum:
    e = draw(st.integers(1, MAX_E))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    return Quorum(e, qw, qa)


@st.composite
def quorum_and_positions(draw: st.DrawFn) -> tuple[Quorum, frozenset[int]]:
    q = draw(quorums())
    positions = draw(st.sets(st.integers(0, q.ensemble_size - 1)))
    return q, frozenset(positions)


def brute_write_set(q: Quorum, entry_id: int) -> list[int]:
    return [(entry_id + k) % q.ensemble_size for k in range(q.write_quorum)]


def all_write_sets(q: Quorum) -> list[set[int]]:
    """The write set of every entry: striping repeats with period E, so entries 0..E-1 cover
    every write set there is."""
    return [set(brute_write_set(q, i)) for i in range(q.ensemble_size)]


# -- striping -------------------------------------------------------------------------------


@given(quorums(), st.integers(0, 2**40))
def test_write_set_is_consecutive_positions_mod_e(q: Quorum, entry_id: int) -> None:
    ws = q.write_set(entry_id)
    assert ws == brute_write_set(q, entry_id)
    assert len(set(ws)) == q.write_quorum, "a write set holds Qw distinct bookies"


@given(quorums(), st.integers(0, 2**40), st.data())
def test_stores_agrees_with_write_set(q: Quorum, entry_id: int, data: st.DataObject) -> None:
    position = data.draw(st.integers(0, q.ensemble_size - 1))
    assert q.stores(entry_id, position) == (position in brute_write_set(q, entry_id))


@given(quorums())
def test_each_position_stores_qw_of_every_e_consecutive_entries(q: Quorum) -> None:
    for position in range(q.ensemble_size):
        stored = sum(q.stores(i, position) for i in range(q.ensemble_size))
        assert stored == q.write_quorum


@given(quorums())
def test_write_quorums_cover_every_write_set(q: Quorum) -> None:
    listed = [set(w) for w in q.write_quorums()]
    for ws in all_write_sets(q):
        assert ws in listed
    for w in listed:
        assert w in all_write_sets(q)


# -- fencing --------------------------------------------------------------------------------


@given(quorum_and_positions())
def test_fencing_complete_iff_every_write_quorum_has_enough_answers(
    case: tuple[Quorum, frozenset[int]],
) -> None:
    q, answered = case
    need = q.write_quorum - q.ack_quorum + 1
    expected = all(len(ws & answered) >= need for ws in all_write_sets(q))
    assert q.fencing_complete(answered) == expected


@given(quorum_and_positions())
def test_fencing_complete_means_old_writer_cannot_reach_ack_quorum(
    case: tuple[Quorum, frozenset[int]],
) -> None:
    """The safety property: once fencing is complete, for every entry the bookies of its write
    set that did NOT answer the fence (and so may still accept the old writer's add) number
    fewer than Qa. And the condition is tight: if fencing is not complete, some entry still
    has Qa unfenced bookies in its write set."""
    q, answered = case
    unfenced = [ws - answered for ws in all_write_sets(q)]
    if q.fencing_complete(answered):
        for entry_id, rest in enumerate(unfenced):
            assert len(rest) < q.ack_quorum, (
                f"{q}: fencing called complete with {sorted(answered)} answered, but entry "
                f"{entry_id} still has {sorted(rest)} unfenced (>= Qa)"
            )
    else:
        assert any(len(rest) >= q.ack_quorum for rest in unfenced), (
            f"{q}: fencing not complete with {sorted(answered)} answered although no entry "
            "can get Qa acks any more"
        )


@given(quorum_and_positions())
def test_fencing_complete_is_monotone(case: tuple[Quorum, frozenset[int]]) -> None:
    q, answered = case
    if q.fencing_complete(answered):
        for extra in range(q.ensemble_size):
            assert q.fencing_complete(answered | {extra})


@given(quorum_and_positions())
def test_fencing_impossible_iff_the_rest_cannot_complete_it(
    case: tuple[Quorum, frozenset[int]],
) -> None:
    q, failed = case
    everyone_else = frozenset(range(q.ensemble_size)) - failed
    assert q.fencing_impossible(failed) == (not q.fencing_complete(everyone_else))


@given(quorums())
def test_fencing_with_no_answers_or_no_failures(q: Quorum) -> None:
    assert not q.fencing_complete(frozenset())
    assert q.fencing_complete(frozenset(range(q.ensemble_size)))
    assert not q.fencing_impossible(frozenset())
    assert q.fencing_impossible(frozenset(range(q.ensemble_size)))


# -- recovery reads ---------------------------------------------------------------------------


@given(quorums(), st.integers(0, 2**20), st.data())
def test_entry_absent_means_fewer_than_qa_can_hold_it(
    q: Quorum, entry_id: int, data: st.DataObject
) -> None:
    ws = brute_write_set(q, entry_id)
    no_such_entry = data.draw(st.sets(st.sampled_from(ws)))
    could_hold = set(ws) - no_such_entry
    if q.entry_absent(no_such_entry):
        assert len(could_hold) < q.ack_quorum, (
            f"{q}: entry {entry_id} called absent from {sorted(no_such_entry)} but "
            f"{sorted(could_hold)} (>= Qa) may hold it"
        )
    else:
        # Tight: recovery must not give up reading while Qa bookies might hold the entry,
        # and must stop once they cannot.
        assert len(could_hold) >= q.ack_quorum


# -- acks -------------------------------------------------------------------------------------

ACTIONS = st.sampled_from(["ack", "fail", "forget"])


@given(quorums(), st.integers(0, 2**20), st.data())
def test_ackset_against_model(q: Quorum, entry_id: int, data: st.DataObject) -> None:
    """Per position the last word counts: an ack, or a failure (ignored after an ack, since the
    entry is durable there), or nothing once the bookie was replaced (forget)."""
    ws = brute_write_set(q, entry_id)
    events = data.draw(st.lists(st.tuples(ACTIONS, st.sampled_from(ws)), max_size=30))
    acks = AckSet(q)
    state: dict[int, str] = {}
    for action, position in events:
        getattr(acks, action)(position)
        if action == "ack":
            state[position] = "acked"
        elif action == "fail":
            if state.get(position) != "acked":
                state[position] = "failed"
        else:
            state.pop(position, None)
        acked = {p for p, s in state.items() if s == "acked"}
        failed = {p for p, s in state.items() if s == "failed"}
        assert acks.acked == acked
        assert acks.complete == (len(acked) >= q.ack_quorum)
        assert acks.failed == (len(failed) > q.write_quorum - q.ack_quorum)
        assert not (acks.complete and acks.failed), "an add cannot both succeed and fail"
        if acks.failed:
            # Failed means Qa acks can no longer come from this write set.
            assert len(set(ws) - failed) < q.ack_quorum


@given(quorums(), st.permutations(list(range(MAX_E))))
def test_ackset_completes_exactly_at_qa_acks(q: Quorum, order: list[int]) -> None:
    positions = [p for p in order if p < q.ensemble_size][: q.write_quorum]
    acks = AckSet(q)
    for n, position in enumerate(positions, start=1):
        acks.ack(position)
        acks.ack(position)  # a duplicate ack counts once
        assert acks.complete == (n >= q.ack_quorum)


@given(quorums(), st.permutations(list(range(MAX_E))))
def test_ackset_fails_beyond_qw_minus_qa_failures(q: Quorum, order: list[int]) -> None:
    positions = [p for p in order if p < q.ensemble_size][: q.write_quorum]
    acks = AckSet(q)
    for n, position in enumerate(positions, start=1):
        acks.fail(position)
        assert acks.failed == (n > q.write_quorum - q.ack_quorum)
        assert not acks.complete


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("e", "qw", "qa"),
    [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0), (3, 0, 0), (1, 2, 1), (5, 3, -1), (-1, -1, -1)],
)
def test_bad_quorums_raise_with_the_numbers(e: int, qw: int, qa: int) -> None:
    with pytest.raises(QuorumConfigError) as info:
        Quorum(e, qw, qa)
    message = str(info.value)
    for name, value in (("E", e), ("Qw", qw), ("Qa", qa)):
        assert f"{name}={value}" in message, message
    assert isinstance(info.value, ValueError)


@given(st.integers(-3, 10), st.integers(-3, 10), st.integers(-3, 10))
def test_quorum_valid_iff_e_ge_qw_ge_qa_ge_1(e: int, qw: int, qa: int) -> None:
    valid = e >= qw >= qa >= 1
    try:
        Quorum(e, qw, qa)
    except QuorumConfigError:
        assert not valid
    else:
        assert valid
