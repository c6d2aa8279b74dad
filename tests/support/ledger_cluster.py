"""A private ledger cluster for tests: one real etcd, N real bookie processes, ledger clients.

Bookies register under fixed etcd paths, so every cluster gets its own ``EtcdServer`` (the
session-wide one cannot be shared). Bookies come from :class:`tests.support.bookie.BookieFactory`
and are started in parallel.

Also runnable as a writer process for fault tests that SIGKILL the writer itself::

    python -m tests.support.ledger_cluster write METADATA_URL E QW QA COUNT [ENTRY_SIZE]

It creates a ledger, prints ``ledger <id>``, then adds COUNT entries (pipelined) whose payloads
are :func:`payload_for` and prints ``acked <entry id>`` (flushed) as each add is acknowledged.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from magnetar.common.ledger.client import LedgerClient, LedgerClientConfig
from magnetar.common.metadata import open_store
from magnetar.common.metadata.etcd import EtcdTls
from tests.support.bookie import BookieFactory, BookieProcess, BookieStartError
from tests.support.etcd import REPO_ROOT, EtcdServer, free_port

FAST_BOOKIE = {"journal_sync": False}


def payload_for(ledger_id: int, entry_id: int, size: int = 200) -> bytes:
    """A deterministic payload, so a reader can tell exactly what each entry should hold."""
    rng = random.Random(ledger_id * 1_000_003 + entry_id)
    head = f"L{ledger_id}E{entry_id}|".encode()
    return head + rng.randbytes(max(size - len(head), 0))


def start_bookie(bookie: BookieProcess, attempts: int = 3) -> BookieProcess:
    """Start a bookie; if a port picked by ``free_port`` was taken meanwhile (another process
    bound it between the pick and the bookie's bind), pick new ports and try again."""
    for attempt in range(attempts):
        try:
            return bookie.start()
        except BookieStartError as e:
            if "address already in use" not in str(e) or attempt == attempts - 1:
                raise
            bookie.port, bookie.http_port = free_port(), free_port()
    raise AssertionError("unreachable")


class LedgerCluster:
    """etcd + bookies; ``client()`` gives LedgerClients, each with its own store session."""

    def __init__(
        self,
        base_dir: Path,
        bookies: int,
        *,
        etcd: EtcdServer | None = None,
        store_tls: EtcdTls | None = None,
        **settings: object,
    ) -> None:
        """``etcd``: another etcd than a plain one (a ``TlsEtcdServer``), reached by the
        test's own stores with ``store_tls``; the bookies' TLS settings go in ``settings``."""
        self.base_dir = base_dir
        self.etcd = etcd or EtcdServer()
        self.store_tls = store_tls
        self.factory = BookieFactory(base_dir)
        self.settings = {**FAST_BOOKIE, **settings}
        self.bookie_count = bookies
        self._writers = 0
        self._writer_logs: dict[int, Path] = {}

    @property
    def url(self) -> str:
        return self.etcd.url

    @property
    def bookies(self) -> list[BookieProcess]:
        return self.factory.bookies

    def start(self) -> LedgerCluster:
        self.etcd.start()
        created = [
            self.factory.create(metadata_url=self.etcd.url, **self.settings)
            for _ in range(self.bookie_count)
        ]
        with ThreadPoolExecutor(len(created)) as pool:
            list(pool.map(start_bookie, created))
        return self

    def close(self) -> None:
        try:
            self.factory.close()
        finally:
            self.etcd.close()

    def bookie(self, address: str) -> BookieProcess:
        for b in self.bookies:
            if b.address == address:
                return b
        raise KeyError(f"no bookie {address} in this cluster: {[b.address for b in self.bookies]}")

    def logs(self) -> str:
        return self.factory.logs()

    @asynccontextmanager
    async def client(self, config: LedgerClientConfig | None = None) -> AsyncIterator[LedgerClient]:
        store = await open_store(self.url, tls=self.store_tls)
        try:
            async with LedgerClient(store, config) as client:
                yield client
        finally:
            await store.close()

    def bk(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``magnetar bk --metadata-url URL ARGS...``."""
        return subprocess.run(
            [sys.executable, "-m", "magnetar.cli", "bk", "--metadata-url", self.url, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def writer_process(
        self, e: int, qw: int, qa: int, count: int, entry_size: int = 200
    ) -> subprocess.Popen[str]:
        """The writer of this module's ``__main__`` in its own process (see the module doc)."""
        self._writers += 1
        log_path = self.base_dir / f"writer-{self._writers}.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.ledger_cluster",
                    "write",
                    self.url,
                    str(e),
                    str(qw),
                    str(qa),
                    str(count),
                    str(entry_size),
                ],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        self._writer_logs[process.pid] = log_path
        return process

    def writer_log(self, process: subprocess.Popen[str]) -> Path:
        """Where a writer process's stderr goes."""
        return self._writer_logs[process.pid]


def ledger_cluster_fixture(
    base_dir: Path, bookies: int, **settings: object
) -> Iterator[LedgerCluster]:
    """Body of a cluster fixture; bookie logs are printed at teardown (shown on failure)."""
    cluster = LedgerCluster(base_dir, bookies, **settings)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        if cluster.bookies:
            print(cluster.logs())


async def _write_main(url: str, e: int, qw: int, qa: int, count: int, size: int) -> None:
    store = await open_store(url)
    async with LedgerClient(store) as client:
        handle = await client.create_ledger(e, qw, qa)
        print(f"ledger {handle.ledger_id}", flush=True)

        def report(fut: asyncio.Future[int]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                print(f"acked {fut.result()}", flush=True)

        futures = []
        for entry_id in range(count):
            fut = await handle.add_async(payload_for(handle.ledger_id, entry_id, size))
            fut.add_done_callback(report)
            futures.append(fut)
            if entry_id % 50 == 0:
                await asyncio.sleep(0)  # let acks print while adds are in flight
        await asyncio.gather(*futures, return_exceptions=True)
        await handle.close()
        print("closed", flush=True)
    await store.close()


if __name__ == "__main__":
    if len(sys.argv) < 7 or sys.argv[1] != "write":
        sys.exit(__doc__)
    _, _, url, *numbers = sys.argv
    asyncio.run(
        _write_main(
            url, *(int(n) for n in numbers[:4]), int(numbers[4]) if len(numbers) > 4 else 200
        )
    )
