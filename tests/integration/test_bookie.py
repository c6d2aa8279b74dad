"""The bookie as a process: protocol, bad input, fencing, corruption, GC, read-only, registration.

Every test runs real ``magnetar bookie`` processes (tests/support/bookie.py) and talks to them
with the real ledger-side client, ``BookieClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from magnetar.common.ledger.bookie_client import BookieClient, BookieError, BookieUnavailableError
from magnetar.common.ledger.bookies import BookieRegistration, list_bookies, registration_key
from magnetar.common.ledger.entry import HEADER_SIZE, encode_entry
from magnetar.common.metadata import MetadataStore, open_store
from magnetar.common.proto import bookie_pb2 as pb
from tests.support.bookie import (
    BookieFactory,
    BookieStartError,
    bookie_factory_fixture,
)
from tests.support.etcd import EtcdServer, free_port

FAST = {"journal_sync": False}
#: The journal's fsync histogram (its buckets are timings: measured in bench/, not asserted).
FSYNC_HISTOGRAM = "magnetar_bookie_journal_fsync_latency_seconds"


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    yield from bookie_factory_fixture(tmp_path)


def entry(ledger_id: int, entry_id: int, payload: bytes, lac: int | None = None) -> bytes:
    return encode_entry(
        ledger_id, entry_id, entry_id - 1 if lac is None else lac, entry_id * 1000, payload
    )


def payload_for(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    rng = random.Random(ledger_id * 1_000_003 + entry_id)
    return rng.randbytes(size)


async def write(
    client: BookieClient, ledger_id: int, entry_ids: range, size: int = 100
) -> dict[int, bytes]:
    """Add entries (pipelined); return what was sent, by entry id."""
    sent = {i: entry(ledger_id, i, payload_for(ledger_id, i, size)) for i in entry_ids}
    await asyncio.gather(*(client.add(ledger_id, i, e) for i, e in sent.items()))
    return sent


async def read_all(client: BookieClient, ledger_id: int, sent: dict[int, bytes]) -> None:
    got = await asyncio.gather(*(client.read(ledger_id, i) for i in sent))
    for (entry_id, expected), actual in zip(sent.items(), got, strict=True):
        assert actual == expected, f"ledger {ledger_id} entry {entry_id} read back different"


async def read_ranges(
    client: BookieClient, ledger_id: int, sent: dict[int, bytes], max_bytes: int = 64 << 10
) -> int:
    """Read ``sent`` (consecutive entry ids) back by range reads of at most ``max_bytes``;
    assert each entry byte-identical; return how many requests it took."""
    entry_id, last, requests = min(sent), max(sent), 0
    while entry_id <= last:
        got = await client.read_range(ledger_id, entry_id, last - entry_id + 1, max_bytes)
        requests += 1
        assert got, f"ledger {ledger_id}: empty range from entry {entry_id}"
        assert len(got) == 1 or sum(map(len, got)) <= max_bytes
        for offset, actual in enumerate(got):
            assert actual == sent[entry_id + offset], f"entry {entry_id + offset} differs"
        entry_id += len(got)
    return requests


async def status_of(awaitable: object) -> str:
    """The status name a call ends with ("OK" if it succeeds)."""
    try:
        await awaitable  # type: ignore[misc]
    except BookieError as e:
        return e.status_name
    return "OK"


async def assert_serving(client: BookieClient, ledger_id: int) -> None:
    """A normal add and read still work."""
    e = entry(ledger_id, 0, b"still serving")
    await asyncio.wait_for(client.add(ledger_id, 0, e), 10)
    assert await client.read(ledger_id, 0) == e


def metric_value(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" (\S+)"
    match = re.search(r"^" + pattern + "$", text, re.MULTILINE)
    assert match, f"metric {name}{{{labels}}} not exported"
    return float(match.group(1))


def files_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# -- protocol ---------------------------------------------------------------------------------


async def test_add_read_round_trip_and_last_entry(bookies: BookieFactory) -> None:
    bookie = bookies.start(**FAST)
    rng = random.Random(1)
    largest = 5 * 2**20 - HEADER_SIZE  # the default max_entry_size, header included
    sizes = [0, 1, 100, 8192, largest, *(rng.randint(0, 20_000) for _ in range(40))]
    async with BookieClient(bookie.address) as client:
        sent: dict[int, bytes] = {}
        for ledger_id in (1, 2**40 + 7):
            batch = {i: entry(ledger_id, i, rng.randbytes(size)) for i, size in enumerate(sizes)}
            await asyncio.gather(*(client.add(ledger_id, i, e) for i, e in batch.items()))
            sent.update({ledger_id * 1000 + i: e for i, e in batch.items()})
            await read_all(client, ledger_id, batch)
            last = len(sizes) - 1
            assert await client.read(ledger_id, -1) == batch[last]
            position = await client.read_lac(ledger_id)
            assert (position.lac, position.last_entry_id) == (last - 1, last)
            # Range reads (BookKeeper's batch read): bounded by count and bytes, the first
            # entry whatever its size, ending at the last stored entry.
            assert await read_ranges(client, ledger_id, batch) > 3
            assert len(await client.read_range(ledger_id, 4, 100, 1)) == 1  # the 5 MiB entry
            assert await client.read_range(ledger_id, 0, 3, 1 << 30) == [
                batch[i] for i in (0, 1, 2)
            ]
            assert await client.read_range(ledger_id, last, 100, 1 << 30) == [batch[last]]
            for first, status in ((last + 1, "NO_SUCH_ENTRY"), (-1, "BAD_REQUEST")):
                assert await status_of(client.read_range(ledger_id, first, 10, 1000)) == status
        assert await status_of(client.read_range(999, 0, 10, 1000)) == "NO_SUCH_LEDGER"

        # From the entry log (after a checkpoint) and after a restart: still byte-identical.
        bookie.checkpoint()
        await read_all(client, 1, {i: sent[1000 + i] for i in range(len(sizes))})
        await read_ranges(client, 1, {i: sent[1000 + i] for i in range(len(sizes))})
    bookie.restart()
    async with BookieClient(bookie.address) as client:
        for ledger_id in (1, 2**40 + 7):
            batch = {i: sent[ledger_id * 1000 + i] for i in range(len(sizes))}
            await read_all(client, ledger_id, batch)
            await read_ranges(client, ledger_id, batch, max_bytes=1 << 30)
            assert await client.read(ledger_id, -1) == batch[len(sizes) - 1]
            position = await client.read_lac(ledger_id)
            assert (position.lac, position.last_entry_id) == (len(sizes) - 2, len(sizes) - 1)


async def test_read_lac_long_poll(bookies: BookieFactory) -> None:
    bookie = bookies.start(**FAST)
    async with BookieClient(bookie.address) as client:
        await write(client, 5, range(2))
        assert (await client.read_lac(5)).lac == 0

        poll = asyncio.create_task(client.read_lac(5, previous=0, wait_ms=20_000))
        await asyncio.sleep(0.3)
        assert not poll.done(), "long poll returned although the LAC did not move"
        # An entry carrying the same LAC does not end the poll; one that raises it does.
        await client.add(5, 2, entry(5, 2, b"same lac", lac=0))
        await asyncio.sleep(0.3)
        assert not poll.done(), "long poll returned although the LAC did not pass previous"
        await client.add(5, 3, entry(5, 3, b"raises lac", lac=2))
        position = await asyncio.wait_for(poll, 10)
        assert position.lac == 2
        assert position.last_entry_id == 3

        # No news: TIMEOUT, carrying the current LAC.
        with pytest.raises(BookieError) as err:
            await client.read_lac(5, previous=2, wait_ms=300)
        assert err.value.status == pb.TIMEOUT

        # A poll on a ledger the bookie has not seen yet waits for its first entries.
        poll = asyncio.create_task(client.read_lac(6, previous=-1, wait_ms=20_000))
        await asyncio.sleep(0.2)
        assert not poll.done()
        await write(client, 6, range(3))
        assert (await asyncio.wait_for(poll, 10)).lac >= 0

        # Without a wait, an unknown ledger is an error, not an empty answer.
        assert await status_of(client.read_lac(777)) == "NO_SUCH_LEDGER"

        # Deleting the ledger ends a poll on it.
        poll = asyncio.create_task(client.read_lac(6, previous=10, wait_ms=20_000))
        await asyncio.sleep(0.2)
        assert not poll.done()
        await client.delete_ledger(6)
        assert await asyncio.wait_for(status_of(poll), 10) == "NO_SUCH_LEDGER"


# -- bad input --------------------------------------------------------------------------------


async def test_bad_requests_get_clear_errors_and_the_bookie_keeps_serving(
    bookies: BookieFactory,
) -> None:
    bookie = bookies.start(max_entry_size=4096, **FAST)
    async with BookieClient(bookie.address) as client:
        await write(client, 1, range(3))

        assert await status_of(client.read(999, 0)) == "NO_SUCH_LEDGER"
        assert await status_of(client.read(999, -1)) == "NO_SUCH_LEDGER"
        await assert_serving(client, 100)
        assert await status_of(client.read(1, 3)) == "NO_SUCH_ENTRY"
        assert await status_of(client.read(1, 10**12)) == "NO_SUCH_ENTRY"
        assert await status_of(client.read(1, -5)) == "BAD_REQUEST"
        await assert_serving(client, 101)

        # Size limit counts the whole formatted entry.
        exact = entry(2, 0, b"x" * (4096 - HEADER_SIZE))
        assert await status_of(client.add(2, 0, exact)) == "OK"
        too_large = entry(2, 1, b"x" * (4097 - HEADER_SIZE))
        with pytest.raises(BookieError) as err:
            await client.add(2, 1, too_large)
        assert err.value.status_name == "TOO_LARGE"
        assert "max_entry_size" in str(err.value)
        await assert_serving(client, 102)

        # Header ids that do not match the request.
        with pytest.raises(BookieError) as err:
            await client.add(3, 6, entry(3, 5, b"says entry 5"))
        assert err.value.status_name == "BAD_REQUEST"
        assert "entry 5" in str(err.value)
        assert await status_of(client.add(4, 0, entry(3, 0, b"says ledger 3"))) == "BAD_REQUEST"
        assert await status_of(client.add(3, -2, entry(3, -2, b"negative"))) == "BAD_REQUEST"
        assert await status_of(client.add(3, 0, b"short")) == "BAD_REQUEST"
        await assert_serving(client, 103)

        # Corrupt digest: refused, and nothing of it is stored.
        corrupt = bytearray(entry(3, 0, b"payload that gets corrupted"))
        corrupt[-3] ^= 0x40
        with pytest.raises(BookieError) as err:
            await client.add(3, 0, bytes(corrupt))
        assert err.value.status_name == "DIGEST_MISMATCH"
        assert await status_of(client.read(3, 0)) in ("NO_SUCH_LEDGER", "NO_SUCH_ENTRY")
        await assert_serving(client, 104)

        # A bad add in a batch fails alone; the others in the same stream message succeed.
        good1, good2 = entry(5, 0, b"good"), entry(5, 1, b"good too")
        results = await asyncio.gather(
            client.add(5, 0, good1),
            client.add(5, 1, b"\x00" * 10),
            client.add(5, 1, good2),
            return_exceptions=True,
        )
        assert results[0] is None and results[2] is None, results
        assert isinstance(results[1], BookieError) and results[1].status_name == "BAD_REQUEST"
        assert await client.read(5, 1) == good2
        await read_all(client, 1, {i: entry(1, i, payload_for(1, i)) for i in range(3)})


async def test_garbage_on_the_add_stream(bookies: BookieFactory) -> None:
    bookie = bookies.start(**FAST)
    async with grpc.aio.insecure_channel(bookie.address) as channel:
        call = channel.stream_stream(
            "/magnetar.bookie.Bookie/AddEntries",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )()
        await call.write(b"\xff\xfe\xfd garbage that is not an AddRequest \x00\x01\x02" * 3)
        # The bookie may refuse the stream before the second write: then that write fails and
        # the refusal is read below.
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.write(os.urandom(1000))

        async def drain() -> list[bytes]:
            return [message async for message in call]

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(drain(), 10)
        # A clear refusal of the malformed request, not an "unknown" servicer crash.
        assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), (
            err.value.code(),
            err.value.details(),
        )
    async with BookieClient(bookie.address) as client:
        await assert_serving(client, 1)
    assert "Traceback" not in bookie.log_text(), "malformed add stream logged a stack trace"


async def test_junk_bytes_on_the_ports(bookies: BookieFactory) -> None:
    bookie = bookies.start(**FAST)
    for port in (bookie.port, bookie.http_port):
        for junk in (
            os.urandom(5000),
            b"\x00" * 64,
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 99,
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(junk)
                sock.shutdown(socket.SHUT_WR)
                try:
                    while sock.recv(65536):  # the bookie answers or closes; it must not hang
                        pass
                except ConnectionResetError:
                    pass
    async with BookieClient(bookie.address) as client:
        await assert_serving(client, 1)
    status, _ = bookie.http("GET", "/health")
    assert status == 200
    assert bookie.running


# -- fencing ----------------------------------------------------------------------------------


async def test_fencing_refuses_normal_adds_and_survives_sigkill(bookies: BookieFactory) -> None:
    bookie = bookies.start(**FAST)
    async with BookieClient(bookie.address) as client:
        sent = await write(client, 7, range(5))
        position = await client.fence(7)
        assert (position.lac, position.last_entry_id) == (3, 4)
        with pytest.raises(BookieError) as err:
            await client.add(7, 5, entry(7, 5, b"from the old writer"))
        assert err.value.status_name == "FENCED"
        recovered = entry(7, 5, b"recovery add")
        await client.add(7, 5, recovered, recovery=True)
        assert await client.read(7, 5) == recovered
        # Fencing again is harmless and reports the recovered entry.
        assert (await client.fence(7)).last_entry_id == 5

        # Fenced with its entries in the entry log, then crashed: the fence still holds.
        bookie.checkpoint()
        await write(client, 13, range(3))
        bookie.checkpoint()
        assert (await client.fence(13)).last_entry_id == 2

        # A fencing read fences a ledger too; fencing a ledger never seen here works as well.
        assert await status_of(client.read(8, -1, fence=True)) == "NO_SUCH_ENTRY"
        assert await status_of(client.add(8, 0, entry(8, 0, b"x"))) == "FENCED"
        assert (await client.fence(9)).last_entry_id == -1
        assert await status_of(client.add(9, 0, entry(9, 0, b"x"))) == "FENCED"

    bookie.restart(kill=True)
    async with BookieClient(bookie.address) as client:
        for ledger_id in (7, 8, 9, 13):
            assert await status_of(client.add(ledger_id, 6, entry(ledger_id, 6, b"late"))) == (
                "FENCED"
            ), f"ledger {ledger_id} lost its fence in a crash"
        await client.add(7, 6, entry(7, 6, b"recovery after crash"), recovery=True)
        await read_all(client, 7, {**sent, 5: recovered})
        assert (await client.fence(7)).last_entry_id == 6
        position = await client.fence(13)
        assert (position.lac, position.last_entry_id) == (1, 2)
        await client.add(13, 3, entry(13, 3, b"recovered"), recovery=True)
        assert (await client.read_lac(13)).last_entry_id == 3
        await assert_serving(client, 10)


async def test_deletion_survives_sigkill_before_any_checkpoint(bookies: BookieFactory) -> None:
    bookie = bookies.start(checkpoint_interval_s=3600, **FAST)
    async with BookieClient(bookie.address) as client:
        kept = await write(client, 30, range(20))
        await write(client, 31, range(20))
        await client.delete_ledger(31)
        assert await status_of(client.read(31, 0)) == "NO_SUCH_LEDGER"
    bookie.restart(kill=True)  # ledger 31 is still in the journal; replay must not revive it
    async with BookieClient(bookie.address) as client:
        assert await status_of(client.read(31, 0)) == "NO_SUCH_LEDGER"
        assert await status_of(client.read(31, -1)) == "NO_SUCH_LEDGER"
        assert await status_of(client.add(31, 20, entry(31, 20, b"x"))) == "NO_SUCH_LEDGER"
        await read_all(client, 30, kept)
    bookie.checkpoint()
    bookie.restart()
    async with BookieClient(bookie.address) as client:
        assert await status_of(client.read(31, 5)) == "NO_SUCH_LEDGER"
        await read_all(client, 30, kept)


# -- corruption -------------------------------------------------------------------------------


async def test_flipped_byte_in_an_entry_log_is_a_digest_mismatch(bookies: BookieFactory) -> None:
    bookie = bookies.start(**FAST)
    async with BookieClient(bookie.address) as client:
        sent = await write(client, 11, range(10), size=1000)
    bookie.checkpoint()
    bookie.stop()

    def flip(target: bytes, at: int) -> None:
        for path in bookie.entry_log_files:
            data = bytearray(path.read_bytes())
            where = data.find(target)
            if where >= 0:
                data[where + at] ^= 0x01
                path.write_bytes(bytes(data))
                return
        raise AssertionError("entry not found in any entry log after a checkpoint")

    flip(sent[5], HEADER_SIZE + 500)  # payload byte
    flip(sent[7], 17)  # a header byte (the lac)
    bookie.start()
    async with BookieClient(bookie.address) as client:
        for bad in (5, 7):
            with pytest.raises(BookieError) as err:
                await client.read(11, bad)
            assert err.value.status_name == "DIGEST_MISMATCH"
            # Asked again (maybe from a cache now): still refused, never the corrupt bytes.
            assert await status_of(client.read(11, bad)) == "DIGEST_MISMATCH"
        await read_all(client, 11, {i: e for i, e in sent.items() if i not in (5, 7)})
        assert await client.read(11, -1) == sent[9]
        await assert_serving(client, 12)
    _, body = bookie.http("GET", "/metrics")
    assert metric_value(body.decode(), "magnetar_bookie_digest_errors_total") >= 2


async def test_compaction_keeps_healthy_entries_of_a_log_with_a_damaged_record_length(
    bookies: BookieFactory,
) -> None:
    """The index knows where every live entry is; one damaged length prefix in front of them
    must not make compaction skip them and then delete the log that holds them."""
    bookie = bookies.start(gc_interval_s=0, **FAST)
    async with BookieClient(bookie.address) as client:
        kept = await write(client, 1, range(10), size=1000)
        await write(client, 2, range(30), size=1000)
    bookie.stop()  # final checkpoint: [ledger 1][ledger 2] in one entry log, sorted by ledger
    (log,) = [p for p in bookie.entry_log_files if p.stat().st_size > 8]
    data = bytearray(log.read_bytes())
    assert data.find(kept[0]) == 8 + 4, "expected ledger 1 entry 0 as the log's first record"
    data[8] ^= 0x80  # high byte of the first record's u32 length: now far past the file's end
    log.write_bytes(bytes(data))
    bookie.start()
    async with BookieClient(bookie.address) as client:
        await read_all(client, 1, kept)  # the damage is outside every entry
        await client.delete_ledger(2)  # leaves the log 25% live: compacted
        status, body = bookie.http("PUT", "/api/v1/bookie/gc")
        assert status == 200, body
        assert json.loads(body)["compacted_logs"] + json.loads(body)["removed_logs"] >= 1, body
    bookie.restart()  # reads come from disk, not from the read cache
    async with BookieClient(bookie.address) as client:
        for entry_id, expected in kept.items():
            result = await status_of(client.read(1, entry_id))
            assert result == "OK", (
                f"ledger 1 entry {entry_id} is {result} after compaction (gc: {body!r})"
            )
            assert await client.read(1, entry_id) == expected


# -- garbage collection -----------------------------------------------------------------------


async def test_gc_reclaims_deleted_ledgers_and_keeps_the_rest(bookies: BookieFactory) -> None:
    bookie = bookies.start(entry_log_max_bytes=1 << 20, gc_interval_s=0, **FAST)
    ledgers = range(1, 13)
    sent: dict[int, dict[int, bytes]] = {}
    async with BookieClient(bookie.address) as client:
        for ledger_id in ledgers:  # ~260 KB each: three or four ledgers per entry log
            sent[ledger_id] = await write(client, ledger_id, range(64), size=4000)
        bookie.checkpoint()
        log_bytes_before = sum(p.stat().st_size for p in bookie.entry_log_files)
        dir_bytes_before = files_bytes(bookie.ledger_dir)
        assert len(bookie.entry_log_files) >= 3

        keep = {1, 6, 12}
        for ledger_id in ledgers:
            if ledger_id not in keep:
                await client.delete_ledger(ledger_id)
        deleted_bytes = sum(
            len(e) for lid in ledgers if lid not in keep for e in sent[lid].values()
        )

        status, body = bookie.http("PUT", "/api/v1/bookie/gc")
        assert status == 200, body
        result = json.loads(body)
        assert result["removed_logs"] + result["compacted_logs"] >= 1, result

        log_bytes_after = sum(p.stat().st_size for p in bookie.entry_log_files)
        dir_bytes_after = files_bytes(bookie.ledger_dir)
        assert log_bytes_after <= log_bytes_before - deleted_bytes // 2, (
            f"entry logs {log_bytes_before} -> {log_bytes_after} bytes after deleting "
            f"{deleted_bytes} bytes of ledgers; gc said {result}"
        )
        assert dir_bytes_after < dir_bytes_before

        for ledger_id in ledgers:
            if ledger_id in keep:
                await read_all(client, ledger_id, sent[ledger_id])
            else:
                assert await status_of(client.read(ledger_id, 0)) == "NO_SUCH_LEDGER"
                assert await status_of(client.add(ledger_id, 64, entry(ledger_id, 64, b"x"))) == (
                    "NO_SUCH_LEDGER"
                )

    bookie.restart()
    async with BookieClient(bookie.address) as client:
        for ledger_id in ledgers:
            if ledger_id in keep:
                await read_all(client, ledger_id, sent[ledger_id])
                assert await client.read(ledger_id, -1) == sent[ledger_id][63]
            else:
                assert await status_of(client.read(ledger_id, 3)) == "NO_SUCH_LEDGER"
        # A second GC after the restart finds nothing wrong and loses nothing.
        status, body = bookie.http("POST", "/api/v1/bookie/gc")
        assert status == 200, body
        for ledger_id in keep:
            await read_all(client, ledger_id, sent[ledger_id])


async def test_reads_stay_exact_while_checkpoints_and_gc_run(bookies: BookieFactory) -> None:
    """Writers, readers, deletions, frequent checkpoints and GC with compaction, all at once."""
    bookie = bookies.start(
        entry_log_max_bytes=256 << 10,
        checkpoint_interval_s=0.1,
        gc_interval_s=0.3,
        compaction_threshold=0.9,
        read_cache_bytes=0,  # every read goes to the index and the entry logs
        **FAST,
    )
    sent: dict[int, dict[int, bytes]] = {}
    errors: list[str] = []
    async with BookieClient(bookie.address) as client:
        for ledger_id in range(40, 52):
            sent[ledger_id] = await write(client, ledger_id, range(40), size=3000)
        deleted = set(range(40, 52, 2))
        stop = asyncio.Event()

        async def reader(seed: int) -> int:
            rng = random.Random(seed)
            reads = 0
            while not stop.is_set():
                ledger_id = rng.choice(sorted(set(sent) - deleted))
                entry_id = rng.choice(sorted(sent[ledger_id]))
                try:
                    got = await client.read(ledger_id, entry_id)
                except BookieError as e:
                    errors.append(f"read {ledger_id}/{entry_id}: {e}")
                    continue
                if got != sent[ledger_id][entry_id]:
                    errors.append(f"read {ledger_id}/{entry_id}: different bytes")
                reads += 1
            return reads

        async def range_reader(seed: int) -> int:
            rng = random.Random(seed)
            reads = 0
            while not stop.is_set():
                ledger_id = rng.choice(sorted(set(sent) - deleted))
                known = sent[ledger_id]
                first = rng.choice(sorted(known))
                count = rng.randint(1, max(known) - first + 1)
                try:
                    got = await client.read_range(ledger_id, first, count, rng.choice((1, 1 << 20)))
                except BookieError as e:
                    errors.append(f"range read {ledger_id}/{first}: {e}")
                    continue
                if not 1 <= len(got) <= count or any(
                    g != known[first + i] for i, g in enumerate(got)
                ):
                    errors.append(f"range read {ledger_id}/{first}+{count}: different entries")
                reads += 1
            return reads

        async def churn() -> None:
            for ledger_id in sorted(deleted):
                await client.delete_ledger(ledger_id)
                await asyncio.sleep(0.15)
            for round_ in range(6):  # more data for the kept ledgers, more logs to collect
                for ledger_id in sorted(set(sent) - deleted):
                    new = range(40 + round_ * 10, 50 + round_ * 10)
                    sent[ledger_id] |= await write(client, ledger_id, new, size=3000)
                status, body = await asyncio.to_thread(bookie.http, "PUT", "/api/v1/bookie/gc")
                assert status == 200, body
            stop.set()

        *reads, ranges, _ = await asyncio.gather(
            *(reader(i) for i in range(3)), range_reader(3), churn()
        )
        assert not errors, errors[:10]
        assert sum(reads) > 0 and ranges > 0
        for ledger_id in set(sent) - deleted:
            await read_all(client, ledger_id, sent[ledger_id])
            await read_ranges(client, ledger_id, sent[ledger_id])
    bookie.restart()
    async with BookieClient(bookie.address) as client:
        for ledger_id in set(sent) - deleted:
            await read_all(client, ledger_id, sent[ledger_id])
        for ledger_id in deleted:
            assert await status_of(client.read(ledger_id, 0)) == "NO_SUCH_LEDGER"


async def test_second_bookie_on_the_same_directories_is_refused(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    first = bookies.start(**FAST)
    async with BookieClient(first.address) as client:
        sent = await write(client, 1, range(50))
    second = bookies.create(**FAST)
    second.journal_dir, second.ledger_dir = first.journal_dir, first.ledger_dir
    with pytest.raises(BookieStartError):
        second.start()
    assert "Traceback" not in second.log_text()
    # The first one is unharmed, also across its own restart.
    async with BookieClient(first.address) as client:
        await read_all(client, 1, sent)
        sent |= await write(client, 1, range(50, 60))
    first.restart(kill=True)
    async with BookieClient(first.address) as client:
        await read_all(client, 1, sent)


# -- read-only --------------------------------------------------------------------------------


@pytest.fixture
async def etcd_store(etcd_server: EtcdServer) -> AsyncIterator[MetadataStore]:
    """A metadata session of the test's own on the shared etcd."""
    store = await open_store(etcd_server.url)
    try:
        yield store
    finally:
        await store.close()


