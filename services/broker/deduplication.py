"""Message deduplication: a producer's message whose sequence id is not above the highest one
already stored for that producer name is acknowledged but not stored again.

The highest persisted sequence id per producer name survives restarts: a snapshot in the
managed ledger's properties (every ``SNAPSHOT_EVERY`` entries and when the topic closes) plus
a scan of the entries written after the snapshot when the topic is loaded.
"""

from __future__ import annotations

import json
import logging

from magnetar.broker.entry import entry_metadata
from magnetar.broker.managed_ledger import ManagedLedger
from magnetar.broker.position import Position

log = logging.getLogger(__name__)

SNAPSHOT_PROPERTY = "deduplication-snapshot"
SNAPSHOT_EVERY = 1000


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

    def is_duplicate(self, producer_name: str, sequence_id: int, highest: int) -> bool:
        """True for a resent message; otherwise records it as accepted."""
        if sequence_id <= self.pushed.get(producer_name, -1):
            return True
        self.pushed[producer_name] = max(sequence_id, highest)
        return False

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
