"""Ledger recovery: how a new owner takes a ledger from a writer that may still be alive.

1. CAS the metadata OPEN -> IN_RECOVERY (a ledger already IN_RECOVERY is recovered again: the
   steps are idempotent, and the closing CAS makes concurrent recoverers agree).
2. Fence the last ensemble. Fencing holds once ``Qw - Qa + 1`` bookies of every write quorum
   answered; then the old writer can no longer collect ``Qa`` acks for any entry.
3. Read forward from the highest LAC the fenced bookies reported. An entry found on any replica
   is re-added (recovery flag) to its whole write set; an entry is absent once ``Qw - Qa + 1``
   bookies of its write set say "no such entry", and recovery stops there.
4. CAS the metadata to CLOSED with the last entry and length. If another recoverer closed it
   first, its result stands and is returned.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from magnetar.common.ledger.bookie_client import BookieError
from magnetar.common.ledger.distribution import Quorum
from magnetar.common.ledger.entry import (
    DigestMismatchError,
    EntryFormatError,
    decode_header,
    verify_entry,
)
from magnetar.common.ledger.errors import RecoveryError
from magnetar.common.ledger.metadata import LedgerMetadata, LedgerState, ledger_key
from magnetar.common.metadata import BadVersionError
from magnetar.common.proto import bookie_pb2 as pb

if TYPE_CHECKING:
    from magnetar.common.ledger.client import LedgerClient

log = logging.getLogger(__name__)

_ABSENT = (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER)


async def recover_ledger(client: LedgerClient, ledger_id: int) -> tuple[LedgerMetadata, int]:
    """Fence and close the ledger; return its final (CLOSED) metadata and version."""
    metadata, version = await client.read_metadata(ledger_id)
    if metadata.is_closed:
        return metadata, version
    if metadata.state is LedgerState.OPEN:
        metadata, version = await _mark_in_recovery(client, ledger_id, metadata, version)
        if metadata.is_closed:
            return metadata, version

    quorum = metadata.quorum
    fragment = metadata.last_fragment
    bookies = fragment.bookies
    max_lac = await _fence(client, ledger_id, quorum, bookies)
    # Entries before the last fragment were acknowledged when it was created.
    entry_id = max(max_lac, fragment.first_entry_id - 1) + 1
    last_entry_id, length = entry_id - 1, None
    while True:
        entry = await _recovery_read(client, ledger_id, entry_id, quorum, bookies)
        if entry is None:
            break
        await _rewrite(client, ledger_id, entry_id, entry, quorum, bookies)
        last_entry_id, length = entry_id, decode_header(entry).length
        entry_id += 1
    if length is None:
        length = await _length_through(client, ledger_id, metadata, last_entry_id)
    log.info("ledger %d recovered: last entry %d, length %d", ledger_id, last_entry_id, length)
    return await _close(client, ledger_id, last_entry_id, length)


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


async def _rewrite(
    client: LedgerClient,
    ledger_id: int,
    entry_id: int,
    entry: bytes,
    quorum: Quorum,
    bookies: tuple[str, ...],
) -> None:
    """Re-add an entry found by recovery to its whole write set (at least Qa must take it)."""
    write_set = quorum.write_set(entry_id)
    results = await asyncio.gather(
        *(
            client.bookie(bookies[p]).add(ledger_id, entry_id, entry, recovery=True)
            for p in write_set
        ),
        return_exceptions=True,
    )
    stored = sum(1 for r in results if not isinstance(r, BaseException))
    if stored < quorum.ack_quorum:
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        raise RecoveryError(
            f"ledger {ledger_id} entry {entry_id}: re-add reached {stored} bookies: {errors}"
        )


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
    client: LedgerClient, ledger_id: int, last_entry_id: int, length: int
) -> tuple[LedgerMetadata, int]:
    metadata, version = await client.read_metadata(ledger_id)
    while not metadata.is_closed:
        closed = replace(
            metadata, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length
        )
        try:
            return closed, await client.store.put(ledger_key(ledger_id), closed.to_bytes(), version)
        except BadVersionError:
            metadata, version = await client.read_metadata(ledger_id)
    if metadata.last_entry_id != last_entry_id:
        log.info(
            "ledger %d: another recoverer closed it first at entry %d (this one found %d); theirs stands",
            ledger_id,
            metadata.last_entry_id,
            last_entry_id,
        )
    return metadata, version
