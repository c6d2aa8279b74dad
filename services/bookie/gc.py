"""The bookie's garbage collector (BookKeeper's GarbageCollectorThread): orphan ledgers, then
entry-log space.

A ledger is deleted from its bookies first and from the metadata store last; a bookie that was
down or unreachable at that moment keeps the ledger's data with nobody left to delete it. Each
GC round therefore compares the ledgers this bookie holds with the ledgers the metadata store
knows (BookKeeper's ScanAndCompareGarbageCollector) and deletes here those the store no longer
has. Then the entry logs are collected: logs holding only deleted ledgers are removed, logs
with little live data compacted (``LedgerStorage.gc``).

Deleting a ledger that still exists would lose acknowledged data, so a ledger is collected
only when every one of these holds:

1. its id is at most the ledger-id counter as read when the scan started: a ledger created
   after that (its metadata perhaps not written yet, its first adds perhaps already here) has
   a larger id;
2. it is absent from the store's list of ledgers, taken after this bookie's own list (a ledger
   created between the two lists is in the store's);
3. it is still absent when asked for again right before it is deleted (BookKeeper's
   ``verifyMetadataOnGc``): the list may be stale, and the gap between allocating an id and
   writing its metadata is covered by this second look;
4. no add reached it here for ``gc_orphan_min_idle_s`` (a writer whose metadata write is slow,
   or from a client that writes metadata late, is left alone).

A store that cannot be trusted is never read as "every ledger is gone": the scan is skipped if
the store has no ledger-id counter or another cluster's instance id, and on any store error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from magnetar.bookie.ledger_storage import GcResult, LedgerStorage, StorageError
from magnetar.bookie.metrics import BookieMetrics
from magnetar.common.ledger.identity import read_instance_id
from magnetar.common.ledger.metadata import LEDGER_ID_COUNTER, LEDGERS_PATH, ledger_key
from magnetar.common.metadata import MetadataError, MetadataStore

log = logging.getLogger(__name__)


class OrphanScanSkipped(Exception):
    """The metadata store cannot be used to decide what is an orphan; nothing was deleted.
    ``level``: how loudly to log it (a store that never created a ledger is normal)."""

    def __init__(self, message: str, level: int = logging.WARNING) -> None:
        super().__init__(message)
        self.level = level


@dataclass(slots=True)
class GcRound:
    """What one GC round did."""

    orphan_ledgers: list[int] = field(default_factory=list)
    #: Why the orphan scan did not run (None: it ran).
    orphan_scan_skipped: str | None = None
    entry_logs: GcResult = field(default_factory=GcResult)


class GarbageCollector:
    """Runs GC rounds for one bookie. ``store`` gives the bookie's current metadata session
    (it changes when a lost session is replaced); ``instance_id`` is the cluster this bookie's
    cookie belongs to ("" for a cookie from before instance ids: not checked)."""

    def __init__(
        self,
        storage: LedgerStorage,
        store: Callable[[], MetadataStore | None],
        metrics: BookieMetrics,
        *,
        address: str,
        instance_id: str,
        min_idle_s: float,
    ) -> None:
        self.storage = storage
        self._store = store
        self.metrics = metrics
        self.address = address
        self.instance_id = instance_id
        self.min_idle_s = min_idle_s

    async def run(self) -> GcRound:
        """One round: collect orphan ledgers, then reclaim entry-log space (theirs included)."""
        result = GcRound()
        try:
            result.orphan_ledgers = await self.collect_orphans()
        except OrphanScanSkipped as e:
            result.orphan_scan_skipped = str(e)
            self.metrics.gc_orphan_scans.labels("skipped").inc()
            log.log(e.level, "bookie %s: orphan-ledger scan skipped: %s", self.address, e)
        else:
            self.metrics.gc_orphan_scans.labels("done").inc()
        result.entry_logs = await self.storage.gc()
        return result

    async def collect_orphans(self) -> list[int]:
        """Delete here the ledgers the metadata store no longer has (see the module docstring
        for the four conditions); the ids deleted."""
        store = self._store()
        if store is None:
            raise OrphanScanSkipped("no metadata session")
        try:
            return await self._collect(store)
        except MetadataError as e:
            raise OrphanScanSkipped(f"metadata store error: {e}") from None
        except OSError as e:
            raise OrphanScanSkipped(f"metadata store unreachable: {e}") from None

    async def _collect(self, store: MetadataStore) -> list[int]:
        await self._check_cluster(store)
        counter = await store.get(LEDGER_ID_COUNTER)
        if counter is None:
            raise OrphanScanSkipped(
                f"the metadata store has no ledger-id counter ({LEDGER_ID_COUNTER}): it never "
                "created a ledger, or was reset; nothing here is treated as an orphan",
                logging.DEBUG,
            )
        allocated = int(counter.value)
        held = await self.storage.ledger_ids()
        known = await self._stored_ledger_ids(store)
        candidates = sorted(i for i in held if i <= allocated and i not in known)
        collected = []
        for ledger_id in candidates:
            if self.storage.idle_seconds(ledger_id) < self.min_idle_s:
                continue
            if await store.get(ledger_key(ledger_id)) is not None:
                continue  # created after the list was taken
            try:
                deleted = await self.storage.delete_if_idle(ledger_id, self.min_idle_s)
            except StorageError as e:
                log.error(
                    "bookie %s: gc could not delete orphan ledger %d: %s",
                    self.address,
                    ledger_id,
                    e.message,
                )
                continue
            if deleted:
                collected.append(ledger_id)
                self.metrics.gc_orphan_ledgers.inc()
                log.info(
                    "bookie %s: gc deleted ledger %d: the metadata store no longer has it "
                    "(it was deleted while this bookie could not be told)",
                    self.address,
                    ledger_id,
                )
        return collected

    async def _check_cluster(self, store: MetadataStore) -> None:
        if not self.instance_id:
            return
        found = await read_instance_id(store)
        if found is None or found[0] != self.instance_id:
            raise OrphanScanSkipped(
                f"the metadata store's cluster instance id is {found[0] if found else 'missing'}, "
                f"not {self.instance_id} as in this bookie's cookie: it was reset or replaced; "
                "nothing is deleted against it"
            )

    @staticmethod
    async def _stored_ledger_ids(store: MetadataStore) -> set[int]:
        ids = set()
        for name in await store.children(LEDGERS_PATH):
            try:
                ids.add(int(name))
            except ValueError:
                continue
        return ids
