"""Reading a topic's compacted view through a cursor (Pulsar's CompactedTopicImpl reads): from
the cursor's read position, the compacted ledger's entries at or after it, up to the horizon;
once the compacted ledger has nothing more, the read position moves to the first entry after
the horizon and the cursor reads the topic's ledgers from there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnetar.broker.ledger.errors import ManagedLedgerError
from magnetar.broker.model.position import Position
from magnetar.common.ledger.errors import LedgerError

if TYPE_CHECKING:
    from magnetar.broker.ledger.compacted_ledger import CompactedLedger
    from magnetar.broker.ledger.cursor import ManagedCursor


async def read(
    cursor: ManagedCursor, view: CompactedLedger, max_entries: int
) -> list[tuple[Position, bytes]]:
    """Up to ``max_entries`` unacknowledged entries of ``view`` from the read position, which
    moves past them (past the horizon once the view is done). A failed read leaves it."""
    result: list[tuple[Position, bytes]] = []
    moves = cursor.moves
    while len(result) < max_entries and cursor.read_position <= view.horizon:
        start = cursor.read_position
        hint = cursor.compacted_hint
        try:
            if hint is not None and hint[0] == view.ledger_id and hint[1] == start:
                first = hint[2]
            else:
                first = await view.find(start)
            found = await view.read(first, max_entries - len(result))
        except LedgerError as e:  # e.g. replaced by a newer compaction while this read waited
            raise ManagedLedgerError(
                f"managed ledger {cursor.ml.name}: reading compacted ledger {view.ledger_id} "
                f"failed: {e}"
            ) from e
        if cursor.moves != moves:
            return []  # rewound or reset meanwhile: the read position is the new one
        if not found:
            cursor.read_position = cursor.ml.next_position(view.horizon)
            break
        result.extend((p, data) for _, p, data in found if not cursor.is_acked(p))
        last_id, last, _ = found[-1]
        cursor.read_position = Position(last.ledger_id, last.entry_id + 1)
        cursor.compacted_hint = (view.ledger_id, cursor.read_position, last_id + 1)
    return result
