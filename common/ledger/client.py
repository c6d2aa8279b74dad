"""LedgerClient: create, open (with or without recovery), delete and list ledgers.

The broker and the auditor use this, never the bookie protocol directly. One client holds one
BookieClient per bookie address and shares it among every ledger it handles.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from magnetar.common.ledger.bookie_client import (
    BookieClient,
    BookieError,
    BookieTls,
    RangeReadUnsupportedError,
)
from magnetar.common.ledger.bookies import BookieRegistration, list_bookies
from magnetar.common.ledger.distribution import Quorum
from magnetar.common.ledger.entry import (
    DigestMismatchError,
    EntryFormatError,
    check_entry,
)
from magnetar.common.ledger.errors import (
    EntryDigestError,
    LedgerError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadError,
)
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.metadata import (
    LEDGER_ID_COUNTER,
    LEDGERS_PATH,
    Fragment,
    LedgerMetadata,
    ledger_key,
)
from magnetar.common.ledger.placement import PlacementPolicy, RackAwarePlacement
from magnetar.common.ledger.racks import load_racks
from magnetar.common.ledger.recovery import recover_ledger
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore
from magnetar.common.proto import bookie_pb2 as pb

log = logging.getLogger(__name__)

_ABSENT = (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER)
DEFAULT_MAX_ENTRY_SIZE = 5 * 1024 * 1024 + 10 * 1024
#: Entry bytes asked for in one range read (the bookie sends the first entry whatever its size).
RANGE_READ_BYTES = 4 * 1024 * 1024

T = TypeVar("T")


class _NoReplicaAnswered(Exception):
    """Every replica asked failed; ``errors`` by bookie address."""

    def __init__(self, errors: dict[str, BaseException]) -> None:
        super().__init__(errors)
        self.errors = errors


@dataclass(slots=True)
class LedgerClientConfig:
    add_timeout_s: float = 10.0  # a bookie silent this long on an add is replaced
    read_timeout_s: float = 10.0
    speculative_read_s: float = 0.5  # ask the next replica if the first has not answered by then
    max_pending_adds: int = 10_000  # per ledger handle: add_async waits beyond this
    max_pending_bytes: int = 64 * 1024 * 1024
    #: Largest entry (header included) sent when the ensemble's bookies do not say theirs:
    #: Pulsar's bookie frame limit, 5 MiB of message + 10 KiB of headers.
    max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE


#: Ledger ids of a new counter start at the clock in milliseconds times this: far above any
#: id an earlier counter could have reached (that would take this many ledgers per
#: millisecond, on average, since the earlier counter started).
LEDGER_IDS_PER_MS = 1024


def first_ledger_id(now_ms: int | None = None) -> int:
    """The first id of a new ledger-id counter (see ``_allocate_ledger_id``)."""
    return (int(time.time() * 1000) if now_ms is None else now_ms) * LEDGER_IDS_PER_MS


def master_key_for(password: bytes | None) -> bytes:
    """A ledger's master key: SHA-256 of the password (as BookKeeper derives it with SHA-1),
    or 16 random bytes."""
    if password is None:
        return os.urandom(16)
    return hashlib.sha256(b"magnetar-ledger-key:" + password).digest()


class LedgerClient:
    """``tls``: reach bookies over TLS channels (None: plain gRPC, the default). Its files are
    read here, once; bookies in this process (``add_local_bookie``) are reached without it."""

    def __init__(
        self,
        store: MetadataStore,
        config: LedgerClientConfig | None = None,
        placement: PlacementPolicy | None = None,
        *,
        tls: BookieTls | None = None,
    ) -> None:
        self.store = store
        self._credentials = None if tls is None else tls.channel_credentials()
        self.config = config or LedgerClientConfig()
        self.placement = placement or RackAwarePlacement()
        self._bookies: dict[str, BookieClient] = {}
        #: Bookies in this process, reached without gRPC (see ``add_local_bookie``).
        self._local: dict[str, BookieClient] = {}
        self.corrupt_reads = 0  # replicas that returned a corrupt entry (reported in the log too)
        #: Bookies that said they have no range read (older ones): read one entry at a time.
        self._no_range_read: set[str] = set()

    def add_local_bookie(self, address: str, client: object) -> None:
        """Reach the bookie at ``address`` through ``client`` (an object with BookieClient's
        calls, e.g. ``magnetar.bookie.local_client.LocalBookieClient``) instead of gRPC."""
        self._local[address] = client  # type: ignore[assignment]

    def bookie(self, address: str) -> BookieClient:
        local = self._local.get(address)
        if local is not None:
            return local
        client = self._bookies.get(address)
        if client is None:
            client = self._bookies[address] = BookieClient(
                address, timeout=self.config.read_timeout_s, credentials=self._credentials
            )
        return client

    async def close(self) -> None:
        clients, self._bookies = {**self._bookies, **self._local}, {}
        self._local = {}
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def registered_bookies(self) -> list[BookieRegistration]:
        """The registered bookies, each with its rack when the admin set one (for placement)."""
        registered = await list_bookies(self.store)
        try:
            racks = (await load_racks(self.store))[0].racks()
        except ValueError as e:  # a damaged document must not stop ledgers being made
            log.warning("bookie rack information unreadable, placing without it: %s", e)
            racks = {}
        return [b.on_rack(racks.get(b.address)) for b in registered]

    def entry_size_limit(
        self, ensemble: Sequence[str], registrations: Sequence[BookieRegistration]
    ) -> int:
        """The largest entry every bookie of ``ensemble`` takes: the smallest limit their
        registrations state, or the configured default if none states one."""
        stated = [
            r.max_entry_size
            for r in registrations
            if r.address in ensemble and r.max_entry_size > 0
        ]
        return min(stated, default=self.config.max_entry_size)

    # -- metadata ---------------------------------------------------------------------------

    async def read_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        found = await self.store.get(ledger_key(ledger_id))
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_bytes(found.value), found.version

    async def list_ledgers(self) -> list[int]:
        ids = []
        for name in await self.store.children(LEDGERS_PATH):
            try:
                ids.append(int(name))
            except ValueError:
                log.warning("ignoring unexpected key %s/%s", LEDGERS_PATH, name)
        return sorted(ids)

    async def _allocate_ledger_id(self) -> int:
        """Cluster-unique ids from a counter in the metadata store (CAS increment).

        A new counter starts at :func:`first_ledger_id` (the clock, not 0): if the store is
        ever reset or replaced while bookies keep old data, the ids it hands out are above
        every id the old counter gave, so no new ledger is created under an old ledger's id.
        """
        while True:
            current = await self.store.get(LEDGER_ID_COUNTER)
            next_id = int(current.value) + 1 if current else first_ledger_id()
            try:
                await self.store.put(
                    LEDGER_ID_COUNTER,
                    str(next_id).encode(),
                    current.version if current else NOT_EXISTS,
                )
            except BadVersionError:
                continue
            return next_id

    # -- create / open / delete ----------------------------------------------------------------

    async def create_ledger(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        password: bytes | None = None,
    ) -> LedgerHandle:
        """Create a ledger and open it for writing. Its master key (sent with every add, kept
        in the metadata for recovery) is derived from ``password`` when one is given, else
        random: nobody without the metadata can add to it."""
        quorum = Quorum(ensemble_size, write_quorum, ack_quorum)  # raises on a bad combination
        registrations = await self.registered_bookies()
        ensemble = self.placement.choose(quorum.ensemble_size, registrations)
        ledger_id = await self._allocate_ledger_id()
        metadata = LedgerMetadata(
            ensemble_size=ensemble_size,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            fragments=(Fragment(0, tuple(ensemble)),),
            ctime_ms=int(time.time() * 1000),
            custom_metadata=dict(custom_metadata or {}),
            master_key=master_key_for(password),
        )
        version = await self.store.put(ledger_key(ledger_id), metadata.to_bytes(), NOT_EXISTS)
        log.info(
            "ledger %d created on %s (E%d Qw%d Qa%d)",
            ledger_id,
            ensemble,
            ensemble_size,
            write_quorum,
            ack_quorum,
        )
        return LedgerHandle(
            self,
            ledger_id,
            metadata,
            version,
            writable=True,
            max_entry_size=self.entry_size_limit(ensemble, registrations),
        )

    async def open_ledger(self, ledger_id: int, *, recovery: bool = True) -> LedgerHandle:
        """Open for reading. With ``recovery`` (the default) an open ledger is fenced and closed
        first, so its end is final and its old writer can add nothing more."""
        if recovery:
            metadata, version = await recover_ledger(self, ledger_id)
            return LedgerHandle(self, ledger_id, metadata, version, writable=False)
        metadata, version = await self.read_metadata(ledger_id)
        handle = LedgerHandle(self, ledger_id, metadata, version, writable=False)
        if not metadata.is_closed:
            try:
                await handle.refresh_lac()
            except ReadError as e:
                log.warning("ledger %d: LAC unknown for now: %s", ledger_id, e)
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger from every bookie that stores a fragment of it, then its metadata."""
        metadata, version = await self.read_metadata(ledger_id)
        bookies = sorted({b for f in metadata.fragments for b in f.bookies})
        results = await asyncio.gather(
            *(self.bookie(b).delete_ledger(ledger_id) for b in bookies), return_exceptions=True
        )
        for address, result in zip(bookies, results, strict=True):
            if isinstance(result, Exception):
                # The data stays on that bookie until it is deleted there; the metadata goes anyway
                # so nobody reads the ledger again.
                log.warning("ledger %d: delete on bookie %s failed: %s", ledger_id, address, result)
        await self.store.delete(ledger_key(ledger_id), version)
        log.info("ledger %d deleted", ledger_id)

    # -- reads over replicas ---------------------------------------------------------------------

    async def read_from_replicas(
        self, ledger_id: int, entry_id: int, bookies: Sequence[str]
    ) -> bytes:
        """Read from the first replica; ask the next one on an error (a corrupt copy included),
        or when the current one has not answered within ``speculative_read_s``. The first
        verified copy wins. If none is intact: NoSuchEntryError when every replica says it has
        no such entry, EntryDigestError when the copies that exist are all corrupt, else
        ReadError (some replica could not be asked; trying later may succeed)."""
        try:
            return await self._first_answer(
                bookies, lambda address: self._read_verified(address, ledger_id, entry_id)
            )
        except _NoReplicaAnswered as failed:
            errors = failed.errors
        if errors and all(
            isinstance(e, BookieError) and e.status in _ABSENT for e in errors.values()
        ):
            raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id}: no replica has it")
        detail = "; ".join(f"{a}: {e}" for a, e in errors.items())
        if any(isinstance(e, EntryDigestError) for e in errors.values()) and all(
            isinstance(e, EntryDigestError) or (isinstance(e, BookieError) and e.status in _ABSENT)
            for e in errors.values()
        ):
            raise EntryDigestError(ledger_id, entry_id, f"every replica failed: {detail}")
        raise ReadError(f"ledger {ledger_id} entry {entry_id}: every replica failed ({detail})")

    def has_range_read(self, address: str) -> bool:
        """Whether range reads are tried on this bookie (not when it said it has none)."""
        return address not in self._no_range_read

    async def read_range_from_replicas(
        self,
        ledger_id: int,
        first: int,
        last: int,
        bookies: Sequence[str],
        max_bytes: int = RANGE_READ_BYTES,
    ) -> list[bytes]:
        """A range read (BookKeeper's batch read) of entries ``first`` .. at most ``last`` from
        ``bookies``, each of which must store every entry of the range (one fragment of a
        ledger whose ensemble size is its write quorum). Replicas are asked as
        :meth:`read_from_replicas` asks them (the next on an error or after
        ``speculative_read_s``); the first answer with entries wins. Every entry's digest and
        ids are checked as a single read checks them; an answer is cut at its first bad
        entry. Returns at least entry ``first`` and as many more as the bookie sent (at most
        ``max_bytes`` or so). ReadError when no replica answered with entries (the caller
        reads entry ``first`` alone, which says why); bookies without range reads are
        remembered and left out (:meth:`has_range_read`)."""
        capable = [b for b in bookies if b not in self._no_range_read]
        if not capable:
            raise ReadError(f"ledger {ledger_id}: no bookie of {list(bookies)} has range reads")
        count = last - first + 1
        try:
            return await self._first_answer(
                capable,
                lambda address: self._read_range_verified(
                    address, ledger_id, first, count, max_bytes
                ),
            )
        except _NoReplicaAnswered as failed:
            detail = "; ".join(f"{a}: {e}" for a, e in failed.errors.items())
            raise ReadError(
                f"ledger {ledger_id}: range read from entry {first} failed ({detail})"
            ) from None

    async def _first_answer(
        self, bookies: Sequence[str], attempt: Callable[[str], Awaitable[T]]
    ) -> T:
        """``attempt`` on the first replica, then on the next one on an error or after
        ``speculative_read_s`` without an answer; the first success wins (the others are
        cancelled). _NoReplicaAnswered, with each replica's error, when every one failed."""
        errors: dict[str, BaseException] = {}
        running: dict[asyncio.Task[T], str] = {}
        next_index = 0

        def start_next() -> None:
            nonlocal next_index
            if next_index < len(bookies):
                address = bookies[next_index]
                next_index += 1
                running[asyncio.ensure_future(attempt(address))] = address

        start_next()
        try:
            while running:
                more = next_index < len(bookies)
                done, _ = await asyncio.wait(
                    running,
                    timeout=self.config.speculative_read_s if more else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    start_next()
                    continue
                for task in done:
                    address = running.pop(task)
                    error = task.exception()
                    if error is None:
                        return task.result()
                    errors[address] = error
                    start_next()
        finally:
            for task in running:
                task.cancel()
        raise _NoReplicaAnswered(errors)

    async def _read_range_verified(
        self, address: str, ledger_id: int, first: int, count: int, max_bytes: int
    ) -> list[bytes]:
        try:
            entries = await self.bookie(address).read_range(ledger_id, first, count, max_bytes)
        except RangeReadUnsupportedError:
            self._no_range_read.add(address)
            log.info("bookie %s has no range read: its entries are read one by one", address)
            raise
        except BookieError as e:
            if e.status == pb.DIGEST_MISMATCH:
                raise self._report_corrupt(address, ledger_id, first, str(e)) from None
            raise
        verified: list[bytes] = []
        for entry in entries[:count]:
            try:
                self._check_copy(address, ledger_id, first + len(verified), entry)
            except EntryDigestError:
                if verified:
                    return verified
                raise
            verified.append(entry)
        if not verified:
            raise ReadError(f"bookie {address}: range read from entry {first} returned nothing")
        return verified

    async def _read_verified(self, address: str, ledger_id: int, entry_id: int) -> bytes:
        try:
            entry = await self.bookie(address).read(ledger_id, entry_id)
        except BookieError as e:
            if e.status == pb.DIGEST_MISMATCH:
                raise self._report_corrupt(address, ledger_id, entry_id, str(e)) from None
            raise
        self._check_copy(address, ledger_id, entry_id, entry)
        return entry

    def _check_copy(self, address: str, ledger_id: int, entry_id: int, entry: bytes) -> None:
        """EntryDigestError (reported) unless ``entry`` is an intact copy of that entry."""
        try:
            got_ledger, got_entry, _lac = check_entry(entry)
        except (DigestMismatchError, EntryFormatError) as e:
            raise self._report_corrupt(address, ledger_id, entry_id, str(e)) from None
        if got_ledger != ledger_id or got_entry != entry_id:
            message = f"asked for {ledger_id}/{entry_id}, got {got_ledger}/{got_entry}"
            raise self._report_corrupt(address, ledger_id, entry_id, message)

    def _report_corrupt(
        self, address: str, ledger_id: int, entry_id: int, detail: str
    ) -> EntryDigestError:
        """Count and log a corrupt replica; the error to raise for it."""
        self.corrupt_reads += 1
        log.error(
            "corrupt replica: bookie %s returned a bad copy of ledger %d entry %d (%s); reading another",
            address,
            ledger_id,
            entry_id,
            detail,
        )
        return EntryDigestError(ledger_id, entry_id, f"bookie {address}: {detail}")

    async def read_lac(self, ledger_id: int, bookies: Sequence[str]) -> int:
        """The highest LAC any of these bookies reports for the ledger."""
        results = await asyncio.gather(
            *(self.bookie(b).read_lac(ledger_id) for b in bookies), return_exceptions=True
        )
        lacs = [r.lac for r in results if not isinstance(r, BaseException)]
        absent = [r for r in results if isinstance(r, BookieError) and r.status in _ABSENT]
        if not lacs and len(absent) < len(results):
            raise ReadError(
                f"ledger {ledger_id}: no bookie of {list(bookies)} answered the LAC request"
            )
        return max(lacs, default=-1)

    async def wait_for_lac(
        self, ledger_id: int, bookies: Sequence[str], previous: int, timeout_s: float
    ) -> int:
        """Long poll the bookies; the first to report a LAC past ``previous`` answers."""
        wait_ms = int(timeout_s * 1000)
        tasks = [
            asyncio.create_task(
                self.bookie(b).read_lac(ledger_id, previous=previous, wait_ms=wait_ms)
            )
            for b in bookies
        ]
        best = previous
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    position = await next_done
                except BookieError:
                    continue
                best = max(best, position.lac)
                if best > previous:
                    break
        finally:
            for task in tasks:
                task.cancel()
        return best


__all__ = ["LedgerClient", "LedgerClientConfig", "LedgerError"]
