"""A damaged local metadata file (``meta.db``) is refused loudly, never a bare SQLite traceback.

Damage SQLite can see (not a database at all, malformed pages) raises MetadataDamagedError
naming the file and the way forward, and leaves the file untouched for the operator. A torn
WAL tail is not damage to SQLite (it replays the committed prefix, by design); that case must
open cleanly with a consistent prefix. An empty ``meta.db`` is indistinguishable from a new
one here; the cluster identity checks deal with it.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from magnetar.common.metadata import MetadataDamagedError, MetadataError, Versioned, open_store

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
