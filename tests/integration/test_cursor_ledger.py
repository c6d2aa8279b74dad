"""Cursor ledgers on real in-process bookies: a cursor's large state (many ack holes) goes to a
ledger of its own, the metadata record stays small, ledgers roll and old ones are deleted, an
unreadable cursor ledger redelivers from the mark-delete position, and a cursor that cannot
store its state says so once.

A "restart" is simulated as in test_managed_ledger.py: the managed ledger is abandoned without
closing anything and reopened with a new LedgerClient on the same store.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.service import Bookie
from magnetar.broker.ledger.cursor import ManagedCursor
from magnetar.broker.ledger.managed_ledger import ManagedLedger
from magnetar.broker.model.position import Position
from magnetar.common.ledger.errors import NoSuchLedgerError
from magnetar.common.metadata import open_store
from tests.integration.test_managed_ledger import Env, crash, start_bookie
from tests.support.polling import wait_until_async

ENTRIES = 100_000


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    store = await open_store(f"local://{tmp_path}/meta.db")
    bookies = [await start_bookie(store, tmp_path / f"b{i}") for i in range(3)]
    environment = Env(store, bookies, tmp_path)
    try:
        yield environment
    finally:
        for ml in environment.mls:
            if ml.client._bookies or ml.client._local or not ml.cursors:
                try:
                    await ml.close()
                except Exception as e:
                    print(f"closing {ml}: {e}")
        for client in environment.clients:
            await client.close()
        for bookie in environment.bookies:
            await bookie.stop()
        await store.close()


async def die(ml: ManagedLedger) -> None:
    """crash(), and stop the timers of the cursors' ledger handles too."""
    for cursor in ml.cursors.values():
        handle = cursor._ledger._handle
        if handle is not None and handle._timer is not None:
            handle._timer.cancel()
    await crash(ml)


async def answer_all(ml: ManagedLedger, addresses: list[str]) -> bool:
    try:
        await asyncio.gather(*(ml.client.bookie(a).info() for a in addresses))
    except Exception:
        return False
    return True


async def restart_bookie(env: Env, directory: Path, address: str) -> Bookie:
    """A stopped bookie started again on its directories and address (its cookie says both)."""
    bookie = Bookie(
        BookieConfig(
            bind_address="127.0.0.1",
            advertised_address="127.0.0.1",
            port=int(address.rsplit(":", 1)[1]),
            http_port=0,
            journal_dir=str(directory / "journal"),
            ledger_dir=str(directory / "ledgers"),
            journal_sync=False,
        ),
        env.store,
    )
    await bookie.start()
    return bookie


async def add(ml: ManagedLedger, count: int) -> list[Position]:
    positions: list[Position] = []
    for start in range(0, count, 5000):
        futures = [ml.add_entry_async(b"m%d" % i) for i in range(start, min(start + 5000, count))]
        positions.extend(await asyncio.gather(*futures))
    return positions


async def record(env: Env, cursor: ManagedCursor) -> tuple[bytes, dict[str, object]]:
    found = await env.store.get(cursor.key)
    assert found is not None
    return found.value, json.loads(found.value)


async def ledger_exists(env: Env, ledger_id: int) -> bool:
    try:
        await env.clients[0].read_metadata(ledger_id)
    except NoSuchLedgerError:
        return False
    return True


async def test_fifty_thousand_holes(env: Env) -> None:
    ml = await env.open(max_entries_per_ledger=40_000)
    positions = await add(ml, ENTRIES)
    cursor = await ml.open_cursor("sub", initial="earliest")
    acked = positions[1::2]  # every other entry: 50,000 holes, none joins the mark-delete
    cursor.delete(acked)
    assert cursor.individually_acked.range_count == 50_000
    ranges = cursor.individually_acked.ranges()
    await cursor.persist()
    assert cursor.persist_error is None
    value, doc = await record(env, cursor)
    assert len(value) < 300, value  # the record names the ledger; the ranges are not in it
    assert "acked" not in doc
    cursor_ledger = doc["cursor_ledger"]
    assert cursor_ledger == cursor.cursor_ledger
    assert cursor_ledger not in ml.ledger_ids  # not data: never trimmed with the topic
    assert cursor.persistence_stats()["cursorLedger"] == cursor_ledger
    # One more entry, sent once the others were acknowledged, carries their LAC: the restart's
    # recovery of the data ledger then reads one entry, not the ~5,000 sent before their LAC.
    positions.append(await ml.add_entry(b"tail"))
    await die(ml)

    again = await env.open(max_entries_per_ledger=40_000)
    loaded = await again.open_cursor("sub")
    assert loaded.mark_delete_position == Position(
        positions[0].ledger_id, positions[0].entry_id - 1
    )
    assert loaded.individually_acked.ranges() == ranges
    acked_set = set(acked)
    assert all(loaded.is_acked(p) == (p in acked_set) for p in positions)
    # Delivery after the restart: exactly the unacknowledged entries, in order (a prefix:
    # reading 100,000 entries back from the bookies takes minutes).
    delivered = [p for p, _ in await loaded.read_entries(1000)]
    assert delivered == positions[0:2000:2]
    # Acking what is left moves mark-delete to the end; the state goes back to the record
    # and the cursor ledger is deleted.
    loaded.delete(positions[0::2])
    assert loaded.mark_delete_position == positions[-1]
    await loaded.persist()
    _, doc = await record(env, loaded)
    assert "cursor_ledger" not in doc and doc["acked"] == []
    assert loaded.cursor_ledger is None
    assert not await ledger_exists(env, cursor_ledger)


