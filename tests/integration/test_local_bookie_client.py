"""The in-process bookie client answers exactly as the gRPC one, on the same real bookie."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.local_client import LocalBookieClient
from magnetar.bookie.service import Bookie
from magnetar.common.ledger.bookie_client import BookieClient, BookieError
from magnetar.common.ledger.entry import encode_entry
from magnetar.common.metadata import open_store
from magnetar.common.proto import bookie_pb2 as pb


@pytest.fixture
async def bookie(tmp_path: Path) -> AsyncIterator[Bookie]:
    store = await open_store(f"local://{tmp_path}/meta.db")
    node = Bookie(
        BookieConfig(
            bind_address="127.0.0.1",
            advertised_address="127.0.0.1",
            port=0,
            http_port=0,
            journal_dir=str(tmp_path / "journal"),
            ledger_dir=str(tmp_path / "ledgers"),
            journal_sync=False,
            max_entry_size=4096,
        ),
        store,
    )
    await node.start()
    try:
        yield node
    finally:
        await node.stop()
        await store.close()


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = bytes([entry_id % 251]) * size
    return encode_entry(ledger_id, entry_id, entry_id - 1, size * (entry_id + 1), payload)


@pytest.mark.parametrize("kind", ["grpc", "local"])
async def test_same_answers_on_both_paths(bookie: Bookie, kind: str) -> None:
    client = (
        BookieClient(bookie.address)
        if kind == "grpc"
        else LocalBookieClient(bookie.address, bookie.storage, bookie.info)
    )
    try:
        order: list[int] = []

        def done(entry_id: int):  # type: ignore[no-untyped-def]
            return lambda error: order.append(entry_id if error is None else -entry_id)

        for i in range(200):
            client.add_entry(7, i, entry(7, i), done(i))
        await asyncio.wait_for(client.add(7, 200, entry(7, 200)), 10)
        assert order == list(range(200))  # completions in order, all ok
        assert client.pending_adds == 0
        assert await client.read(7, 5) == entry(7, 5)
        assert (await client.read_lac(7)).last_entry_id == 200

        with pytest.raises(BookieError) as missing:
            await client.read(7, 999)
        assert missing.value.status == pb.NO_SUCH_ENTRY
        with pytest.raises(BookieError) as unknown:
            await client.read(8, 0)
        assert unknown.value.status in (pb.NO_SUCH_LEDGER, pb.NO_SUCH_ENTRY)
        with pytest.raises(BookieError) as too_big:
            await client.add(7, 201, entry(7, 201, size=8192))
        assert too_big.value.status == pb.TOO_LARGE
        with pytest.raises(BookieError) as timeout:
            await client.read_lac(7, previous=200, wait_ms=50)
        assert timeout.value.status == pb.TIMEOUT

        position = await client.fence(7)
        assert position.last_entry_id == 200
        with pytest.raises(BookieError) as fenced:
            await client.add(7, 201, entry(7, 201))
        assert fenced.value.status == pb.FENCED
        await client.add(7, 201, entry(7, 201), recovery=True)  # recovery may still write
        assert (await client.info()).free_bytes > 0

        await client.delete_ledger(7)
        with pytest.raises(BookieError):
            await client.read(7, 5)
    finally:
        await client.close()
