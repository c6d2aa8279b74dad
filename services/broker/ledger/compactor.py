"""The compactor (Pulsar's TwoPhaseCompactor), run on the broker that owns the topic.

It reads the topic's compacted view as it stands (the previous compacted ledger, then the
topic's entries after its horizon) up to the topic's last entry when the run starts, which
becomes the new horizon. Phase one finds the latest message of each key (``compaction_rules``);
phase two reads the same entries again and writes what is kept, in order, to a new ledger
through the ledger client. Then the managed ledger records ``(ledger, horizon)`` in one CAS of
its properties, the previous compacted ledger is deleted, and the ``__compaction`` cursor moves
to the horizon (its backlog is what the next run has to read: the threshold trigger's measure;
it also holds back retention, so nothing is trimmed before it is compacted).

Crash safety: the new ledger is named in the properties as pending before anything is written
to it; a run deletes a pending ledger left by an interrupted one first. Until the final CAS the
previous (ledger, horizon) stays recorded and readable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from magnetar.broker.ledger.compacted_ledger import (
    PENDING_PROPERTY,
    CompactedLedger,
    CompactionRecord,
    encode_entry,
)
from magnetar.broker.ledger.compaction_rules import keyed_messages, retain
from magnetar.broker.ledger.managed_ledger import ManagedLedger
from magnetar.broker.model.position import Position
from magnetar.common.ledger.handle import LedgerHandle

log = logging.getLogger(__name__)

#: Pulsar's name for the compactor's durable cursor (a subscription of the topic).
COMPACTION_CURSOR = "__compaction"
#: Entries read at once, and adds to the new ledger in flight at once.
READ_BATCH = 200
WRITE_WINDOW = 256


@dataclass(slots=True, frozen=True)
class CompactionResult:
    ledger_id: int
    horizon: Position
    entries_written: int
    keys: int
    #: Messages read that the compacted view no longer holds (Pulsar's removed-event count).
    removed: int


class Compactor:
    """One run over ``ml``; ``run`` raises on any failure (the previous view stays)."""

    def __init__(self, ml: ManagedLedger) -> None:
        self.ml = ml
        #: Messages read so far in phase one (progress, for logs and tests).
        self.read_messages = 0

    async def run(self) -> CompactionResult:
        ml = self.ml
        cursor = await ml.open_cursor(COMPACTION_CURSOR, "earliest")
        await self._drop_pending()
        end = ml.last_confirmed_position
        previous = ml.compacted
        log.info("topic %s: compacting through %s: reading the keys", ml.name, end)
        latest, seen = await self._latest_per_key(previous, end)
        handle = await ml.client.create_ledger(
            ml.config.ensemble_size,
            ml.config.write_quorum,
            ml.config.ack_quorum,
            custom_metadata={
                "managed-ledger": ml.name.encode(),
                "application": b"magnetar",
                "component": b"compacted-ledger",
            },
        )
        try:
            await ml.update_properties({PENDING_PROPERTY: str(handle.ledger_id)})
            log.info(
                "topic %s: compacting through %s: writing %d messages (of %d entries) to ledger %d",
                ml.name,
                end,
                sum(len(v) for v in latest.values()),
                len(latest),
                handle.ledger_id,
            )
            written = await self._write(previous, end, latest, handle)
            await handle.close()
            view = await CompactedLedger.open(ml.client, CompactionRecord(handle.ledger_id, end))
        except BaseException:
            await asyncio.shield(self._abandon(handle.ledger_id))
            raise
        try:
            await ml.install_compacted(view)
        except BaseException:
            await view.close()
            raise
        cursor.mark_delete(end)
        await cursor.persist()
        kept = sum(len(v) for v in latest.values())
        return CompactionResult(handle.ledger_id, end, written, kept, seen - kept)

    async def _drop_pending(self) -> None:
        """Delete the ledger an interrupted run created and never recorded."""
        pending = self.ml.properties.get(PENDING_PROPERTY)
        if pending is None:
            return
        log.info("topic %s: deleting ledger %s of an interrupted compaction", self.ml.name, pending)
        await self._abandon(int(pending))

    async def _abandon(self, ledger_id: int) -> None:
        await self.ml.reader.delete([ledger_id])
        if self.ml.properties.get(PENDING_PROPERTY) == str(ledger_id):
            await self.ml.update_properties({PENDING_PROPERTY: None})

    async def _view(
        self, previous: CompactedLedger | None, end: Position
    ) -> AsyncIterator[tuple[Position, bytes]]:
        """The compacted view's entries through ``end``: the previous compacted ledger, then
        the topic after its horizon."""
        start = self.ml.first_position
        if previous is not None:
            entry_id = 0
            while entry_id < previous.entries:
                found = await previous.read(entry_id, READ_BATCH)
                if not found:
                    break
                for _, position, stored in found:
                    yield position, stored
                entry_id = found[-1][0] + 1
            start = self.ml.next_position(previous.horizon)
        position: Position | None = start
        while position is not None and position <= end:
            entries = await self.ml.read_entries(position, READ_BATCH)
            entries = [e for e in entries if e[0] <= end]
            if not entries:
                return
            for item in entries:
                yield item
            position = self.ml.first_at_or_after(
                Position(entries[-1][0].ledger_id, entries[-1][0].entry_id + 1)
            )

    async def _latest_per_key(
        self, previous: CompactedLedger | None, end: Position
    ) -> tuple[dict[Position, set[int]], int]:
        """Phase one: position -> batch indexes of the messages kept; messages seen."""
        latest: dict[str, tuple[Position, int]] = {}
        seen = 0
        async for position, stored in self._view(previous, end):
            for message in keyed_messages(stored):
                seen += 1
                if message.key is None:
                    continue
                if message.deletes:
                    latest.pop(message.key, None)
                else:
                    latest[message.key] = (position, message.index)
            self.read_messages = seen
        kept: dict[Position, set[int]] = {}
        for position, index in latest.values():
            kept.setdefault(position, set()).add(index)
        return kept, seen

    async def _write(
        self,
        previous: CompactedLedger | None,
        end: Position,
        kept: dict[Position, set[int]],
        handle: LedgerHandle,
    ) -> int:
        """Phase two: the kept messages, in order, to the new ledger."""
        pending: list[asyncio.Future[int]] = []
        written = 0
        async for position, stored in self._view(previous, end):
            keep = kept.get(position)
            if not keep:
                continue
            entry = retain(stored, keep)
            if entry is None:
                continue
            pending.append(await handle.add_async(encode_entry(position, entry)))
            written += 1
            if len(pending) >= WRITE_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return written
