"""A bookie in the same process, seen by the ledger client: the calls of ``BookieClient``, made
straight on the bookie's storage, without gRPC and without encoding a message per add.

``magnetar standalone`` hands one to its broker's ledger client. The semantics are those of the
gRPC path: adds are taken in order and in batches, each completes once durable (journal
fsync), completions come back in journal order, and the storage's errors arrive as the same
``BookieError`` statuses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from magnetar.bookie.ledger_storage import AddRun, LedgerStorage, StorageError
from magnetar.common.ledger.bookie_client import (
    AddCallback,
    BookieError,
    BookieUnavailableError,
    GroupAnswer,
    LedgerPosition,
    add_future,
)
from magnetar.common.proto import bookie_pb2 as pb

log = logging.getLogger(__name__)

#: At most this many entry bytes go to the storage in one batch (as one gRPC AddRequest would).
MAX_BATCH_BYTES = 1024 * 1024


_Batch = tuple[list[AddCallback], Awaitable[list[tuple[int, int, str]]] | BaseException]


class LocalBookieClient:
    def __init__(
        self, address: str, storage: LedgerStorage, info: Callable[[], pb.BookieInfoResponse]
    ) -> None:
        self.address = address
        self.storage = storage
        self._info = info
        #: Adds waiting for the submit task, as runs (``AddRun``), each with its bytes and its
        #: callbacks (one per entry).
        self._runs: list[tuple[AddRun, int, list[AddCallback]]] = []
        self._ready = asyncio.Event()
        self._batches: asyncio.Queue[_Batch] = asyncio.Queue()
        self._outstanding = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    # -- adds ----------------------------------------------------------------------------

    def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        entry: bytes,
        callback: AddCallback,
        *,
        recovery: bool = False,
        master_key: bytes = b"",
    ) -> None:
        self._queue(AddRun(ledger_id, entry_id, [entry], master_key, recovery), [callback])

    def add_run(
        self,
        ledger_id: int,
        first_entry_id: int,
        entries: list[bytes],
        answer: GroupAnswer,
        *,
        master_key: bytes = b"",
    ) -> None:
        """``add_entry`` of consecutive entries answered by one ``GroupAnswer``, in one call
        (what ``add_entries`` uses): completed in runs, the answer told once per run."""
        self._queue(AddRun(ledger_id, first_entry_id, entries, master_key), [answer] * len(entries))

    def _queue(self, run: AddRun, callbacks: list[AddCallback]) -> None:
        """Queue adds for the submit task (started with the first add)."""
        if self._closed:
            raise BookieUnavailableError(self.address, "client closed")
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._submit(), name=f"local-bookie-submit-{self.address}"),
                asyncio.create_task(self._complete(), name=f"local-bookie-done-{self.address}"),
            ]
        self._runs.append((run, sum(map(len, run.entries)), callbacks))
        self._outstanding += len(callbacks)
        if not self._ready.is_set():
            self._ready.set()

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        entry: bytes,
        *,
        recovery: bool = False,
        master_key: bytes = b"",
    ) -> asyncio.Future[None]:
        fut, settle = add_future()
        self.add_entry(ledger_id, entry_id, entry, settle, recovery=recovery, master_key=master_key)
        return fut

    @property
    def pending_adds(self) -> int:
        return self._outstanding

    async def _submit(self) -> None:
        """Hand queued adds to the storage in batches, in order (it journals them at once)."""
        while True:
            if not self._runs:
                self._ready.clear()
                await self._ready.wait()
                continue
            await self.storage.wait_for_capacity()
            take, size = 0, 0
            for _, run_size, _ in self._runs:  # whole runs, one over the limit alone
                take += 1
                size += run_size
                if size >= MAX_BATCH_BYTES:
                    break
            taken = self._runs[:take]
            del self._runs[:take]
            runs = [run for run, _, _ in taken]
            callbacks = [callback for _, _, told in taken for callback in told]
            try:
                adds = self.storage.add_runs(runs, check_digests=False)
                self._batches.put_nowait((callbacks, adds))
            except Exception as e:  # the storage is closed or broken: these adds failed
                self._batches.put_nowait((callbacks, e))

    async def _complete(self) -> None:
        """Call back each batch once durable, in the order the batches were taken."""
        while True:
            callbacks, done = await self._batches.get()
            try:
                if isinstance(done, BaseException):
                    raise done
                failures = await done
            except asyncio.CancelledError:
                self._settle(callbacks, BookieUnavailableError(self.address, "client closed"))
                raise
            except Exception as e:
                self._settle(callbacks, BookieUnavailableError(self.address, f"add failed: {e}"))
                continue
            self._outstanding -= len(callbacks)
            if not failures:  # the usual batch: every add stored, no lookup
                _succeeded(callbacks)
                continue
            failed = {i: (status, message) for i, status, message in failures}
            for i, callback in enumerate(callbacks):
                problem = failed.get(i)
                _call(callback, None if problem is None else BookieError(self.address, *problem))

    def _settle(self, callbacks: list[AddCallback], error: BookieError) -> None:
        self._outstanding -= len(callbacks)
        for callback in callbacks:
            _call(callback, error)

    # -- other calls ---------------------------------------------------------------------

    async def read(self, ledger_id: int, entry_id: int, *, fence: bool = False) -> bytes:
        try:
            if fence:
                await self.storage.fence(ledger_id)
            return await self.storage.read(ledger_id, entry_id)
        except StorageError as e:
            raise BookieError(self.address, e.status, e.message) from None

    async def read_range(
        self, ledger_id: int, first: int, max_count: int, max_bytes: int
    ) -> list[bytes]:
        try:
            return await self.storage.read_range(ledger_id, first, max_count, max_bytes)
        except StorageError as e:
            raise BookieError(self.address, e.status, e.message) from None

    async def read_lac(
        self, ledger_id: int, *, previous: int = -2, wait_ms: int = 0
    ) -> LedgerPosition:
        wait_s = wait_ms / 1000 if previous >= -1 else 0.0
        try:
            state = await self.storage.read_lac(ledger_id, previous, wait_s)
        except StorageError as e:
            raise BookieError(self.address, e.status, e.message) from None
        if wait_s > 0 and state.lac <= previous:
            raise BookieError(self.address, pb.TIMEOUT, "LAC did not advance in time")
        return LedgerPosition(state.lac, state.last_entry_id)

    async def fence(self, ledger_id: int) -> LedgerPosition:
        try:
            state = await self.storage.fence(ledger_id)
        except StorageError as e:
            raise BookieError(self.address, e.status, e.message) from None
        return LedgerPosition(state.lac, state.last_entry_id)

    async def delete_ledger(self, ledger_id: int) -> None:
        try:
            await self.storage.delete_ledger(ledger_id)
        except StorageError as e:
            raise BookieError(self.address, e.status, e.message) from None

    async def info(self) -> pb.BookieInfoResponse:
        return self._info()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        return None  # same process: nothing to connect

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        error = BookieUnavailableError(self.address, "client closed")
        callbacks = [callback for _, _, told in self._runs for callback in told]
        while not self._batches.empty():
            callbacks += self._batches.get_nowait()[0]
        self._runs, self._outstanding = [], 0
        for callback in callbacks:
            _call(callback, error)


def _succeeded(callbacks: list[AddCallback]) -> None:
    """Tell every add of a batch it is stored: a run of one group's entries (the same
    ``GroupAnswer``, as ``add_run`` queues them) told at once, any other add on its own."""
    run_of: AddCallback | None = None
    run = 0
    for callback in [*callbacks, None]:
        if callback is run_of:
            run += 1
            continue
        if type(run_of) is GroupAnswer:
            try:
                run_of.answered(run, None)
            except Exception:
                log.exception("add callback failed")
        elif run_of is not None:
            for _ in range(run):
                _call(run_of, None)
        run_of, run = callback, 1


def _call(callback: AddCallback, error: BookieError | None) -> None:
    """A caller's callback that raises must not stop the completions of everyone else."""
    try:
        callback(error)
    except Exception:
        log.exception("add callback failed")