async def test_cursor_ledger_rolls_and_old_ones_are_deleted(env: Env) -> None:
    ml = await env.open(max_unacked_ranges_in_metadata=10, cursor_ledger_max_entries=3)
    positions = await add(ml, 200)
    cursor = await ml.open_cursor("sub", initial="earliest")
    named: list[int] = []
    for step in range(10):
        cursor.delete(positions[1 + 2 * step * 5 : 1 + 2 * (step + 1) * 5 + 20 : 2])
        await cursor.persist()
        assert cursor.persist_error is None
        if not named or named[-1] != cursor.cursor_ledger:
            assert cursor.cursor_ledger is not None
            named.append(cursor.cursor_ledger)
    # Ten states, three per ledger: four ledgers, of which only the last one is left.
    assert len(named) == 4
    for old in named[:-1]:
        assert not await ledger_exists(env, old)
    assert await ledger_exists(env, named[-1])
    _, doc = await record(env, cursor)
    assert doc["cursor_ledger"] == named[-1]
    expected = cursor.individually_acked.ranges()
    await ml.close()

    # After a clean close the new owner reads the same state, and its first write rolls to a
    # ledger of its own (the old one was fenced when it was read).
    again = await env.open(max_unacked_ranges_in_metadata=10, cursor_ledger_max_entries=3)
    loaded = await again.open_cursor("sub")
    assert loaded.individually_acked.ranges() == expected
    loaded.delete([positions[199]])
    await loaded.persist()
    assert loaded.cursor_ledger not in (None, named[-1])
    assert not await ledger_exists(env, named[-1])

    # Deleting the subscription deletes its cursor ledger; deleting the topic deletes those of
    # the other cursors.
    last = loaded.cursor_ledger
    assert last is not None
    await again.delete_cursor("sub")
    assert not await ledger_exists(env, last)
    other = await again.open_cursor("other", initial="earliest")
    other.delete(positions[1:100:2])
    await other.persist()
    other_ledger = other.cursor_ledger
    assert other_ledger is not None
    await again.delete()
    assert not await ledger_exists(env, other_ledger)
    assert not await env.store.scan(again.key)


async def test_unreadable_cursor_ledger_redelivers_from_mark_delete(env: Env) -> None:
    ml = await env.open(max_unacked_ranges_in_metadata=10)
    positions = await add(ml, 100)
    cursor = await ml.open_cursor("sub", initial="earliest")
    cursor.delete(positions[:20])  # mark-delete moves to 19
    await cursor.persist()
    cursor.delete(positions[21:100:2])  # 40 holes: into the cursor ledger
    await cursor.persist()
    lost_ledger = cursor.cursor_ledger
    assert lost_ledger is not None
    _, doc = await record(env, cursor)
    assert doc["mark_delete"] == [positions[19].ledger_id, positions[19].entry_id]
    await die(ml)
    await env.client().delete_ledger(lost_ledger)  # the cursor ledger is gone

    again = await env.open(max_unacked_ranges_in_metadata=10)
    loaded = await again.open_cursor("sub")
    # Everything after the stored mark-delete is delivered again; nothing before it.
    assert loaded.mark_delete_position == positions[19]
    assert [p for p, _ in await loaded.read_entries(1000)] == positions[20:]
    # And the cursor stores new state normally, no longer naming the lost ledger.
    loaded.delete(positions[21:60:2])
    await loaded.persist()
    assert loaded.persist_error is None
    assert loaded.cursor_ledger not in (None, lost_ledger)


