"""The ledger client against a real etcd and real bookie processes, and the ``magnetar bk`` tools.

One cluster (etcd + 3 bookies) serves the module; every test works on its own ledgers.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections.abc import Iterator

import crc32c
import grpc
import pytest

from magnetar.common.ledger.bookie_client import BookieClient, BookieError
from magnetar.common.ledger.distribution import QuorumConfigError
from magnetar.common.ledger.errors import (
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from magnetar.common.ledger.metadata import LedgerState
from magnetar.common.ledger.placement import NotEnoughBookiesError
from magnetar.common.proto import bookie_pb2 as pb
from magnetar.common.proto import bookie_pb2_grpc
from tests.support.etcd import free_port
from tests.support.ledger_cluster import LedgerCluster, ledger_cluster_fixture, payload_for
from tests.support.polling import wait_until_async

BOOKIES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerCluster]:
    yield from ledger_cluster_fixture(tmp_path_factory.mktemp("ledger-cluster"), BOOKIES)


def payloads(ledger_id: int, count: int, seed: int = 0) -> list[bytes]:
    """Payloads of varied sizes (empty ones included)."""
    rng = random.Random(seed)
    sizes = [0, 1, 5000, *(rng.randint(0, 3000) for _ in range(count - 3))]
    return [payload_for(ledger_id, i, size)[:size] for i, size in enumerate(sizes[:count])]


async def test_create_add_read_close_round_trip(cluster: LedgerCluster) -> None:
    async with cluster.client() as client:
        handle = await client.create_ledger(3, 2, 2, custom_metadata={"owner": b"test"})
        assert len(set(handle.ensemble)) == 3
        assert set(handle.ensemble) == {b.address for b in cluster.bookies}
        sent = payloads(handle.ledger_id, 300)
        # Pipelined adds, then some one at a time: ids are consecutive and in order.
        futures = [await handle.add_async(p) for p in sent[:250]]
        ids = list(await asyncio.gather(*futures))
        for p in sent[250:]:
            ids.append(await handle.add(p))
        assert ids == list(range(300))
        assert handle.last_add_confirmed == 299
        await handle.close()
        assert handle.metadata.state is LedgerState.CLOSED
        with pytest.raises(LedgerClosedError):
            await handle.add(b"after close")

    async with cluster.client() as reader:
        metadata, _ = await reader.read_metadata(handle.ledger_id)
        assert metadata.state is LedgerState.CLOSED
        assert metadata.last_entry_id == 299
        assert metadata.length == sum(len(p) for p in sent)
        assert (metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum) == (3, 2, 2)
        assert metadata.custom_metadata == {"owner": b"test"}
        assert len(metadata.fragments) == 1

        opened = await reader.open_ledger(handle.ledger_id)
        assert opened.readable_last_entry == 299
        entries = await opened.read(0, 299)
        assert [e.entry_id for e in entries] == list(range(300))
        for e, p in zip(entries, sent, strict=True):
            assert e.payload == p, f"entry {e.entry_id} came back different"
        running = 0
        for e, p in zip(entries, sent, strict=True):
            running += len(p)
            assert e.length == running
        assert (await opened.read_entry(2)).payload == sent[2]
        with pytest.raises(NoSuchEntryError):
            await opened.read_entry(300)
        with pytest.raises(NoSuchEntryError):
            await opened.read(250, 300)
        with pytest.raises(LedgerClosedError):
            await opened.add(b"a reader cannot write")
        assert reader.corrupt_reads == 0


async def test_batch_reads_by_range_and_by_entry_give_the_same_entries(
    cluster: LedgerCluster,
) -> None:
    """``read_batch``: range reads where every bookie stores every entry (E = Qw), one read
    per entry where entries are striped (E > Qw); the same entries as ``read`` either way."""
    async with cluster.client() as client:
        written = {}
        for quorum in ((2, 2, 2), (3, 2, 2)):
            handle = await client.create_ledger(*quorum)
            sent = payloads(handle.ledger_id, 120, seed=7)
            await asyncio.gather(*[await handle.add_async(p) for p in sent])
            await handle.close()
            written[handle.ledger_id] = sent
    async with cluster.client() as reader:
        for ledger_id, sent in written.items():
            opened = await reader.open_ledger(ledger_id, recovery=False)
            for first, last in ((0, 119), (5, 5), (17, 101)):
                batch = await opened.read_batch(first, last)
                assert [e.entry_id for e in batch] == list(range(first, last + 1))
                assert [e.payload for e in batch] == sent[first : last + 1]
                assert batch == await opened.read(first, last)
            with pytest.raises(NoSuchEntryError):
                await opened.read_batch(100, 120)
        assert reader.corrupt_reads == 0


class BookieBeforeRangeReads(bookie_pb2_grpc.BookieServicer):
    """The gRPC surface of a bookie older than range reads: ``ReadEntry`` answered by a real
    bookie, ``ReadEntries`` left to gRPC (UNIMPLEMENTED)."""

    def __init__(self, real: BookieClient) -> None:
        self.real = real

    async def ReadEntry(self, request: pb.ReadRequest, context: object) -> pb.ReadResponse:
        try:
            entry = await self.real.read(request.ledger_id, request.entry_id, fence=request.fence)
        except BookieError as e:
            return pb.ReadResponse(status=e.status, message=str(e))
        return pb.ReadResponse(
            status=pb.OK, ledger_id=request.ledger_id, entry_id=request.entry_id, entry=entry
        )


async def test_bookies_without_range_reads_are_read_entry_by_entry(
    cluster: LedgerCluster,
) -> None:
    async with cluster.client() as client:
        handle = await client.create_ledger(2, 2, 2)
        sent = payloads(handle.ledger_id, 40, seed=3)
        await asyncio.gather(*[await handle.add_async(p) for p in sent])
        await handle.close()
    real = BookieClient(handle.ensemble[0])
    server = grpc.aio.server()
    bookie_pb2_grpc.add_BookieServicer_to_server(BookieBeforeRangeReads(real), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with cluster.client() as reader:
            for address in handle.ensemble:  # both replicas answer as the older bookie does
                reader.add_local_bookie(address, BookieClient(f"127.0.0.1:{port}"))
            opened = await reader.open_ledger(handle.ledger_id, recovery=False)
            batch = await opened.read_batch(0, 39)
            assert [e.payload for e in batch] == sent
            assert not any(reader.has_range_read(a) for a in handle.ensemble)
            assert [e.payload for e in await opened.read_batch(10, 12)] == sent[10:13]
    finally:
        await server.stop(None)
        await real.close()


async def test_empty_ledger_closes_with_no_entries(cluster: LedgerCluster) -> None:
    async with cluster.client() as client:
        handle = await client.create_ledger(2, 2, 1)
        await handle.close()
        metadata, _ = await client.read_metadata(handle.ledger_id)
        assert (metadata.state, metadata.last_entry_id, metadata.length) == (
            LedgerState.CLOSED,
            -1,
            0,
        )
        opened = await client.open_ledger(handle.ledger_id)
        assert await opened.read(0, -1) == []


async def test_bad_quorums_and_too_few_bookies_name_the_counts(cluster: LedgerCluster) -> None:
    async with cluster.client() as client:
        before = await client.list_ledgers()
        with pytest.raises(QuorumConfigError) as bad:
            await client.create_ledger(2, 3, 2)
        assert "E=2" in str(bad.value) and "Qw=3" in str(bad.value) and "Qa=2" in str(bad.value)
        with pytest.raises(QuorumConfigError) as bad:
            await client.create_ledger(3, 2, 3)
        assert "Qw=2" in str(bad.value) and "Qa=3" in str(bad.value)
        with pytest.raises(QuorumConfigError):
            await client.create_ledger(3, 3, 0)
        with pytest.raises(NotEnoughBookiesError) as few:
            await client.create_ledger(BOOKIES + 2, 2, 2)
        message = str(few.value)
        assert f"need {BOOKIES + 2}" in message, message
        assert f"{BOOKIES} are registered" in message, message
        # A refused create leaves nothing behind.
        assert await client.list_ledgers() == before


async def test_ledger_ids_unique_across_concurrent_clients(cluster: LedgerCluster) -> None:
    async with cluster.client() as a, cluster.client() as b:

        async def create(client_index: int) -> list[int]:
            client = (a, b)[client_index % 2]
            handles = await asyncio.gather(*(client.create_ledger(2, 2, 2) for _ in range(8)))
            for h in handles:
                await h.close()
            return [h.ledger_id for h in handles]

        batches = await asyncio.gather(*(create(i) for i in range(4)))
        ids = [i for batch in batches for i in batch]
        assert len(ids) == 32
        assert len(set(ids)) == 32, f"duplicate ledger ids: {sorted(ids)}"
        listed = set(await a.list_ledgers())
        assert set(ids) <= listed


async def test_open_without_recovery_reads_to_lac_and_waits_for_more(
    cluster: LedgerCluster,
) -> None:
    async with cluster.client() as wclient, cluster.client() as rclient:
        writer = await wclient.create_ledger(3, 2, 2)
        ledger_id = writer.ledger_id
        for i in range(10):
            assert await writer.add(payload_for(ledger_id, i)) == i

        reader = await rclient.open_ledger(ledger_id, recovery=False)
        lac = reader.readable_last_entry
        # Entry 9 carried LAC 8; the writer may or may not have told the bookies about 9 yet.
        assert 8 <= lac <= 9, lac
        entries = await reader.read(0, lac)
        assert [e.payload for e in entries] == [payload_for(ledger_id, i) for i in range(lac + 1)]
        with pytest.raises(NoSuchEntryError):
            await reader.read_entry(lac + 1)
        # Opening without recovery neither fences nor closes: the writer goes on.
        metadata, _ = await rclient.read_metadata(ledger_id)
        assert metadata.state is LedgerState.OPEN
        assert await writer.add(payload_for(ledger_id, 10)) == 10

        waiting = asyncio.create_task(reader.wait_for_lac(10, timeout_s=30))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "wait_for_lac returned before the LAC passed 10"
        for i in range(11, 16):
            assert await writer.add(payload_for(ledger_id, i)) == i
        new_lac = await asyncio.wait_for(waiting, 60)
        assert 10 < new_lac <= 15
        assert reader.readable_last_entry == new_lac
        assert (await reader.read_entry(new_lac)).payload == payload_for(ledger_id, new_lac)

        await writer.close()
        metadata, _ = await rclient.read_metadata(ledger_id)
        assert (metadata.state, metadata.last_entry_id) == (LedgerState.CLOSED, 15)


async def test_delete_removes_metadata_and_bookie_copies(cluster: LedgerCluster) -> None:
    async with cluster.client() as client:
        handle = await client.create_ledger(3, 3, 2)
        ledger_id = handle.ledger_id
        for i in range(20):
            await handle.add(payload_for(ledger_id, i))
        await handle.close()
        ensemble = handle.metadata.last_fragment.bookies

        # Every bookie holds a copy first: the third write of each entry may still be on its
        # way when the close returns (an add completes at the ack quorum, 2 of 3).
        async def stored_everywhere() -> bool:
            try:
                return all([await client.bookie(a).read(ledger_id, 19) for a in ensemble])
            except BookieError:
                return False

        assert await wait_until_async(stored_everywhere, timeout=15)
        for address in ensemble:
            assert await client.bookie(address).read(ledger_id, 0)

        await client.delete_ledger(ledger_id)

        with pytest.raises(NoSuchLedgerError):
            await client.read_metadata(ledger_id)
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(ledger_id)
        assert ledger_id not in await client.list_ledgers()
        for address in ensemble:
            async with BookieClient(address) as bookie:
                with pytest.raises(BookieError) as gone:
                    await bookie.read(ledger_id, 0)
                assert gone.value.status in (pb.NO_SUCH_LEDGER, pb.NO_SUCH_ENTRY), gone.value
        with pytest.raises(NoSuchLedgerError):
            await client.delete_ledger(ledger_id)


# -- magnetar bk ----------------------------------------------------------------------------


def json_lines(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_bk_tools(cluster: LedgerCluster) -> None:
    simpletest = "simpletest --ensemble 3 --write-quorum 2 --ack-quorum 2 --entries 500"
    run = cluster.bk(*simpletest.split(), "--entry-size", "300", "--json")
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"simpletest --json printed more than one line: {run.stdout!r}"
    result = json.loads(lines[0])
    assert result["acked"] == 500 and result["failed"] == 0, result
    assert result["last_entry_id"] == 499
    ledger_id = result["ledger_id"]
    assert isinstance(ledger_id, int)

    run = cluster.bk("readledger", str(ledger_id), "--json")
    assert run.returncode == 0, run.stderr
    entries = json_lines(run.stdout)
    assert [e["entry_id"] for e in entries] == list(range(500))
    assert all(e["length"] == 300 for e in entries)
    # simpletest writes one payload for every entry: one checksum, a real one.
    assert len({e["crc32c"] for e in entries}) == 1
    assert entries[0]["crc32c"] != crc32c.crc32c(b"")

    run = cluster.bk("readledger", str(ledger_id), "--from", "10", "--to", "19", "--json")
    assert run.returncode == 0, run.stderr
    assert [e["entry_id"] for e in json_lines(run.stdout)] == list(range(10, 20))

    run = cluster.bk("ledgermetadata", str(ledger_id), "--json")
    assert run.returncode == 0, run.stderr
    (meta,) = json_lines(run.stdout)
    assert meta["ledger_id"] == ledger_id
    assert meta["state"] == "CLOSED"
    assert meta["last_entry_id"] == 499
    assert meta["length"] == 500 * 300
    assert (meta["ensemble_size"], meta["write_quorum"], meta["ack_quorum"]) == (3, 2, 2)
    assert len(meta["fragments"][0]["bookies"]) == 3  # type: ignore[index]

    run = cluster.bk("ledgermetadata", str(ledger_id))
    assert run.returncode == 0, run.stderr
    assert "CLOSED" in run.stdout and "499" in run.stdout

    run = cluster.bk("listledgers")
    assert run.returncode == 0, run.stderr
    assert str(ledger_id) in run.stdout.split()
    run = cluster.bk("listledgers", "--json")
    assert {"ledger_id": ledger_id} in json_lines(run.stdout)

    run = cluster.bk("recover", str(ledger_id), "--json")
    assert run.returncode == 0, run.stderr
    (rec,) = json_lines(run.stdout)
    assert (rec["state"], rec["last_entry_id"], rec["length"]) == ("CLOSED", 499, 150000)

    run = cluster.bk("deleteledger", str(ledger_id), "--json")
    assert run.returncode == 0, run.stderr
    run = cluster.bk("listledgers")
    assert str(ledger_id) not in run.stdout.split()
    run = cluster.bk("ledgermetadata", str(ledger_id))
    assert run.returncode != 0
    assert str(ledger_id) in run.stderr and "Traceback" not in run.stderr


async def test_bk_recover_fences_an_open_ledger(cluster: LedgerCluster) -> None:
    async with cluster.client() as client:
        writer = await client.create_ledger(3, 2, 2)
        for i in range(25):
            await writer.add(payload_for(writer.ledger_id, i))
        run = await asyncio.to_thread(cluster.bk, "recover", str(writer.ledger_id), "--json")
        assert run.returncode == 0, run.stderr
        (rec,) = json_lines(run.stdout)
        # Recovery reads past the LAC the bookies know (23): every acknowledged entry is in.
        assert rec["state"] == "CLOSED"
        assert rec["last_entry_id"] == 24
        assert rec["length"] == 25 * len(payload_for(writer.ledger_id, 0))
        with pytest.raises(LedgerFencedError):
            await writer.add(b"after recovery")


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("simpletest", "--ensemble", "2", "--write-quorum", "3", "--entries", "5"), "Qw=3"),
        (("simpletest", "--ensemble", str(BOOKIES + 1), "--entries", "5"), f"need {BOOKIES + 1}"),
        (("readledger", "987654321"), "987654321"),
        (("ledgermetadata", "987654321"), "987654321"),
        (("recover", "987654321"), "987654321"),
        (("deleteledger", "987654321"), "987654321"),
        (("ledgermetadata", "not-a-number"), "invalid int"),
        (("no-such-tool",), "invalid choice"),
    ],
)
def test_bk_bad_input_exits_nonzero_with_a_message(
    cluster: LedgerCluster, args: tuple[str, ...], expect: str
) -> None:
    run = cluster.bk(*args)
    assert run.returncode != 0
    assert expect in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_bk_unreachable_metadata_store_exits_nonzero() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "magnetar.cli",
            "bk",
            "--metadata-url",
            f"etcd://127.0.0.1:{free_port()}",
            "listledgers",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode != 0
    assert run.stderr.strip(), "no message on stderr"
    assert "Traceback" not in run.stderr, run.stderr
