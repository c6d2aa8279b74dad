"""Ledger metadata: the stored form round-trips, and fragment arithmetic."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.ledger.metadata import Fragment, LedgerMetadata, LedgerState

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
ADDRESSES = st.builds(
    "{}:{}".format, st.text("abcdefxyz0123456789.-", min_size=1, max_size=12), st.integers(1, 65535)
)


@st.composite
def metadatas(draw: st.DrawFn, min_fragments: int = 1) -> LedgerMetadata:
    e = draw(st.integers(1, 9))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    gaps = draw(st.lists(st.integers(1, 10_000), min_size=min_fragments - 1, max_size=6))
    starts = [0]
    for gap in gaps:
        starts.append(starts[-1] + gap)
    fragments = tuple(
        Fragment(s, tuple(draw(st.lists(ADDRESSES, min_size=e, max_size=e, unique=True))))
        for s in starts
    )
    return LedgerMetadata(
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=qa,
        fragments=fragments,
        state=draw(st.sampled_from(list(LedgerState))),
        last_entry_id=draw(st.integers(-1, 2**63 - 1)),
        length=draw(st.integers(0, 2**63 - 1)),
        ctime_ms=draw(INT64),
        custom_metadata=draw(st.dictionaries(TEXT, st.binary(max_size=50), max_size=5)),
    )


@given(metadatas())
def test_to_bytes_from_bytes_round_trip(metadata: LedgerMetadata) -> None:
    raw = metadata.to_bytes()
    assert isinstance(raw, bytes)
    back = LedgerMetadata.from_bytes(raw)
    assert back == metadata
    assert back.state is metadata.state
    # Map order on the wire is not fixed, so compare decoded forms, not bytes.
    assert LedgerMetadata.from_bytes(back.to_bytes()) == metadata


@given(metadatas())
def test_json_dict_names_every_fragment(metadata: LedgerMetadata) -> None:
    data = metadata.to_json_dict()
    assert data["state"] == metadata.state.name
    assert data["last_entry_id"] == metadata.last_entry_id
    assert [f["first_entry_id"] for f in data["fragments"]] == [  # type: ignore[index,union-attr]
        f.first_entry_id for f in metadata.fragments
    ]


def brute_fragment_for(metadata: LedgerMetadata, entry_id: int) -> Fragment:
    """The fragment with the largest first entry id that is <= entry_id."""
    candidates = [f for f in metadata.fragments if f.first_entry_id <= entry_id]
    return max(candidates, key=lambda f: f.first_entry_id)


@given(metadatas(), st.data())
def test_fragment_for_is_the_last_fragment_starting_at_or_before(
    metadata: LedgerMetadata, data: st.DataObject
) -> None:
    last_start = metadata.last_fragment.first_entry_id
    entry_id = data.draw(st.integers(0, last_start + 10_000))
    assert metadata.fragment_for(entry_id) == brute_fragment_for(metadata, entry_id)
    # Boundaries: a fragment's own first entry is in it, the entry before is in the previous.
    for i, fragment in enumerate(metadata.fragments):
        assert metadata.fragment_for(fragment.first_entry_id) == fragment
        if i > 0:
            assert metadata.fragment_for(fragment.first_entry_id - 1) == metadata.fragments[i - 1]


@given(metadatas(min_fragments=1), st.data())
def test_with_fragment_at_an_existing_start_replaces_it(
    metadata: LedgerMetadata, data: st.DataObject
) -> None:
    """A writer that retries an ensemble change (or changes again before any entry went to the
    new fragment) replaces the fragment that starts at the same entry instead of stacking a
    second one there."""
    last = metadata.last_fragment
    bookies = tuple(f"new-{i}:1" for i in range(metadata.ensemble_size))
    updated = metadata.with_fragment(last.first_entry_id, bookies)
    assert updated.fragments == (*metadata.fragments[:-1], Fragment(last.first_entry_id, bookies))
    starts = [f.first_entry_id for f in updated.fragments]
    assert len(starts) == len(set(starts)), f"two fragments start at the same entry: {starts}"
    # Nothing else changed, and the original is untouched (frozen).
    assert dataclasses.replace(updated, fragments=metadata.fragments) == metadata
    assert metadata.last_fragment == last
    assert LedgerMetadata.from_bytes(updated.to_bytes()) == updated


@given(metadatas(), st.integers(1, 10_000))
def test_with_fragment_after_the_last_appends(metadata: LedgerMetadata, gap: int) -> None:
    start = metadata.last_fragment.first_entry_id + gap
    bookies = tuple(f"b{i}:2" for i in range(metadata.ensemble_size))
    updated = metadata.with_fragment(start, bookies)
    assert updated.fragments == (*metadata.fragments, Fragment(start, bookies))
    assert updated.fragment_for(start - 1) == metadata.last_fragment
    assert updated.fragment_for(start).bookies == bookies


def test_fragment_for_example() -> None:
    metadata = LedgerMetadata(
        3,
        2,
        2,
        (Fragment(0, ("a:1", "b:1", "c:1")), Fragment(100, ("a:1", "d:1", "c:1"))),
    )
    assert metadata.fragment_for(0).first_entry_id == 0
    assert metadata.fragment_for(99).first_entry_id == 0
    assert metadata.fragment_for(100).bookies == ("a:1", "d:1", "c:1")
    assert metadata.fragment_for(10**12).first_entry_id == 100
    replaced = metadata.with_fragment(100, ("a:1", "e:1", "c:1"))
    assert [f.first_entry_id for f in replaced.fragments] == [0, 100]
    assert replaced.fragment_for(150).bookies == ("a:1", "e:1", "c:1")


def test_from_bytes_of_garbage_is_an_error() -> None:
    with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError or a bad state value
        LedgerMetadata.from_bytes(b"\xff\xff\xff\xff")
