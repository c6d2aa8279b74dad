"""The replication worker (BookKeeper's ``ReplicationWorker``): runs on every bookie, takes
under-replicated ledgers one at a time and gives them back full replication.

For a marked ledger (see ``common/ledger/underreplication``):

1. Lock it: an ephemeral key of this worker's session, so the lock of a worker that dies
   expires with its lease and another worker takes the ledger over.
2. For each fragment whose ensemble names a bookie of the mark: choose replacements with the
   placement policy (bookies not in the ensemble, not in the mark), copy every entry the lost
   positions stored, from the surviving replicas to the replacements (recovery adds, the
   ledger's master key), then CAS the fragment's new ensemble into the metadata through the one
   ensemble-change routine (``common/ledger/ensemble``). Nothing is written to the metadata
   before a fragment is fully copied, so a worker that dies mid-copy leaves no partial fragment;
   the copies it made are garbage the new ensemble never names.
3. Open ledgers: fragments before the last are complete (every entry in them was acknowledged
   before the writer moved on) and are copied. The last fragment is the writer's: a live writer
   replaces a lost bookie at its next add. If the ledger is still open with a marked bookie in
   its last fragment ``open_ledger_rereplication_grace_period`` after it was marked, its writer
   is taken to be gone: the worker fences and recovers it (closing it), as BookKeeper does, and
   then copies the now-closed last fragment.
4. Clear the mark by CAS on its version: a bookie added to the mark meanwhile keeps it.

Copies are paced to ``replication_rate_by_bytes`` so recovery leaves room for client traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from magnetar.bookie.metrics import BookieMetrics
from magnetar.common.ledger.bookie_client import BookieError
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.ensemble import (
    EnsembleChange,
    EnsembleChangeConflict,
    commit_change,
    plan_change,
)
from magnetar.common.ledger.errors import LedgerError, NoSuchLedgerError
from magnetar.common.ledger.metadata import Fragment, LedgerMetadata
from magnetar.common.ledger.placement import NotEnoughBookiesError
from magnetar.common.ledger.recovery import recover_ledger
from magnetar.common.ledger.underreplication import (
    MARKS_PATH,
    UnderReplicatedMark,
    list_marks,
    lock_key,
    mark_key,
)
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataError, NoSuchKeyError

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ReplicationSettings:
    rereplication_entry_batch_size: int = 100
    replication_rate_by_bytes: int = 0  # bytes/s copied by one worker; 0: no limit
    open_ledger_rereplication_grace_period: float = 30.0
    poll_interval_s: float = 5.0  # a scan of the marks even when no watch event came


class ByteRateLimiter:
    """Paces copies to ``rate`` bytes per second (0: no limit): each acquire of ``n`` bytes
    moves the earliest next start ``n / rate`` seconds later."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._next = 0.0

    def delay(self, n: int, now: float) -> float:
        """Seconds to wait at ``now`` before copying ``n`` bytes (books them)."""
        if self.rate <= 0:
            return 0.0
        start = max(self._next, now)
        self._next = start + n / self.rate
        return start - now

    async def acquire(self, n: int) -> None:
        wait = self.delay(n, time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)


class ReplicationIncomplete(Exception):
    """The ledger could not be fully replicated now; its mark stays for a later attempt."""


@dataclass(slots=True, frozen=True)
class ReplicationResult:
    fragments: int
    entries: int
    bytes: int
    complete: bool


