"""Ledger faults with real processes: a bookie killed or paused under a writer, a writer fenced
by recovery (alive, or SIGKILLed mid-flight), concurrent recoverers, a corrupt replica.

What must hold (ARCHITECTURE.md "Storage layer"): every add acknowledged to a writer is in the
ledger byte for byte, whatever failed; after recovery the old writer can add nothing; every
recoverer agrees on the ledger's end; a corrupt copy is detected and another replica served.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.common.ledger.bookie_client import BookieClient, BookieError
from magnetar.common.ledger.client import LedgerClient, LedgerClientConfig
from magnetar.common.ledger.entry import verify_entry
from magnetar.common.ledger.errors import EntryTooLargeError, LedgerFencedError
from magnetar.common.ledger.handle import LedgerHandle
from magnetar.common.ledger.metadata import LedgerMetadata, LedgerState
from magnetar.common.proto import bookie_pb2 as pb
from tests.support.ledger_cluster import LedgerCluster, ledger_cluster_fixture, payload_for

# Generous bounds so a broken product fails the test instead of hanging it.
WAIT_S = 60.0
#: Long enough that a healthy bookie slowed by a loaded machine is not taken for the paused one
#: (four bookies: a second replacement would find no spare), short enough to keep tests quick.
PAUSED_ADD_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerCluster]:
    """Shared by the module's tests: each works on ledgers of its own, and none leaves a bookie
    down (a paused one is resumed, a stopped one started again)."""
    yield from ledger_cluster_fixture(tmp_path_factory.mktemp("cluster3"), 3)


@pytest.fixture
def cluster4(tmp_path: Path) -> Iterator[LedgerCluster]:
    yield from ledger_cluster_fixture(tmp_path, 4)


class Writer:
    """Pipelined adds of :func:`payload_for` payloads; remembers what was acknowledged."""

    def __init__(self, handle: LedgerHandle, size: int = 300) -> None:
        self.handle = handle
        self.size = size
        self.next_id = 0
        self.acked: list[int] = []
        self.errors: list[BaseException] = []
        self.futures: list[asyncio.Future[int]] = []
        self._progress = asyncio.Event()
        self.pushed = asyncio.Event()  # set at every add started

    def payload(self, entry_id: int) -> bytes:
        return payload_for(self.handle.ledger_id, entry_id, self.size)

    def _done(self, fut: asyncio.Future[int]) -> None:
        if fut.exception() is None:
            self.acked.append(fut.result())
        else:
            self.errors.append(fut.exception())  # type: ignore[arg-type]
        self._progress.set()

    async def push(self, count: int, max_in_flight: int | None = None) -> None:
        """Start ``count`` adds (waits only for window room, and with ``max_in_flight`` until
        no more than that many are unacknowledged)."""
        for _ in range(count):
            if max_in_flight is not None:
                await self.wait_acked(self.next_id - max_in_flight)
            fut = await self.handle.add_async(self.payload(self.next_id))
            self.next_id += 1
            self.pushed.set()
            fut.add_done_callback(self._done)
            self.futures.append(fut)
            if self.next_id % 100 == 0:
                await asyncio.sleep(0)

    async def settle(self) -> None:
        await asyncio.wait_for(asyncio.gather(*self.futures, return_exceptions=True), WAIT_S)

    async def wait_acked(self, count: int) -> None:
        if len(self.acked) >= count:
            return

        async def poll() -> None:
            while len(self.acked) < count:
                if self.errors:
                    raise AssertionError(f"adds failed: {self.errors[:3]}")
                self._progress.clear()
                await self._progress.wait()

        await asyncio.wait_for(poll(), WAIT_S)


async def read_back(client: LedgerClient, ledger_id: int, expected: dict[int, bytes]) -> None:
    """Open (with recovery) and check every expected entry is there, byte for byte."""
    handle = await client.open_ledger(ledger_id)
    last = max(expected, default=-1)
    assert handle.readable_last_entry >= last
    entries = await handle.read(0, handle.readable_last_entry)
    assert [e.entry_id for e in entries] == list(range(handle.readable_last_entry + 1))
    for e in entries:
        if e.entry_id in expected:
            assert e.payload == expected[e.entry_id], f"entry {e.entry_id} read back different"


async def check_every_copy(
    ledger_id: int, metadata: LedgerMetadata, expected: dict[int, bytes]
) -> None:
    """Every copy any bookie of a fragment holds of an entry of that fragment is intact and is
    the entry that was sent (a bookie may lack entries it never got)."""
    ends = [f.first_entry_id for f in metadata.fragments[1:]] + [metadata.last_entry_id + 1]

    async def check(bookie: BookieClient, address: str, e: int) -> None:
        try:
            entry = await bookie.read(ledger_id, e)
        except BookieError as err:
            assert err.status in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER), err
            return
        header = verify_entry(entry)
        assert (header.ledger_id, header.entry_id) == (ledger_id, e)
        assert entry.endswith(expected[e]), f"{address} holds a wrong entry {e}"

    for fragment, end in zip(metadata.fragments, ends, strict=True):
        for address in fragment.bookies:
            async with BookieClient(address) as bookie:
                for first in range(fragment.first_entry_id, end, 100):
                    last = min(first + 100, end)
                    await asyncio.gather(*(check(bookie, address, e) for e in range(first, last)))


async def test_bookie_killed_mid_write_ensemble_change(cluster4: LedgerCluster) -> None:
    """4 bookies, E3/Qw2/Qa2: SIGKILL an ensemble bookie while thousands of adds are in flight.
    Writes go on through an ensemble change; nothing acknowledged is lost."""
    async with cluster4.client() as client:
        handle = await client.create_ledger(3, 2, 2)
        ensemble = handle.ensemble
        spare = {b.address for b in cluster4.bookies} - set(ensemble)
        writer = Writer(handle)
        pushing = asyncio.create_task(writer.push(5000, max_in_flight=1000))
        await writer.wait_acked(1000)
        # Under load the acks can catch up with the pusher for a moment (seen once in a full
        # run): wait until some adds are in flight, so the kill below lands mid-write.
        while writer.next_id == len(writer.acked) and not pushing.done():
            writer.pushed.clear()
            await asyncio.wait_for(writer.pushed.wait(), WAIT_S)
        # Adds are still being pushed and many are in flight when the bookie dies.
        in_flight = writer.next_id - len(writer.acked)
        acked_at_kill = len(writer.acked)
        victim_position = writer.next_id % 3
        victim = ensemble[victim_position]
        cluster4.bookie(victim).kill()  # synchronous: no add is sent while it dies
        first_sent_after_kill = writer.next_id
        await asyncio.wait_for(pushing, WAIT_S)
        await writer.settle()
        assert in_flight > 0 and first_sent_after_kill < 5000, "the kill was not mid-write"
        assert writer.errors == [], f"adds failed after a single bookie died: {writer.errors[:3]}"
        assert writer.acked == list(range(writer.next_id)), "acks out of order or missing"
        await handle.close()

        metadata, _ = await client.read_metadata(handle.ledger_id)
        assert metadata.state is LedgerState.CLOSED
        assert metadata.last_entry_id == writer.next_id - 1
        assert len(metadata.fragments) == 2, metadata.fragments
        first, second = metadata.fragments
        assert first.first_entry_id == 0 and first.bookies == ensemble
        assert victim not in second.bookies
        assert second.bookies[victim_position] in spare
        for p in range(3):
            if p != victim_position:
                assert second.bookies[p] == ensemble[p], "a live bookie was replaced"
        # The change starts where acks stopped: not before an entry acked before the kill, and
        # not after the first entry sent after the kill that the dead bookie had to store.
        must_move = next(
            e
            for e in range(first_sent_after_kill, writer.next_id)
            if victim_position in handle.metadata.quorum.write_set(e)
        )
        assert acked_at_kill <= second.first_entry_id <= must_move, (
            acked_at_kill,
            second.first_entry_id,
            must_move,
        )

    async with cluster4.client() as reader:
        await read_back(
            reader, handle.ledger_id, {i: writer.payload(i) for i in range(writer.next_id)}
        )
        # Entries of the new fragment really are on the replacement bookie.
        replacement = second.bookies[victim_position]
        quorum = metadata.quorum
        async with BookieClient(replacement) as bookie:
            for e in range(second.first_entry_id, writer.next_id):
                if victim_position in quorum.write_set(e):
                    entry = await bookie.read(handle.ledger_id, e)
                    assert entry.endswith(writer.payload(e))
        assert reader.corrupt_reads == 0


async def test_no_add_completes_while_the_ensemble_changes(
    cluster3: LedgerCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """E2/Qw2/Qa2 on [A, B]: A stores entry N while B is paused, then A dies and the next add
    finds it gone. The change starts at N (the first unacknowledged entry) and puts C in A's
    place, so N must reach C before it is acknowledged. B's ack arriving while the change waits on the metadata store must not
    complete N on A's earlier ack: that left N on B alone while the metadata named C (seen in
    CI: a decommissioned bookie took the only other copy of an acknowledged entry with it)."""
    caplog.set_level(logging.WARNING, logger="magnetar.common.ledger.handle")
    async with cluster3.client() as client:
        handle = await client.create_ledger(2, 2, 2)
        a, b = handle.ensemble
        for i in range(10):
            await handle.add(payload_for(handle.ledger_id, i))
        entry = 10
        cluster3.bookie(b).pause()
        try:
            added = await handle.add_async(payload_for(handle.ledger_id, entry))
            async with BookieClient(a) as on_a:
                await wait_stored(on_a, handle.ledger_id, entry)
            assert not added.done()
            cluster3.etcd.pause()  # the change cannot reach the metadata store until resumed
            try:
                cluster3.bookie(a).kill()
                # The next add finds A gone (as the writer in CI found its bookie read-only).
                later = await handle.add_async(payload_for(handle.ledger_id, entry + 1))
                failed = f"bookie {a} (position 0) failed"
                for _ in range(int(WAIT_S / 0.01)):
                    if any(failed in r.getMessage() for r in caplog.records):
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError(f"the writer never noticed {a} was gone")
                cluster3.bookie(b).resume()
                async with BookieClient(b) as on_b:
                    await wait_stored(on_b, handle.ledger_id, entry)
                await asyncio.sleep(0.3)  # B's ack reaches the handle meanwhile
                assert not added.done(), "entry acknowledged during the ensemble change"
            finally:
                cluster3.etcd.resume()
            assert await asyncio.wait_for(added, WAIT_S) == entry
            assert await asyncio.wait_for(later, WAIT_S) == entry + 1
            await handle.close()
        finally:
            cluster3.bookie(b).resume()
            if not cluster3.bookie(a).running:
                cluster3.bookie(a).start()
        metadata, _ = await client.read_metadata(handle.ledger_id)
        (_, first), (_, second) = [(f.first_entry_id, f.bookies) for f in metadata.fragments]
        assert metadata.fragments[1].first_entry_id == entry and first == (a, b), metadata
        replacement = second[0]
        assert replacement not in (a, b) and second[1] == b, metadata
        async with BookieClient(replacement) as on_c:
            stored = await on_c.read(handle.ledger_id, entry)
        assert stored.endswith(payload_for(handle.ledger_id, entry))


async def wait_stored(bookie: BookieClient, ledger_id: int, entry_id: int) -> None:
    """Until ``bookie`` answers a read of the entry (it stored it)."""

    async def poll() -> None:
        while True:
            try:
                await bookie.read(ledger_id, entry_id)
                return
            except BookieError as e:
                if e.status not in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER):
                    raise
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), WAIT_S)


async def test_bookie_paused_adds_complete_at_ack_quorum(cluster4: LedgerCluster) -> None:
    """E3/Qw3/Qa2: SIGSTOP one ensemble bookie; adds keep completing on the other two; after
    SIGCONT and close, every entry reads back, and no replica holds a corrupt copy."""
    config = LedgerClientConfig(add_timeout_s=PAUSED_ADD_TIMEOUT_S)
    async with cluster4.client(config) as client:
        handle = await client.create_ledger(3, 3, 2)
        ensemble = handle.ensemble
        writer = Writer(handle)
        await writer.push(300)
        await writer.settle()
        paused = cluster4.bookie(ensemble[1])
        paused.pause()
        try:
            before = len(writer.acked)
            await writer.push(1500)
            await writer.settle()  # fails (timeout) if adds wait for the paused bookie
            assert len(writer.acked) == before + 1500
            assert writer.errors == []
        finally:
            paused.resume()
        await writer.push(500)
        await writer.settle()
        assert writer.errors == [], writer.errors[:3]
        assert writer.acked == list(range(writer.next_id))
        await handle.close()
        metadata, _ = await client.read_metadata(handle.ledger_id)
        assert metadata.last_entry_id == writer.next_id - 1

    expected = {i: writer.payload(i) for i in range(writer.next_id)}
    async with cluster4.client() as reader:
        await read_back(reader, handle.ledger_id, expected)
        assert reader.corrupt_reads == 0
        await check_every_copy(handle.ledger_id, metadata, expected)


async def test_paused_bookie_is_replaced_after_add_timeout(cluster4: LedgerCluster) -> None:
    """E3/Qw2/Qa2: with one write-set bookie paused, adds cannot reach Qa; after
    ``add_timeout_s`` the writer replaces it (ensemble change) and the adds complete. Its late
    answers after SIGCONT change nothing."""
    config = LedgerClientConfig(add_timeout_s=PAUSED_ADD_TIMEOUT_S)
    async with cluster4.client(config) as client:
        handle = await client.create_ledger(3, 2, 2)
        ensemble = handle.ensemble
        writer = Writer(handle)
        await writer.push(200)
        await writer.settle()
        paused = cluster4.bookie(ensemble[0])
        paused.pause()
        try:
            await writer.push(600)
            await writer.settle()  # times out (fails) if a silent bookie is never replaced
            assert writer.errors == [], writer.errors[:3]
            assert writer.acked == list(range(800))
        finally:
            paused.resume()
        await writer.push(300)
        await writer.settle()
        assert writer.errors == [], writer.errors[:3]
        assert writer.acked == list(range(1100))
        await handle.close()
        metadata, _ = await client.read_metadata(handle.ledger_id)
        assert metadata.last_entry_id == 1099
        assert len(metadata.fragments) == 2, metadata.fragments
        assert 200 <= metadata.fragments[1].first_entry_id <= 800
        assert paused.address not in metadata.fragments[1].bookies
        assert metadata.fragments[1].bookies[1:] == ensemble[1:]

    expected = {i: writer.payload(i) for i in range(writer.next_id)}
    async with cluster4.client() as reader:
        await read_back(reader, handle.ledger_id, expected)
        assert reader.corrupt_reads == 0
    await check_every_copy(handle.ledger_id, metadata, expected)


async def test_recovery_with_a_dead_ensemble_bookie(cluster4: LedgerCluster) -> None:
    """The writer stops (as if crashed) and a bookie of its ensemble dies too: recovery still
    fences (the two live bookies cover every write quorum of E3/Qw2/Qa2), finds the last
    acknowledged entry and closes the ledger with it. The entries past the LAC the bookies
    know (hundreds: the last adds were pipelined) must be re-replicated to Qa bookies, so
    recovery has to replace the dead one, as BookKeeper's recovery does through an ensemble
    change, and every entry from the change on must be on the bookies the metadata names."""
    async with cluster4.client() as a_client:
        a = await a_client.create_ledger(3, 2, 2)
        for i in range(100):
            assert await a.add(payload_for(a.ledger_id, i)) == i
        pipelined = [await a.add_async(payload_for(a.ledger_id, i)) for i in range(100, 400)]
        assert await asyncio.gather(*pipelined) == list(range(100, 400))
        dead = a.ensemble[0]
        cluster4.bookie(dead).kill()
        async with cluster4.client() as b_client:
            b = await asyncio.wait_for(b_client.open_ledger(a.ledger_id), WAIT_S)
            assert b.metadata.state is LedgerState.CLOSED
            assert b.metadata.last_entry_id == 399, "an acknowledged entry was dropped"
            entries = await b.read(0, 399)
            assert [e.payload for e in entries] == [payload_for(a.ledger_id, i) for i in range(400)]
            with pytest.raises(LedgerFencedError):
                await a.add(b"after recovery")
        metadata = b.metadata
        assert len(metadata.fragments) == 2, metadata.fragments
        changed = metadata.fragments[1]
        assert dead not in changed.bookies and changed.first_entry_id < 300, changed
        for position, address in enumerate(changed.bookies):
            async with BookieClient(address) as bookie:
                for e in range(changed.first_entry_id, 400):
                    if position in metadata.quorum.write_set(e):
                        stored = await bookie.read(a.ledger_id, e)
                        assert stored.endswith(payload_for(a.ledger_id, e)), (e, address)


async def test_recovery_with_a_paused_ensemble_bookie(cluster3: LedgerCluster) -> None:
    """E3/Qw3/Qa2 with one bookie paused (SIGSTOP: alive but silent, like a partition):
    fencing holds with the other two (Qw - Qa + 1 = 2 of the one write quorum), the entries
    past the LAC are found on them and re-added to Qa bookies, so recovery can finish without
    the paused one. It must not wait for an answer that may never come."""
    async with cluster3.client() as a_client:
        a = await a_client.create_ledger(3, 3, 2)
        for i in range(50):
            assert await a.add(payload_for(a.ledger_id, i)) == i
        paused = cluster3.bookie(a.ensemble[2])
        paused.pause()
        try:
            config = LedgerClientConfig(add_timeout_s=PAUSED_ADD_TIMEOUT_S, read_timeout_s=2.0)
            async with cluster3.client(config) as b_client:
                b = await asyncio.wait_for(b_client.open_ledger(a.ledger_id), 30)
                assert b.metadata.state is LedgerState.CLOSED
                assert b.metadata.last_entry_id == 49
                entries = await b.read(0, 49)
                assert [e.payload for e in entries] == [
                    payload_for(a.ledger_id, i) for i in range(50)
                ]
        finally:
            paused.resume()


async def test_fencing_race_with_a_live_writer(cluster3: LedgerCluster) -> None:
    """A keeps writing while B opens the ledger with recovery: A's next add fails with
    LedgerFencedError, B's ledger holds everything A was told succeeded, and A's close does
    not move B's end."""
    async with cluster3.client() as a_client, cluster3.client() as b_client:
        a = await a_client.create_ledger(3, 2, 2)
        writer = Writer(a)
        stop = asyncio.Event()

        async def keep_writing() -> None:
            try:
                while not stop.is_set():
                    await writer.push(50)
            except LedgerFencedError:
                pass

        pushing = asyncio.create_task(keep_writing())
        await writer.wait_acked(500)
        b = await asyncio.wait_for(b_client.open_ledger(a.ledger_id), WAIT_S)
        acked_when_recovered = list(writer.acked)
        stop.set()
        await asyncio.wait_for(pushing, WAIT_S)
        await writer.settle()

        assert b.metadata.state is LedgerState.CLOSED
        last = b.metadata.last_entry_id
        assert writer.acked, "nothing was acknowledged"
        assert max(writer.acked) <= last, (
            f"A was told entry {max(writer.acked)} succeeded; recovery ended the ledger at {last}"
        )
        assert len(acked_when_recovered) <= len(writer.acked)
        assert all(isinstance(e, LedgerFencedError) for e in writer.errors), writer.errors[:3]
        with pytest.raises(LedgerFencedError):
            await a.add(b"after the takeover")

        entries = await b.read(0, last)
        for e in entries:
            assert e.payload == writer.payload(e.entry_id), f"entry {e.entry_id} differs"

        meta_before, _ = await b_client.read_metadata(a.ledger_id)
        await a.close()
        meta_after, _ = await b_client.read_metadata(a.ledger_id)
        assert meta_after.state is LedgerState.CLOSED
        assert (meta_after.last_entry_id, meta_after.length) == (last, b.metadata.length)
        assert meta_after == meta_before


