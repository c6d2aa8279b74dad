"""How a managed ledger reaches its ledgers once written: reads (the cache of recent adds
first, then the bookies through one read handle per ledger, kept open until the ledger is
dropped or the managed ledger closes), recovery of a ledger left open, and deletion. Entries no
bookie holds intact are remembered for stats until read again."""

from __future__ import annotations

import logging

from magnetar.broker.ledger.entry_cache import EntryCache
from magnetar.broker.ledger.errors import ManagedLedgerError, UnreadableEntryError
from magnetar.broker.ledger.ml_stats import ManagedLedgerStats
from magnetar.broker.model.position import Position, position_of
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.errors import EntryDigestError, LedgerError, NoSuchLedgerError
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.managed_ledger_list import LedgerInfo

log = logging.getLogger("magnetar.broker.ledger.managed_ledger")


class EntryReader:
    """The read side of one managed ledger (``name``)."""

    def __init__(
        self,
        name: str,
        client: LedgerClient,
        cache_bytes: int,
        stats: ManagedLedgerStats,
    ) -> None:
        self.name = name
        self.client = client
        self.cache = EntryCache(cache_bytes)
        self.stats = stats
        #: Open read handles of closed ledgers, by ledger id.
        self.handles: dict[int, LedgerHandle] = {}
        #: Entries found with no intact copy on any bookie -> why (cleared once read again).
        self.unreadable: dict[Position, str] = {}

    def keep(self, handle: LedgerHandle) -> None:
        """Read ``handle``'s ledger through it from now on (a closed or recovered handle)."""
        self.handles[handle.ledger_id] = handle

    async def forget(self, ledger_id: int) -> None:
        """The ledger is being deleted: nothing of it is cached or kept open."""
        self.cache.drop_ledger(ledger_id)
        handle = self.handles.pop(ledger_id, None)
        if handle is not None:
            await handle.close()

    async def recover(self, info: LedgerInfo) -> LedgerInfo | None:
        """Open ``info``'s ledger with recovery (fencing any writer still at it) and read it
        through that handle from now on: its closed info, or None when the ledger is gone."""
        try:
            handle = await self.client.open_ledger(info.ledger_id, recovery=True)
        except NoSuchLedgerError:
            log.warning(
                "managed ledger %s: ledger %d is gone; dropping it", self.name, info.ledger_id
            )
            return None
        self.keep(handle)
        return info.closed_as(handle.metadata)

    async def delete(self, ledger_ids: list[int]) -> None:
        """Delete the ledgers from the bookies (a ledger already gone is fine); nothing of
        them stays cached or open."""
        for ledger_id in ledger_ids:
            await self.forget(ledger_id)
            try:
                await self.client.delete_ledger(ledger_id)
            except NoSuchLedgerError:
                pass
            except Exception as e:  # the ledger leaks on the bookies; the auditor may find it
                log.warning(
                    "managed ledger %s: deleting ledger %d failed: %s", self.name, ledger_id, e
                )

    async def close(self) -> None:
        for handle in self.handles.values():
            await handle.close()
        self.handles.clear()

    async def read_range(
        self, ledger_id: int, first: int, last: int, current: LedgerHandle | None
    ) -> list[tuple[Position, bytes]]:
        """Entries ``first..last`` of a ledger (``current``: the one being written, read
        through its writer): from the cache while it has them, then from the bookies. An
        entry no bookie holds intact is remembered in ``unreadable`` and raises
        UnreadableEntryError, after the entries before it when there are any."""
        result: list[tuple[Position, bytes]] = []
        entry_id = first
        get = self.cache.get
        while entry_id <= last:
            position = position_of((ledger_id, entry_id))
            cached = get(position)
            if cached is None:
                break
            result.append((position, cached))
            entry_id += 1
        stats = self.stats
        read_bytes = 0
        if result:
            read_bytes = sum(len(data) for _, data in result)
            stats.cache_hits += len(result)
            stats.cache_hit_bytes += read_bytes
        if entry_id <= last:
            handle = await self._handle(ledger_id, current)
            try:
                entries = await handle.read(entry_id, last)
            except EntryDigestError as e:
                stats.reads_failed += 1
                bad = Position(ledger_id, e.entry_id)
                if e.entry_id > entry_id:
                    # Give what comes before the damaged entry; the next read stops at it.
                    return result + await self.read_range(
                        ledger_id, entry_id, e.entry_id - 1, current
                    )
                if bad not in self.unreadable:
                    log.error(
                        "managed ledger %s: entry %s is unreadable, no bookie has an intact "
                        "copy: %s",
                        self.name,
                        bad,
                        e,
                    )
                self.unreadable[bad] = str(e)
                raise UnreadableEntryError(
                    f"managed ledger {self.name}: entry {bad} is unreadable: {e}", bad
                ) from e
            except LedgerError as e:
                stats.reads_failed += 1
                raise ManagedLedgerError(
                    f"managed ledger {self.name}: reading ledger {ledger_id} "
                    f"entries {entry_id}..{last} failed: {e}"
                ) from e
            result.extend((Position(ledger_id, e.entry_id), e.payload) for e in entries)
            miss_bytes = sum(len(e.payload) for e in entries)
            read_bytes += miss_bytes
            stats.cache_misses += len(entries)
            stats.cache_miss_bytes += miss_bytes
            if self.unreadable:
                for item in entries:
                    self.unreadable.pop(Position(ledger_id, item.entry_id), None)
        stats.reads_succeeded += len(result)
        stats.read_bytes += read_bytes
        return result

    async def _handle(self, ledger_id: int, current: LedgerHandle | None) -> LedgerHandle:
        if current is not None and current.ledger_id == ledger_id:
            return current
        handle = self.handles.get(ledger_id)
        if handle is None:
            # Closed ledgers only (the current one is read through the writer), so no recovery.
            handle = await self.client.open_ledger(ledger_id, recovery=False)
            self.handles[ledger_id] = handle
        return handle
