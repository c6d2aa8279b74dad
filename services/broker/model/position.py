"""A position in a managed ledger: (ledger id, entry id). A leaf module: it imports nothing of
the broker, so everything may import it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True, order=True)
class Position:
    """An entry of the managed ledger; ordered by ledger id, then entry id. Ids are signed
    (Pulsar's Java longs): ``(L, -1)`` is "before the first entry of ledger L" and ``(-1, -1)``
    is "before everything"."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"
