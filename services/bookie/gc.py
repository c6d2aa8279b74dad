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

Unreferenced ledgers (a store that went back in time: restored from an old backup, or its log
cut at a damage) are reported, never collected. A ledger with entries here is *unreferenced*
when

- ``unlisted``: its metadata's ``managed-ledger`` custom field names a topic whose ledger list
  (the broker's managed-ledger record) does not hold it;
- ``topic-missing``: it names a topic that has no managed-ledger record at all;
- ``above-counter``: the store has no metadata for it and its id is above the store's ledger-id
  counter (or there is no counter): the store handed that id out and forgot it.

A consistent store never shows these for long: a broker lists a ledger (compare-and-set of the
record) before it writes to it, removes it from the list only to delete it right after, and
deletes a topic's ledgers before its record; ids come from the counter before any add. So the
entries here are looked at first and the record read after, and the counter re-read after the
bookie's own list. Each is logged once (WARNING) with the way forward, counted in the
``magnetar_bookie_unreferenced_ledgers`` gauge by reason, and returned in ``GcRound``;
``magnetar bk listunreferenced`` lists the first two kinds from the store. The first two are
never collected because the store has their metadata; an ``above-counter`` ledger would become
a candidate once the counter passes its id, so the ids reported so are kept out of collection
for as long as this bookie runs. Cursor ledgers (``cursor`` custom field) are named by their
cursor's record, not the list, and are not judged here.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from magnetar.bookie.ledger_storage import GcResult, LedgerStorage, StorageError
from magnetar.bookie.metrics import BookieMetrics
from magnetar.common.ledger.identity import read_instance_id
from magnetar.common.ledger.managed_ledger_keys import managed_ledger_key
from magnetar.common.ledger.managed_ledger_list import referenced_ledger_ids
from magnetar.common.ledger.metadata import (
    LEDGER_ID_COUNTER,
    LEDGERS_PATH,
    LedgerMetadata,
    ledger_key,
)
from magnetar.common.metadata import MetadataError, MetadataStore

log = logging.getLogger(__name__)


class Unreferenced(enum.Enum):
    """Why a ledger with entries is reported instead of collected (module docstring)."""

    UNLISTED = "unlisted"
    TOPIC_MISSING = "topic-missing"
    ABOVE_COUNTER = "above-counter"


@dataclass(slots=True, frozen=True)
class UnreferencedLedger:
    """A ledger that holds entries but that no topic refers to. ``managed_ledger``: the topic's
    log its metadata names (``tenant/namespace/domain/topic``; None: no metadata);
    ``last_entry_id``: the last entry held (here, or by its metadata), None if unknown."""

    ledger_id: int
    reason: Unreferenced
    managed_ledger: str | None
    last_entry_id: int | None

    def describe(self) -> str:
        entries = (
            "entries unknown"
            if self.last_entry_id is None
            else f"entries up to {self.last_entry_id}"
        )
        if self.reason is Unreferenced.ABOVE_COUNTER:
            return (
                f"ledger {self.ledger_id} ({entries}) has no metadata and an id above the "
                "store's ledger-id counter: the metadata store lost its record (restored from "
                "an older backup, or its log cut). Restore the store from a backup that holds "
                "it if its entries are wanted; no tool rebuilds its metadata. This bookie keeps "
                "it while it runs (after a restart, only while the counter stays below its id)"
            )
        why = (
            "whose ledger list does not hold it"
            if self.reason is Unreferenced.UNLISTED
            else "which has no ledger list at all"
        )
        return (
            f"ledger {self.ledger_id} ({entries}) belongs to managed ledger "
            f"{self.managed_ledger} {why}: the "
            "metadata store lost the list's update (restored from an older backup, or its log "
            "cut). Garbage collection never deletes it: adopt it into the topic's ledger list "
            "(docs/operations.md), or delete it with `magnetar bk deleteledger "
            f"{self.ledger_id}` if its messages are not wanted (`magnetar bk listunreferenced` "
            "lists all such ledgers)"
        )


def managed_ledger_of(metadata: LedgerMetadata) -> str | None:
    """The managed ledger (a topic's log) whose messages a ledger holds, from its custom
    metadata; None for a cursor ledger (its cursor's record names it) and for ledgers no topic
    wrote."""
    if "cursor" in metadata.custom_metadata:
        return None
    name = metadata.custom_metadata.get("managed-ledger")
    return name.decode("utf-8", "replace") if name else None


async def listed_ledgers(store: MetadataStore, name: str) -> set[int] | None:
    """The ledger ids a managed-ledger record lists, its compacted ledgers included; None: no
    record. A record that cannot be parsed raises ValueError, KeyError or TypeError."""
    found = await store.get(managed_ledger_key(name))
    if found is None:
        return None
    return referenced_ledger_ids(found.value)


async def find_unlisted(
    store: MetadataStore, ledgers: Mapping[int, tuple[str, int | None]]
) -> list[UnreferencedLedger]:
    """Of ``ledgers`` (id -> (managed ledger, last entry id)), the ones their managed ledger's
    record does not list. Read the entries first, then call this: a broker lists a ledger
    before adding to it."""
    by_name: dict[str, list[int]] = {}
    for ledger_id, (name, _) in ledgers.items():
        by_name.setdefault(name, []).append(ledger_id)
    found = []
    for name, ids in sorted(by_name.items()):
        try:
            listed = await listed_ledgers(store, name)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("the managed-ledger record of %s cannot be read: %s", name, e)
            continue
        for ledger_id in sorted(ids):
            if listed is None:
                reason = Unreferenced.TOPIC_MISSING
            elif ledger_id not in listed:
                reason = Unreferenced.UNLISTED
            else:
                continue
            found.append(UnreferencedLedger(ledger_id, reason, name, ledgers[ledger_id][1]))
    return found


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
    #: Ledgers with entries here that no topic refers to: reported, kept.
    unreferenced: list[UnreferencedLedger] = field(default_factory=list)
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
        #: Reported unreferenced ledgers (logged once each); ``above-counter`` ones are never
        #: collected by this process.
        self._reported: set[tuple[int, Unreferenced]] = set()
        self._kept: set[int] = set()
        self._last_unreferenced: list[UnreferencedLedger] = []
        #: Ledger id -> the managed ledger that wrote it (None: a cursor ledger or not a
        #: topic's), from its custom metadata, for the ledgers this bookie holds.
        self._writer_of: dict[int, str | None] = {}

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
        result.unreferenced = self.unreferenced
        result.entry_logs = await self.storage.gc()
        return result

    @property
    def unreferenced(self) -> list[UnreferencedLedger]:
        """The unreferenced ledgers the last orphan scan found (empty if it was skipped before
        it could tell)."""
        return list(self._last_unreferenced)

    async def collect_orphans(self) -> list[int]:
        """Delete here the ledgers the metadata store no longer has (see the module docstring
        for the four conditions); the ids deleted."""
        self._last_unreferenced = []
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
        held = await self.storage.ledger_ids()
        known = await self._stored_ledger_ids(store)
        self._last_unreferenced = await self._find_unreferenced(store, held, known)
        if counter is None:
            raise OrphanScanSkipped(
                f"the metadata store has no ledger-id counter ({LEDGER_ID_COUNTER}): it never "
                "created a ledger, or was reset; nothing here is treated as an orphan",
                logging.DEBUG,
            )
        allocated = int(counter.value)
        candidates = sorted(
            i for i in held if i <= allocated and i not in known and i not in self._kept
        )
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

    async def _find_unreferenced(
        self, store: MetadataStore, held: set[int], known: set[int]
    ) -> list[UnreferencedLedger]:
        """The unreferenced ledgers among ``held`` (module docstring); reports them."""
        entries: dict[int, int] = {}
        for ledger_id in sorted(held):
            if ledger_id < 0:
                continue  # bookiesanity's ledgers, never from the counter
            try:
                last = (await self.storage.read_lac(ledger_id)).last_entry_id
            except StorageError:
                continue  # deleted since the list was taken
            if last >= 0:
                entries[ledger_id] = last
        found: list[UnreferencedLedger] = []
        # Re-read after the bookie's own list: an id handed out since is at most this.
        counter = await store.get(LEDGER_ID_COUNTER)
        allocated = int(counter.value) if counter is not None else 0
        for ledger_id, last in entries.items():
            if ledger_id in known or (ledger_id <= allocated and ledger_id not in self._kept):
                continue  # (once reported, still reported after the counter passed it)
            if await store.get(ledger_key(ledger_id)) is None:
                found.append(UnreferencedLedger(ledger_id, Unreferenced.ABOVE_COUNTER, None, last))
        by_name: dict[int, tuple[str, int | None]] = {}
        for ledger_id in set(self._writer_of) - held:
            del self._writer_of[ledger_id]
        for ledger_id, last in entries.items():
            if ledger_id not in known:
                continue
            if ledger_id not in self._writer_of:
                # A ledger's writer never changes: its metadata is read once, not every round.
                stored = await store.get(ledger_key(ledger_id))
                if stored is None:
                    continue
                try:
                    self._writer_of[ledger_id] = managed_ledger_of(
                        LedgerMetadata.from_bytes(stored.value)
                    )
                except Exception:  # not ledger metadata we can read: not ours to judge
                    continue
            name = self._writer_of[ledger_id]
            if name is not None:
                by_name[ledger_id] = (name, last)
        found += await find_unlisted(store, by_name)
        self._report(found)
        return found

    def _report(self, found: list[UnreferencedLedger]) -> None:
        counts = dict.fromkeys(Unreferenced, 0)
        for ledger in found:
            counts[ledger.reason] += 1
            if ledger.reason is Unreferenced.ABOVE_COUNTER:
                self._kept.add(ledger.ledger_id)
            if (ledger.ledger_id, ledger.reason) not in self._reported:
                self._reported.add((ledger.ledger_id, ledger.reason))
                log.warning("bookie %s: %s", self.address, ledger.describe())
        for reason, count in counts.items():
            self.metrics.unreferenced_ledgers.labels(reason.value).set(count)

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