class WriterProcess:
    """The ledger_cluster writer in a subprocess; collects its ``acked N`` lines."""

    def __init__(self, cluster: LedgerCluster, count: int) -> None:
        self.process = cluster.writer_process(3, 2, 2, count)
        self.log_path = cluster.writer_log(self.process)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    @property
    def ledger_id(self) -> int:
        return int(self.lines[0].split()[1])

    @property
    def acked(self) -> list[int]:
        return [int(line.split()[1]) for line in list(self.lines) if line.startswith("acked ")]

    async def wait_acked(self, count: int) -> None:
        async def poll() -> None:
            while len(self.acked) < count:
                if self.process.poll() is not None:
                    err = self.log_path.read_text(errors="replace")[-3000:]
                    raise AssertionError(f"writer exited early ({self.process.returncode}): {err}")
                await asyncio.sleep(0.02)

        await asyncio.wait_for(poll(), WAIT_S)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(10)  # everything it printed before dying


async def test_writer_killed_mid_flight_recovery_keeps_every_ack(cluster3: LedgerCluster) -> None:
    writer = WriterProcess(cluster3, 1_000_000)
    try:
        await writer.wait_acked(1500)
    finally:
        writer.kill()
    acked = writer.acked
    assert acked == list(range(len(acked))), "the writer printed acks out of order"
    async with cluster3.client() as client:
        metadata, _ = await client.read_metadata(writer.ledger_id)
        assert metadata.state is LedgerState.OPEN
        handle = await asyncio.wait_for(client.open_ledger(writer.ledger_id), WAIT_S)
        last = handle.metadata.last_entry_id
        assert last >= acked[-1], f"acked up to {acked[-1]}, recovered only to {last}"
        entries = await handle.read(0, last)
        assert [e.entry_id for e in entries] == list(range(last + 1))
        for e in entries:  # acked ones, and the unacked ones recovery kept, are what was sent
            assert e.payload == payload_for(writer.ledger_id, e.entry_id), e.entry_id
        assert handle.metadata.length == sum(len(e.payload) for e in entries)
        # Recovery re-replicated what it kept: each entry is on its whole write set now.
        fragment = handle.metadata.last_fragment
        quorum = handle.metadata.quorum
        for e in range(max(0, last - 50), last + 1):
            for p in quorum.write_set(e):
                copy = await client.bookie(fragment.bookies[p]).read(writer.ledger_id, e)
                assert copy.endswith(payload_for(writer.ledger_id, e))