async def registration(store: MetadataStore, address: str) -> BookieRegistration | None:
    found = await store.get(registration_key(address))
    return None if found is None else BookieRegistration.from_json(found.value)


async def wait_registration_read_only(store: MetadataStore, address: str, read_only: bool) -> None:
    found = None
    for _ in range(100):
        found = await registration(store, address)
        if found is not None and found.read_only == read_only:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"registration of {address} never showed read_only={read_only}: {found}")


async def test_read_only_over_the_disk_threshold_and_back(
    bookies: BookieFactory, etcd_server: EtcdServer, etcd_store: MetadataStore
) -> None:
    quota = 8 << 20
    bookie = bookies.start(
        metadata_url=etcd_server.url,
        disk_quota_bytes=quota,
        disk_usage_threshold=0.5,
        disk_usage_lwm=0.3,
        disk_check_interval_s=0.2,
        gc_interval_s=0,
        **FAST,
    )
    size = 64 * 1024
    written: dict[int, dict[int, bytes]] = {}
    async with BookieClient(bookie.address) as client:
        refused = None
        for n in range(400):  # at most 25 MiB; the bookie must turn read-only long before
            ledger_id, entry_id = 20 + n // 16, n % 16
            e = entry(ledger_id, entry_id, payload_for(ledger_id, entry_id, size))
            try:
                await client.add(ledger_id, entry_id, e)
            except BookieError as err:
                refused = err
                break
            written.setdefault(ledger_id, {})[entry_id] = e
            await asyncio.sleep(0.01)
        assert refused is not None, "bookie never refused adds past its disk threshold"
        assert refused.status_name == "READ_ONLY", refused
        assert sum(len(v) for v in written.values()) * size >= quota * 0.4

        # Reads are still served; every write path says READ_ONLY.
        for ledger_id, sent in written.items():
            await read_all(client, ledger_id, sent)
        assert await status_of(client.add(999, 0, entry(999, 0, b"new ledger"))) == "READ_ONLY"
        info = await client.info()
        assert info.read_only
        assert info.disk_usage >= 0.3
        status, body = bookie.http("GET", "/api/v1/bookie/info")
        assert status == 200 and json.loads(body)["read_only"] is True
        await wait_registration_read_only(etcd_store, bookie.address, True)

        # Delete nearly everything, collect garbage: writable again.
        survivor = min(written)
        for ledger_id in written:
            if ledger_id != survivor:
                await client.delete_ledger(ledger_id)
        status, body = bookie.http("PUT", "/api/v1/bookie/gc")
        assert status == 200, body
        assert json.loads(body)["read_only"] is False, body
        await assert_serving(client, 1000)
        assert not (await client.info()).read_only
        await wait_registration_read_only(etcd_store, bookie.address, False)
        await read_all(client, survivor, written[survivor])


