"""Cluster identity under damage: a reset metadata store, wiped disks, swapped directories,
another cluster's store. Each either starts with every acknowledged message, or refuses with a
message that says what happened and what to do; never a silent loss, never old data under a
new name.

Real processes throughout: ``magnetar standalone`` with the official client, ``magnetar bookie``
processes on a private etcd (cookies and the instance id live at fixed keys), and the
``magnetar bk`` command an operator would run.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.common.ledger.bookie_client import BookieClient, BookieError
from magnetar.common.ledger.client import LedgerClient, LedgerClientConfig
from magnetar.common.ledger.entry import encode_entry
from magnetar.common.ledger.errors import RecoveryError
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.identity import read_cookie, read_instance_id
from magnetar.common.metadata import MetadataStore, open_store
from tests.support.bookie import BookieFactory, BookieProcess, BookieStartError
from tests.support.etcd import EtcdServer
from tests.support.raw_client import drain
from tests.support.standalone import StandaloneProcess, client

MESSAGES = 2000
COOKIE = "bookie-cookie.json"


# -- standalone: a reset metadata store -------------------------------------------------------


def start_refused(node: StandaloneProcess) -> str:
    """Run the standalone as ``start`` would and expect it to refuse; its log of that run."""
    before = len(node.log_tail(10**9))
    command = [
        sys.executable, "-m", "magnetar.cli", "standalone", "--data-dir", str(node.data_dir),
        "--broker-port", str(node.port), "--bookie-port", str(node.bookie_port),
        "--bookie-http-port", str(node.bookie_http_port), "--no-journal-sync",
        "--http-port", str(node.http_port),
    ]  # fmt: skip
    with open(node.log_path, "ab") as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=60)
    text = node.log_tail(10**9)[before:]
    assert result.returncode == 1, f"standalone did not refuse (exit {result.returncode}):\n{text}"
    return text


def produce(node: StandaloneProcess, topic: str, count: int) -> list[bytes]:
    c = client(node)
    try:
        c.subscribe(topic, "keep").close()  # a durable cursor keeps every message
        # Blocking when the client's queue is full: without it, sends past its 1,000 pending
        # messages fail with ProducerQueueIsFull (once 155 of 2,000 here, under load).
        producer = c.create_producer(
            topic, batching_enabled=True, batching_max_messages=50, block_if_queue_full=True
        )
        sent = [f"{topic} #{i}".encode() for i in range(count)]
        results: list[pulsar.Result] = []
        for data in sent:
            producer.send_async(data, lambda result, _id: results.append(result))
        producer.flush()
        producer.close()
        assert results == [pulsar.Result.Ok] * count, {str(r) for r in results}
        return sent
    finally:
        c.close()


def receive_all(
    node: StandaloneProcess, topic: str, subscription: str, wait_ms: int, expect: int = 0
) -> list[bytes]:
    c = client(node)
    try:
        consumer = c.subscribe(
            topic, subscription, initial_position=pulsar.InitialPosition.Earliest
        )
        return [m.data() for m in drain(consumer, quiet_ms=wait_ms, expect=expect)]
    finally:
        c.close()


def test_standalone_refuses_a_reset_metadata_store_and_never_serves_old_data_as_new(
    tmp_path: Path,
) -> None:
    node = StandaloneProcess(tmp_path / "standalone")
    data_dir = node.data_dir
    meta = data_dir / "meta.db"
    backup = tmp_path / "backup"
    try:
        node.start()
        sent = produce(node, "before-reset", MESSAGES)
        node.stop()
        backup.mkdir()
        for path in data_dir.glob("meta.db*"):
            shutil.copy2(path, backup / path.name)

        # meta.db truncated to 0 bytes (its WAL gone with it): an empty store.
        meta.write_bytes(b"")
        for stale in (data_dir / "meta.db-wal", data_dir / "meta.db-shm"):
            stale.unlink(missing_ok=True)
        refusal = start_refused(node)
        assert "does not know this bookie's cluster" in refusal
        assert "reset or lost" in refusal and "Restore the metadata store" in refusal
        assert str(meta.resolve()) in refusal
        # The refused start created no cluster in the empty store: it refuses again.
        assert "does not know this bookie's cluster" in start_refused(node)

        # meta.db deleted.
        for path in data_dir.glob("meta.db*"):
            path.unlink()
        assert "does not know this bookie's cluster" in start_refused(node)

        # An operator who also removes the cookies to force a start is still refused: the
        # bookie holds data an empty store knows nothing of.
        cookies = {}
        for path in data_dir.glob(f"bookie/*/{COOKIE}"):
            cookies[path] = path.read_bytes()
            path.unlink()
        for path in data_dir.glob("meta.db*"):
            path.unlink()
        refusal = start_refused(node)
        assert "is empty (no instance id, no ledgers) but this bookie holds data" in refusal

        # The way forward: restore meta.db (and the cookies). Everything is there, and a new
        # topic holds nothing of the old one.
        for path, content in cookies.items():
            path.write_bytes(content)
        for path in data_dir.glob("meta.db*"):
            path.unlink()
        for path in backup.iterdir():
            shutil.copy2(path, data_dir / path.name)
        node.start()
        assert receive_all(node, "before-reset", "keep", 3000, expect=len(sent)) == sent
        assert receive_all(node, "after-restore", "fresh", 1500) == []
        new = produce(node, "after-restore", 3)
        assert receive_all(node, "after-restore", "fresh2", 3000, expect=len(new)) == new
    finally:
        node.kill()
        print(node.log_tail())


def test_standalone_refuses_a_metadata_store_restored_from_an_older_backup(
    tmp_path: Path,
) -> None:
    node = StandaloneProcess(tmp_path / "standalone")
    data_dir = node.data_dir
    old = tmp_path / "old-backup"
    try:
        node.start()
        produce(node, "before-backup", 10)
        node.stop()
        old.mkdir()
        for path in data_dir.glob("meta.db*"):
            shutil.copy2(path, old / path.name)
        # Life goes on after the backup: new topics, new ledgers (the id counter moves on).
        node.start()
        sent = produce(node, "after-backup", 10)
        node.stop()

        # The store goes back to the older backup while the bookie keeps its newer data.
        newer = tmp_path / "newer"
        newer.mkdir()
        for path in data_dir.glob("meta.db*"):
            shutil.move(path, newer / path.name)
        for path in old.iterdir():
            shutil.copy2(path, data_dir / path.name)
        refusal = start_refused(node)
        assert "is behind this bookie's data: its ledger-id counter is at " in refusal, refusal
        assert "Restore" in refusal and "from its newest backup" in refusal, refusal
        assert "Traceback" not in refusal, refusal

        # The way forward: the newest store. Nothing was lost.
        for path in data_dir.glob("meta.db*"):
            path.unlink()
        for path in newer.iterdir():
            shutil.copy2(path, data_dir / path.name)
        node.start()
        assert receive_all(node, "after-backup", "keep", 3000, expect=len(sent)) == sent
    finally:
        node.kill()
        print(node.log_tail())


# -- bookies on a private etcd ------------------------------------------------------------------


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    """A private etcd: cookies and the instance id live at fixed keys."""
    with EtcdServer() as server:
        yield server


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    factory = BookieFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()
        print(factory.logs())


@pytest.fixture
async def store(etcd: EtcdServer) -> AsyncIterator[MetadataStore]:
    s = await open_store(etcd.url)
    try:
        yield s
    finally:
        await s.close()


def bk(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "bk", "--metadata-url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def refusal(bookie: BookieProcess) -> str:
    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    return str(refused.value)


def wipe(bookie: BookieProcess) -> None:
    shutil.rmtree(bookie.journal_dir)
    shutil.rmtree(bookie.ledger_dir)


async def status(call: object) -> str:
    try:
        await call  # type: ignore[misc]
    except BookieError as e:
        return e.status_name
    return "OK"


async def recover_when_back(ledgers: LedgerClient, ledger_id: int) -> LedgerHandle:
    """Recovery, retried while the restarted bookie's connection comes back (gRPC waits out
    its reconnect backoff first); RecoveryError says retrying is safe."""
    for _attempt in range(10):
        try:
            return await ledgers.open_ledger(ledger_id, recovery=True)
        except RecoveryError as e:
            last = e
            await asyncio.sleep(1.0)
    raise last


async def test_wiped_bookie_is_refused_until_reregistered_then_starts_empty_and_recovery_does_not_count_it(
    etcd: EtcdServer, bookies: BookieFactory, store: MetadataStore, tmp_path: Path
) -> None:
    a, b, c = (bookies.start(metadata_url=etcd.url, journal_sync=False) for _ in range(3))
    instance = await read_instance_id(store)
    assert instance is not None
    for bookie in (a, b, c):
        found = await read_cookie(store, bookie.address)
        assert found is not None and found[0].instance_id == instance[0]
        assert found[0].journal_dir == str(bookie.journal_dir.resolve())
    config = LedgerClientConfig(read_timeout_s=2.0, add_timeout_s=3.0, speculative_read_s=0.2)
    async with LedgerClient(store, config) as ledgers:
        handle = await ledgers.create_ledger(3, 3, 2)
        payloads = [f"entry {i}".encode() for i in range(10)]
        for payload in payloads:
            await handle.add(payload)
        ledger_id = handle.ledger_id

        a.stop()
        old_disks = tmp_path / "a-old"
        shutil.copytree(a.base_dir, old_disks, ignore=shutil.ignore_patterns("*.log", "LOCK"))
        wipe(a)
        text = refusal(a)
        assert "are empty" in text and "were wiped or replaced" in text
        assert f"magnetar bk reregister --address {a.address}" in text

        # Refused while the bookie runs; accepted once it is stopped.
        running = bk(etcd.url, "reregister", "--address", b.address)
        assert running.returncode == 1 and "is running" in running.stderr
        result = bk(etcd.url, "reregister", "--address", a.address)
        assert result.returncode == 0, result.stderr
        assert "incarnation 2" in result.stdout
        cookie, _ = await read_cookie(store, a.address)  # type: ignore[misc]
        assert cookie.incarnation == 2 and not cookie.formatted
        assert cookie.wiped_below > ledger_id

        a.start()  # empty, as the new incarnation
        cookie, _ = await read_cookie(store, a.address)  # type: ignore[misc]
        assert cookie.formatted and cookie.incarnation == 2
        async with BookieClient(a.address, timeout=5) as direct:
            # An old ledger: the wiped bookie cannot say "absent".
            assert await status(direct.read(ledger_id, 0)) == "WIPED"
            assert await status(direct.read_lac(ledger_id)) == "WIPED"
            # A ledger newer than the re-registration: ordinary answers.
            assert await status(direct.read(cookie.wiped_below + 5, 0)) == "NO_SUCH_LEDGER"

        # Recovery with b down: a's "no such entry" does not count, so entry 10 cannot be
        # proven absent (Qw - Qa + 1 = 2 answers needed, only c's counts).
        b.stop()
        with pytest.raises(RecoveryError, match="neither found nor provably absent"):
            await ledgers.open_ledger(ledger_id, recovery=True)
        b.start()
        recovered = await recover_when_back(ledgers, ledger_id)
        assert recovered.metadata.is_closed and recovered.metadata.last_entry_id == 9
        assert [e.payload for e in await recovered.read(0, 9)] == payloads

        # The old disks coming back after the re-registration are refused.
        a.stop()
        wipe(a)
        shutil.copytree(old_disks / "journal", a.journal_dir)
        shutil.copytree(old_disks / "ledgers", a.ledger_dir)
        text = refusal(a)
        assert "are incarnation 1" in text and "records incarnation 2" in text
        assert "Wipe both directories" in text


async def test_swapped_directories_are_refused_and_work_again_once_put_back(
    etcd: EtcdServer, bookies: BookieFactory
) -> None:
    a, b = (bookies.start(metadata_url=etcd.url, journal_sync=False) for _ in range(2))
    async with BookieClient(a.address) as client_a:
        await client_a.add(1, 0, _entry(1, 0, b"on a"), master_key=b"k")
    a.stop()
    b.stop()
    swap = a.base_dir.parent / "swap"
    a.base_dir.rename(swap)
    b.base_dir.rename(a.base_dir)
    swap.rename(b.base_dir)
    assert f"holds the data of bookie {b.address}" in refusal(a)
    assert f"holds the data of bookie {a.address}" in refusal(b)
    b.base_dir.rename(swap)
    a.base_dir.rename(b.base_dir)
    swap.rename(a.base_dir)
    a.start()
    b.start()
    async with BookieClient(a.address) as client_a:
        assert await client_a.read(1, 0) == _entry(1, 0, b"on a")


async def test_a_bookie_against_a_reset_or_foreign_store_is_refused(
    etcd: EtcdServer, bookies: BookieFactory
) -> None:
    bookie = bookies.start(metadata_url=etcd.url, journal_sync=False)
    bookie.stop()
    with EtcdServer() as other:
        # A store that knows no cluster: reset or lost.
        bookie.metadata_url = other.url
        text = refusal(bookie)
        assert "does not know this bookie's cluster" in text and "Restore" in text
        other_store = await open_store(other.url)
        try:
            assert await read_instance_id(other_store) is None  # the refusal created nothing
        finally:
            await other_store.close()
        # Another cluster's store.
        foreign = bookies.start(metadata_url=other.url, journal_sync=False)
        text = refusal(bookie)
        assert "this bookie belongs to cluster" in text and "another cluster's" in text
        foreign.stop()  # while its etcd is up: stopped without it, it waits out its session
    bookie.metadata_url = etcd.url
    bookie.start()


def _entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return encode_entry(ledger_id, entry_id, entry_id - 1, len(payload), payload)
