"""The in-process client's adds come to the ledger storage as runs (``LedgerStorage.add_runs``:
a ledger's state and the writer's key checked once per run, each entry's header on its own).
They must end as the same adds one by one (``add``) end: the same refusals at the same op
numbers, the same entries stored, the same LAC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.ledger_storage import AddRun, LedgerStorage, StorageError
from magnetar.common.ledger.entry import encode_entry
from magnetar.common.proto import bookie_pb2 as pb


class Add:
    def __init__(self, ledger_id: int, entry_id: int, entry: bytes, key: bytes, recovery: bool):
        self.ledger_id, self.entry_id, self.entry = ledger_id, entry_id, entry
        self.master_key, self.recovery = key, recovery


#: Data past the largest entry a bookie takes.
TOO_LARGE_DATA = bytes(6 * 1024 * 1024)


def entry(ledger_id: int, entry_id: int, *, header_id: int | None = None) -> bytes:
    """An entry as a ledger client encodes it (``header_id``: a header naming another id)."""
    named = entry_id if header_id is None else header_id
    return encode_entry(
        ledger_id, named, named - 1, 100 * (named + 1), f"{ledger_id}/{named}".encode()
    )


def run(ledger_id: int, first: int, count: int, key: bytes = b"k", **kwargs: object) -> AddRun:
    entries = [entry(ledger_id, i) for i in range(first, first + count)]
    return AddRun(ledger_id, first, entries, key, **kwargs)  # type: ignore[arg-type]


def as_adds(runs: list[AddRun]) -> list[Add]:
    return [
        Add(r.ledger_id, entry_id, e, r.master_key, r.recovery)
        for r in runs
        for entry_id, e in enumerate(r.entries, r.first_entry_id)
    ]


async def started(path: Path) -> LedgerStorage:
    storage = LedgerStorage(
        BookieConfig(
            journal_dir=str(path / "journal"), ledger_dir=str(path / "ledgers"), journal_sync=False
        )
    )
    await storage.start()
    return storage


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[LedgerStorage, LedgerStorage]]:
    one, other = await started(tmp_path / "runs"), await started(tmp_path / "adds")
    try:
        yield one, other
    finally:
        await one.close()
        await other.close()


async def stored(storage: LedgerStorage, ledger_id: int, upto: int) -> list[str]:
    found = []
    for entry_id in range(upto):
        try:
            found.append((await storage.read(ledger_id, entry_id)).hex())
        except StorageError as e:
            found.append(pb.Status.Name(e.status))
    return found


async def test_runs_end_as_their_adds_one_by_one(
    pair: tuple[LedgerStorage, LedgerStorage],
) -> None:
    by_runs, by_adds = pair
    for storage in pair:  # ledger 3 is fenced before the adds come
        assert await storage.add([Add(3, 0, entry(3, 0), b"k", False)]) == []
        await storage.fence(3)
    bad_header = run(2, 0, 3)
    bad_header.entries[1] = entry(2, 1, header_id=7)
    fenced_with_a_large_one = run(3, 1, 3)
    fenced_with_a_large_one.entries[1] = encode_entry(3, 2, 1, 1, TOO_LARGE_DATA)
    too_large_first = run(7, 0, 1)  # its key must not stay: nothing of it reached the journal
    too_large_first.entries[0] = encode_entry(7, 0, -1, 1, TOO_LARGE_DATA)
    rounds = [
        # fine; one entry refused; fenced (the large entry's own refusal first)
        (
            [run(1, 0, 5), bad_header, fenced_with_a_large_one],
            [(6, "BAD_REQUEST"), (8, "FENCED"), (9, "TOO_LARGE"), (10, "FENCED")],
        ),
        # the other writer's adds were taken
        ([too_large_first, run(7, 0, 2, key=b"another writer")], [(0, "TOO_LARGE")]),
        (
            [run(1, 5, 3, key=b"other"), run(3, 1, 2, recovery=True), run(4, 0, 1)],
            [(0, "UNAUTHORIZED"), (1, "UNAUTHORIZED"), (2, "UNAUTHORIZED")],
        ),
    ]
    for runs, expected in rounds:
        failures = await by_runs.add_runs(runs)
        assert failures == await by_adds.add(as_adds(runs))
        assert [(i, pb.Status.Name(s)) for i, s, _ in failures] == expected
    for ledger_id, upto in ((1, 9), (2, 3), (3, 4), (4, 2), (7, 2)):
        assert await stored(by_runs, ledger_id, upto) == await stored(by_adds, ledger_id, upto)
        assert (await by_runs.read_lac(ledger_id)).lac == (await by_adds.read_lac(ledger_id)).lac
    assert (await by_runs.read_lac(1)).lac == 3  # entry 4 of ledger 1 says LAC 3
    assert (await by_runs.read_lac(3)).lac == 1  # the recovery run got in


async def test_a_run_with_a_bad_digest_is_refused_entry_by_entry(
    pair: tuple[LedgerStorage, LedgerStorage],
) -> None:
    by_runs, by_adds = pair
    damaged = run(5, 0, 3)
    damaged.entries[2] = damaged.entries[2][:-1] + b"!"
    failures = await by_runs.add_runs([damaged])
    assert [(i, pb.Status.Name(s)) for i, s, _ in failures] == [(2, "DIGEST_MISMATCH")]
    assert failures == await by_adds.add(as_adds([damaged]))
    assert await by_runs.add_runs([damaged], check_digests=False) == []  # in-process: taken
