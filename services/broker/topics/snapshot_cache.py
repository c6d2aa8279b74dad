"""The snapshots a replicated subscription may use (Pulsar's ReplicatedSubscriptionSnapshotCache).

A snapshot pairs a position of the local topic with the position of each remote cluster's copy
at which everything that copy held had reached the local topic before that local position. Once
the subscription's mark-delete position reaches a snapshot's local position, the remote
subscriptions of the same name may move to the snapshot's remote positions: nothing they skip
is unacknowledged here.

Pure code. ``advanced`` hands out the latest usable snapshot and forgets it and every older one.
At most ``max_cached`` are kept: a new one beyond that evicts, among the ones between the oldest
and the newest, the one whose neighbours are closest together (``distance``: entries between
two positions), so the kept ones stay spread over the backlog as Pulsar keeps them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from magnetar.broker.model.position import Position


@dataclass(slots=True, frozen=True)
class Snapshot:
    snapshot_id: str
    local: Position
    #: Cluster name -> position in that cluster's copy of the topic.
    clusters: dict[str, Position]


class SnapshotCache:
    def __init__(
        self, max_cached: int, distance: Callable[[Position, Position], int] | None = None
    ) -> None:
        if max_cached < 3:
            raise ValueError("a snapshot cache keeps at least 3 snapshots")
        self.max_cached = max_cached
        self._distance = distance or (lambda a, b: 0)
        self._snapshots: list[Snapshot] = []

    def __len__(self) -> int:
        return len(self._snapshots)

    @property
    def snapshots(self) -> list[Snapshot]:
        return list(self._snapshots)

    def add(self, snapshot: Snapshot) -> None:
        """A snapshot no later than the newest kept one means the subscription was reset:
        what was kept no longer applies."""
        if self._snapshots and snapshot.local <= self._snapshots[-1].local:
            self._snapshots.clear()
        self._snapshots.append(snapshot)
        if len(self._snapshots) > self.max_cached:
            kept = self._snapshots
            gaps = [
                self._distance(kept[i - 1].local, kept[i + 1].local)
                for i in range(1, len(kept) - 1)
            ]
            del kept[1 + gaps.index(min(gaps))]

    def advanced(self, mark_delete: Position) -> Snapshot | None:
        """The mark-delete position moved to ``mark_delete``: the newest snapshot at or before
        it, if any (it and the older ones are dropped)."""
        usable = 0
        while usable < len(self._snapshots) and self._snapshots[usable].local <= mark_delete:
            usable += 1
        if usable == 0:
            return None
        found = self._snapshots[usable - 1]
        del self._snapshots[:usable]
        return found

    def clear(self) -> None:
        self._snapshots.clear()
