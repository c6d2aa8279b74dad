"""Damage the files of a stopped bookie and check it either keeps every acknowledged entry or
refuses to start with a message that names the file and the way forward; never a silent loss.

Real bookie processes, real files: the journal (64 random bytes in the middle, a torn tail, a
deleted file), the index (``index.db`` overwritten with garbage, or deleted) and a deleted entry
log.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.bookie import journal as jnl
from magnetar.common.ledger.bookie_client import (
    BookieClient,
    BookieError,
    BookieUnavailableError,
)
from magnetar.common.ledger.entry import encode_entry
from tests.support.bookie import (
    BookieFactory,
    BookieProcess,
    BookieStartError,
    bookie_factory_fixture,
)

LEDGER = 5
ENTRIES = 2000
GROUP = 25  # adds awaited together: the journal holds many records, not one big batch


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    yield from bookie_factory_fixture(tmp_path)


def make_entries(seed: int) -> dict[int, bytes]:
    rng = random.Random(seed)
    return {
        i: encode_entry(LEDGER, i, i - 1, i, rng.randbytes(rng.randint(200, 1200)))
        for i in range(ENTRIES)
    }


async def write_all(bookie: BookieProcess, entries: dict[int, bytes]) -> None:
    async with BookieClient(bookie.address, timeout=30) as client:
        ids = list(entries)
        for start in range(0, len(ids), GROUP):
            await asyncio.gather(
                *(client.add(LEDGER, i, entries[i]) for i in ids[start : start + GROUP])
            )


async def read_all(bookie: BookieProcess, ids: list[int]) -> dict[int, bytes | str]:
    """Each entry's bytes, or the status name the bookie answered with."""
    gate = asyncio.Semaphore(64)
    async with BookieClient(bookie.address, timeout=30) as client:

        async def one(entry_id: int) -> bytes:
            async with gate:
                return await client.read(LEDGER, entry_id)

        results = await asyncio.gather(*map(one, ids), return_exceptions=True)
    out: dict[int, bytes | str] = {}
    for i, result in zip(ids, results, strict=True):
        if isinstance(result, BookieUnavailableError):
            raise result
        if isinstance(result, BookieError):
            out[i] = result.status_name
        elif isinstance(result, BaseException):
            raise result
        else:
            out[i] = result
    return out


def bk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "bk", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def rebuild_index(bookie: BookieProcess) -> subprocess.CompletedProcess[str]:
    return bk(
        "indexrebuild",
        "--ledger-dir",
        str(bookie.ledger_dir),
        "--journal-dir",
        str(bookie.journal_dir),
    )


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def the_journal_file(bookie: BookieProcess) -> Path:
    """The journal file holding the adds (no checkpoint ran, so they are all in one file)."""
    files = [p for p in bookie.journal_files if p.stat().st_size > len(jnl.MAGIC)]
    assert len(files) == 1, f"expected the adds in one journal file: {bookie.journal_files}"
    return files[0]


