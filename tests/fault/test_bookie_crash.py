"""Crash a bookie mid-stream and check that what it acknowledged survived, byte for byte.

A writer keeps many adds in flight to a bookie running with ``--journal-sync``; the bookie is
SIGKILLed after some thousands of acknowledgements and restarted on the same directories.
Every acknowledged entry must read back identical; an unacknowledged one may be there or not,
but if it is, it must be exactly what was sent.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.common.ledger.bookie_client import BookieClient, BookieError, BookieUnavailableError
from magnetar.common.ledger.bookies import registration_key
from magnetar.common.ledger.entry import encode_entry, verify_entry
from magnetar.common.metadata import open_store
from magnetar.common.proto import bookie_pb2 as pb
from tests.support.bookie import BookieFactory, BookieProcess, bookie_factory_fixture
from tests.support.etcd import EtcdServer

LEDGERS = (101, 102, 103, 104)
TOTAL_ENTRIES = 20_000
IN_FLIGHT = 1500
ENTRY_LOG_MAGIC_BYTES = 8


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    yield from bookie_factory_fixture(tmp_path)


def entry_log_data_bytes(bookie: BookieProcess) -> int:
    """Bytes of entries in the entry logs (a checkpoint has run iff this is > 0)."""
    return sum(
        max(p.stat().st_size - ENTRY_LOG_MAGIC_BYTES, 0)
        for p in bookie.entry_log_files
        if p.exists()
    )


class Writer:
    """Streams adds round-robin over LEDGERS and records exactly which ones were acknowledged."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sent: dict[tuple[int, int], bytes] = {}
        self.acked: set[tuple[int, int]] = set()
        self.refused: list[BaseException] = []

    def make(self, n: int) -> tuple[int, int, bytes]:
        ledger_id = LEDGERS[n % len(LEDGERS)]
        entry_id = n // len(LEDGERS)
        payload = self.rng.randbytes(self.rng.randint(10, 8 * 1024))
        return (
            ledger_id,
            entry_id,
            encode_entry(ledger_id, entry_id, entry_id - 1, entry_id, payload),
        )

    async def run_until_killed(
        self,
        bookie: BookieProcess,
        kill_after_acks: int,
        need_checkpoint: bool = False,
        *,
        sigterm: bool = False,
    ) -> None:
        """Stream adds; once ``kill_after_acks`` are acknowledged (and, if asked, a checkpoint
        wrote entry logs), SIGKILL the bookie (or SIGTERM it and wait for a clean exit)."""
        window = asyncio.Semaphore(IN_FLIGHT)
        killed = False
        async with BookieClient(bookie.address, timeout=30) as client:
            pending: set[asyncio.Future[None]] = set()
            for n in range(TOTAL_ENTRIES):
                await window.acquire()
                if len(self.acked) >= kill_after_acks and (
                    not need_checkpoint or entry_log_data_bytes(bookie) > 0
                ):
                    # Adds surely in flight when the kill lands (a fast bookie may have
                    # answered every earlier one by now).
                    for extra in range(n, n if sigterm else min(n + 8, TOTAL_ENTRIES)):
                        key_and_data = self.make(extra)
                        self.sent[key_and_data[:2]] = key_and_data[2]
                        future = client.add(*key_and_data)
                        pending.add(future)
                        future.add_done_callback(self._done_callback(key_and_data[:2], window))
                    if sigterm:
                        # In a thread: the client keeps taking acks while the bookie shuts down.
                        code = await asyncio.to_thread(bookie.stop)
                        assert code == 0, f"bookie exited with {code} on SIGTERM"
                    else:
                        bookie.kill()
                    killed = True
                    window.release()
                    break
                ledger_id, entry_id, data = self.make(n)
                self.sent[(ledger_id, entry_id)] = data
                future = client.add(ledger_id, entry_id, data)
                pending.add(future)
                future.add_done_callback(self._done_callback((ledger_id, entry_id), window))
            if pending:
                await asyncio.wait(pending, timeout=30)
            assert all(f.done() for f in pending), "adds still pending 30 s after the kill"
        assert killed, (
            f"the writer sent all {TOTAL_ENTRIES} entries before the kill condition held "
            f"({len(self.acked)} acked, entry log data {entry_log_data_bytes(bookie)} bytes)"
        )
        assert not self.refused, f"adds refused before the crash: {self.refused[:3]}"

    def _done_callback(self, key: tuple[int, int], window: asyncio.Semaphore):  # type: ignore[no-untyped-def]
        def done(future: asyncio.Future[None]) -> None:
            window.release()
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                self.acked.add(key)
            elif not isinstance(error, BookieUnavailableError):
                self.refused.append(error)

        return done


