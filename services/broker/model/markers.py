"""Marker entries (Pulsar's ``Markers``): what a broker writes into a topic for its own use.

A marker is a stored entry like any other (``entry.py``'s format) whose MessageMetadata has
``marker_type`` set, produced by ``pulsar.marker`` with sequence id 0, its payload one message of
``common/proto/markers.proto``. Consumers never get one: dispatchers acknowledge markers instead
of sending them, for every subscription. Pure code: build and read, no I/O.

Where each replicated-subscription marker goes (``replicate_to``, Pulsar's choice):

- snapshot request: every remote cluster;
- snapshot response: only the cluster that asked;
- snapshot: nowhere (``replicate_to`` is the local cluster itself);
- update: every remote cluster.
"""

from __future__ import annotations

import time

from google.protobuf.message import DecodeError, Message

from magnetar.broker.model.position import Position
from magnetar.common.proto import markers_pb2 as mk
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

MARKER_PRODUCER = "pulsar.marker"

SNAPSHOT_REQUEST = mk.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST
SNAPSHOT_RESPONSE = mk.REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE
SNAPSHOT = mk.REPLICATED_SUBSCRIPTION_SNAPSHOT
UPDATE = mk.REPLICATED_SUBSCRIPTION_UPDATE

_BODIES: dict[int, type[Message]] = {
    SNAPSHOT_REQUEST: mk.ReplicatedSubscriptionsSnapshotRequest,
    SNAPSHOT_RESPONSE: mk.ReplicatedSubscriptionsSnapshotResponse,
    SNAPSHOT: mk.ReplicatedSubscriptionsSnapshot,
    UPDATE: mk.ReplicatedSubscriptionsUpdate,
}


class MarkerError(ValueError):
    """A marker whose payload is not the message its type names."""


def is_marker(metadata: pb.MessageMetadata) -> bool:
    """Server-only entry (Pulsar's ``isServerOnlyMarker``): any marker type at all."""
    return metadata.HasField("marker_type")


def _entry(marker_type: int, body: Message, replicate_to: str | None) -> bytes:
    metadata = pb.MessageMetadata(
        producer_name=MARKER_PRODUCER,
        sequence_id=0,
        publish_time=int(time.time() * 1000),
        marker_type=marker_type,
    )
    if replicate_to is not None:
        metadata.replicate_to.append(replicate_to)
    return codec.encode_headers_and_payload(metadata, body.SerializeToString())


def _id(position: Position) -> mk.MarkersMessageIdData:
    return mk.MarkersMessageIdData(
        ledger_id=max(position.ledger_id, 0), entry_id=max(position.entry_id, 0)
    )


def position_of(message_id: mk.MarkersMessageIdData) -> Position:
    return Position(message_id.ledger_id, message_id.entry_id)


def _clusters(positions: dict[str, Position]) -> list[mk.ClusterMessageId]:
    return [
        mk.ClusterMessageId(cluster=name, message_id=_id(position))
        for name, position in sorted(positions.items())
    ]


def snapshot_request(snapshot_id: str, source_cluster: str) -> bytes:
    body = mk.ReplicatedSubscriptionsSnapshotRequest(
        snapshot_id=snapshot_id, source_cluster=source_cluster
    )
    return _entry(SNAPSHOT_REQUEST, body, None)


def snapshot_response(snapshot_id: str, reply_to: str, cluster: str, last: Position) -> bytes:
    body = mk.ReplicatedSubscriptionsSnapshotResponse(
        snapshot_id=snapshot_id, cluster=mk.ClusterMessageId(cluster=cluster, message_id=_id(last))
    )
    return _entry(SNAPSHOT_RESPONSE, body, reply_to)


def snapshot(
    snapshot_id: str, local_cluster: str, local: Position, remotes: dict[str, Position]
) -> bytes:
    body = mk.ReplicatedSubscriptionsSnapshot(
        snapshot_id=snapshot_id, local_message_id=_id(local), clusters=_clusters(remotes)
    )
    return _entry(SNAPSHOT, body, local_cluster)


def update(subscription: str, positions: dict[str, Position]) -> bytes:
    body = mk.ReplicatedSubscriptionsUpdate(
        subscription_name=subscription, clusters=_clusters(positions)
    )
    return _entry(UPDATE, body, None)


def parse(marker_type: int, payload: bytes) -> Message:
    """The marker message of ``payload``; MarkerError for an unknown type or bad bytes."""
    kind = _BODIES.get(marker_type)
    if kind is None:
        raise MarkerError(f"unknown marker type {marker_type}")
    try:
        return kind.FromString(payload)
    except DecodeError as e:
        raise MarkerError(f"marker type {marker_type}: {e}") from e
