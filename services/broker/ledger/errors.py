"""What a managed ledger's operations raise."""

from __future__ import annotations

from magnetar.broker.model.position import Position


class ManagedLedgerError(Exception):
    """A managed ledger operation failed."""


class ManagedLedgerFencedError(ManagedLedgerError):
    """Another broker owns this managed ledger now; close it and let the owner serve the topic."""


class ManagedLedgerClosedError(ManagedLedgerError):
    """The managed ledger was closed."""


class ManagedLedgerTerminatedError(ManagedLedgerError):
    """The managed ledger was terminated (Pulsar's ManagedLedgerTerminatedException): it takes
    no more entries, ever; what it holds stays readable."""


class UnreadableEntryError(ManagedLedgerError):
    """No bookie holds an intact copy of this entry (every copy failed its digest or is gone).
    The managed ledger remembers it (``unreadable``) for stats."""

    def __init__(self, message: str, position: Position) -> None:
        super().__init__(message)
        self.position = position


class EntryTooLargeForLedgerError(ManagedLedgerError):
    """One entry is over the bookies' entry size limit: that add fails, nothing else does."""
