"""Replicated subscriptions of one topic (Pulsar's ReplicatedSubscriptionsController and
ReplicatedSubscriptionsSnapshotBuilder).

A subscription is replicated when a consumer subscribed with ``replicate_subscription_state``.
Its position follows across the clusters of a replicated namespace through markers
(``model/markers.py``) written into the topic and carried by the replicators:

1. Every ``replicated_subscriptions_snapshot_frequency_millis`` the owner of a topic that has a
   replicated subscription writes a **snapshot request** (skipped when no data message was
   published since the last completed snapshot started, or a replicator is not connected).
2. A remote cluster's replicator back to us reads the request and its broker answers with a
   **snapshot response** holding its last stored position, replicated to us only.
3. Our replicator to that remote reads the response (stored here at position P). With every
   remote answered (two rounds with more than one remote, Pulsar's rule: a message another
   remote sent on during the first round reaches us before the second round's answers), the
   **snapshot** (P, each remote's position) is written here (replicated nowhere) and given to
   every replicated subscription's ``SnapshotCache``.
4. When a replicated subscription's mark-delete position reaches a snapshot's P, an **update**
   carrying the remote positions is written and replicated; each remote moves its subscription of
   that name there (cumulative ack; created there when missing).

Why a remote may move to its position R: everything that remote held at R was sent to us before
its response, so it is stored here before P, and everything we had sent it before our request is
in its copy before R; so whatever the remote skips is acknowledged here. What lies between our
request and P may be delivered again there: the redelivery is bounded by one snapshot round.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from magnetar.broker.model import markers
from magnetar.broker.model.position import Position
from magnetar.broker.topics.snapshot_cache import Snapshot
from magnetar.common.proto import markers_pb2 as mk
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.topics.persistent import PersistentTopic

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ReplicatedSubscriptionSettings:
    """The broker settings of the same names (Pulsar's defaults)."""

    enabled: bool = True
    snapshot_frequency_ms: int = 1000
    snapshot_timeout_s: int = 30
    max_cached_per_subscription: int = 10


class Outcome(enum.Enum):
    WAIT = "wait"  # more answers to come
    AGAIN = "again"  # first of two rounds complete: ask again
    COMPLETE = "complete"  # write the snapshot


@dataclass(slots=True)
class SnapshotBuilder:
    """One snapshot being built: which remotes still have to answer. Pure."""

    snapshot_id: str
    remotes: frozenset[str]
    started_at: float
    timeout_s: float
    #: Each remote's position from its first answer (the earliest, hence the safe one).
    responses: dict[str, Position] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    first_round_done: bool = False
    completing: bool = False

    def __post_init__(self) -> None:
        self.missing = set(self.remotes)

    def received(self, cluster: str, position: Position) -> Outcome:
        if cluster not in self.remotes:
            return Outcome.WAIT
        self.responses.setdefault(cluster, position)
        self.missing.discard(cluster)
        if self.missing or self.completing:
            return Outcome.WAIT
        if len(self.remotes) > 1 and not self.first_round_done:
            self.first_round_done = True
            self.missing = set(self.remotes)
            return Outcome.AGAIN
        self.completing = True
        return Outcome.COMPLETE

    def timed_out(self, now: float) -> bool:
        return now - self.started_at > self.timeout_s


class ReplicatedSubscriptionsController:
    def __init__(
        self, topic: PersistentTopic, local_cluster: str, settings: ReplicatedSubscriptionSettings
    ) -> None:
        self.topic = topic
        self.local_cluster = local_cluster
        self.settings = settings
        self.pending: dict[str, SnapshotBuilder] = {}
        #: When the last completed snapshot started (monotonic; 0: none yet).
        self.last_completed_started = 0.0
        self.last_completed_id: str | None = None
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"replicated subscriptions of {self.topic.name}"

    @property
    def snapshotting(self) -> bool:
        return self._task is not None

    def start_snapshots(self) -> None:
        if self._task is None and self.settings.enabled:
            self._task = asyncio.create_task(self._run(), name=repr(self))

    async def stop_snapshots(self) -> None:
        task, self._task = self._task, None
        self.pending.clear()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        interval = self.settings.snapshot_frequency_ms / 1000
        while True:
            try:
                self.start_new_snapshot()
            except Exception:
                log.exception("%s: starting a snapshot failed", self)
            await asyncio.sleep(interval)

    # -- snapshots we start ---------------------------------------------------------------------

    def start_new_snapshot(self) -> None:
        now = time.monotonic()
        for snapshot_id in [i for i, b in self.pending.items() if b.timed_out(now)]:
            log.info("%s: snapshot %s timed out", self, snapshot_id)
            del self.pending[snapshot_id]
        if self.topic.last_data_at < self.last_completed_started:
            return  # nothing published since the last snapshot: it still holds
        replicators = self.topic.replicators
        if not replicators or not all(r.connected for r in replicators.values()):
            return  # an unreachable remote could not answer
        builder = SnapshotBuilder(
            str(uuid.uuid4()), frozenset(replicators), now, self.settings.snapshot_timeout_s
        )
        self.pending[builder.snapshot_id] = builder
        self._write(markers.snapshot_request(builder.snapshot_id, self.local_cluster))

    def _write(self, entry: bytes, on_stored: Callable[[Position], None] | None = None) -> None:
        self.topic.write_marker(entry, on_stored)

    # -- markers that came from a remote (read by our replicator to that remote) -----------------

    async def received_marker(
        self, position: Position, metadata: pb.MessageMetadata, payload: bytes
    ) -> None:
        try:
            body = markers.parse(metadata.marker_type, payload)
        except markers.MarkerError as e:
            log.warning("%s: marker at %s ignored: %s", self, position, e)
            return
        if isinstance(body, mk.ReplicatedSubscriptionsSnapshotRequest):
            self._received_request(body)
        elif isinstance(body, mk.ReplicatedSubscriptionsSnapshotResponse):
            self._received_response(position, body)
        elif isinstance(body, mk.ReplicatedSubscriptionsUpdate):
            await self._received_update(body)

    def _received_request(self, request: mk.ReplicatedSubscriptionsSnapshotRequest) -> None:
        # Our last stored position; the response itself is stored after it.
        last = self.topic.ml.last_confirmed_position
        self._write(
            markers.snapshot_response(
                request.snapshot_id, request.source_cluster, self.local_cluster, last
            )
        )

    def _received_response(
        self, position: Position, response: mk.ReplicatedSubscriptionsSnapshotResponse
    ) -> None:
        builder = self.pending.get(response.snapshot_id)
        if builder is None:
            return  # timed out, or not ours
        remote = markers.position_of(response.cluster.message_id)
        outcome = builder.received(response.cluster.cluster, remote)
        if outcome is Outcome.AGAIN:
            self._write(markers.snapshot_request(builder.snapshot_id, self.local_cluster))
        elif outcome is Outcome.COMPLETE:
            snapshot = Snapshot(builder.snapshot_id, position, dict(builder.responses))
            entry = markers.snapshot(
                builder.snapshot_id, self.local_cluster, position, snapshot.clusters
            )
            self._write(entry, lambda _: self._completed(builder, snapshot))

    def _completed(self, builder: SnapshotBuilder, snapshot: Snapshot) -> None:
        self.pending.pop(builder.snapshot_id, None)
        self.last_completed_started = builder.started_at
        self.last_completed_id = builder.snapshot_id
        for subscription in list(self.topic.subscriptions.values()):
            if subscription.replicated:
                subscription.add_snapshot(snapshot, self.settings.max_cached_per_subscription)

    async def _received_update(self, update: mk.ReplicatedSubscriptionsUpdate) -> None:
        for cluster in update.clusters:
            if cluster.cluster == self.local_cluster:
                position = markers.position_of(cluster.message_id)
                await self.topic.follow_replicated_subscription(update.subscription_name, position)
                return

    # -- our replicated subscriptions ----------------------------------------------------------

    def local_subscription_updated(self, subscription: str, snapshot: Snapshot) -> None:
        """A replicated subscription's mark-delete position reached ``snapshot``."""
        log.debug("%s: %s moves the remotes to %s", self, subscription, snapshot.clusters)
        self._write(markers.update(subscription, snapshot.clusters))
