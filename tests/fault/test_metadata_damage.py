"""A damaged local metadata file (``meta.db``) is refused loudly, never a bare SQLite traceback.

Damage SQLite can see (not a database at all, malformed pages) raises MetadataDamagedError
naming the file and the way forward, and leaves the file untouched for the operator. So does
damage it cannot see: a write-ahead log with valid commits after a damaged frame, which SQLite
would replay only up to the damage (common/metadata/sqlite_wal.py). A torn WAL tail (bad or
partial frames at the end) is what a crash leaves; that case opens with a consistent prefix and
a warning. An empty ``meta.db`` is indistinguishable from a new one here; the cluster identity
checks deal with it.

The standalone tests run the issue's case with a real process and the official client: kill -9
after receipted messages, damage ``meta.db-wal``, start again; and a store rolled back to before
a topic's ledger list was written, whose ledger the bookie keeps and reports.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import pulsar
import pytest

from magnetar.common.ledger.bookie_client import BookieClient
from magnetar.common.metadata import MetadataDamagedError, MetadataError, Versioned, open_store
from magnetar.common.metadata.sqlite_wal import FRAME_HEADER, HEADER, scan_wal
from tests.support.standalone import StandaloneProcess, client

KEYS = 400
VALUE = b"v" * 200  # enough keys and bytes for a multi-page B-tree


async def _write_store(path: Path) -> dict[str, Versioned]:
    async with await open_store(f"local://{path}") as store:
        return {
            f"/ledgers/{i:05}": Versioned(VALUE, await store.put(f"/ledgers/{i:05}", VALUE))
            for i in range(KEYS)
        }


async def _assert_refused(path: Path) -> None:
    before = _contents(path)
    for _ in range(2):  # the second try must not trip over a lock left by the first
        with pytest.raises(MetadataDamagedError) as refused:
            await open_store(f"local://{path}")
        message = str(refused.value)
        assert str(path) in message and "restore" in message, message
        assert refused.value.__cause__ is not None  # the SQLite error stays attached
    assert _contents(path) == before, "a damaged metadata file must be left as it was"


def _contents(path: Path) -> bytes:
    return path.read_bytes()


def _overwrite_middle_pages(path: Path) -> None:
    # Closed cleanly: everything was checkpointed into meta.db, nothing is left in the WAL.
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    size, page = path.stat().st_size, 4096
    assert size >= 8 * page
    with open(path, "r+b") as f:
        # Pages in the middle, not the header: only a page check finds this.
        f.seek((size // page // 2) * page)
        f.write(random.Random(3).randbytes(2 * page))


def _zero_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"\x00" * 100)  # the 100-byte database header


def _crash_image(live: Path, crashed: Path) -> None:
    """The files as they are on disk while the owner still runs, with the WAL torn in the
    middle of a frame."""
    crashed.mkdir()
    for name in ("meta.db", "meta.db-wal"):
        shutil.copy(live / name, crashed / name)
    wal = crashed / "meta.db-wal"
    assert wal.stat().st_size > 8192
    os.truncate(wal, wal.stat().st_size // 2 + 123)


async def test_garbage_file_is_refused_with_the_file_named(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    path.write_bytes(random.Random(9).randbytes(16384))
    await _assert_refused(path)


async def test_malformed_pages_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    await _write_store(path)
    _overwrite_middle_pages(path)
    await _assert_refused(path)


async def test_header_overwritten_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    await _write_store(path)
    _zero_header(path)
    await _assert_refused(path)


async def test_torn_wal_tail_opens_with_a_consistent_prefix(tmp_path: Path) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    live.mkdir()
    store = await open_store(f"local://{live}/meta.db")
    try:
        written = {f"/k/{i:04}": await store.put(f"/k/{i:04}", b"x" * 100) for i in range(200)}
        _crash_image(live, crashed)
    finally:
        await store.close()
    try:
        async with await open_store(f"local://{crashed}/meta.db") as reopened:
            found = await reopened.scan("/k/")
            await reopened.put("/k/after", b"writable")
    except MetadataError as e:  # refusing is acceptable too, but only as a typed error
        assert "meta.db" in str(e)
        return
    # Whatever survived is an in-order prefix of the writes, each with its own version.
    keys = sorted(found)
    assert keys == sorted(written)[: len(keys)]
    assert all(found[k] == Versioned(b"x" * 100, written[k]) for k in keys)


# -- the write-ahead log: damage SQLite would cut silently is refused ---------------------------


def _commit_ends(wal: bytes) -> list[int]:
    """Offsets just past each commit frame of the log's valid prefix."""
    scan = scan_wal(wal)
    frame_size = FRAME_HEADER.size + scan.page_size
    ends = []
    for k in range(scan.valid_frames):
        offset = HEADER.size + k * frame_size
        if FRAME_HEADER.unpack_from(wal, offset)[1]:
            ends.append(offset + frame_size)
    return ends


