"""A bookie whose metadata session expires (the process was paused past its TTL) notices the
loss when it runs again and registers itself under a new session."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.common.ledger.bookie_client import BookieClient
from magnetar.common.ledger.bookies import registration_key
from magnetar.common.ledger.entry import encode_entry, verify_entry
from magnetar.common.metadata import open_store
from tests.support.bookie import BookieFactory, bookie_factory_fixture
from tests.support.etcd import EtcdServer


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    yield from bookie_factory_fixture(tmp_path)


async def _wait_for(predicate, what: str, seconds: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + seconds
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_bookie_registers_again_after_its_session_expired(
    etcd_server: EtcdServer, bookies: BookieFactory
) -> None:
    bookie = bookies.start(metadata_url=etcd_server.url, session_ttl_s=2, journal_sync=False)
    key = registration_key(bookie.address)
    store = await open_store(etcd_server.url)
    try:

        async def registered() -> bool:
            return await store.get(key) is not None

        async def gone() -> bool:
            return await store.get(key) is None

        assert await registered()
        bookie.pause()
        try:
            await _wait_for(gone, "the paused bookie's lease to expire")
        finally:
            bookie.resume()
        await _wait_for(registered, "the bookie to register again")
        assert "lost its metadata session" in bookie.log_text()

        # And it still serves.
        async with BookieClient(bookie.address) as client:
            entry = encode_entry(7, 0, -1, 5, b"hello")
            await client.add(7, 0, entry)
            assert verify_entry(await client.read(7, 0)).entry_id == 0
    finally:
        await store.close()
