"""The auditor (BookKeeper's ``Auditor``): one per cluster, elected among the bookies, finds the
ledgers that lost a replica and marks them under-replicated for the replication workers.

- Election: ``/magnetar/elections/auditor`` (the store's leader election); the leader key is an
  ephemeral key of the winner's session, so when its bookie dies another takes over and starts
  from what the store says (marks already made stay; nothing is held in memory only).
- Lost bookies: the auditor watches the bookie registrations. A bookie whose registration is
  gone for ``lost_bookie_recovery_delay`` seconds is lost: every ledger with a fragment on it is
  marked. A bookie that comes back within the delay costs nothing. When the auditor starts, it
  takes every bookie named by a ledger but not registered as lost from that moment (a new
  auditor waits the delay again, it does not know since when).
- Periodic check (``auditor_periodic_check_interval``): every ledger's ensembles against the
  registered bookies, for whatever the watch missed; and less often
  (``auditor_periodic_bookie_check_interval``) a sample of entries of each closed ledger read
  from every replica that should hold them: a replica that says "no such entry" is marked.
- ``lost_bookie_recovery_delay`` and ``auto_recovery_daemon_enabled`` are read from the store
  on every round, so ``magnetar bk lostbookierecoverydelay`` / ``autorecovery`` apply at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from magnetar.bookie.metrics import BookieMetrics
from magnetar.common.ledger.bookie_client import BookieError
from magnetar.common.ledger.bookies import AVAILABLE_PATH, list_bookies
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.metadata import LEDGERS_PATH, LedgerMetadata
from magnetar.common.ledger.underreplication import list_marks, mark_under_replicated
from magnetar.common.metadata import (
    EventType,
    LeaderElection,
    MetadataError,
    MetadataStore,
    WatchEvent,
)
from magnetar.common.proto import bookie_pb2 as pb

log = logging.getLogger(__name__)

ELECTION = "auditor"
SAMPLED_ENTRIES = 3  # entries per closed ledger read from each replica by the bookie check


@dataclass(slots=True, frozen=True)
class AuditorSettings:
    auditor_periodic_check_interval: float = 604800.0
    auditor_periodic_bookie_check_interval: float = 86400.0
    tick_s: float = 0.5  # how often lost bookies are compared with the delay


async def ledgers_by_bookie(store: MetadataStore) -> dict[int, tuple[LedgerMetadata, set[str]]]:
    """Every ledger with its metadata and the bookies its fragments name."""
    found = await store.scan(LEDGERS_PATH + "/")
    ledgers: dict[int, tuple[LedgerMetadata, set[str]]] = {}
    for key, value in found.items():
        try:
            ledger_id = int(key.rsplit("/", 1)[1])
        except ValueError:
            continue
        metadata = LedgerMetadata.from_bytes(value.value)
        ledgers[ledger_id] = (metadata, {b for f in metadata.fragments for b in f.bookies})
    return ledgers


async def mark_ledgers_of(store: MetadataStore, bookies: set[str]) -> list[int]:
    """Mark every ledger with a fragment on one of ``bookies``; the ledger ids marked anew."""
    marked = []
    for ledger_id, (_, named) in sorted((await ledgers_by_bookie(store)).items()):
        on = named & bookies
        if on and await mark_under_replicated(store, ledger_id, on):
            marked.append(ledger_id)
    return marked


class Auditor:
    """Campaigns for the auditor role and audits while it holds it."""

    def __init__(
        self,
        client: LedgerClient,
        address: str,
        settings: AuditorSettings,
        metrics: BookieMetrics,
        *,
        enabled: Callable[[], Awaitable[bool]],
        delay: Callable[[], Awaitable[float]],
    ) -> None:
        self.client = client
        self.address = address
        self.settings = settings
        self.metrics = metrics
        self._enabled = enabled
        self._delay = delay
        #: Registered bookies as the watch last said, and since when (monotonic) each one
        #: named by a ledger has been missing.
        self._registered: set[str] = set()
        self._missing_since: dict[str, float] = {}

    async def run(self) -> None:
        election = self.client.store.election(ELECTION)
        try:
            while True:
                await election.campaign(self.address.encode())
                log.info("bookie %s is the auditor", self.address)
                self.metrics.auditor.set(1)
                try:
                    await self._audit(election)
                except (MetadataError, OSError) as e:
                    log.warning(
                        "auditor %s: metadata store failed (%s); standing again", self.address, e
                    )
                finally:
                    self.metrics.auditor.set(0)
                    with contextlib.suppress(MetadataError, OSError):
                        await election.resign()
                await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(MetadataError, OSError):
                await election.resign()

    async def _audit(self, election: LeaderElection) -> None:
        store = self.client.store
        async with store.watch(AVAILABLE_PATH + "/", prefix=True) as events:
            self._registered = {b.address for b in await list_bookies(store)}
            self._missing_since = {}
            await self.check_all_ledgers()
            watch = asyncio.create_task(self._follow(events), name="auditor-watch")
            rounds = asyncio.create_task(self._rounds(election), name="auditor-rounds")
            try:
                # Either ending ends the term: a watch that stopped would leave the auditor
                # blind to registrations, so it stands again with a new one.
                await asyncio.wait((watch, rounds), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (watch, rounds):
                    task.cancel()
                results = await asyncio.gather(watch, rounds, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.warning(
                        "auditor %s: %s: %s; standing again",
                        self.address,
                        type(result).__name__,
                        result,
                    )

    async def _follow(self, events: AsyncIterator[WatchEvent]) -> None:
        async for event in events:
            address = event.key.rsplit("/", 1)[1]
            if event.type is EventType.DELETE:
                self._registered.discard(address)
                self._missing_since.setdefault(address, time.monotonic())
                log.info("auditor: bookie %s is gone", address)
            else:
                self._registered.add(address)
                if self._missing_since.pop(address, None) is not None:
                    log.info("auditor: bookie %s is back", address)

    async def _rounds(self, election: LeaderElection) -> None:
        now = time.monotonic()
        next_check = now + self._interval(self.settings.auditor_periodic_check_interval)
        next_bookie_check = now + self._interval(
            self.settings.auditor_periodic_bookie_check_interval
        )
        while True:
            await asyncio.sleep(self.settings.tick_s)
            if not election.is_leader:
                log.warning("bookie %s lost the auditor role", self.address)
                return
            await self._report()
            if not await self._enabled():
                continue
            await self._mark_lost()
            now = time.monotonic()
            if now >= next_check:
                await self.check_all_ledgers()
                next_check = now + self._interval(self.settings.auditor_periodic_check_interval)
            if now >= next_bookie_check:
                await self.check_sampled_entries()
                next_bookie_check = now + self._interval(
                    self.settings.auditor_periodic_bookie_check_interval
                )

    @staticmethod
    def _interval(seconds: float) -> float:
        return seconds if seconds > 0 else float("inf")

    async def _mark_lost(self) -> None:
        delay = await self._delay()
        now = time.monotonic()
        due = {a for a, since in self._missing_since.items() if now - since >= delay}
        if not due:
            return
        started = time.monotonic()
        marked = await mark_ledgers_of(self.client.store, due)
        self.metrics.bookkeeper.publish_time_for_lost_bookie.record_latency(
            time.monotonic() - started
        )
        for address in due:
            del self._missing_since[address]
        log.info(
            "auditor: bookies %s gone for %.1f s or more: %d ledgers marked under-replicated",
            sorted(due),
            delay,
            len(marked),
        )

    async def check_all_ledgers(self) -> None:
        """Every bookie named by a ledger but not registered counts as missing from now on
        (if it is not already); the delay then decides."""
        started = time.monotonic()
        named: set[str] = set()
        ledgers = await ledgers_by_bookie(self.client.store)
        for _, bookies in ledgers.values():
            named |= bookies
        now = time.monotonic()
        self.metrics.bookkeeper.ledgers_checked += len(ledgers)
        self.metrics.bookkeeper.check_all_ledgers_time.record_latency(now - started)
        for address in named - self._registered:
            self._missing_since.setdefault(address, now)

    async def check_sampled_entries(self) -> None:
        """Read a few entries of each closed ledger from every replica that should hold them;
        mark a ledger whose live replica says it has no such entry."""
        for ledger_id, (metadata, _) in (await ledgers_by_bookie(self.client.store)).items():
            if not metadata.is_closed or metadata.last_entry_id < 0:
                continue
            quorum = metadata.quorum
            missing: set[str] = set()
            for entry_id in random.sample(
                range(metadata.last_entry_id + 1), min(SAMPLED_ENTRIES, metadata.last_entry_id + 1)
            ):
                fragment = metadata.fragment_for(entry_id)
                for position in quorum.write_set(entry_id):
                    address = fragment.bookies[position]
                    if address not in self._registered:
                        continue  # a lost bookie is the other check's business
                    try:
                        await self.client.bookie(address).read(ledger_id, entry_id)
                    except BookieError as e:
                        if e.status in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER, pb.WIPED):
                            missing.add(address)
            if missing and await mark_under_replicated(self.client.store, ledger_id, missing):
                log.warning(
                    "auditor: ledger %d: sampled entries missing on %s; marked under-replicated",
                    ledger_id,
                    sorted(missing),
                )

    async def _report(self) -> None:
        marks = await list_marks(self.client.store)
        self.metrics.under_replicated_ledgers.set(len(marks))
        self.metrics.bookkeeper.auditor_under_replicated.record(len(marks))
        oldest = min((m.marked_at for m, _ in marks.values()), default=None)
        self.metrics.replication_lag.set(0.0 if oldest is None else max(time.time() - oldest, 0))
