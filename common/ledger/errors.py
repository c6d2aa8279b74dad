"""Errors of the ledger client."""

from __future__ import annotations


class LedgerError(Exception):
    """A ledger operation failed."""


class NoSuchLedgerError(LedgerError):
    """No metadata exists for that ledger id."""


class NoSuchEntryError(LedgerError):
    """The entry is not in the ledger (beyond its end, or absent on every replica)."""


class LedgerClosedError(LedgerError):
    """The handle is closed, or was opened for reading only."""


class LedgerFencedError(LedgerError):
    """Another owner fenced (recovered) the ledger. Adds still pending may or may not be in it:
    the recovered ledger's last entry says which are."""


class LedgerUnauthorizedError(LedgerError):
    """A bookie refused an add because the ledger id is held there under another master key:
    the id was reused (a reset metadata store) or the writer is not the ledger's. Nothing more
    is written to this ledger."""


class EntryTooLargeError(LedgerError):
    """One add was refused because its entry is over the bookies' max entry size. Only that
    add failed: the ledger and its ensemble are fine, and later adds go on."""

    def __init__(self, ledger_id: int, size: int, limit: int, detail: str = "") -> None:
        self.ledger_id = ledger_id
        self.size = size
        self.limit = limit
        super().__init__(
            f"ledger {ledger_id}: entry of {size} bytes (header included) is over the "
            f"max entry size {limit}" + (f" ({detail})" if detail else "")
        )


class ReadError(LedgerError):
    """No replica returned the entry (bookies down, or every copy corrupt)."""


class EntryDigestError(ReadError):
    """Every replica that answered returned a corrupt copy of the entry (digest mismatch, or not
    the entry asked for) or had none, and at least one copy was corrupt: the entry is
    unreadable. Raised for one replica by the replica read too, which then asks the next one."""

    def __init__(self, ledger_id: int, entry_id: int, detail: str) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        super().__init__(f"ledger {ledger_id} entry {entry_id}: no intact copy ({detail})")


class RecoveryError(LedgerError):
    """Recovery could not finish now (not enough bookies answered); it is safe to retry."""