async def test_bookies_down_stores_a_bounded_state_and_says_so_once(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    ml = await env.open(max_unacked_ranges_in_metadata=10)
    positions = await add(ml, 100)
    cursor = await ml.open_cursor("sub", initial="earliest")
    cursor.delete(positions[1:100:2])  # 50 holes
    await cursor.persist()
    first_ledger = cursor.cursor_ledger
    assert first_ledger is not None
    for bookie in env.bookies:
        await bookie.stop()
    cursor.delete([positions[2]])
    caplog.set_level(logging.INFO, logger="magnetar.broker.ledger.cursor")
    for _ in range(3):
        cursor.delete([positions[4]])
        await cursor.persist()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "cursor ledger cannot be written" in errors[0].getMessage()
    assert cursor.persist_error is not None
    assert cursor.persistence_stats()["persistError"] == cursor.persist_error
    # The record holds mark-delete and the first ten ranges: a restart redelivers, not loses.
    _, doc = await record(env, cursor)
    assert "cursor_ledger" not in doc and len(doc["acked"]) == 10  # type: ignore[arg-type]
    assert cursor._retry_delay() > ml.config.cursor_persist_interval_s  # backing off

    # Bookies back: the next try stores the whole state again and says so.
    addresses = [b.address for b in env.bookies]
    restarted_at = len(caplog.records)
    env.bookies = [
        await restart_bookie(env, env.base_dir / f"b{i}", address)
        for i, address in enumerate(addresses)
    ]
    # Until every bookie answers this client again: a connection still in its reconnect backoff
    # fails the first add to it, an ERROR of a bookie that is not back yet, not the one checked.
    assert await wait_until_async(lambda: answer_all(ml, addresses), timeout=30)
    answering_at = len(caplog.records)
    for _ in range(40):  # the client's connections to the bookies come back after a moment
        await cursor.persist()
        if cursor.persist_error is None:
            break
        await asyncio.sleep(0.5)
    assert cursor.persist_error is None
    assert cursor.cursor_ledger is not None
    # The cursor's own backoff retry may have stored it while the bookies came back.
    assert any("stored again" in r.getMessage() for r in caplog.records[restarted_at:])
    assert not any(r.levelno == logging.ERROR for r in caplog.records[answering_at:])


async def test_store_and_bookies_both_failing_is_an_error_once(
    env: Env, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ml = await env.open()
    positions = await add(ml, 10)
    cursor = await ml.open_cursor("sub", initial="earliest")

    async def refuse(*args: object, **kwargs: object) -> int:
        raise ConnectionError("metadata store unavailable")

    monkeypatch.setattr(env.store, "put", refuse)
    caplog.set_level(logging.ERROR, logger="magnetar.broker.ledger.cursor")
    delays = []
    for i in range(4):
        cursor.delete([positions[2 + i]])
        with pytest.raises(ConnectionError):
            await cursor.persist()
        delays.append(cursor._retry_delay())
    assert len(caplog.records) == 1
    assert "could not be stored" in caplog.records[0].getMessage()
    assert cursor.persist_error is not None
    assert delays == sorted(delays) and delays[-1] > delays[0]
    monkeypatch.undo()
    await cursor.persist()
    assert cursor.persist_error is None


async def test_a_stale_owner_stops_writing_its_cursor_ledger(env: Env) -> None:
    first = await env.open(max_unacked_ranges_in_metadata=10)
    positions = await add(first, 100)
    old = await first.open_cursor("sub", initial="earliest")
    old.delete(positions[1:60:2])
    await old.persist()
    old_ledger = old.cursor_ledger
    second = await env.open(max_unacked_ranges_in_metadata=10)
    new = await second.open_cursor("sub")  # reads (and fences) the old owner's cursor ledger
    assert new.individually_acked.ranges() == old.individually_acked.ranges()
    # The stale owner's next append is refused by the bookies: it stops persisting.
    old.delete(positions[61:100:2])
    await old.persist()
    assert old._fenced
    new.delete([positions[0]])
    await new.persist()
    await second.close()
    third = await env.open(max_unacked_ranges_in_metadata=10)
    loaded = await third.open_cursor("sub")
    assert loaded.mark_delete_position == positions[1]
    assert not loaded.is_acked(positions[61])  # the stale owner's acks never landed
    assert not await ledger_exists(env, old_ledger)  # type: ignore[arg-type]