async def check_after_restart(bookie: BookieProcess, writer: Writer) -> None:
    keys = sorted(writer.sent)
    lost: list[tuple[int, int]] = []
    async with BookieClient(bookie.address, timeout=30) as client:

        async def read(key: tuple[int, int]) -> bytes | int:
            try:
                return await client.read(*key)
            except BookieUnavailableError:
                raise
            except BookieError as e:
                return e.status

        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            results = await asyncio.gather(*(read(k) for k in chunk))
            for key, result in zip(chunk, results, strict=True):
                if isinstance(result, bytes):
                    verify_entry(result)  # raises on corrupt bytes
                    assert result == writer.sent[key], f"{key} read back different bytes"
                elif key in writer.acked:
                    lost.append(key)
                else:
                    assert result in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER), (
                        f"{key}: unexpected status {pb.Status.Name(result)}"
                    )
        assert not lost, (
            f"{len(lost)} of {len(writer.acked)} acknowledged entries lost, e.g. {lost[:10]}"
        )
        for ledger_id in LEDGERS:
            acked_ids = [e for lid, e in writer.acked if lid == ledger_id]
            last = verify_entry(await client.read(ledger_id, -1))
            assert last.entry_id >= max(acked_ids)
            position = await client.read_lac(ledger_id)
            assert position.last_entry_id == last.entry_id


@pytest.mark.parametrize(
    ("checkpoint_interval_s", "need_checkpoint"),
    [(3600.0, False), (0.2, True)],
    ids=["before-any-checkpoint", "around-checkpoints"],
)
async def test_sigkill_mid_stream_loses_no_acknowledged_entry(
    bookies: BookieFactory, checkpoint_interval_s: float, need_checkpoint: bool
) -> None:
    settings: dict[str, object] = {
        "journal_sync": True,
        "checkpoint_interval_s": checkpoint_interval_s,
        "journal_file_max_bytes": 1 << 20,  # replay spans many journal files
    }
    if need_checkpoint:
        # A small write cache also makes memtable-full flushes race the timed checkpoints.
        settings |= {"write_cache_bytes": 4 << 20, "max_entry_size": 64 << 10}
    bookie = bookies.start(**settings)
    writer = Writer(seed=int(checkpoint_interval_s * 10))
    await writer.run_until_killed(bookie, kill_after_acks=3000, need_checkpoint=need_checkpoint)
    if not need_checkpoint:
        assert entry_log_data_bytes(bookie) == 0, "a checkpoint ran before the kill"
    assert len(writer.acked) >= 3000
    assert len(writer.sent) > len(writer.acked), "the kill did not land mid-stream"

    bookie.start()
    await check_after_restart(bookie, writer)

    # Recovered state is durable too: checkpoint it, restart cleanly, check again.
    bookie.checkpoint()
    bookie.restart()
    await check_after_restart(bookie, writer)


