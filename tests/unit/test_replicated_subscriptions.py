"""Replicated subscriptions' pure parts (issue 25): marker entries with Pulsar's marker types and
where each is replicated (``model/markers``), the snapshot cache a replicated subscription keeps
(``topics/snapshot_cache``) and the snapshot builder's rounds (one with one remote, two with
more, Pulsar's rule)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.ledger.positions import LedgerPositions
from magnetar.broker.model import markers
from magnetar.broker.model.entry import entry_metadata, entry_payload, is_marker_entry
from magnetar.broker.model.position import Position
from magnetar.broker.topics.replicated_subscriptions import Outcome, SnapshotBuilder
from magnetar.broker.topics.replicator import outgoing_entry
from magnetar.broker.topics.snapshot_cache import Snapshot, SnapshotCache
from magnetar.common.ledger.managed_ledger_list import LedgerInfo
from magnetar.common.proto import markers_pb2 as mk
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec


def test_marker_types_are_pulsars() -> None:
    assert (markers.SNAPSHOT_REQUEST, markers.SNAPSHOT_RESPONSE) == (10, 11)
    assert (markers.SNAPSHOT, markers.UPDATE) == (12, 13)


def test_each_marker_goes_where_pulsar_sends_it() -> None:
    request = markers.snapshot_request("s1", "east")
    response = markers.snapshot_response("s1", "east", "west", Position(3, 9))
    snapshot = markers.snapshot("s1", "east", Position(4, 2), {"west": Position(3, 9)})
    update = markers.update("app", {"west": Position(3, 9)})
    for entry in (request, response, snapshot, update):
        metadata = entry_metadata(entry)
        assert markers.is_marker(metadata)
        assert (metadata.producer_name, metadata.sequence_id) == ("pulsar.marker", 0)
    # Request and update to every remote; the response only to who asked; the snapshot nowhere.
    assert outgoing_entry(request, "east", "west") is not None
    assert outgoing_entry(update, "east", "north") is not None
    assert outgoing_entry(response, "west", "east") is not None
    assert outgoing_entry(response, "west", "north") is None
    assert outgoing_entry(snapshot, "east", "west") is None
    # A marker that came by replication is never sent on (no loops).
    replicated = outgoing_entry(request, "east", "west")
    assert replicated is not None
    assert outgoing_entry(replicated[0], "west", "north") is None


def test_marker_payloads_read_back() -> None:
    entry = markers.snapshot("s1", "east", Position(4, 2), {"west": Position(3, 9)})
    body = markers.parse(entry_metadata(entry).marker_type, entry_payload(entry))
    assert isinstance(body, mk.ReplicatedSubscriptionsSnapshot)
    assert markers.position_of(body.local_message_id) == Position(4, 2)
    assert [(c.cluster, markers.position_of(c.message_id)) for c in body.clusters] == [
        ("west", Position(3, 9))
    ]
    update = markers.update("app", {"west": Position(1, 1), "north": Position(2, 2)})
    parsed = markers.parse(markers.UPDATE, entry_payload(update))
    assert isinstance(parsed, mk.ReplicatedSubscriptionsUpdate)
    assert parsed.subscription_name == "app"
    with pytest.raises(markers.MarkerError):
        markers.parse(99, b"")
    with pytest.raises(markers.MarkerError):
        markers.parse(markers.SNAPSHOT, b"\xff\xff")


def snap(entry: int) -> Snapshot:
    return Snapshot(f"s{entry}", Position(1, entry), {"west": Position(7, entry * 2)})


def test_cache_gives_the_newest_snapshot_reached_and_forgets_older_ones() -> None:
    cache = SnapshotCache(10)
    for entry in (10, 20, 30):
        cache.add(snap(entry))
    assert cache.advanced(Position(1, 5)) is None
    assert cache.advanced(Position(1, 25)) == snap(20)
    assert [s.local for s in cache.snapshots] == [Position(1, 30)]
    assert cache.advanced(Position(1, 29)) is None
    assert cache.advanced(Position(2, 0)) == snap(30)
    assert len(cache) == 0


def test_cache_is_cleared_by_an_older_snapshot() -> None:
    cache = SnapshotCache(5)
    cache.add(snap(10))
    cache.add(snap(20))
    cache.add(snap(15))  # the subscription was reset
    assert [s.local for s in cache.snapshots] == [Position(1, 15)]


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60, unique=True))
def test_cache_keeps_at_most_its_bound_with_first_and_last(entries: list[int]) -> None:
    entries.sort()
    cache = SnapshotCache(4, lambda a, b: b.entry_id - a.entry_id)
    for entry in entries:
        cache.add(snap(entry))
    kept = [s.local.entry_id for s in cache.snapshots]
    assert len(kept) == min(4, len(entries))
    assert kept == sorted(kept) and kept[-1] == entries[-1] and kept[0] == entries[0]


def test_cache_bound_at_least_three() -> None:
    with pytest.raises(ValueError):
        SnapshotCache(2)


def test_one_remote_one_round() -> None:
    builder = SnapshotBuilder("s", frozenset({"west"}), 0.0, 30)
    assert builder.received("west", Position(3, 4)) is Outcome.COMPLETE
    assert builder.responses == {"west": Position(3, 4)}
    assert builder.received("west", Position(3, 5)) is Outcome.WAIT  # completing already


def test_two_remotes_two_rounds_keeping_first_answers() -> None:
    builder = SnapshotBuilder("s", frozenset({"west", "north"}), 0.0, 30)
    assert builder.received("west", Position(3, 4)) is Outcome.WAIT
    assert builder.received("nowhere", Position(9, 9)) is Outcome.WAIT
    assert builder.received("north", Position(5, 1)) is Outcome.AGAIN
    assert builder.received("north", Position(5, 8)) is Outcome.WAIT
    assert builder.received("west", Position(3, 9)) is Outcome.COMPLETE
    assert builder.responses == {"west": Position(3, 4), "north": Position(5, 1)}
    assert not builder.timed_out(30.0) and builder.timed_out(30.5)


class Ledgers(LedgerPositions):
    """Closed ledgers of the given entry counts (ids 10, 20, ...), none open."""

    def __init__(self, counts: list[int]) -> None:
        self._ledgers = [
            LedgerInfo(10 * (i + 1), entries=n, closed=True) for i, n in enumerate(counts)
        ]
        self._current = None


@given(st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_previous_position_walks_back_over_every_entry(counts: list[int]) -> None:
    """What a reader's last message id is found by when the last entries are markers."""
    ledgers = Ledgers(counts)
    existing = [Position(i, e) for i, n in ledgers.ledger_extents() for e in range(n)]
    walked = []
    at = ledgers.previous_position(Position(10 * len(counts) + 10, 0))
    while at is not None:
        walked.append(at)
        at = ledgers.previous_position(at)
    assert walked == existing[::-1]
    for a in existing:
        for b in existing:
            assert ledgers.entries_between(a, b) == max(existing.index(b) - existing.index(a), 0)


@given(
    st.text(max_size=30),
    st.integers(0, 2**64 - 1),
    st.lists(st.text(max_size=10), max_size=3),
    st.one_of(st.none(), st.integers(0, 2**31 - 1)),
)
def test_is_marker_entry_agrees_with_decoding(
    name: str, sequence: int, replicate_to: list[str], marker_type: int | None
) -> None:
    """The quick look for the marker_type tag never disagrees with decoding the metadata,
    also when a producer name or a cluster name holds the tag's bytes."""
    metadata = pb.MessageMetadata(
        producer_name=name + "\xa0\x01", sequence_id=sequence, publish_time=1
    )
    metadata.replicate_to.extend(replicate_to)
    if marker_type is not None:
        metadata.marker_type = marker_type
    entry = codec.encode_headers_and_payload(metadata, b"\xa0\x01payload")
    assert is_marker_entry(entry) is (marker_type is not None)
    assert is_marker_entry(markers.update("s", {})) is True
