"""Orphan-ledger garbage collection with real bookie processes and a real etcd.

A ledger whose metadata is gone but whose data stayed on a bookie (the bookie was down when the
ledger was deleted, or the metadata was removed by hand) is deleted by that bookie's GC; the
other ledgers stay, and so does a ledger being created right now (adds before its metadata).
A ledger whose topic's list lost it (a store that went back in time) stays and is reported.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import pytest

from magnetar.bookie.gc import managed_ledger_key
from magnetar.common.ledger.bookie_client import (
    BookieClient,
    BookieError,
    BookieUnavailableError,
)
from magnetar.common.ledger.client import LedgerClient, master_key_for
from magnetar.common.ledger.entry import encode_entry
from magnetar.common.ledger.managed_ledger_list import LedgerInfo, ManagedLedgerRecord
from magnetar.common.ledger.metadata import (
    LEDGER_ID_COUNTER,
    Fragment,
    LedgerMetadata,
    ledger_key,
)
from magnetar.common.metadata import NOT_EXISTS, MetadataStore, open_store
from magnetar.common.proto import bookie_pb2 as pb
from tests.support.bookie import BookieProcess
from tests.support.ledger_cluster import LedgerCluster, ledger_cluster_fixture, payload_for

#: Short enough for a test, long enough that a ledger written to in the same breath is "recent"
#: even on a loaded machine (the scans after an add go through HTTP and etcd round trips).
MIN_IDLE_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerCluster]:
    yield from ledger_cluster_fixture(
        tmp_path_factory.mktemp("orphan-gc"),
        3,
        gc_interval_s=0,  # GC only on request: each test says when
        gc_orphan_min_idle_s=MIN_IDLE_S,
    )


def run_gc(bookie: BookieProcess) -> dict[str, object]:
    status, body = bookie.http("POST", "/api/v1/bookie/gc")
    assert status == 200, body
    return json.loads(body)


async def bookie_status(address: str, ledger_id: int, entry_id: int = 0) -> str:
    """What the bookie answers to a read. A bookie just restarted may be refused for a moment
    (gRPC's reconnect backoff from before the restart): asked again then."""
    async with BookieClient(address) as client:
        for _ in range(100):
            try:
                await client.read(ledger_id, entry_id)
            except BookieUnavailableError:
                await asyncio.sleep(0.1)
                continue
            except BookieError as e:
                return pb.Status.Name(e.status)
            return "OK"
    raise AssertionError(f"bookie {address} stayed unavailable")


def metric(bookie: BookieProcess, name: str) -> float:
    status, body = bookie.http("GET", "/metrics")
    assert status == 200
    match = re.search(rf"^{re.escape(name)} (\S+)$", body.decode(), re.MULTILINE)
    assert match, f"{name} not exported"
    return float(match.group(1))


def entry_log_bytes(bookie: BookieProcess) -> int:
    status, body = bookie.http("GET", "/api/v1/bookie/info")
    assert status == 200
    return int(json.loads(body)["entry_log_bytes"])


async def write_ledger(client: LedgerClient, entries: int, size: int = 2000) -> int:
    handle = await client.create_ledger(3, 3, 2)
    for i in range(entries):
        await handle.add_async(payload_for(handle.ledger_id, i, size))
    await handle.close()
    return handle.ledger_id


async def read_back(client: LedgerClient, ledger_id: int, entries: int, size: int = 2000) -> None:
    handle = await client.open_ledger(ledger_id)
    got = await handle.read(0, entries - 1)
    assert [e.payload for e in got] == [payload_for(ledger_id, i, size) for i in range(entries)]


async def test_orphans_are_collected_and_the_rest_stays(cluster: LedgerCluster) -> None:
    entries = 100
    down = cluster.bookies[0]
    async with cluster.client() as client:
        deleted_while_down, metadata_removed, kept = [
            await write_ledger(client, entries) for _ in range(3)
        ]
        # 1. A bookie is down while a ledger is deleted: its copy is left behind.
        down.stop()
        await client.delete_ledger(deleted_while_down)
        down.start()
        # 2. A ledger's metadata removed directly (a delete whose bookie calls all failed).
        await client.store.delete(ledger_key(metadata_removed))
        for b in cluster.bookies:
            b.checkpoint()  # entries into entry logs, so GC must reclaim log space too
        assert await bookie_status(down.address, deleted_while_down) == "OK"
        logs_before = entry_log_bytes(down)

        await asyncio.sleep(MIN_IDLE_S + 0.2)
        result = run_gc(down)
        assert result["orphan_ledgers"] == sorted([deleted_while_down, metadata_removed]), result
        assert result["freed_bytes"] > 0, result
        assert entry_log_bytes(down) < logs_before
        assert metric(down, "magnetar_bookie_gc_orphan_ledgers_total") == 2
        for others in cluster.bookies[1:]:
            assert run_gc(others)["orphan_ledgers"] == [metadata_removed]

        for b in cluster.bookies:
            for gone in (deleted_while_down, metadata_removed):
                assert await bookie_status(b.address, gone) == "NO_SUCH_LEDGER"
            assert await bookie_status(b.address, kept, entries - 1) == "OK"
        await read_back(client, kept, entries)

        # The deletion is durable: a crash and restart do not bring the data back.
        down.restart(kill=True)
        assert await bookie_status(down.address, metadata_removed) == "NO_SUCH_LEDGER"
        assert run_gc(down)["orphan_ledgers"] == []
        await read_back(client, kept, entries)


async def allocate_ledger_id(store: MetadataStore) -> int:
    """Take the next id from the counter, as LedgerClient does before writing the metadata."""
    current = await store.get(LEDGER_ID_COUNTER)
    assert current is not None, "the cluster created ledgers, so the counter exists"
    next_id = int(current.value) + 1
    await store.put(LEDGER_ID_COUNTER, str(next_id).encode(), current.version)
    return next_id


async def add_direct(address: str, ledger_id: int, entries: range, key: bytes) -> None:
    async with BookieClient(address) as bookie:
        await asyncio.gather(
            *(
                bookie.add(
                    ledger_id,
                    i,
                    encode_entry(ledger_id, i, i - 1, 0, payload_for(ledger_id, i)),
                    master_key=key,
                )
                for i in entries
            )
        )


async def test_a_ledger_being_created_is_not_collected(cluster: LedgerCluster) -> None:
    target = cluster.bookies[1]
    store = await open_store(cluster.url)
    try:
        async with LedgerClient(store) as client:
            await write_ledger(client, 1)  # the counter exists
            key = master_key_for(b"creating")
            # A writer took an id and its first adds reached the bookie; its metadata is late.
            creating = await allocate_ledger_id(store)
            await add_direct(target.address, creating, range(10), key)
            # Adds for an id the counter has not even handed out yet.
            ahead = int((await store.get(LEDGER_ID_COUNTER)).value) + 1000  # type: ignore[union-attr]
            await add_direct(target.address, ahead, range(3), key)

            # Within the idle window, and with more adds still arriving: left alone.
            for batch in range(3):
                assert run_gc(target)["orphan_ledgers"] == []
                await add_direct(target.address, creating, range(10 + batch, 11 + batch), key)
            # The metadata lands after the scans; past the idle window it now exists.
            metadata = LedgerMetadata(
                ensemble_size=1,
                write_quorum=1,
                ack_quorum=1,
                fragments=(Fragment(0, (target.address,)),),
                master_key=key,
            )
            await store.put(ledger_key(creating), metadata.to_bytes(), NOT_EXISTS)
            await asyncio.sleep(MIN_IDLE_S + 0.2)
            # The id above the counter read at the scan's start is never a candidate either.
            assert run_gc(target)["orphan_ledgers"] == []
            assert await bookie_status(target.address, ahead) == "OK"

            handle = await client.open_ledger(creating)  # recovery: fences and closes it
            got = await handle.read(0, 12)
            assert [e.payload for e in got] == [payload_for(creating, i) for i in range(13)]
    finally:
        await store.close()


async def test_periodic_gc_collects_on_its_own(cluster: LedgerCluster) -> None:
    bookie = cluster.factory.create(
        metadata_url=cluster.url,
        journal_sync=False,
        gc_interval_s=0.5,
        gc_orphan_min_idle_s=0.5,
    )
    bookie.start()
    try:
        store = await open_store(cluster.url)
        try:
            orphan = await allocate_ledger_id(store)  # allocated, metadata never written
            await add_direct(bookie.address, orphan, range(5), b"k")
            for _ in range(100):
                if await bookie_status(bookie.address, orphan) == "NO_SUCH_LEDGER":
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"periodic GC never collected ledger {orphan}")
            # The ledger reads as gone as soon as its deletion starts; the count follows once
            # the deletion is recorded.
            for _ in range(50):
                if metric(bookie, "magnetar_bookie_gc_orphan_ledgers_total") != 0:
                    break
                await asyncio.sleep(0.1)
            assert metric(bookie, "magnetar_bookie_gc_orphan_ledgers_total") == 1
            assert "Traceback" not in bookie.log_text()
        finally:
            await store.close()
    finally:
        bookie.stop()


