"""Ledger master keys (BookKeeper's): a bookie keeps the key of a ledger's first add and refuses
adds under any other key, across restarts; a ledger id reused after a metadata store reset can
neither append to nor serve the old ledger's entries; new counters never hand out old ids.

Real bookie processes, a real etcd where a ledger client needs registrations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from magnetar.bookie import journal as jnl
from magnetar.common.ledger.bookie_client import BookieClient, BookieError
from magnetar.common.ledger.client import LedgerClient, first_ledger_id
from magnetar.common.ledger.entry import encode_entry
from magnetar.common.ledger.errors import LedgerUnauthorizedError
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.metadata import LEDGER_ID_COUNTER, ledger_key
from magnetar.common.metadata import NOT_EXISTS, MetadataStore, open_store
from tests.support.bookie import BookieFactory, bookie_factory_fixture
from tests.support.etcd import EtcdServer


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    yield from bookie_factory_fixture(tmp_path)


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


@pytest.fixture
async def store(etcd: EtcdServer) -> AsyncIterator[MetadataStore]:
    s = await open_store(etcd.url)
    try:
        yield s
    finally:
        await s.close()


def entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return encode_entry(ledger_id, entry_id, entry_id - 1, (entry_id + 1) * 10, payload)


async def status(call: object) -> str:
    try:
        await call  # type: ignore[misc]
    except BookieError as e:
        return e.status_name
    return "OK"


async def test_an_add_under_another_master_key_is_refused_and_stays_refused_after_a_crash(
    bookies: BookieFactory,
) -> None:
    bookie = bookies.start(journal_sync=False)
    first = entry(42, 0, b"the owner's")
    async with BookieClient(bookie.address, timeout=5) as client:
        await client.add(42, 0, first, master_key=b"owner")
        assert await status(client.add(42, 1, entry(42, 1, b"x"), master_key=b"intruder")) == (
            "UNAUTHORIZED"
        )
        # Not even as a recovery add, nor without a key.
        assert await status(
            client.add(42, 1, entry(42, 1, b"x"), recovery=True, master_key=b"intruder")
        ) == ("UNAUTHORIZED")
        assert await status(client.add(42, 1, entry(42, 1, b"x"))) == "UNAUTHORIZED"
        await client.add(42, 1, entry(42, 1, b"owner again"), master_key=b"owner")
    # The key was journaled with the first add (the same fsync): kill -9 before any checkpoint.
    bookie.restart(kill=True)
    async with BookieClient(bookie.address, timeout=5) as client:
        assert await status(client.add(42, 2, entry(42, 2, b"x"), master_key=b"intruder")) == (
            "UNAUTHORIZED"
        )
        await client.add(42, 2, entry(42, 2, b"owner"), master_key=b"owner")
        assert await client.read(42, 0) == first
        # Another ledger is another key.
        await client.add(43, 0, entry(43, 0, b"other"), master_key=b"intruder")
    # A clean stop checkpoints: the keys move to the index and the journal files that held
    # them go. Both ledgers still refuse a stranger's key, from the index alone.
    bookie.restart()
    journaled = [
        record.kind
        for path in bookie.journal_files
        for record in jnl.scan_journal_bytes(path.read_bytes()).records
    ]
    assert jnl.RecordType.MASTER_KEY not in journaled
    async with BookieClient(bookie.address, timeout=5) as client:
        assert await status(client.add(42, 3, entry(42, 3, b"x"), master_key=b"intruder")) == (
            "UNAUTHORIZED"
        )
        assert await status(client.add(43, 1, entry(43, 1, b"x"), master_key=b"owner")) == (
            "UNAUTHORIZED"
        )
        await client.add(42, 3, entry(42, 3, b"owner"), master_key=b"owner")


async def test_a_ledger_id_reused_after_a_store_reset_gets_nothing_of_the_old_ledger(
    etcd: EtcdServer, bookies: BookieFactory, store: MetadataStore
) -> None:
    bookies.start(metadata_url=etcd.url, journal_sync=False)
    async with LedgerClient(store) as ledgers:
        old = await ledgers.create_ledger(1, 1, 1)
        assert old.ledger_id >= first_ledger_id(0)  # the counter started at the clock
        assert len(old.metadata.master_key) == 16
        for i in range(5):
            await old.add(f"old {i}".encode())
        await old.close()

        # The metadata store forgets the ledger and its counter (a reset); a writer then gets
        # the same id with a fresh key: its adds are refused, nothing old becomes readable.
        metadata, version = await ledgers.read_metadata(old.ledger_id)
        await store.delete(ledger_key(old.ledger_id), version)
        await store.delete(LEDGER_ID_COUNTER)
        reused = replace(
            metadata,
            state=type(metadata.state).OPEN,
            last_entry_id=-1,
            length=0,
            master_key=b"a new writer key",
        )
        new_version = await store.put(ledger_key(old.ledger_id), reused.to_bytes(), NOT_EXISTS)
        handle = LedgerHandle(ledgers, old.ledger_id, reused, new_version, writable=True)
        with pytest.raises(LedgerUnauthorizedError, match="UNAUTHORIZED"):
            await handle.add(b"new data")
        assert handle.readable_last_entry == -1
        await handle.close()

        # A new counter starts above every id the old one handed out.
        fresh = await ledgers.create_ledger(1, 1, 1)
        assert fresh.ledger_id > old.ledger_id
        await fresh.add(b"fresh")
        await fresh.close()


async def test_recovery_rewrites_with_the_ledgers_key(
    etcd: EtcdServer, bookies: BookieFactory, store: MetadataStore
) -> None:
    for _ in range(3):
        bookies.start(metadata_url=etcd.url, journal_sync=False)
    async with LedgerClient(store) as ledgers:
        writer = await ledgers.create_ledger(3, 3, 2, password=b"secret")
        again = await ledgers.create_ledger(1, 1, 1, password=b"secret")
        assert writer.metadata.master_key == again.metadata.master_key  # derived, not random
        payloads = [f"entry {i}".encode() for i in range(20)]
        for payload in payloads:
            await writer.add(payload)
        recovered = await ledgers.open_ledger(writer.ledger_id, recovery=True)
        assert recovered.metadata.last_entry_id == 19
        assert [e.payload for e in await recovered.read(0, 19)] == payloads