class Replicator:
    """Replicates one ledger away from a set of bookies (the worker and ``bk recover`` use it)."""

    def __init__(
        self,
        client: LedgerClient,
        settings: ReplicationSettings,
        metrics: BookieMetrics | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.limiter = ByteRateLimiter(settings.replication_rate_by_bytes)

    async def replicate(
        self, ledger_id: int, bookies: frozenset[str], *, marked_at: float | None = None
    ) -> ReplicationResult:
        """Move every fragment copy held by ``bookies`` to other bookies. ``marked_at`` (wall
        clock) starts the open-ledger grace period; None fences an open ledger at once."""
        metadata, version = await self.client.read_metadata(ledger_id)
        if not metadata.is_closed and any(b in bookies for b in metadata.last_fragment.bookies):
            waited = time.time() - marked_at if marked_at is not None else float("inf")
            if waited >= self.settings.open_ledger_rereplication_grace_period:
                log.info(
                    "ledger %d: still open with %s in its last ensemble after %.0f s: "
                    "fencing and recovering it (its writer is gone)",
                    ledger_id,
                    sorted(set(metadata.last_fragment.bookies) & bookies),
                    waited,
                )
                metadata, version = await recover_ledger(self.client, ledger_id)
        fragments = entries = copied = 0
        complete = True
        index = 0
        while index < len(metadata.fragments):
            fragment = metadata.fragments[index]
            last = self._last_entry(metadata, index)
            positions = [p for p, b in enumerate(fragment.bookies) if b in bookies]
            if not positions:
                index += 1
                continue
            if last is None:
                complete = False  # the open ledger's last fragment: its writer's business
                index += 1
                continue
            change = plan_change(
                fragment.bookies,
                fragment.first_entry_id,
                positions,
                await self.client.registered_bookies(),
                self.client.placement,
                exclude=bookies,
            )
            n, size = await self._copy(ledger_id, metadata, fragment, last, change, bookies)
            metadata, version = await commit_change(
                self.client.store,
                ledger_id,
                metadata,
                version,
                change,
                read_metadata=functools.partial(self.client.read_metadata, ledger_id),
            )
            fragments, entries, copied = fragments + 1, entries + n, copied + size
            if self.metrics is not None:
                self.metrics.fragments_replicated.inc()
                self.metrics.bookkeeper.replicated_fragments += 1
            log.info(
                "ledger %d: fragment %s re-replicated (%d entries, %d bytes)",
                ledger_id,
                change,
                n,
                size,
            )
            index = 0  # the metadata may have moved on meanwhile: look again from the start
        return ReplicationResult(fragments, entries, copied, complete)

    @staticmethod
    def _last_entry(metadata: LedgerMetadata, index: int) -> int | None:
        """The last entry fragment ``index`` serves; None for an open ledger's last fragment
        (its end is not decided yet)."""
        if index + 1 < len(metadata.fragments):
            end = metadata.fragments[index + 1].first_entry_id - 1
            return min(end, metadata.last_entry_id) if metadata.is_closed else end
        return metadata.last_entry_id if metadata.is_closed else None

    async def _copy(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        fragment: Fragment,
        last: int,
        change: EnsembleChange,
        lost: frozenset[str],
    ) -> tuple[int, int]:
        """Copy the entries ``fragment.first_entry_id .. last`` that the replaced positions
        hold to their replacements; returns (entries, bytes) copied."""
        quorum = metadata.quorum
        replaced = set(change.positions)
        batch = max(self.settings.rereplication_entry_batch_size, 1)
        copied_entries = copied_bytes = 0

        async def copy_one(entry_id: int) -> int:
            write_set = quorum.write_set(entry_id)
            targets = [p for p in write_set if p in replaced]
            if not targets:
                return 0
            sources = [fragment.bookies[p] for p in write_set if fragment.bookies[p] not in lost]
            if not sources:
                raise ReplicationIncomplete(
                    f"ledger {ledger_id} entry {entry_id}: every replica is on a lost bookie "
                    f"({[fragment.bookies[p] for p in write_set]})"
                )
            try:
                entry = await self.client.read_from_replicas(ledger_id, entry_id, sources)
            except LedgerError as e:
                raise ReplicationIncomplete(
                    f"ledger {ledger_id} entry {entry_id}: no surviving replica could be read: {e}"
                ) from None
            if self.metrics is not None:
                self.metrics.bookkeeper.entries_read += 1
                self.metrics.bookkeeper.bytes_read += len(entry)
            await self.limiter.acquire(len(entry) * len(targets))
            adds = [
                self.client.bookie(change.new[p]).add(
                    ledger_id, entry_id, entry, recovery=True, master_key=metadata.master_key
                )
                for p in targets
            ]
            try:
                async with asyncio.timeout(self.client.config.add_timeout_s):
                    await asyncio.gather(*adds)
            except (BookieError, TimeoutError) as e:
                raise ReplicationIncomplete(
                    f"ledger {ledger_id} entry {entry_id}: copy to "
                    f"{[change.new[p] for p in targets]} failed: {e}"
                ) from None
            size = len(entry) * len(targets)
            if self.metrics is not None:
                self.metrics.replicated_bytes.inc(size)
                self.metrics.bookkeeper.entries_written += len(targets)
                self.metrics.bookkeeper.bytes_written += size
            return size

        for start in range(fragment.first_entry_id, last + 1, batch):
            sizes = await asyncio.gather(
                *(copy_one(e) for e in range(start, min(start + batch - 1, last) + 1))
            )
            copied_entries += sum(1 for s in sizes if s)
            copied_bytes += sum(sizes)
        return copied_entries, copied_bytes


class ReplicationWorker:
    """Takes marked ledgers, one at a time, while autorecovery is enabled."""

    def __init__(
        self,
        client: LedgerClient,
        address: str,
        settings: ReplicationSettings,
        metrics: BookieMetrics,
        *,
        enabled: Callable[[], Awaitable[bool]],
    ) -> None:
        self.client = client
        self.address = address
        self.settings = settings
        self.replicator = Replicator(client, settings, metrics)
        self._enabled = enabled
        self._wake = asyncio.Event()

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch_marks(), name="replication-watch")
        try:
            while True:
                try:
                    if await self._enabled():
                        await self.run_once()
                except (MetadataError, OSError) as e:
                    log.warning("replication worker %s: metadata store: %s", self.address, e)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.poll_interval_s):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch_marks(self) -> None:
        while True:
            try:
                async with self.client.store.watch(MARKS_PATH + "/", prefix=True) as events:
                    async for _ in events:
                        self._wake.set()
            except (MetadataError, OSError) as e:
                log.info("replication worker %s: watch of marks ended (%s)", self.address, e)
            await asyncio.sleep(self.settings.poll_interval_s)

    async def run_once(self, ledgers: Collection[int] | None = None) -> int:
        """One pass over the marked ledgers (only ``ledgers`` if given); returns how many this
        worker cleared."""
        marks = [i for i in await list_marks(self.client.store) if ledgers is None or i in ledgers]
        random.shuffle(marks)  # workers spread over the ledgers instead of queueing on one
        cleared = 0
        for ledger_id in marks:
            if not await self._enabled():
                break
            if await self._take(ledger_id):
                cleared += 1
        return cleared

    def _timed(self, started: float, *, success: bool) -> None:
        """One ledger's re-replication, as BookKeeper's ``rereplicate`` op stats."""
        metrics = self.replicator.metrics
        if metrics is not None:
            metrics.bookkeeper.rereplicate.record_latency(
                time.monotonic() - started, success=success
            )

    async def _take(self, ledger_id: int) -> bool:
        store = self.client.store
        try:
            await store.put(lock_key(ledger_id), self.address.encode(), NOT_EXISTS, ephemeral=True)
        except BadVersionError:
            return False  # another worker has it
        try:
            found = await store.get(mark_key(ledger_id))
            if found is None:
                return False
            mark = UnderReplicatedMark.from_json(found.value)
            started = time.monotonic()
            try:
                result = await self.replicator.replicate(
                    ledger_id, mark.bookies, marked_at=mark.marked_at
                )
            except NoSuchLedgerError:
                result = ReplicationResult(0, 0, 0, complete=True)  # deleted: nothing to do
            except (
                ReplicationIncomplete,
                EnsembleChangeConflict,
                NotEnoughBookiesError,
                LedgerError,
            ) as e:
                self._timed(started, success=False)
                log.warning(
                    "ledger %d: re-replication away from %s not done, will retry: %s",
                    ledger_id,
                    sorted(mark.bookies),
                    e,
                )
                return False
            self._timed(started, success=result.complete)
            if not result.complete:
                return False
            try:
                await store.delete(mark_key(ledger_id), found.version)
            except (BadVersionError, NoSuchKeyError):
                return False  # marked again meanwhile: the next pass looks at it
            log.info(
                "ledger %d: fully replicated away from %s (%d fragments, %d bytes)",
                ledger_id,
                sorted(mark.bookies),
                result.fragments,
                result.bytes,
            )
            return True
        finally:
            with contextlib.suppress(MetadataError, OSError):
                await store.delete(lock_key(ledger_id))