async def test_concurrent_recoverers_agree(cluster3: LedgerCluster) -> None:
    writer = WriterProcess(cluster3, 1_000_000)
    try:
        await writer.wait_acked(800)
    finally:
        writer.kill()
    acked = writer.acked
    async with cluster3.client() as one, cluster3.client() as two:
        h1, h2 = await asyncio.wait_for(
            asyncio.gather(one.open_ledger(writer.ledger_id), two.open_ledger(writer.ledger_id)),
            WAIT_S,
        )
        assert h1.metadata.state is LedgerState.CLOSED
        assert h2.metadata.state is LedgerState.CLOSED
        assert (h1.metadata.last_entry_id, h1.metadata.length) == (
            h2.metadata.last_entry_id,
            h2.metadata.length,
        )
        stored, _ = await one.read_metadata(writer.ledger_id)
        assert (stored.last_entry_id, stored.length) == (
            h1.metadata.last_entry_id,
            h1.metadata.length,
        )
        assert stored.last_entry_id >= acked[-1]
        # A third recoverer later finds it closed and changes nothing.
        h3 = await one.open_ledger(writer.ledger_id)
        assert h3.metadata.last_entry_id == stored.last_entry_id


async def test_corrupt_replica_is_detected_and_another_served(cluster3: LedgerCluster) -> None:
    """Flip a payload byte in one bookie's entry log; reads, single and by range, return the
    good replica's bytes and the client counts (reports) the corrupt copy."""
    async with cluster3.client() as client:
        handle = await client.create_ledger(2, 2, 2)  # every entry on both: range reads
        ledger_id = handle.ledger_id
        for i in range(60):
            await handle.add(payload_for(ledger_id, i, 400))
        await handle.close()
    target = 31
    good = payload_for(ledger_id, target, 400)
    # The bookie first in the entry's write set is the one a reader asks first.
    position = handle.metadata.quorum.write_set(target)[0]
    bookie = cluster3.bookie(handle.metadata.last_fragment.bookies[position])
    bookie.checkpoint()
    assert bookie.stop() == 0
    flipped = 0
    for log_file in bookie.entry_log_files:
        data = bytearray(log_file.read_bytes())
        at = data.find(good)
        if at >= 0:
            data[at + 200] ^= 0xFF
            log_file.write_bytes(bytes(data))
            flipped += 1
    assert flipped == 1, f"entry {target} found in {flipped} entry logs of {bookie.address}"
    bookie.start()

    # A long speculative delay: the corrupt replica answers first, deterministically.
    async with cluster3.client(LedgerClientConfig(speculative_read_s=5.0)) as reader:
        opened = await reader.open_ledger(ledger_id)
        entry = await opened.read_entry(target)
        assert entry.payload == good
        assert reader.corrupt_reads >= 1, "the corrupt copy was not reported"
        entries = await opened.read(0, 59)
        assert [e.payload for e in entries] == [payload_for(ledger_id, i, 400) for i in range(60)]
        # The corrupt bookie's range ends before the bad copy; from it, the other replica.
        entries = await opened.read_batch(0, 59)
        assert [e.payload for e in entries] == [payload_for(ledger_id, i, 400) for i in range(60)]
    # The bookie itself refuses to serve the bad copy as good.
    async with BookieClient(bookie.address) as direct:
        with pytest.raises(BookieError) as bad:
            await direct.read(ledger_id, target)
        assert bad.value.status == pb.DIGEST_MISMATCH


