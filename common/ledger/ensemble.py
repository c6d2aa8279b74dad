"""Ensemble change: the one routine that replaces bookies of a ledger's ensemble.

Three callers replace bookies, and all go through here:

- the writer (``LedgerHandle``), when a bookie fails during adds: a new last fragment from the
  first unacknowledged entry;
- recovery, when a bookie fails while recovered entries are re-added: a new last fragment from
  the entry being re-added;
- the replication worker, after it copied a fragment's entries to new bookies: the same
  fragment (same first entry) with the lost bookies replaced, later fragments untouched.

A change is planned (:func:`plan_change`, pure: placement over the registered bookies) and then
committed (:func:`commit_change`, a CAS on the ledger's metadata). The rule of the commit: the
change names the fragment it starts at and the bookies it replaces at which positions. If the
metadata moved on since it was read (BadVersion), the caller's ``on_conflict`` sees the new
metadata first (and raises if the change no longer belongs there, e.g. the writer finds the
ledger fenced); then the change is applied to the new metadata only if the ensemble serving its
first entry still holds the replaced bookies at those positions. Otherwise someone else changed
the same bookies, and :class:`EnsembleChangeConflict` is raised: the caller starts again from
the metadata as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from magnetar.common.ledger.bookies import BookieRegistration
from magnetar.common.ledger.metadata import LedgerMetadata, ledger_key
from magnetar.common.ledger.placement import PlacementPolicy
from magnetar.common.metadata import BadVersionError, MetadataStore

log = logging.getLogger(__name__)


class EnsembleChangeConflict(Exception):
    """Someone else replaced the same bookies of the same fragment first."""


@dataclass(slots=True, frozen=True)
class EnsembleChange:
    """Replace ``old`` by ``new`` for the entries from ``first_entry_id`` on."""

    first_entry_id: int
    old: tuple[str, ...]
    new: tuple[str, ...]

    @property
    def positions(self) -> list[int]:
        return [p for p, (a, b) in enumerate(zip(self.old, self.new, strict=True)) if a != b]

    @property
    def replaced(self) -> dict[str, str]:
        """Old bookie -> its replacement."""
        return {self.old[p]: self.new[p] for p in self.positions}

    def applies_to(self, metadata: LedgerMetadata) -> bool:
        """The ensemble serving ``first_entry_id`` still holds the bookies this change replaces."""
        current = metadata.fragment_for(self.first_entry_id).bookies
        return all(current[p] == self.old[p] for p in self.positions)

    def apply(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """``metadata`` with the new ensemble from ``first_entry_id`` on; later fragments (the
        results of later ensemble changes) stay as they are."""
        return metadata.with_ensemble_from(self.first_entry_id, self.new)

    def __str__(self) -> str:
        moves = ", ".join(f"{a} -> {b}" for a, b in self.replaced.items())
        return f"from entry {self.first_entry_id}: {moves}"


def plan_change(
    ensemble: Sequence[str],
    first_entry_id: int,
    positions: Collection[int],
    registrations: Sequence[BookieRegistration],
    placement: PlacementPolicy,
    exclude: Collection[str] = (),
) -> EnsembleChange:
    """Replacements for the bookies at ``positions`` chosen by ``placement`` among the
    registered writable bookies that are neither in ``ensemble`` nor in ``exclude``.
    Raises NotEnoughBookiesError when there are too few."""
    ordered = sorted(set(positions))
    chosen = placement.choose(len(ordered), registrations, exclude=set(ensemble) | set(exclude))
    new = list(ensemble)
    for position, address in zip(ordered, chosen, strict=True):
        new[position] = address
    return EnsembleChange(first_entry_id, tuple(ensemble), tuple(new))


async def commit_change(
    store: MetadataStore,
    ledger_id: int,
    metadata: LedgerMetadata,
    version: int,
    change: EnsembleChange,
    *,
    read_metadata: Callable[[], Awaitable[tuple[LedgerMetadata, int]]],
    on_conflict: Callable[[LedgerMetadata], None] = lambda _: None,
) -> tuple[LedgerMetadata, int]:
    """CAS ``change`` into the ledger's metadata; return the new metadata and version.

    ``read_metadata`` gives ``(metadata, version)`` as stored now.
    ``on_conflict`` runs on each newer metadata met (it raises to stop). Raises
    EnsembleChangeConflict if the replaced bookies were replaced by someone else meanwhile."""
    while True:
        updated = change.apply(metadata)
        try:
            version = await store.put(ledger_key(ledger_id), updated.to_bytes(), version)
        except BadVersionError:
            metadata, version = await read_metadata()
            on_conflict(metadata)
            if not change.applies_to(metadata):
                raise EnsembleChangeConflict(
                    f"ledger {ledger_id}: ensemble change {change} conflicts with the stored "
                    f"ensemble {list(metadata.fragment_for(change.first_entry_id).bookies)}"
                ) from None
            continue
        log.info("ledger %d: ensemble change %s", ledger_id, change)
        return updated, version
