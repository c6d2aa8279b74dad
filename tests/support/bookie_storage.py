"""A bookie's ledger storage in the test process, for tests of what runs on top of it (GC)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.gc import GarbageCollector
from magnetar.bookie.ledger_storage import LedgerStorage
from magnetar.bookie.metrics import BookieMetrics
from magnetar.common.ledger.entry import encode_entry


class StoredAdd:
    """One add as the bookie's server hands it to the storage."""

    def __init__(self, ledger_id: int, entry_id: int) -> None:
        self.ledger_id, self.entry_id = ledger_id, entry_id
        self.entry = encode_entry(ledger_id, entry_id, entry_id - 1, 10, b"payload")
        self.recovery = False
        self.master_key = b"key"


@pytest.fixture(name="storage")
async def storage_fixture(tmp_path: Path) -> AsyncIterator[LedgerStorage]:
    """A started ledger storage on fresh directories, closed after the test."""
    config = BookieConfig(
        journal_dir=str(tmp_path / "journal"),
        ledger_dir=str(tmp_path / "ledgers"),
        journal_sync=False,
    )
    started = LedgerStorage(config)
    await started.start()
    try:
        yield started
    finally:
        await started.close()


async def add(storage: LedgerStorage, ledger_id: int, entries: int = 3) -> None:
    """Store entries 0..entries-1 of ``ledger_id``; every add must succeed."""
    assert await storage.add([StoredAdd(ledger_id, i) for i in range(entries)]) == []


def gc_over(
    storage: LedgerStorage, store: object, instance_id: str, min_idle_s: float = 0
) -> GarbageCollector:
    """The bookie's garbage collector over ``storage``, asking ``store`` (a stand-in for the
    metadata store that answers what the test scripts) for the cluster ``instance_id``."""
    return GarbageCollector(
        storage,
        lambda: store,  # type: ignore[arg-type,return-value]
        BookieMetrics(),
        address="127.0.0.1:3181",
        instance_id=instance_id,
        min_idle_s=min_idle_s,
    )
