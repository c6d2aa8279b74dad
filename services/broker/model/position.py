"""A position in a managed ledger: (ledger id, entry id). A leaf module: it imports nothing of
the broker, so everything may import it."""

from __future__ import annotations

import functools
from typing import NamedTuple


class Position(NamedTuple):
    """An entry of the managed ledger; ordered by ledger id, then entry id. Ids are signed
    (Pulsar's Java longs): ``(L, -1)`` is "before the first entry of ledger L" and ``(-1, -1)``
    is "before everything". A named tuple: hashed and compared in C, several times per message
    (the entry cache, the cursor's ranges, the dispatcher's bookkeeping)."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


#: ``Position`` of a ``(ledger id, entry id)`` pair, made in C: a named tuple's own constructor
#: is Python code, and the hot paths (each stored entry, each acknowledged message) make one.
position_of = functools.partial(tuple.__new__, Position)
