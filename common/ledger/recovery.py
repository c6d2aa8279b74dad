"""Ledger recovery: how a new owner takes a ledger from a writer that may still be alive.

1. CAS the metadata OPEN -> IN_RECOVERY (a ledger already IN_RECOVERY is recovered again: the
   steps are idempotent, and the closing CAS makes concurrent recoverers agree).
2. Fence the last ensemble. Fencing holds once ``Qw - Qa + 1`` bookies of every write quorum
   answered; then the old writer can no longer collect ``Qa`` acks for any entry.
3. Read forward from the highest LAC the fenced bookies reported, a window of entries at a
   time (up to ``RECOVERY_WINDOW``). An entry found on any replica is re-added (recovery flag)
   to its whole write set, the window's found entries at once; a bookie that fails or does not
   answer in time is replaced through an ensemble change, as a writer would. An entry is
   absent once ``Qw - Qa + 1`` bookies of its write set say "no such entry", and recovery
   stops there (entries found after it were never acknowledged either). A
   bookie re-registered empty after losing its disks answers WIPED for ledgers older than its
   re-registration: that is not "no such entry" and does not count. Re-adds carry the
   ledger's master key from its metadata (bookies refuse any other key).
4. CAS the metadata to CLOSED with the last entry and length. If another recoverer closed it
   first, its result stands and is returned; if another changed the metadata without closing
   it, recovery starts again from the new metadata.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from magnetar.common.ledger.bookie_client import BookieError
from magnetar.common.ledger.distribution import Quorum
from magnetar.common.ledger.ensemble import EnsembleChangeConflict, commit_change, plan_change
from magnetar.common.ledger.entry import (
    DigestMismatchError,
    EntryFormatError,
    decode_header,
    verify_entry,
)
from magnetar.common.ledger.errors import RecoveryError
from magnetar.common.ledger.metadata import LedgerMetadata, LedgerState, ledger_key
from magnetar.common.ledger.placement import NotEnoughBookiesError
from magnetar.common.metadata import BadVersionError
from magnetar.common.proto import bookie_pb2 as pb

if TYPE_CHECKING:
    from magnetar.common.ledger.client import LedgerClient

log = logging.getLogger(__name__)

_ABSENT = (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER)


#: Most entries past the LAC recovery reads and re-adds at once (the window starts at one and
#: doubles while every entry of it is found, so a writer that left few behind costs few reads).
RECOVERY_WINDOW = 64


class _ConcurrentChange(Exception):
    """Someone else changed the ledger's metadata mid-recovery; start again from it."""


async def recover_ledger(client: LedgerClient, ledger_id: int) -> tuple[LedgerMetadata, int]:
    """Fence and close the ledger; return its final (CLOSED) metadata and version."""
    for attempt in range(5):
        try:
            return await _recover_once(client, ledger_id)
        except _ConcurrentChange:
            log.info("ledger %d: metadata changed during recovery; starting again", ledger_id)
            await asyncio.sleep(0.05 * (attempt + 1))
    raise RecoveryError(
        f"ledger {ledger_id}: metadata kept changing under concurrent recovery; retry"
    )


async def _recover_once(client: LedgerClient, ledger_id: int) -> tuple[LedgerMetadata, int]:
    metadata, version = await client.read_metadata(ledger_id)
    if metadata.is_closed:
        return metadata, version
    if metadata.state is LedgerState.OPEN:
        metadata, version = await _mark_in_recovery(client, ledger_id, metadata, version)
        if metadata.is_closed:
            return metadata, version

    quorum = metadata.quorum
    fragment = metadata.last_fragment
    bookies = fragment.bookies  # entries past the LAC are read from here, whatever happens next
    max_lac = await _fence(client, ledger_id, quorum, bookies)
    # Entries before the last fragment were acknowledged when it was created.
    entry_id = max(max_lac, fragment.first_entry_id - 1) + 1
    writer = _RecoveryWriter(client, ledger_id, metadata, version)
    last_entry_id, length = entry_id - 1, None
    window = 1
    while True:
        # Entries past the LAC are read a window at a time (all at once), and the found
        # prefix is re-added at once; the window grows while every entry of it is found.
        results = await asyncio.gather(
            *(
                _recovery_read(client, ledger_id, e, quorum, bookies)
                for e in range(entry_id, entry_id + window)
            ),
            return_exceptions=True,
        )
        found: list[tuple[int, bytes]] = []
        for offset, result in enumerate(results):
            if isinstance(result, BaseException):
                raise result  # neither found nor provably absent, before the end was found
            if result is None:
                break  # absent: never acknowledged, and nothing after it was either
            found.append((entry_id + offset, result))
        await writer.rewrite_all(found)
        if found:
            last_entry_id, entry = found[-1]
            length = decode_header(entry).length
        if len(found) < window:
            break
        entry_id += window
        window = min(window * 2, RECOVERY_WINDOW)
    if length is None:
        length = await _length_through(client, ledger_id, metadata, last_entry_id)
    log.info("ledger %d recovered: last entry %d, length %d", ledger_id, last_entry_id, length)
    return await _close(client, ledger_id, writer.metadata, writer.version, last_entry_id, length)