async def test_grouped_adds_survive_a_bookie_killed_mid_write(cluster4: LedgerCluster) -> None:
    """4 bookies, E3/Qw3/Qa2 (every entry on the whole ensemble, so consecutive adds go as
    groups, as a managed ledger sends them): SIGKILL an ensemble bookie while groups are in
    flight. Every group is acknowledged, in order, with the ids it was given; the replacement
    holds the entries from the change on; every entry reads back byte for byte."""
    group_size, groups = 50, 80
    async with cluster4.client() as client:
        handle = await client.create_ledger(3, 3, 2)
        assert handle.groups_adds
        ensemble = handle.ensemble
        spare = {b.address for b in cluster4.bookies} - set(ensemble)
        told: list[tuple[int, BaseException | None]] = []
        progress = asyncio.Event()
        sent: dict[int, bytes] = {}

        def answered(first: int, error: BaseException | None) -> None:
            told.append((first, error))
            progress.set()

        async def wait_told(count: int) -> None:
            while len(told) < count:
                progress.clear()
                await asyncio.wait_for(progress.wait(), WAIT_S)

        killed_at = None
        for number in range(groups):
            first = number * group_size
            payloads = [payload_for(handle.ledger_id, first + i, 300) for i in range(group_size)]
            while not handle.try_push_group(payloads, answered):
                await asyncio.wait_for(handle.wait_for_room(), WAIT_S)
            sent.update({first + i: p for i, p in enumerate(payloads)})
            if number == groups // 2:
                await wait_told(10)
                killed_at = len(told)
                victim = ensemble[1]
                cluster4.bookie(victim).kill()  # groups still in flight
            if number % 4 == 0:
                await asyncio.sleep(0)
        await wait_told(groups)
        assert killed_at is not None and killed_at < groups, "the kill was not mid-write"
        assert [error for _, error in told] == [None] * groups, told[:3]
        assert [first for first, _ in told] == [n * group_size for n in range(groups)]
        assert handle.last_add_confirmed == groups * group_size - 1
        # Qa2 of Qw3: the adds were acknowledged by the two bookies left; the replacement's
        # copies may still be on their way (a new connection to it, a loaded machine). Wait
        # for its copy of the last entry while the client is open, as BookKeeper's close
        # does not wait for them either.
        [replacement] = set(handle.ensemble) - set(ensemble)
        async with BookieClient(replacement) as bookie:
            await wait_stored(bookie, handle.ledger_id, groups * group_size - 1)
        await handle.close()
        metadata, _ = await client.read_metadata(handle.ledger_id)
        assert metadata.last_entry_id == groups * group_size - 1
        assert len(metadata.fragments) == 2, metadata.fragments
        second = metadata.fragments[1]
        assert victim not in second.bookies and second.bookies[1] in spare
        # Groups are acknowledged whole: the change starts at a group's first entry.
        assert second.first_entry_id % group_size == 0

    async with cluster4.client() as reader:
        await read_back(reader, handle.ledger_id, sent)
        async with BookieClient(second.bookies[1]) as bookie:
            for e in range(second.first_entry_id, groups * group_size, 97):
                assert (await bookie.read(handle.ledger_id, e)).endswith(sent[e])
        assert reader.corrupt_reads == 0


