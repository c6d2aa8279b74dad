"""Integrity of a bookie at its edges, with real bookie processes: a server socket never shares
an address in use; an entry over the size limit fails alone; a corrupt replica is read around,
and an entry with no intact replica is a clear EntryDigestError."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.common.ledger.bookie_client import BookieClient
from magnetar.common.ledger.entry import HEADER_SIZE, encode_entry, verify_entry
from magnetar.common.ledger.errors import (
    EntryDigestError,
    EntryTooLargeError,
    LedgerError,
    ReadError,
)
from tests.support.bookie import BookieFactory, BookieProcess, bookie_factory_fixture
from tests.support.damage import flip_byte_of
from tests.support.ledger_cluster import (
    LedgerCluster,
    ledger_cluster_fixture,
    payload_for,
    start_bookie,
)


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    yield from bookie_factory_fixture(tmp_path)


async def _add_and_read(address: str, ledger_id: int, entry_id: int) -> bytes:
    payload = f"ledger {ledger_id} entry {entry_id}".encode()
    async with BookieClient(address, timeout=10) as client:
        await client.add(ledger_id, entry_id, encode_entry(ledger_id, entry_id, -1, 1, payload))
        entry = await client.read(ledger_id, entry_id)
    header = verify_entry(entry)
    assert (header.ledger_id, header.entry_id) == (ledger_id, entry_id)
    return entry[-len(payload) :]


# -- server sockets ------------------------------------------------------------------------


@pytest.mark.parametrize("shared", ["port", "http_port"])
def test_second_bookie_on_a_port_in_use_refuses_to_start(
    bookies: BookieFactory, shared: str
) -> None:
    first = bookies.start(journal_sync=False)
    assert asyncio.run(_add_and_read(first.address, 7, 0)) == b"ledger 7 entry 0"

    second = bookies.create(journal_sync=False)
    setattr(second, shared, getattr(first, shared))
    # Run it to its end: waiting for /ready would ask the first bookie when the HTTP port is
    # the shared one.
    try:
        refused = subprocess.run(second.command(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a second bookie on the {shared} of a running one did not exit")
    message = refused.stdout + refused.stderr
    assert refused.returncode != 0, message
    bound = f"127.0.0.1:{getattr(first, shared)}"
    assert f"cannot listen on {bound} ({shared}): address already in use" in message, message
    assert "Traceback" not in message, message

    # The first bookie is untouched: still ready, still storing and serving its entries.
    assert first.running
    assert first.http("GET", "/ready")[0] == 200
    assert asyncio.run(_add_and_read(first.address, 7, 1)) == b"ledger 7 entry 1"
    assert "cannot listen" not in first.log_text()


# -- entry size ------------------------------------------------------------------------------

PULSAR_FRAME_LIMIT = 5 * 1024 * 1024 + 10 * 1024


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LedgerCluster]:
    yield from ledger_cluster_fixture(tmp_path, 3)


@pytest.fixture
def small_entry_cluster(tmp_path: Path) -> Iterator[LedgerCluster]:
    yield from ledger_cluster_fixture(tmp_path, 3, max_entry_size=4096)


async def test_too_large_entry_fails_alone_before_it_is_sent(cluster: LedgerCluster) -> None:
    async with cluster.client() as client:
        handle = await client.create_ledger(3, 2, 2)
        assert handle.max_entry_size == PULSAR_FRAME_LIMIT  # from the bookies' registrations
        ensemble = handle.ensemble
        assert await handle.add(b"first") == 0
        with pytest.raises(EntryTooLargeError) as err:
            await handle.add(b"x" * (PULSAR_FRAME_LIMIT - HEADER_SIZE + 1))
        assert err.value.size == PULSAR_FRAME_LIMIT + 1
        assert err.value.limit == PULSAR_FRAME_LIMIT
        # A 5 MiB message with room for headers fits; the entry ids have no hole.
        largest = b"y" * (PULSAR_FRAME_LIMIT - HEADER_SIZE)
        assert await handle.add(largest) == 1
        assert await handle.add(b"last") == 2
        assert handle.ensemble == ensemble
        assert len(handle.metadata.fragments) == 1, "a too-large add changed the ensemble"
        await handle.close()
        reader = await client.open_ledger(handle.ledger_id)
        got = [e.payload for e in await reader.read(0, 2)]
        assert got == [b"first", largest, b"last"]


async def test_too_large_answer_from_a_bookie_is_not_a_bookie_failure(
    small_entry_cluster: LedgerCluster,
) -> None:
    async with small_entry_cluster.client() as client:
        handle = await client.create_ledger(3, 3, 2)
        assert handle.max_entry_size == 4096
        ensemble = handle.ensemble
        assert await handle.add(b"zero") == 0
        # The handle's limit is stale (as if the bookies were reconfigured meanwhile), so
        # the bookies are the ones to refuse; an add queued behind the big one goes too.
        handle.max_entry_size = 1 << 20
        big = await handle.add_async(b"b" * 10_000)
        behind = await handle.add_async(b"behind")
        with pytest.raises(EntryTooLargeError, match="TOO_LARGE"):
            await big
        with pytest.raises(LedgerError, match="send it again"):
            await behind
        assert handle.max_entry_size < 10_000 + HEADER_SIZE
        # The handle goes on, on the same ensemble, with the refused ids reused.
        assert await handle.add(b"one") == 1
        assert await handle.add(b"two") == 2
        assert handle.ensemble == ensemble
        assert len(handle.metadata.fragments) == 1, "TOO_LARGE was taken for a bookie failure"
        await handle.close()
        reader = await client.open_ledger(handle.ledger_id)
        assert reader.metadata.last_entry_id == 2
        assert [e.payload for e in await reader.read(0, 2)] == [b"zero", b"one", b"two"]


# -- digest mismatch on a replica ---------------------------------------------------------------


def corrupt_entry_on_disk(bookie: BookieProcess, payload: bytes) -> None:
    """Flip a byte of ``payload`` where it lies in the stopped bookie's entry logs."""
    flip_byte_of(bookie.entry_log_files, payload)