async def _mark_in_recovery(
    client: LedgerClient, ledger_id: int, metadata: LedgerMetadata, version: int
) -> tuple[LedgerMetadata, int]:
    while metadata.state is LedgerState.OPEN:
        marked = replace(metadata, state=LedgerState.IN_RECOVERY)
        try:
            return marked, await client.store.put(ledger_key(ledger_id), marked.to_bytes(), version)
        except BadVersionError:
            metadata, version = await client.read_metadata(ledger_id)
    return metadata, version


async def _fence(
    client: LedgerClient, ledger_id: int, quorum: Quorum, bookies: tuple[str, ...]
) -> int:
    """Fence every bookie of the ensemble; return the highest LAC once fencing holds."""

    async def fence_one(position: int) -> tuple[int, int | None, BookieError | None]:
        try:
            return position, (await client.bookie(bookies[position]).fence(ledger_id)).lac, None
        except BookieError as e:
            return position, None, e

    tasks = [asyncio.create_task(fence_one(p)) for p in range(len(bookies))]
    answered: set[int] = set()
    failed: set[int] = set()
    max_lac = -1
    try:
        for next_done in asyncio.as_completed(tasks):
            position, lac, error = await next_done
            if error is not None or lac is None:
                log.warning(
                    "ledger %d: fence failed on %s: %s", ledger_id, bookies[position], error
                )
                failed.add(position)
                if quorum.fencing_impossible(failed):
                    raise RecoveryError(
                        f"ledger {ledger_id}: fencing cannot hold, bookies failed: "
                        f"{sorted(bookies[p] for p in failed)}; retry when they are back"
                    )
                continue
            answered.add(position)
            max_lac = max(max_lac, lac)
            if quorum.fencing_complete(answered):
                return max_lac
    finally:
        for task in tasks:
            task.cancel()
    raise RecoveryError(f"ledger {ledger_id}: fencing did not complete")


async def _recovery_read(
    client: LedgerClient, ledger_id: int, entry_id: int, quorum: Quorum, bookies: tuple[str, ...]
) -> bytes | None:
    """The entry if a replica has a good copy; None once Qw - Qa + 1 of its write set say it is
    absent (then at most Qa - 1 bookies can hold it, so it was never acknowledged)."""

    async def read_one(position: int) -> tuple[int, bytes | None, BaseException | None]:
        try:
            entry = await client.bookie(bookies[position]).read(ledger_id, entry_id)
            header = verify_entry(entry)
            if header.ledger_id != ledger_id or header.entry_id != entry_id:
                raise EntryFormatError(f"got ledger {header.ledger_id} entry {header.entry_id}")
            return position, entry, None
        except (DigestMismatchError, EntryFormatError) as e:
            log.error(
                "ledger %d entry %d: corrupt copy on %s: %s",
                ledger_id,
                entry_id,
                bookies[position],
                e,
            )
            return position, None, e
        except BookieError as e:
            return position, None, e

    tasks = [asyncio.create_task(read_one(p)) for p in quorum.write_set(entry_id)]
    absent: set[int] = set()
    failed: list[str] = []
    try:
        for next_done in asyncio.as_completed(tasks):
            position, entry, error = await next_done
            if entry is not None:
                return entry
            if isinstance(error, BookieError) and error.status in _ABSENT:
                absent.add(position)
                if quorum.entry_absent(absent):
                    return None
            else:
                failed.append(f"{bookies[position]} ({error})")
    finally:
        for task in tasks:
            task.cancel()
    raise RecoveryError(
        f"ledger {ledger_id} entry {entry_id}: neither found nor provably absent "
        f"({len(absent)} said absent, failed: {failed}); retry when the bookies are back"
    )


