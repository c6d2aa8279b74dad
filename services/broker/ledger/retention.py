"""Which ledgers of a managed ledger may go: the trimming and retention rules, as pure
functions of its ledger list (the managed ledger applies them under its metadata lock)."""

from __future__ import annotations

from magnetar.broker.ledger.ledger_info import MiB
from magnetar.broker.model.position import Position
from magnetar.common.ledger.managed_ledger_list import LedgerInfo


def closed_before(
    ledgers: list[LedgerInfo], current: int | None, before: Position
) -> list[LedgerInfo]:
    """The closed ledgers (never ``current``, the one being written) whose every entry is
    before ``before``."""
    return [
        i
        for i in ledgers
        if i.ledger_id != current and i.closed and Position(i.ledger_id, i.entries - 1) < before
    ]


def past_retention(
    ledgers: list[LedgerInfo],
    consumed: set[int],
    total_size: int,
    retention_minutes: int,
    retention_mb: int,
    now_ms: float,
) -> list[int]:
    """Pulsar's retention rule: oldest first, a ``consumed`` ledger goes while it is older than
    ``retention_minutes`` or the rest of the topic is over ``retention_mb`` (-1: no limit for
    either); the first ledger that is kept stops the run."""
    deleted, doomed = 0, []
    for info in ledgers:
        if info.ledger_id not in consumed:
            break
        expired = (
            retention_minutes >= 0
            and (info.closed_ms or info.ctime_ms) < now_ms - retention_minutes * 60_000
        )
        over_size = retention_mb >= 0 and total_size - deleted > retention_mb * MiB
        if not expired and not over_size:
            break
        doomed.append(info.ledger_id)
        deleted += info.size
    return doomed


def last_position_closed_before(ledgers: list[LedgerInfo], cutoff_ms: float) -> Position | None:
    """The last entry of the oldest run of ledgers closed before ``cutoff_ms`` (their every
    entry is older than that), or None: what the TTL may acknowledge without reading."""
    last = None
    for info in ledgers:
        if not info.closed or not info.closed_ms or info.closed_ms >= cutoff_ms:
            break
        if info.entries > 0:
            last = Position(info.ledger_id, info.entries - 1)
    return last