def _last_frame(wal: bytes) -> tuple[int, int]:
    """(offset, size) of the log's last whole frame."""
    frame_size = FRAME_HEADER.size + scan_wal(wal).page_size
    frames = (len(wal) - HEADER.size) // frame_size
    return HEADER.size + (frames - 1) * frame_size, frame_size


def _damage_last_frame(wal: Path, how: str) -> None:
    offset, size = _last_frame(wal.read_bytes())
    if how == "cut mid last frame":
        os.truncate(wal, offset + size // 2)
    else:
        with open(wal, "r+b") as f:
            f.seek(offset + 30)
            f.write(random.Random(4).randbytes(size - 40))


def _overwrite_4k_in_the_middle(wal: Path) -> int:
    size = wal.stat().st_size
    with open(wal, "r+b") as f:
        f.seek(size // 2)
        f.write(random.Random(16).randbytes(4096))
    return size // 2


def _keys_at(db: Path, wal: bytes) -> dict[str, bytes]:
    """The store's keys as SQLite recovers them from ``db`` with this log (on copies)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "meta.db"
        shutil.copy(db, copy)
        Path(f"{copy}-wal").write_bytes(wal)
        conn = sqlite3.connect(copy)
        try:
            return {k.decode(): v for k, v in conn.execute("SELECT key, value FROM kv")}
        finally:
            conn.close()


def _cut_offset(message: str, wal: Path) -> int:
    """The offset the refusal tells the operator to cut the log at."""
    match = re.search(rf"truncate -s (\d+) {re.escape(str(wal))}", message)
    assert match, message
    return int(match.group(1))


async def test_wal_damaged_in_the_middle_is_refused_until_cut(tmp_path: Path) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    live.mkdir()
    crashed.mkdir()
    store = await open_store(f"local://{live}/meta.db")
    try:
        written = {f"/k/{i:04}": await store.put(f"/k/{i:04}", b"x" * 100) for i in range(300)}
        for name in ("meta.db", "meta.db-wal"):  # as on disk while the owner runs (kill -9)
            shutil.copy(live / name, crashed / name)
    finally:
        await store.close()
    path, wal = crashed / "meta.db", crashed / "meta.db-wal"
    _overwrite_4k_in_the_middle(wal)
    files = {p: p.read_bytes() for p in (path, wal)}

    for _ in range(2):  # the second try must not trip over a lock left by the first
        with pytest.raises(MetadataDamagedError) as refused:
            await open_store(f"local://{path}")
        message = str(refused.value)
        assert str(wal) in message and "restore" in message and "truncate -s" in message
        assert "committed transactions" in message
    assert {p: p.read_bytes() for p in files} == files, "the files must be left as they were"

    # The other way forward it names: cut the log at the damage, accepting the loss.
    os.truncate(wal, _cut_offset(message, wal))
    async with await open_store(f"local://{path}") as reopened:
        found = await reopened.scan("/k/")
        await reopened.put("/k/after", b"writable")
    keys = sorted(found)
    assert 0 < len(keys) < len(written)
    assert keys == sorted(written)[: len(keys)]
    assert all(found[k] == Versioned(b"x" * 100, written[k]) for k in keys)


@pytest.mark.parametrize("how", ["cut mid last frame", "last frame garbled"])
async def test_wal_torn_tail_is_accepted_with_a_warning(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    live.mkdir()
    crashed.mkdir()
    store = await open_store(f"local://{live}/meta.db")
    try:
        written = {f"/k/{i:04}": await store.put(f"/k/{i:04}", b"x" * 100) for i in range(100)}
        for name in ("meta.db", "meta.db-wal"):
            shutil.copy(live / name, crashed / name)
    finally:
        await store.close()
    _damage_last_frame(crashed / "meta.db-wal", how)
    with caplog.at_level(logging.WARNING, logger="magnetar.common.metadata.local"):
        async with await open_store(f"local://{crashed}/meta.db") as reopened:
            found = await reopened.scan("/k/")
    assert sorted(found) == sorted(written)[:-1]  # the last put was the torn transaction
    assert any("torn write" in r.getMessage() for r in caplog.records)


# -- a real ``magnetar standalone``: kill -9, damage meta.db-wal, start again --------------------

MESSAGES = 2000


def _produce(node: StandaloneProcess, topic: str, count: int) -> list[bytes]:
    """``count`` messages, each sent with its receipt (one entry each: no batching)."""
    c = client(node)
    try:
        producer = c.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        sent = [f"{topic}-{i}".encode() for i in range(count)]
        for data in sent:
            producer.send(data)
        return sent
    finally:
        c.close()


def _drain(node: StandaloneProcess, topic: str, subscription: str) -> list[bytes]:
    """Everything a new subscription from the earliest message reads (until 3 s of quiet)."""
    c = client(node)
    try:
        consumer = c.subscribe(
            topic, subscription, initial_position=pulsar.InitialPosition.Earliest
        )
        got = []
        while True:
            try:
                message = consumer.receive(timeout_millis=3000)
            except pulsar.Timeout:
                return got
            got.append(message.data())
            consumer.acknowledge(message)
    finally:
        c.close()


def _bookie_http(node: StandaloneProcess, method: str, path: str) -> bytes:
    url = f"http://127.0.0.1:{node.bookie_http_port}{path}"
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=60) as r:
        return r.read()


def _unreferenced_gauge(node: StandaloneProcess, reason: str) -> float:
    text = _bookie_http(node, "GET", "/metrics").decode()
    match = re.search(
        rf'^magnetar_bookie_unreferenced_ledgers\{{reason="{reason}"\}} (\S+)$', text, re.M
    )
    assert match, f"no unreferenced_ledgers gauge for {reason}"
    return float(match.group(1))


def _managed_ledger_key(name: str) -> str:
    return "/magnetar/managed-ledgers/" + urllib.parse.quote(name, safe="")


def _refused_start(node: StandaloneProcess) -> str:
    with pytest.raises(AssertionError, match="standalone exited"):
        node.start()
    assert node.process is not None and node.process.wait(10) != 0
    return node.log_tail(20000)


@pytest.mark.parametrize("how", ["cut mid last frame", "last frame garbled"])
def test_standalone_starts_after_a_torn_wal_tail_with_every_receipted_message(
    tmp_path: Path, how: str
) -> None:
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
        receipted = _produce(node, "torn-tail", MESSAGES)
        # The store's last transactions are another topic's (the torn one is not ours).
        _produce(node, "written-later", 1)
        node.kill()
        _damage_last_frame(node.data_dir / "meta.db-wal", how)
        node.start()
        got = _drain(node, "torn-tail", "audit")
        assert len(got) == MESSAGES and set(got) == set(receipted)
        assert "torn write" in node.log_tail(50000)
    finally:
        node.stop()
        print(node.log_tail())


def test_standalone_refuses_a_wal_damaged_in_the_middle_and_keeps_the_lost_ledger(
    tmp_path: Path,
) -> None:
    """The issue's case: 2,000 receipted messages, kill -9, 4 KiB overwritten in the middle of
    meta.db-wal. The start is refused naming the log; cut as the refusal says (accepting the
    loss), the store has lost the topic's ledger, and the bookie keeps and reports it."""
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
        _produce(node, "persistent://public/default/middle", MESSAGES)
        node.kill()
        db, wal = node.data_dir / "meta.db", node.data_dir / "meta.db-wal"
        damaged_at = _overwrite_4k_in_the_middle(wal)
        damaged = wal.read_bytes()

        log = _refused_start(node)
        assert f"has a damaged write-ahead log {wal}" in log, log
        assert "restore" in log and "magnetar bk listunreferenced" in log
        assert wal.read_bytes() == damaged, "the log must be left as it was"

        cut = _cut_offset(log, wal)
        assert cut <= damaged_at
        ml_key = _managed_ledger_key("public/default/persistent/middle")
        assert ml_key not in _keys_at(db, damaged[:cut]), "the damage is not before the topic"
        os.truncate(wal, cut)
        node.start()
        result = json.loads(_bookie_http(node, "POST", "/api/v1/bookie/gc"))
        assert result["orphan_ledgers"] == [], result
        reported = sum(
            _unreferenced_gauge(node, r) for r in ("unlisted", "topic-missing", "above-counter")
        )
        assert reported == 1
        assert f"(entries up to {MESSAGES - 1})" in node.log_tail(50000)
    finally:
        node.stop()
        print(node.log_tail())


def test_standalone_ledger_orphaned_by_a_rolled_back_store_is_reported_and_kept(
    tmp_path: Path,
) -> None:
    """The store rolled back to just before the topic's ledger list was written (the ledger's
    own metadata survives): its ledger is kept and reported by the bookie, and listed by
    ``magnetar bk listunreferenced``, first as topic-missing, then, once the topic has a new
    list, as unlisted."""
    node = StandaloneProcess(tmp_path / "standalone").start()
    topic = "persistent://public/default/rolled-back"
    managed_ledger = "public/default/persistent/rolled-back"
    ml_key = _managed_ledger_key(managed_ledger)
    try:
        _produce(node, topic, MESSAGES)
        node.kill()
        db, wal = node.data_dir / "meta.db", node.data_dir / "meta.db-wal"
        log_bytes = wal.read_bytes()
        record = json.loads(_keys_at(db, log_bytes)[ml_key])
        (ledger_id,) = [info["ledger_id"] for info in record["ledgers"]]
        ends = [e for e in _commit_ends(log_bytes) if ml_key not in _keys_at(db, log_bytes[:e])]
        assert f"/magnetar/ledgers/{ledger_id}" in _keys_at(db, log_bytes[: ends[-1]])
        os.truncate(wal, ends[-1])  # the rollback: every transaction from the list's on

        node.start()
        result = json.loads(_bookie_http(node, "POST", "/api/v1/bookie/gc"))
        assert result["orphan_ledgers"] == [], result
        assert _unreferenced_gauge(node, "topic-missing") == 1
        assert (
            f"ledger {ledger_id} (entries up to {MESSAGES - 1}) belongs to managed ledger "
            f"{managed_ledger} which has no ledger list"
        ) in node.log_tail(50000)
        # The topic in use again gets a new list, without the old ledger.
        (after,) = _produce(node, topic, 1)
        assert _drain(node, topic, "audit") == [after]
        json.loads(_bookie_http(node, "POST", "/api/v1/bookie/gc"))
        assert _unreferenced_gauge(node, "unlisted") == 1
        assert _unreferenced_gauge(node, "topic-missing") == 0
    finally:
        node.stop()
        print(node.log_tail())

    listed = subprocess.run(
        [
            sys.executable, "-m", "magnetar.cli", "bk", "--metadata-url", f"local://{db}",
            "listunreferenced", "--json",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["ledger_id"], r["reason"], r["managed_ledger"]) for r in rows] == [
        (ledger_id, "unlisted", managed_ledger)
    ], listed.stdout

    # Kept all along: after another start and GC round the bookie still serves all of it.
    node.start()
    try:
        assert json.loads(_bookie_http(node, "POST", "/api/v1/bookie/gc"))["orphan_ledgers"] == []
        first, last = asyncio.run(_read_ends(f"127.0.0.1:{node.bookie_port}", ledger_id))
        assert first.endswith(f"{topic}-0".encode())
        assert last.endswith(f"{topic}-{MESSAGES - 1}".encode())
    finally:
        node.stop()


async def _read_ends(address: str, ledger_id: int) -> tuple[bytes, bytes]:
    async with BookieClient(address) as bookie:
        return await bookie.read(ledger_id, 0), await bookie.read(ledger_id, MESSAGES - 1)