async def test_overwrite_inside_the_journal_refuses_start_until_repaired(
    bookies: BookieFactory,
) -> None:
    bookie = bookies.start(journal_sync=True, checkpoint_interval_s=3600)
    sent = make_entries(seed=11)
    await write_all(bookie, sent)
    bookie.kill()
    path = the_journal_file(bookie)
    size = path.stat().st_size
    assert size > 1_000_000
    at = size // 2
    overwrite(path, at, random.Random(12).randbytes(64))
    damaged_content = path.read_bytes()

    # Refused, with the file, the offset and the way forward; nothing cut or changed.
    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    message = str(refused.value)
    assert "exited with code 1" in message, message
    assert f"journal file {path} is damaged at offset " in message, message
    offset = int(message.split(" is damaged at offset ")[1].split()[0])
    length = int(message.split(f"offset {offset} (")[1].split()[0])
    assert offset <= at < offset + length, message
    assert "restore the journal directory" in message, message
    assert f"magnetar bk journalrepair --journal-dir {bookie.journal_dir}" in message, message
    assert "Traceback" not in message, message
    assert path.read_bytes() == damaged_content, "a refused start must not touch the journal"
    with pytest.raises(BookieStartError):  # and again: the refusal is not a one-off
        bookie.start()

    # The repair tool refuses to run beside a live bookie, says what it would drop, drops it.
    dry = bk("journalrepair", "--journal-dir", str(bookie.journal_dir), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would drop {path} offset {offset}: " in dry.stdout, dry.stdout
    assert path.read_bytes() == damaged_content
    repaired = bk("journalrepair", "--journal-dir", str(bookie.journal_dir))
    assert repaired.returncode == 0, repaired.stderr
    line = next(x for x in repaired.stdout.splitlines() if x.startswith(f"dropped {path}"))
    assert f"offset {offset}: " in line and "damage inside the file" in line, repaired.stdout
    dropped_bytes = int(line.split(": ")[1].split(" bytes")[0])
    assert 64 <= dropped_bytes < 200_000, line
    assert "records skipped" in repaired.stdout, repaired.stdout

    # The bookie starts; every entry outside the dropped bytes is there, byte for byte.
    bookie.start()
    got = await read_all(bookie, list(sent))
    kept = [i for i in sent if got[i] == sent[i]]
    lost = [i for i in sent if got[i] != sent[i]]
    assert all(got[i] == "NO_SUCH_ENTRY" for i in lost), {i: got[i] for i in lost[:5]}
    assert 1 <= len(lost) <= 200, f"{len(lost)} entries lost to 64 damaged bytes"
    assert lost == list(range(lost[0], lost[-1] + 1)), "only one contiguous run is dropped"
    assert kept[-1] == ENTRIES - 1, "the records after the damage must survive"
    # Still whole after another crash and restart.
    bookie.restart(kill=True)
    again = await read_all(bookie, kept)
    assert all(again[i] == sent[i] for i in kept)


async def test_repair_refuses_while_the_bookie_runs(bookies: BookieFactory) -> None:
    bookie = bookies.start(journal_sync=False)
    result = bk("journalrepair", "--journal-dir", str(bookie.journal_dir))
    assert result.returncode == 1
    assert "stop the bookie first" in result.stderr, result.stderr


async def test_torn_tail_of_the_newest_journal_file_keeps_every_complete_record(
    bookies: BookieFactory,
) -> None:
    bookie = bookies.start(journal_sync=True, checkpoint_interval_s=3600)
    sent = make_entries(seed=21)
    await write_all(bookie, sent)
    # The last entry alone in the last record, so the cut below tears exactly that record.
    last = encode_entry(LEDGER, ENTRIES, ENTRIES - 1, ENTRIES, b"the torn one" * 40)
    async with BookieClient(bookie.address) as client:
        await client.add(LEDGER, ENTRIES, last)
    bookie.kill()
    path = the_journal_file(bookie)
    os.truncate(path, path.stat().st_size - 100)

    bookie.start()
    log_text = bookie.log_text()
    assert (
        "trailing bytes of journal file" in log_text and "are not a whole record; cut" in log_text
    )
    # The cut record's entry header survived; nothing later carries a LAC that reaches it.
    assert f"they held ledger {LEDGER} entry {ENTRIES}." in log_text
    assert "No later entry's LAC in the journal shows" in log_text
    got = await read_all(bookie, [*sent, ENTRIES])
    lost = {i: got[i] for i in sent if got[i] != sent[i]}
    assert not lost, f"{len(lost)} complete entries lost: {dict(list(lost.items())[:5])}"
    assert got[ENTRIES] == "NO_SUCH_ENTRY"


# -- index.db ----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["whole-file", "middle-pages"])
async def test_damaged_index_refuses_start_until_rebuilt_from_entry_logs(
    bookies: BookieFactory, where: str
) -> None:
    bookie = bookies.start(journal_sync=False, checkpoint_interval_s=3600)
    sent = make_entries(seed=31)
    await write_all(bookie, sent)
    bookie.checkpoint()  # the entries go to the entry logs and the index; the journal is trimmed
    assert bookie.stop() == 0
    index = bookie.ledger_dir / "index.db"
    size = index.stat().st_size
    assert size >= 32 * 1024, "the index should hold the 2000 entries"
    rng = random.Random(32)
    if where == "whole-file":
        index.write_bytes(rng.randbytes(size))
    else:
        overwrite(index, (size // 2) & ~4095, rng.randbytes(8192))

    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    message = str(refused.value)
    assert "exited with code 1" in message, message
    assert f"index {index} is damaged" in message, message
    assert f"restore the ledger directory {bookie.ledger_dir}" in message, message
    assert f"magnetar bk indexrebuild --ledger-dir {bookie.ledger_dir}" in message, message
    assert "Traceback" not in message and "sqlite3.DatabaseError" not in message, message

    rebuilt = rebuild_index(bookie)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert f"{ENTRIES} entries, 1 ledgers (all marked fenced)" in rebuilt.stdout, rebuilt.stdout
    assert (bookie.ledger_dir / "index.db.damaged").exists()

    bookie.start()
    got = await read_all(bookie, list(sent))
    assert all(got[i] == sent[i] for i in sent), "an entry of the entry logs was not indexed"
    async with BookieClient(bookie.address) as client:
        with pytest.raises(BookieError) as err:  # fenced on the safe side
            await client.add(LEDGER, ENTRIES, encode_entry(LEDGER, ENTRIES, -1, 0, b"late"))
        assert err.value.status_name == "FENCED"


# -- deleted files -------------------------------------------------------------------------------


async def test_deleted_journal_file_refuses_start(bookies: BookieFactory) -> None:
    """The adds are only in the journal (no checkpoint): deleting its file would lose them all."""
    bookie = bookies.start(journal_sync=True, checkpoint_interval_s=3600)
    await write_all(bookie, make_entries(seed=41))
    bookie.kill()
    path = the_journal_file(bookie)
    path.unlink()

    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    message = str(refused.value)
    assert f"journal files {path.name} are missing from {path.parent}" in message, message
    assert f"restore the journal directory {bookie.journal_dir}" in message, message
    assert "magnetar bk reregister" in message, message
    assert "Traceback" not in message, message
    with pytest.raises(BookieStartError):  # not a one-off: nothing was written meanwhile
        bookie.start()


async def test_deleted_index_refuses_start_until_rebuilt(bookies: BookieFactory) -> None:
    bookie = bookies.start(journal_sync=False, checkpoint_interval_s=3600)
    sent = make_entries(seed=51)
    await write_all(bookie, sent)
    bookie.checkpoint()  # the entries go to the entry logs; only the index knows where
    assert bookie.stop() == 0
    index = bookie.ledger_dir / "index.db"
    for suffix in ("", "-wal", "-shm"):
        index.with_name(index.name + suffix).unlink(missing_ok=True)

    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    message = str(refused.value)
    assert f"index {index} is missing, but " in message, message
    assert f"magnetar bk indexrebuild --ledger-dir {bookie.ledger_dir}" in message, message
    assert not index.exists(), "a refused start must not create an empty index"

    rebuilt = rebuild_index(bookie)
    assert rebuilt.returncode == 0, rebuilt.stderr
    bookie.start()
    got = await read_all(bookie, list(sent))
    assert all(got[i] == sent[i] for i in sent), "an entry was not found after the rebuild"


async def test_deleted_entry_log_refuses_start(bookies: BookieFactory) -> None:
    bookie = bookies.start(journal_sync=False, checkpoint_interval_s=3600)
    await write_all(bookie, make_entries(seed=61))
    bookie.checkpoint()
    assert bookie.stop() == 0
    logs = [p for p in bookie.entry_log_files if p.stat().st_size > 1024]
    assert logs, f"expected the entries in an entry log: {bookie.entry_log_files}"
    logs[0].unlink()

    with pytest.raises(BookieStartError) as refused:
        bookie.start()
    message = str(refused.value)
    assert f"places entries of 1 ledgers ({LEDGER}) in entry logs missing from " in message, message
    assert logs[0].name in message, message
    assert f"restore the ledger directory {bookie.ledger_dir}" in message, message
    assert "magnetar bk reregister" in message, message
