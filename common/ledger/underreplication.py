"""Under-replication marks, replication locks and the autorecovery switches in the metadata store
(BookKeeper's ``LedgerUnderreplicationManager``, on Magnetar's store).

Keys (under ``/magnetar/underreplication``):

- ``ledgers/<id>``: the ledger is under-replicated; the JSON value names the bookies whose
  copies must be replaced (lost, or being decommissioned) and when it was first marked. The
  auditor and ``magnetar bk decommissionbookie`` add bookies to a mark by CAS; a replication
  worker deletes it by CAS once the ledger's ensembles no longer name them, so a bookie added
  while it worked is never dropped.
- ``locks/<id>``: ephemeral, held by the worker replicating the ledger; it vanishes with the
  worker's session (lease), so a dead worker's ledger is taken by another.
- ``decommissioning/<address>``: the bookie is being drained; it turns read-only (writers move
  off it at their next add) and placement no longer picks it.
- ``settings``: JSON with ``auto_recovery_daemon_enabled`` and ``lost_bookie_recovery_delay``,
  the two settings changeable at run time (``magnetar bk autorecovery``,
  ``magnetar bk lostbookierecoverydelay``); absent fields fall back to the bookie's own setting.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore, Versioned

ROOT = "/magnetar/underreplication"
MARKS_PATH = f"{ROOT}/ledgers"
LOCKS_PATH = f"{ROOT}/locks"
DECOMMISSIONING_PATH = f"{ROOT}/decommissioning"
SETTINGS_KEY = f"{ROOT}/settings"


def mark_key(ledger_id: int) -> str:
    return f"{MARKS_PATH}/{ledger_id}"


def lock_key(ledger_id: int) -> str:
    return f"{LOCKS_PATH}/{ledger_id}"


def decommissioning_key(address: str) -> str:
    return f"{DECOMMISSIONING_PATH}/{address}"


@dataclass(slots=True, frozen=True)
class UnderReplicatedMark:
    """Why a ledger is under-replicated: the bookies whose copies must be replaced."""

    bookies: frozenset[str]
    marked_at: float = field(default_factory=time.time)  # wall clock: shown to operators

    def to_json(self) -> bytes:
        return json.dumps({"bookies": sorted(self.bookies), "marked_at": self.marked_at}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> UnderReplicatedMark:
        data = json.loads(raw)
        return cls(frozenset(data.get("bookies", ())), float(data.get("marked_at", 0.0)))


@dataclass(slots=True, frozen=True)
class RecoverySettings:
    """The run-time switches; None: use the bookie's configured value."""

    auto_recovery_daemon_enabled: bool | None = None
    lost_bookie_recovery_delay: float | None = None

    def to_json(self) -> bytes:
        data = {
            "auto_recovery_daemon_enabled": self.auto_recovery_daemon_enabled,
            "lost_bookie_recovery_delay": self.lost_bookie_recovery_delay,
        }
        return json.dumps({k: v for k, v in data.items() if v is not None}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RecoverySettings:
        data = json.loads(raw)
        enabled = data.get("auto_recovery_daemon_enabled")
        delay = data.get("lost_bookie_recovery_delay")
        return cls(
            None if enabled is None else bool(enabled), None if delay is None else float(delay)
        )


async def mark_under_replicated(store: MetadataStore, ledger_id: int, bookies: set[str]) -> bool:
    """Add ``bookies`` to the ledger's mark (creating it); True if the mark changed."""
    key = mark_key(ledger_id)
    while True:
        current = await store.get(key)
        if current is None:
            mark = UnderReplicatedMark(frozenset(bookies))
            expected = NOT_EXISTS
        else:
            old = UnderReplicatedMark.from_json(current.value)
            if bookies <= old.bookies:
                return False
            mark = UnderReplicatedMark(old.bookies | bookies, old.marked_at)
            expected = current.version
        try:
            await store.put(key, mark.to_json(), expected)
            return True
        except BadVersionError:
            continue


async def list_marks(store: MetadataStore) -> dict[int, tuple[UnderReplicatedMark, int]]:
    """Every marked ledger: its mark and the mark's version."""
    found = await store.scan(MARKS_PATH + "/")
    marks: dict[int, tuple[UnderReplicatedMark, int]] = {}
    for key, value in found.items():
        try:
            ledger_id = int(key.rsplit("/", 1)[1])
        except ValueError:
            continue
        marks[ledger_id] = (UnderReplicatedMark.from_json(value.value), value.version)
    return marks


async def read_settings(store: MetadataStore) -> RecoverySettings:
    found = await store.get(SETTINGS_KEY)
    return RecoverySettings() if found is None else RecoverySettings.from_json(found.value)


async def update_settings(
    store: MetadataStore,
    *,
    auto_recovery_daemon_enabled: bool | None = None,
    lost_bookie_recovery_delay: float | None = None,
) -> RecoverySettings:
    """Change the given run-time switches (CAS, others kept); returns the settings now stored."""
    while True:
        current: Versioned | None = await store.get(SETTINGS_KEY)
        old = RecoverySettings() if current is None else RecoverySettings.from_json(current.value)
        new = RecoverySettings(
            old.auto_recovery_daemon_enabled
            if auto_recovery_daemon_enabled is None
            else auto_recovery_daemon_enabled,
            old.lost_bookie_recovery_delay
            if lost_bookie_recovery_delay is None
            else lost_bookie_recovery_delay,
        )
        try:
            await store.put(
                SETTINGS_KEY, new.to_json(), NOT_EXISTS if current is None else current.version
            )
            return new
        except BadVersionError:
            continue