async def test_a_ledger_its_topic_does_not_list_is_reported_and_kept(
    cluster: LedgerCluster,
) -> None:
    """A store that went back in time: the topic's ledger list lost the two newest of its
    ledgers (one closed, one still open), whose metadata survived. GC deletes neither; every
    bookie holding them reports them, and ``magnetar bk listunreferenced`` lists them."""
    name = "t/ns/persistent/rolled-back"
    custom = {"managed-ledger": name.encode(), "application": b"magnetar"}
    entries = 10
    async with cluster.client() as client:
        ids = []
        for close in (True, True, False):
            handle = await client.create_ledger(3, 3, 2, custom_metadata=custom)
            for i in range(entries):
                await handle.add_async(payload_for(handle.ledger_id, i, 2000))
            if close:
                await handle.close()
            ids.append(handle.ledger_id)
        listed, lost_closed, lost_open = ids
        holders = [b for b in cluster.bookies if b.address in handle.metadata.fragments[0].bookies]
        assert len(holders) == 3
        # The record as the broker writes it.
        record = ManagedLedgerRecord(name, [LedgerInfo(listed, entries, closed=True)])
        await client.store.put(managed_ledger_key(name), record.to_bytes())
        try:
            for bookie in holders:
                assert run_gc(bookie)["orphan_ledgers"] == []
                assert metric(bookie, UNLISTED) == 2
                log = bookie.log_text()
                for ledger_id in (lost_closed, lost_open):
                    assert f"ledger {ledger_id} (entries up to {entries - 1}) belongs to" in log
            bk = cluster.bk("listunreferenced", "--json")
            assert bk.returncode == 0, bk.stderr
            rows = [json.loads(line) for line in bk.stdout.splitlines()]
            assert rows == [
                {
                    "ledger_id": ledger_id,
                    "reason": "unlisted",
                    "managed_ledger": name,
                    "last_entry_id": entries - 1,
                }
                for ledger_id in (lost_closed, lost_open)
            ]
            await read_back(client, lost_closed, entries)

            # Adopted (listed again): no longer reported.
            record.ledgers += [LedgerInfo(i) for i in (lost_closed, lost_open)]
            await client.store.put(managed_ledger_key(name), record.to_bytes())
            for bookie in holders:
                run_gc(bookie)
                assert metric(bookie, UNLISTED) == 0
        finally:
            for ledger_id in ids:
                await client.delete_ledger(ledger_id)
            await client.store.delete(managed_ledger_key(name))


UNLISTED = 'magnetar_bookie_unreferenced_ledgers{reason="unlisted"}'