class _RecoveryWriter:
    """Re-adds the entries recovery finds (recovery flag, so fenced bookies take them).

    An entry counts as recovered once Qa bookies of its write set stored it. A bookie that
    fails or does not answer within ``add_timeout_s`` is replaced the way a writer would do it:
    a new fragment from that entry on, CAS-ed into the (IN_RECOVERY) metadata, and the entry
    re-sent to the replacement. A conflicting CAS means a concurrent recoverer: start over.
    """

    def __init__(
        self, client: LedgerClient, ledger_id: int, metadata: LedgerMetadata, version: int
    ) -> None:
        self.client = client
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.quorum = metadata.quorum
        self.ensemble = list(metadata.last_fragment.bookies)
        self._failed: set[str] = set()

    async def rewrite_all(self, entries: list[tuple[int, bytes]]) -> None:
        """Re-add consecutive entries, all at once. From the first one a bookie failed, one at
        a time: its replacement's fragment starts there, so each later entry must reach the
        new ensemble too (a copy a later entry left on the replaced bookie does not count)."""
        results = await asyncio.gather(
            *(self._add(e, entry, self.quorum.write_set(e)) for e, entry in entries)
        )
        for index, failed in enumerate(results):
            if failed:
                entry_id, entry = entries[index]
                await self.rewrite(entry_id, entry, failed=failed)
                for entry_id, entry in entries[index + 1 :]:
                    await self.rewrite(entry_id, entry)
                return

    async def rewrite(
        self, entry_id: int, entry: bytes, *, failed: list[int] | None = None
    ) -> None:
        """Re-add one entry; ``failed``: it was sent to its write set already, and the bookies
        at these positions failed."""
        targets = self.quorum.write_set(entry_id)
        if failed is None:
            failed = await self._add(entry_id, entry, targets)
        stored = {p for p in targets if p not in failed}
        while failed:
            try:
                await self._replace(entry_id, failed)
            except NotEnoughBookiesError as e:
                log.warning(
                    "ledger %d entry %d: no replacement bookie (%s)", self.ledger_id, entry_id, e
                )
                break
            targets = failed
            failed = await self._add(entry_id, entry, targets)
            stored.update(p for p in targets if p not in failed)
        if len(stored) < self.quorum.ack_quorum:
            raise RecoveryError(
                f"ledger {self.ledger_id} entry {entry_id}: re-add reached {len(stored)} bookies, "
                f"need {self.quorum.ack_quorum}; retry when bookies are back"
            )

    async def _add(self, entry_id: int, entry: bytes, positions: list[int]) -> list[int]:
        """Send to the bookies at ``positions``; return the positions that failed or timed out."""
        futures = {
            p: self.client.bookie(self.ensemble[p]).add(
                self.ledger_id,
                entry_id,
                entry,
                recovery=True,
                master_key=self.metadata.master_key,
            )
            for p in positions
        }
        await asyncio.wait(futures.values(), timeout=self.client.config.add_timeout_s)
        failed = []
        for position, future in futures.items():
            if not future.done() or future.exception() is not None:
                error = future.exception() if future.done() else "no answer in time"
                log.warning(
                    "ledger %d entry %d: recovery add to %s failed: %s",
                    self.ledger_id,
                    entry_id,
                    self.ensemble[position],
                    error,
                )
                failed.append(position)
        return failed

    async def _replace(self, first_entry_id: int, positions: list[int]) -> None:
        for position in positions:
            self._failed.add(self.ensemble[position])
        change = plan_change(
            self.ensemble,
            first_entry_id,
            positions,
            await self.client.registered_bookies(),
            self.client.placement,
            exclude=self._failed,
        )
        try:
            self.metadata, self.version = await commit_change(
                self.client.store,
                self.ledger_id,
                self.metadata,
                self.version,
                change,
                read_metadata=functools.partial(self.client.read_metadata, self.ledger_id),
                on_conflict=_restart,
            )
        except EnsembleChangeConflict:
            raise _ConcurrentChange() from None
        self.ensemble = list(change.new)


def _restart(metadata: LedgerMetadata) -> None:
    """Any metadata change by someone else during recovery: recover again from it."""
    raise _ConcurrentChange()


async def _length_through(
    client: LedgerClient, ledger_id: int, metadata: LedgerMetadata, last_entry_id: int
) -> int:
    """The ledger length up to ``last_entry_id``, from that entry's header."""
    if last_entry_id < 0:
        return 0
    fragment = metadata.fragment_for(last_entry_id)
    bookies = [fragment.bookies[p] for p in metadata.quorum.write_set(last_entry_id)]
    entry = await client.read_from_replicas(ledger_id, last_entry_id, bookies)
    return decode_header(entry).length


async def _close(
    client: LedgerClient,
    ledger_id: int,
    metadata: LedgerMetadata,
    version: int,
    last_entry_id: int,
    length: int,
) -> tuple[LedgerMetadata, int]:
    closed = replace(metadata, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)
    try:
        return closed, await client.store.put(ledger_key(ledger_id), closed.to_bytes(), version)
    except BadVersionError:
        current, current_version = await client.read_metadata(ledger_id)
    if not current.is_closed:
        raise _ConcurrentChange()
    if current.last_entry_id != last_entry_id:
        log.info(
            "ledger %d: another recoverer closed it first at entry %d (this one found %d); theirs stands",
            ledger_id,
            current.last_entry_id,
            last_entry_id,
        )
    return current, current_version
