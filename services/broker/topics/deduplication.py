"""Message deduplication: a producer's message whose sequence id is not above the highest one
already stored for that producer name is acknowledged but not stored again.

Only a *stored* message makes its resend a duplicate. A message still in flight makes a resend
of it "unknown" (refused, so the client sends it again later, as Pulsar does), and an add that
fails takes the producer's accepted sequence back to what is stored, so its resend is stored.

The highest persisted sequence id per producer name survives restarts: a snapshot in the
managed ledger's properties (every ``SNAPSHOT_EVERY`` entries and when the topic closes) plus
a scan of the entries written after the snapshot when the topic is loaded.
"""

from __future__ import annotations

import enum
import json
import logging

from magnetar.broker.ledger.managed_ledger import ManagedLedger
from magnetar.broker.model.entry import entry_metadata
from magnetar.broker.model.position import Position

log = logging.getLogger(__name__)

SNAPSHOT_PROPERTY = "deduplication-snapshot"
SNAPSHOT_EVERY = 1000


class DuplicateStatus(enum.Enum):
    NEW = "new"  # store it
    DUPLICATE = "duplicate"  # stored already: acknowledge, store nothing
    UNKNOWN = "unknown"  # an earlier copy is still in flight: refuse, the client resends


class Deduplication:
    def __init__(self, ml: ManagedLedger) -> None:
        self.ml = ml
        self.pushed: dict[str, int] = {}  # highest sequence id accepted (stored or in flight)
        self.persisted: dict[str, int] = {}  # highest sequence id durably stored
        self._since_snapshot = 0

    @classmethod
    async def load(cls, ml: ManagedLedger) -> Deduplication:
        dedup = cls(ml)
        start = ml.first_position
        raw = ml.properties.get(SNAPSHOT_PROPERTY)
        if raw:
            snapshot = json.loads(raw)
            dedup.persisted = {k: int(v) for k, v in snapshot["sequences"].items()}
            start = max(start, ml.next_position(Position(*snapshot["position"])))
        scanned = 0
        while True:
            entries = await ml.read_entries(start, 500)
            if not entries:
                break
            for _position, stored in entries:
                metadata = entry_metadata(stored)
                highest = max(metadata.sequence_id, metadata.highest_sequence_id)
                if highest > dedup.persisted.get(metadata.producer_name, -1):
                    dedup.persisted[metadata.producer_name] = highest
            scanned += len(entries)
            start = ml.next_position(entries[-1][0])
        dedup.pushed = dict(dedup.persisted)
        log.info(
            "deduplication state of %s rebuilt (%d entries scanned after the snapshot)",
            ml.name,
            scanned,
        )
        return dedup

    def last_sequence_id(self, producer_name: str) -> int:
        return self.persisted.get(producer_name, -1)

    def check(self, producer_name: str, sequence_id: int, highest: int) -> DuplicateStatus:
        """Classify a message; a NEW one is recorded as accepted (in flight)."""
        if sequence_id <= self.persisted.get(producer_name, -1):
            return DuplicateStatus.DUPLICATE
        if sequence_id <= self.pushed.get(producer_name, -1):
            return DuplicateStatus.UNKNOWN
        self.pushed[producer_name] = max(sequence_id, highest)
        return DuplicateStatus.NEW

    def failed(self, producer_name: str) -> None:
        """An add of this producer failed: what it has in flight is not stored, so a resend of
        it must be taken as new."""
        self.pushed[producer_name] = self.persisted.get(producer_name, -1)

    def persisted_up_to(self, producer_name: str, sequence_id: int) -> bool:
        """Record a durable message; True when a snapshot is due."""
        if sequence_id > self.persisted.get(producer_name, -1):
            self.persisted[producer_name] = sequence_id
        self._since_snapshot += 1
        if self._since_snapshot >= SNAPSHOT_EVERY:
            self._since_snapshot = 0
            return True
        return False

    async def snapshot(self) -> None:
        position = self.ml.last_confirmed_position
        value = json.dumps(
            {"position": [position.ledger_id, position.entry_id], "sequences": self.persisted}
        )
        await self.ml.set_property(SNAPSHOT_PROPERTY, value)
