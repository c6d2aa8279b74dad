"""ManagedLedger and ManagedCursor on real in-process bookies sharing one local metadata store.

A "restart" is simulated by abandoning a managed ledger without closing it (its writer task is
cancelled and its LedgerClient closed, as if the broker died) and opening the same name with a
new LedgerClient on the same store.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.service import Bookie
from magnetar.broker.ledger.cursor import ManagedCursor
from magnetar.broker.ledger.errors import (
    ManagedLedgerError,
    ManagedLedgerFencedError,
    ManagedLedgerTerminatedError,
)
from magnetar.broker.ledger.ledger_info import ManagedLedgerConfig
from magnetar.broker.ledger.managed_ledger import ManagedLedger
from magnetar.broker.model.keys import managed_ledger_key
from magnetar.broker.model.position import Position
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.errors import NoSuchLedgerError
from magnetar.common.metadata import MetadataStore, open_store

TOPIC = "persistent://public/default/orders"
crashed: set[int] = set()  # managed ledgers abandoned by crash(): teardown leaves them be


#: The quorums every test runs with: entries striped over the ensemble (each add alone), and
#: written to the whole ensemble (consecutive adds go as groups: ``ManagedLedger._push_group``).
QUORUMS = {
    "striped": {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2},
    "grouped": {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2},
}


@dataclass
class Env:
    store: MetadataStore
    bookies: list[Bookie]
    base_dir: Path
    quorum: dict[str, int] = field(default_factory=lambda: QUORUMS["striped"])
    clients: list[LedgerClient] = field(default_factory=list)
    mls: list[ManagedLedger] = field(default_factory=list)

    def client(self) -> LedgerClient:
        client = LedgerClient(self.store)
        self.clients.append(client)
        return client

    async def open(self, name: str = TOPIC, **config: object) -> ManagedLedger:
        ml = await ManagedLedger.open(
            name,
            self.client(),
            self.store,
            ManagedLedgerConfig(**{**self.quorum, **config}),  # type: ignore[arg-type]
        )
        self.mls.append(ml)
        return ml


async def crash(ml: ManagedLedger) -> None:
    """Stop using ``ml`` without closing anything, as a broker that died would."""
    await ml.abandon()
    await ml.client.close()
    crashed.add(id(ml))


async def start_bookie(store: MetadataStore, directory: Path) -> Bookie:
    bookie = Bookie(
        BookieConfig(
            bind_address="127.0.0.1",
            advertised_address="127.0.0.1",
            port=0,
            http_port=0,
            journal_dir=str(directory / "journal"),
            ledger_dir=str(directory / "ledgers"),
            journal_sync=False,
        ),
        store,
    )
    await bookie.start()
    return bookie


@pytest.fixture(params=sorted(QUORUMS))
async def env(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    store = await open_store(f"local://{tmp_path}/meta.db")
    bookies = []
    for i in range(3):
        bookies.append(await start_bookie(store, tmp_path / f"b{i}"))
    environment = Env(store, bookies, tmp_path, QUORUMS[request.param])
    try:
        yield environment
    finally:
        for ml in environment.mls:
            if id(ml) in crashed:
                continue
            try:
                await ml.close()
            except Exception as e:  # a fenced or crashed instance may fail to close; fine here
                print(f"closing {ml}: {e}")
        for client in environment.clients:
            await client.close()
        for bookie in environment.bookies:
            await bookie.stop()
        await store.close()


def payload(i: int) -> bytes:
    return f"message-{i}-".encode() * (1 + i % 7)


async def add_many(ml: ManagedLedger, start: int, count: int) -> list[Position]:
    futures = [ml.add_entry_async(payload(i)) for i in range(start, start + count)]
    return list(await asyncio.gather(*futures))


async def test_append_and_read_across_rollovers(env: Env) -> None:
    ml = await env.open(max_entries_per_ledger=10)
    positions = await add_many(ml, 0, 35)
    assert positions == sorted(positions)
    assert len(set(positions)) == 35
    assert len({p.ledger_id for p in positions}) == 4  # 10 + 10 + 10 + 5
    assert [p.entry_id for p in positions[:12]] == [*range(10), 0, 1]
    assert ml.number_of_entries == 35
    assert ml.total_size == sum(len(payload(i)) for i in range(35))
    assert ml.last_confirmed_position == positions[-1]
    assert ml.first_position == positions[0]
    # Across ledger boundaries, through the cache and through the bookies.
    ml.reader.cache.clear()
    read = await ml.read_entries(positions[0], 100)
    assert [p for p, _ in read] == positions
    assert [d for _, d in read] == [payload(i) for i in range(35)]
    middle = await ml.read_entries(positions[8], 5)
    assert [p for p, _ in middle] == positions[8:13]
    assert ml.next_position(positions[9]) == positions[10]
    # A position past a ledger's end means the first entry of the next ledger.
    assert (await ml.read_entries(Position(positions[9].ledger_id, 10), 1))[0][0] == positions[10]
    # Single adds after pipelined ones keep going in order.
    assert await ml.add_entry(b"last") > positions[-1]


async def test_rollover_by_size(env: Env) -> None:
    ml = await env.open(max_ledger_size_bytes=1000)
    positions = [await ml.add_entry(b"x" * 300) for _ in range(9)]
    # A ledger rolls once it holds >= 1000 bytes: 4 entries each.
    assert [p.entry_id for p in positions] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert len(ml.ledger_ids) == 3


async def test_rollover_by_age(env: Env) -> None:
    ml = await env.open(max_ledger_age_s=0.0)
    positions = [await ml.add_entry(b"x") for _ in range(3)]
    # Every ledger is "too old" once it holds an entry, so each add starts a new one.
    assert [p.entry_id for p in positions] == [0, 0, 0]
    assert len({p.ledger_id for p in positions}) == 3


async def test_concurrent_opens_leave_one_owner(env: Env) -> None:
    first = await env.open()
    await first.add_entry(b"before")
    results = await asyncio.gather(env.open(), env.open(), return_exceptions=True)
    opened = [r for r in results if isinstance(r, ManagedLedger)]
    assert opened
    assert all(isinstance(r, ManagedLedgerFencedError) for r in results if r not in opened)
    outcomes = await asyncio.gather(
        *(ml.add_entry(b"mine") for ml in [first, *opened]), return_exceptions=True
    )
    # Exactly one instance (the last to open) still owns the managed ledger.
    assert sum(isinstance(o, Position) for o in outcomes) == 1
    assert all(isinstance(o, (Position, ManagedLedgerFencedError)) for o in outcomes)


async def test_failed_ledger_is_replaced(env: Env) -> None:
    """A bookie of the ensemble dies with no spare to replace it: adds fail (not fenced), and
    once a bookie is back the next add recovers the broken ledger and rolls to a new one."""
    ml = await env.open(write_quorum=3, ack_quorum=3)  # every add needs every bookie
    before = await add_many(ml, 0, 5)
    victim = env.bookies.pop(0)
    await victim.stop()
    with pytest.raises(ManagedLedgerError) as failed:
        await ml.add_entry(b"lost?")
    assert not isinstance(failed.value, ManagedLedgerFencedError)
    env.bookies.append(await start_bookie(env.store, env.base_dir / "b-new"))
    after = await ml.add_entry(b"after")
    assert after.ledger_id > before[-1].ledger_id
    read = await ml.read_entries(before[0], 100)
    assert [p for p, _ in read][:5] == before
    assert read[-1] == (after, b"after")


async def test_reopen_recovers_the_last_ledger(env: Env) -> None:
    ml = await env.open(max_entries_per_ledger=8)
    positions = await add_many(ml, 0, 20)
    await crash(ml)

    again = await env.open(max_entries_per_ledger=8)
    read = await again.read_entries(again.first_position, 100)
    assert [p for p, _ in read] == positions
    assert [d for _, d in read] == [payload(i) for i in range(20)]
    new = await again.add_entry(b"after restart")
    assert new.ledger_id > positions[-1].ledger_id
    assert again.number_of_entries == 21

    # A clean close then reopen: the ledger that was current is closed, an empty one dropped.
    await again.close()
    third = await env.open(max_entries_per_ledger=8)
    assert third.number_of_entries == 21
    assert len(third.ledger_ids) == len(set(p.ledger_id for p in positions)) + 2


async def test_second_owner_fences_the_first(env: Env) -> None:
    first = await env.open(max_entries_per_ledger=25)
    await add_many(first, 0, 10)
    acked: list[tuple[Position, bytes]] = []

    async def produce() -> None:
        """Pipelined adds, 10 at a time, until the first owner is fenced."""
        i = 10
        while True:
            batch = [(first.add_entry_async(payload(j)), payload(j)) for j in range(i, i + 10)]
            i += 10
            for future, data in batch:
                try:
                    acked.append((await future, data))
                except ManagedLedgerFencedError:
                    await asyncio.gather(*(f for f, _ in batch), return_exceptions=True)
                    return

    producer = asyncio.create_task(produce())
    while first.number_of_entries < 40:  # the first owner is busy writing (and rolling over)
        await first.wait_for_entries_after(first.last_confirmed_position, 10)
    second = await env.open()
    await asyncio.wait_for(producer, 60)
    with pytest.raises(ManagedLedgerFencedError):
        await first.add_entry(b"too late")
    # Every entry the first owner acknowledged is in the second one's view, with its data.
    read = dict(await second.read_entries(second.first_position, 100_000))
    assert len(read) >= 10 + len(acked)
    for position, data in acked:
        assert read[position] == data
    assert await second.add_entry(b"new owner") > max(read)
    with pytest.raises(ManagedLedgerFencedError):
        await first.trim(Position(10**9, 0))
    with pytest.raises(ManagedLedgerFencedError):
        await first.delete()


async def test_cursor_ack_holes_and_mark_delete(env: Env) -> None:
    ml = await env.open(max_entries_per_ledger=5)
    positions = await add_many(ml, 0, 12)  # ledgers of 5, 5, 2
    cursor = await ml.open_cursor("sub", initial="earliest")
    assert cursor.backlog == 12
    read = await cursor.read_entries(100)
    assert [p for p, _ in read] == positions

    cursor.delete([positions[1], positions[2], positions[4], positions[5]])
    assert cursor.mark_delete_position < positions[0]
    assert cursor.backlog == 8
    assert cursor.is_acked(positions[4]) and not cursor.is_acked(positions[3])
    cursor.delete([positions[0]])
    assert cursor.mark_delete_position == positions[2]
    # Acking 3 joins the run up to 5, across the boundary between the first two ledgers.
    cursor.delete([positions[3]])
    assert cursor.mark_delete_position == positions[5]
    assert cursor.backlog == 6
    cursor.delete([positions[9], positions[10]])
    assert cursor.individually_acked.ranges() == [
        (positions[9].ledger_id, 4, 4),
        (positions[10].ledger_id, 0, 0),
    ]
    # Redelivery skips acked entries.
    cursor.rewind()
    assert [p for p, _ in await cursor.read_entries(100)] == [
        positions[6],
        positions[7],
        positions[8],
        positions[11],
    ]
    cursor.mark_delete(positions[7])
    assert cursor.backlog == 2
    await ml.close()

    # Persisted on close: a new owner sees the same state.
    again = await env.open(max_entries_per_ledger=5)
    loaded = await again.open_cursor("sub", initial="latest")
    assert loaded.mark_delete_position == positions[7]
    assert loaded.is_acked(positions[9]) and loaded.is_acked(positions[10])
    assert not loaded.is_acked(positions[8])
    assert [p for p, _ in await loaded.read_entries(100)] == [positions[8], positions[11]]
    loaded.delete([positions[8]])
    assert loaded.mark_delete_position == positions[10]
    # "latest" starts after the last entry.
    fresh = await again.open_cursor("fresh", initial="latest")
    assert fresh.backlog == 0
    later = await again.add_entry(b"later")
    assert [p for p, _ in await fresh.read_entries(10)] == [later]


async def test_cursor_persistence_bound(env: Env) -> None:
    """Acks persisted before a crash survive; acks of the last (unpersisted) interval are
    redelivered, never more is lost."""
    ml = await env.open(cursor_persist_interval_s=0.05)
    positions = await add_many(ml, 0, 10)
    cursor = await ml.open_cursor("sub", initial="earliest")
    version = (await env.store.get(cursor.key)).version  # type: ignore[union-attr]
    cursor.mark_delete(positions[3])
    cursor.delete([positions[6]])
    # Written within the interval, without close.
    for _ in range(200):
        found = await env.store.get(cursor.key)
        assert found is not None
        if found.version != version:
            break
        await asyncio.sleep(0.05)
    assert found.version != version
    # Now an interval long enough that the next acks are still in memory at the crash.
    ml.config.cursor_persist_interval_s = 3600
    cursor._last_persist = asyncio.get_running_loop().time()
    cursor.mark_delete(positions[8])
    await crash(ml)

    again = await env.open()
    loaded = await again.open_cursor("sub")
    assert loaded.mark_delete_position == positions[3]
    assert loaded.is_acked(positions[6])
    assert [p for p, _ in await loaded.read_entries(100)] == [
        positions[4],
        positions[5],
        positions[7],
        positions[8],
        positions[9],
    ]


async def test_stale_owner_cannot_overwrite_cursor(env: Env) -> None:
    first = await env.open()
    positions = await add_many(first, 0, 5)
    old_cursor = await first.open_cursor("sub", initial="earliest")
    second = await env.open()
    new_cursor = await second.open_cursor("sub")
    # The stale owner persists before it learns it was fenced (its CAS still matches).
    old_cursor.mark_delete(positions[4])
    await old_cursor.persist()
    # The newer owner's write wins over it, and the newer owner keeps persisting.
    new_cursor.mark_delete(positions[1])
    await new_cursor.persist()
    new_cursor.mark_delete(positions[2])
    await new_cursor.persist()
    await second.close()
    third = await env.open()
    assert (await third.open_cursor("sub")).mark_delete_position == positions[2]
    # And the stale owner, now fenced, stops writing.
    with pytest.raises(ManagedLedgerFencedError):
        await first.add_entry(b"x")
    old_cursor.mark_delete(positions[3])
    await old_cursor.persist()
    await third.close()
    fourth = await env.open()
    assert (await fourth.open_cursor("sub")).mark_delete_position == positions[2]


async def test_properties_are_stored(env: Env) -> None:
    ml = await env.open()
    await ml.set_property("schema", "v1")
    await ml.close()
    assert (await env.open()).properties == {"schema": "v1"}


async def test_terminate_is_kept_by_the_next_owner(env: Env) -> None:
    ml = await env.open(max_entries_per_ledger=2)
    queued = [ml.add_entry_async(payload(i)) for i in range(5)]
    last = await ml.terminate()
    assert [await f for f in queued][-1] == last  # what was queued before is stored
    with pytest.raises(ManagedLedgerTerminatedError):
        await ml.add_entry(b"late")
    assert await ml.terminate() == last
    ledgers = list(ml.ledger_ids)
    assert len(ledgers) == 3
    await crash(ml)
    again = await env.open(max_entries_per_ledger=2)
    assert again.terminated_at == last
    assert again.ledger_ids == ledgers  # no ledger opened for writes
    assert again.last_confirmed_position == last
    assert len(await again.read_entries(again.first_position, 10)) == 5
    with pytest.raises(ManagedLedgerTerminatedError):
        await again.add_entry(b"late")
    assert not await again.wait_for_entries_after(last, 0.1)
    # Trimming everything consumed keeps the last ledger, which holds the last position.
    await again.open_cursor("done", "latest")
    await again.trim(Position(last.ledger_id + 1, 0))
    assert again.ledger_ids == ledgers[-1:]
    assert again.last_confirmed_position == last


async def test_an_add_refused_by_terminate_is_answered_after_the_adds_before_it(
    env: Env,
) -> None:
    """A producer is answered in order: the refusal of an add that came after terminate is
    not told before the receipts of the adds still on their way to the bookies (the official
    client closes its connection on a send error and would fail those, stored as they are)."""
    ml = await env.open()
    told: list[str] = []

    def listener(name: str) -> Callable[[asyncio.Future[Position]], None]:
        return lambda future: told.append(name)

    stored = [ml.add_entry_async(payload(i), listener(f"m{i}")) for i in range(20)]
    for _ in range(5):
        await asyncio.sleep(0)  # the writer sends them to the bookies
    terminating = asyncio.ensure_future(ml.terminate())
    await asyncio.sleep(0)
    late = ml.add_entry_async(b"late", listener("late"))
    last = await terminating
    assert [await f for f in stored][-1] == last
    with pytest.raises(ManagedLedgerTerminatedError):
        await late
    await asyncio.sleep(0)
    assert told == [f"m{i}" for i in range(20)] + ["late"]


async def test_runs_of_adds_are_stored_and_told_in_order_across_rollovers(env: Env) -> None:
    """``add_run_async`` (a producer's SENDs of one read) among single adds: every add stored
    once, in call order, across ledgers rolled over mid-run, each listener told in that order;
    on a terminated managed ledger each add of a run is refused."""
    ml = await env.open(max_entries_per_ledger=4)
    told: list[tuple[str, Position | None]] = []

    def listener(name: str) -> Callable[[asyncio.Future[Position]], None]:
        return lambda future: told.append((name, None if future.exception() else future.result()))

    names = [f"m{i}" for i in range(23)]
    lasts = []
    for chunk in (names[0:1], names[1:11], names[11:12], names[12:23]):
        if len(chunk) == 1:
            lasts.append(ml.add_entry_async(payload(int(chunk[0][1:])), listener(chunk[0])))
        else:
            run = [(payload(int(name[1:])), listener(name)) for name in chunk]
            lasts.append(ml.add_run_async(run))
    last = await lasts[-1]
    assert [name for name, _ in told] == names
    positions = [position for _, position in told]
    assert positions == sorted(positions) and len(set(positions)) == 23
    assert positions[-1] == last and len({p.ledger_id for p in positions}) >= 6
    entries = await ml.read_entries(positions[0], 23)
    assert [data for _, data in entries] == [payload(i) for i in range(23)]
    await ml.terminate()
    refused = ml.add_run_async([(b"a", listener("late-a")), (b"b", listener("late-b"))])
    with pytest.raises(ManagedLedgerTerminatedError):
        await refused
    await asyncio.sleep(0)
    assert told[-2:] == [("late-a", None), ("late-b", None)]


async def test_batch_index_acks(env: Env) -> None:
    ml = await env.open()
    positions = await add_many(ml, 0, 3)
    cursor = await ml.open_cursor("sub", initial="earliest")
    cursor.delete_batch_indexes(positions[0], [0, 2], batch_size=4)
    assert cursor.acked_batch_indexes(positions[0]) == {0, 2}
    assert not cursor.is_acked(positions[0])
    cursor.delete_batch_indexes(positions[1], [1], batch_size=2)
    await ml.close()

    again = await env.open()
    loaded = await again.open_cursor("sub")
    assert loaded.acked_batch_indexes(positions[0]) == {0, 2}
    loaded.delete_batch_indexes(positions[0], [1, 3], batch_size=4)
    # The whole entry is acked: its batch set is cleared and mark-delete moves.
    assert loaded.acked_batch_indexes(positions[0]) == frozenset()
    assert loaded.mark_delete_position == positions[0]
    loaded.delete([positions[1]])
    assert loaded.acked_batch_indexes(positions[1]) == frozenset()
    assert loaded.mark_delete_position == positions[1]


async def test_trim_deletes_only_consumed_ledgers(env: Env) -> None:
    ml = await env.open(max_entries_per_ledger=4)
    positions = await add_many(ml, 0, 14)  # ledgers of 4, 4, 4, 2
    ledgers = sorted({p.ledger_id for p in positions})
    fast = await ml.open_cursor("fast", initial="earliest")
    slow = await ml.open_cursor("slow", initial="earliest")
    fast.mark_delete(positions[13])
    slow.mark_delete(positions[6])  # inside the second ledger
    assert await ml.trim_retained(0, 0) == [ledgers[0]]
    with pytest.raises(NoSuchLedgerError):
        await ml.client.read_metadata(ledgers[0])
    slow.mark_delete(positions[7])  # the second ledger's last entry: fully consumed now
    assert await ml.trim_retained(0, 0) == [ledgers[1]]
    slow.mark_delete(positions[13])
    # The current ledger is never trimmed, even when every entry of it is consumed.
    assert await ml.trim_retained(0, 0) == [ledgers[2]]
    assert ml.ledger_ids == [ledgers[3]]
    read = await ml.read_entries(Position(0, 0), 100)
    assert [p for p, _ in read] == positions[12:]
    assert ml.first_position == positions[12]
    await ml.close()
    again = await env.open(max_entries_per_ledger=4)
    assert again.ledger_ids[0] == ledgers[3]
    assert again.number_of_entries == 2


async def test_tailing_wait(env: Env) -> None:
    ml = await env.open()
    last = await ml.add_entry(b"a")
    assert not await ml.wait_for_entries_after(last, timeout=0.05)
    waiter = asyncio.create_task(ml.wait_for_entries_after(last, timeout=30))
    await asyncio.sleep(0)
    new = await ml.add_entry(b"b")
    assert await waiter
    assert await ml.read_entries(ml.next_position(last), 10) == [(new, b"b")]


async def test_read_from_the_bookies_while_adds_complete(env: Env) -> None:
    """Entries confirmed while a read waits on the bookies are read on, not looped over."""
    ml = await env.open()
    first = await add_many(ml, 0, 20)
    ml.reader.cache.clear()

    def too_long(*_: object) -> None:
        raise TimeoutError("read_entries did not return (spinning without yielding?)")

    # A busy loop never yields to a timeout of the event loop; a signal still interrupts it.
    previous = signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        reading = asyncio.create_task(ml.read_entries(first[0], 1000))
        more = await add_many(ml, 20, 20)
        read = await reading
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    positions = [p for p, _ in read]
    assert positions[:20] == first
    assert positions == (first + more)[: len(positions)]
    assert [d for _, d in read] == [payload(i) for i in range(len(read))]


async def test_delete_removes_ledgers_and_metadata(env: Env) -> None:
    ml = await env.open(max_entries_per_ledger=3)
    positions = await add_many(ml, 0, 7)
    await ml.open_cursor("sub")
    ids = ml.ledger_ids
    await ml.delete()
    assert await env.store.scan(managed_ledger_key(TOPIC)) == {}
    for ledger_id in {p.ledger_id for p in positions} | set(ids):
        with pytest.raises(NoSuchLedgerError):
            await ml.client.read_metadata(ledger_id)


def test_cursor_type_is_exported() -> None:
    assert ManagedCursor.__name__ == "ManagedCursor"


async def test_a_read_in_flight_across_a_rewind_is_dropped(env: Env) -> None:
    ml = await env.open()
    positions = await add_many(ml, 0, 20)
    cursor = await ml.open_cursor("sub", "earliest")
    first = await cursor.read_entries(5)
    assert [p for p, _ in first] == positions[:5]
    ml.reader.cache.clear()
    reading = asyncio.create_task(cursor.read_entries(10))  # waits on the bookies
    await asyncio.sleep(0)
    cursor.rewind()  # e.g. the consumer holding 0..4 left: dispatch again from 0
    assert await reading == []
    assert cursor.read_position == positions[0]
    again = await cursor.read_entries(20)
    assert [p for p, _ in again] == positions


async def test_entries_acknowledged_while_a_read_waits_are_not_returned(env: Env) -> None:
    """An ack that lands while a read waits on the bookies can move mark-delete over entries of
    that read (dropping their ack ranges): they must not be dispatched again (seen as acked
    messages redelivered after a restart, under load)."""
    ml = await env.open()
    positions = await add_many(ml, 0, 20)
    cursor = await ml.open_cursor("sub", "earliest")
    cursor.delete([positions[3], positions[4]])  # holes above mark-delete
    ml.reader.cache.clear()
    reading = asyncio.create_task(cursor.read_entries(10))  # waits on the bookies
    await asyncio.sleep(0)
    cursor.delete(positions[:3])  # mark-delete moves to 4; ranges 3..4 are dropped
    assert cursor.mark_delete_position == positions[4]
    got = [p for p, _ in await reading]
    assert got == positions[5:15]