@pytest.mark.parametrize("how", ["kill", "stop"])
async def test_journal_cut_mid_record(bookies: BookieFactory, how: str) -> None:
    bookie = bookies.start(journal_sync=True, checkpoint_interval_s=3600)
    rng = random.Random(7)
    sent = {
        i: encode_entry(1, i, i - 1, i, rng.randbytes(rng.randint(100, 2000))) for i in range(200)
    }
    async with BookieClient(bookie.address) as client:
        # Entry 199 goes alone, so it is the journal's last record (adds sent together share
        # one batch record): the cut below tears exactly that record.
        await asyncio.gather(*(client.add(1, i, e) for i, e in sent.items() if i < 199))
        await client.add(1, 199, sent[199])
    if how == "kill":
        bookie.kill()
    else:
        assert bookie.stop() == 0
    newest = bookie.journal_files[-1]
    size = newest.stat().st_size
    cut = 5 if how == "kill" else 3
    if how == "kill":
        assert size > 1000, "the newest journal file should hold the adds (no checkpoint ran)"
    os.truncate(newest, size - cut)

    bookie.start()
    survivors = dict(sent) if how == "stop" else {i: e for i, e in sent.items() if i < 199}
    async with BookieClient(bookie.address) as client:
        got = await asyncio.gather(*(client.read(1, i) for i in survivors))
        assert got == list(survivors.values())
        if how == "kill":
            with pytest.raises(BookieError) as err:
                await client.read(1, 199)  # its record was cut
            assert err.value.status_name == "NO_SUCH_ENTRY"
            assert verify_entry(await client.read(1, -1)).entry_id == 198
            # The writer re-sends it and goes on; all of it survives another crash.
            await client.add(1, 199, sent[199])
        more = {i: encode_entry(1, i, i - 1, i, rng.randbytes(500)) for i in range(200, 210)}
        await asyncio.gather(*(client.add(1, i, e) for i, e in more.items()))
        sent |= more
    if how == "kill":
        assert newest.stat().st_size < size - cut, "replay did not cut the torn record off"
    bookie.restart(kill=True)
    async with BookieClient(bookie.address) as client:
        got = await asyncio.gather(*(client.read(1, i) for i in sent))
        assert got == list(sent.values())


async def test_sigterm_mid_stream_keeps_every_acknowledged_entry(bookies: BookieFactory) -> None:
    """A clean shutdown with an add stream and a long poll open: no hang, nothing acked lost."""
    bookie = bookies.start(journal_sync=True, checkpoint_interval_s=0.5)
    writer = Writer(seed=99)
    async with BookieClient(bookie.address, timeout=30) as poller:
        await poller.add(999, 0, encode_entry(999, 0, -1, 0, b"first"))
        poll = asyncio.create_task(poller.read_lac(999, previous=0, wait_ms=60_000))
        await writer.run_until_killed(bookie, kill_after_acks=2000, sigterm=True)
        results = await asyncio.gather(poll, return_exceptions=True)
        assert isinstance(results[0], BookieError), results  # the poll ended with the bookie
    assert len(writer.acked) >= 2000
    bookie.start()
    await check_after_restart(bookie, writer)


async def test_paused_past_its_session_the_bookie_registers_again(
    bookies: BookieFactory, etcd_server: EtcdServer
) -> None:
    bookie = bookies.start(metadata_url=etcd_server.url, session_ttl_s=2, journal_sync=False)
    key = registration_key(bookie.address)
    store = await open_store(etcd_server.url)
    try:
        assert await store.get(key) is not None
        bookie.pause()
        try:
            for _ in range(100):  # the lease runs out while the bookie is frozen
                if await store.get(key) is None:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("registration outlived the session of a paused bookie")
        finally:
            bookie.resume()
        for _ in range(150):
            if await store.get(key) is not None:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"bookie never registered again:\n{bookie.log_tail()}")
        assert bookie.http("GET", "/ready")[0] == 200
        async with BookieClient(bookie.address) as client:
            data = encode_entry(5, 0, -1, 1, b"after the pause")
            await client.add(5, 0, data)
            assert await client.read(5, 0) == data
        # The new registration belongs to a live session: it stays.
        await asyncio.sleep(3)
        assert await store.get(key) is not None
    finally:
        await store.close()
