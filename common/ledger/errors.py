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


class ReadError(LedgerError):
    """No replica returned the entry (bookies down, or every copy corrupt)."""


class RecoveryError(LedgerError):
    """Recovery could not finish now (not enough bookies answered); it is safe to retry."""