# -- registration, health, tools --------------------------------------------------------------


def bk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "bk", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_registration_health_metrics_and_bookiesanity(
    bookies: BookieFactory, etcd_server: EtcdServer, etcd_store: MetadataStore, tmp_path: Path
) -> None:
    bookie = bookies.start(metadata_url=etcd_server.url, session_ttl_s=2, **FAST)
    found = await registration(etcd_store, bookie.address)
    assert found is not None, "bookie is not registered under /magnetar/bookies/available"
    assert found.address == bookie.address
    assert found.http_address == f"127.0.0.1:{bookie.http_port}"
    assert found.read_only is False

    assert bookie.address in [b.address for b in await list_bookies(etcd_store)]

    for path in ("/health", "/ready"):
        status, _ = bookie.http("GET", path)
        assert status == 200, path

    result = bk("--metadata-url", etcd_server.url, "bookiesanity")
    assert result.returncode == 0, result.stdout + result.stderr
    assert bookie.address in result.stdout
    result = bk("--metadata-url", etcd_server.url, "listbookies", "--json")
    assert result.returncode == 0, result.stderr
    listed = [json.loads(line) for line in result.stdout.splitlines()]
    assert {"address": bookie.address, "read_only": False} in [
        {"address": b["address"], "read_only": b["read_only"]} for b in listed
    ]

    async with BookieClient(bookie.address) as client:
        await write(client, 1, range(20))
    status, body = bookie.http("GET", "/metrics")
    assert status == 200
    text = body.decode()
    assert metric_value(text, "magnetar_bookie_add_entries_total", 'status="OK"') >= 20
    # The fsync histogram is exported and has observations; its figures are bench/'s business
    # (bench/bookie_bench.py, docs/performance.md).
    families = {f.name: f for f in text_string_to_metric_families(text)}
    fsync = families[FSYNC_HISTOGRAM]
    assert fsync.type == "histogram"
    assert any(s.name.endswith("_count") and s.value >= 1 for s in fsync.samples)

    # Clean shutdown takes the registration away at once.
    assert bookie.stop() == 0
    assert await registration(etcd_store, bookie.address) is None

    # Restarted right after a crash, the bookie keeps its registration when the crashed
    # process's session expires; crashed for good, the registration goes with its session.
    bookie.start()
    bookie.kill()
    bookie.start()
    for _ in range(25):  # past the old session's 2 s TTL
        assert await registration(etcd_store, bookie.address) is not None, (
            "the old session's expiry took the restarted bookie's registration away"
        )
        await asyncio.sleep(0.2)
    status, _ = bookie.http("GET", "/ready")
    assert status == 200
    bookie.kill()
    for _ in range(150):
        if await registration(etcd_store, bookie.address) is None:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("registration of a SIGKILLed bookie outlived its session")

    # No bookie registered: bookiesanity fails, saying why.
    empty = f"local://{tmp_path / 'empty-meta.db'}"
    result = bk("--metadata-url", empty, "bookiesanity")
    assert result.returncode != 0
    assert "no writable bookie" in result.stderr


async def test_paused_bookie_is_unavailable_then_recovers(bookies: BookieFactory) -> None:
    bookie = bookies.start(**FAST)
    async with BookieClient(bookie.address, timeout=1.0) as client:
        sent = await write(client, 1, range(3))
        bookie.pause()
        try:
            with pytest.raises(BookieUnavailableError):
                await client.read(1, 0)
        finally:
            bookie.resume()
        await read_all(client, 1, sent)
        await assert_serving(client, 2)


def test_a_bookie_refuses_to_serve_its_data_under_another_address(
    bookies: BookieFactory,
) -> None:
    bookie = bookies.start()
    old_address = bookie.address
    bookie.stop()
    bookie.port = free_port()  # same directories, another port: another identity
    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    assert f"holds the data of bookie {old_address}" in str(refused.value)
    bookie.port = int(old_address.rsplit(":", 1)[1])
    bookie.start()  # back under its own address it serves again
    assert bookie.running


def test_a_bookie_with_a_wiped_directory_refuses_to_start(bookies: BookieFactory) -> None:
    bookie = bookies.start()
    bookie.stop()
    (bookie.journal_dir / "bookie-cookie.json").unlink()  # as if the journal disk was replaced
    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    assert "has no cookie" in str(refused.value)