async def test_grouped_and_single_adds_interleave(cluster3: LedgerCluster) -> None:
    """Groups and single adds on one handle take consecutive ids, complete in order, and read
    back as sent; an entry over the limit in a group is refused before anything is sent."""
    async with cluster3.client() as client:
        handle = await client.create_ledger(2, 2, 2)
        order: list[tuple[str, int]] = []
        expected: dict[int, bytes] = {}

        def told(first: int, error: BaseException | None) -> None:
            assert error is None, error
            order.append(("group", first))

        single = []
        for round_number in range(20):
            base = len(expected)
            payloads = [payload_for(handle.ledger_id, base + i, 100) for i in range(7)]
            assert handle.try_push_group(payloads, told)
            expected.update({base + i: p for i, p in enumerate(payloads)})
            alone = payload_for(handle.ledger_id, base + 7, 100)
            future = handle.try_add(alone)
            assert future is not None
            single.append(future)
            expected[base + 7] = alone
            if round_number % 5 == 0:
                await asyncio.sleep(0)
        ids = await asyncio.wait_for(asyncio.gather(*single), WAIT_S)
        assert ids == [8 * n + 7 for n in range(20)]
        assert order == [("group", 8 * n) for n in range(20)]
        too_large = [b"x" * 10, b"y" * (handle.max_entry_size + 1)]
        with pytest.raises(EntryTooLargeError):
            handle.try_push_group(too_large, told)
        assert handle.last_add_confirmed == 159
        await handle.close()
    async with cluster3.client() as reader:
        await read_back(reader, handle.ledger_id, expected)