def test_digest_mismatch_on_one_replica_is_read_from_another(cluster: LedgerCluster) -> None:
    async def write() -> tuple[int, tuple[str, ...]]:
        async with cluster.client() as client:
            handle = await client.create_ledger(3, 3, 3)
            for i in range(20):
                await handle.add(payload_for(handle.ledger_id, i))
            await handle.close()
            return handle.ledger_id, handle.ensemble

    ledger_id, ensemble = asyncio.run(write())
    for bookie in cluster.bookies:
        assert bookie.stop() == 0  # the final checkpoint puts every entry in the entry logs
    # Entry 0: corrupt on the replica asked first only. Entry 5: corrupt on every replica.
    corrupt_entry_on_disk(cluster.bookie(ensemble[0]), payload_for(ledger_id, 0))
    for bookie in cluster.bookies:
        corrupt_entry_on_disk(bookie, payload_for(ledger_id, 5))
    for bookie in cluster.bookies:
        start_bookie(bookie)

    async def read() -> None:
        async with cluster.client() as client:
            handle = await client.open_ledger(ledger_id)
            entry = await handle.read_entry(0)
            assert entry.payload == payload_for(ledger_id, 0)
            assert client.corrupt_reads == 1
            got = await handle.read(0, 4)
            assert [e.payload for e in got] == [payload_for(ledger_id, i) for i in range(5)]
            with pytest.raises(EntryDigestError) as err:
                await handle.read_entry(5)
            assert (err.value.ledger_id, err.value.entry_id) == (ledger_id, 5)
            assert "DIGEST_MISMATCH" in str(err.value)
            assert isinstance(err.value, ReadError)  # callers of the old type still catch it
            got = await handle.read(6, 19)
            assert [e.payload for e in got] == [payload_for(ledger_id, i) for i in range(6, 20)]

    asyncio.run(read())
