"""The in-process bookie client answers exactly as the gRPC one, on the same real bookie."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.local_client import LocalBookieClient
from magnetar.bookie.service import Bookie
from magnetar.common.ledger.bookie_client import BookieClient, BookieError, add_entries
from magnetar.common.ledger.entry import DigestMismatchError, check_entry, encode_entry
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


@pytest.mark.parametrize("kind", ["grpc", "local"])
async def test_groups_are_answered_once_on_both_paths(bookie: Bookie, kind: str) -> None:
    """``add_entries`` (what the ledger handle sends a group with): one answer per group, in
    order with a ledger's single adds; a group holding an
    entry the bookie refuses is answered with that refusal (its other entries may be stored);
    groups larger than one storage batch are answered once too."""
    client = (
        BookieClient(bookie.address)
        if kind == "grpc"
        else LocalBookieClient(bookie.address, bookie.storage, bookie.info)
    )
    try:
        answers: list[tuple[str, int | None]] = []

        def told(name: str):  # type: ignore[no-untyped-def]
            return lambda error: answers.append((name, None if error is None else error.status))

        add_entries(client, 9, 0, [entry(9, i) for i in range(10)], told("first ten"))
        client.add_entry(9, 10, entry(9, 10), told("single"))
        add_entries(client, 9, 11, [entry(9, i) for i in range(11, 14)], told("three"))
        refused = [entry(9, 14), entry(9, 15, size=8192), entry(9, 16)]
        add_entries(client, 9, 14, refused, told("one too large"))
        # 400 entries of 3,000 bytes: more than one batch of the in-process path (1 MiB).
        add_entries(client, 10, 0, [entry(10, i, size=3000) for i in range(400)], told("big"))
        await asyncio.wait_for(client.add(10, 400, entry(10, 400)), 10)
        # Once each; ledger 9's in the order sent (another ledger's may come between).
        assert sorted(answers, key=str) == sorted(
            [
                ("first ten", None),
                ("single", None),
                ("three", None),
                ("one too large", pb.TOO_LARGE),
                ("big", None),
            ],
            key=str,
        )
        assert [name for name, _ in answers if name != "big"] == [
            "first ten",
            "single",
            "three",
            "one too large",
        ]
        assert client.pending_adds == 0
        for i in (0, 9, 10, 13):
            assert await client.read(9, i) == entry(9, i)
        assert await client.read(10, 399) == entry(10, 399, size=3000)
    finally:
        await client.close()


@pytest.mark.parametrize("kind", ["grpc", "local"])
async def test_a_corrupt_digest_is_caught_on_add_over_the_wire_and_on_read(
    bookie: Bookie, kind: str
) -> None:
    """Over gRPC the bookie checks an entry's digest as it is added (a wire can flip bits);
    the in-process client's entries were encoded in the same process a moment before, so
    their digests are not computed again there (BookKeeper's bookies never do). Either way
    the ledger client's reader, which checks every entry it reads, would not take it."""
    client = (
        BookieClient(bookie.address)
        if kind == "grpc"
        else LocalBookieClient(bookie.address, bookie.storage, bookie.info)
    )
    try:
        await client.add(11, 0, entry(11, 0))
        corrupt = bytearray(entry(11, 1))
        corrupt[-3] ^= 0x40
        if kind == "grpc":
            with pytest.raises(BookieError) as refused:
                await client.add(11, 1, bytes(corrupt))
            assert refused.value.status == pb.DIGEST_MISMATCH
            with pytest.raises(BookieError) as missing:
                await client.read(11, 1)
            assert missing.value.status == pb.NO_SUCH_ENTRY
        else:
            await client.add(11, 1, bytes(corrupt))
            with pytest.raises(DigestMismatchError):
                check_entry(await client.read(11, 1))  # what the ledger client's reader does
        assert await client.read(11, 0) == entry(11, 0)
        short = b"\x00" * 10  # too short for a header: refused on both paths
        with pytest.raises(BookieError) as bad:
            await client.add(11, 2, short)
        assert bad.value.status == pb.BAD_REQUEST
    finally:
        await client.close()
