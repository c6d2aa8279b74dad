"""The orphan-ledger rules of the bookie's garbage collector (services/bookie/gc.py), each on its
own: a real LedgerStorage in a tmp directory, and a scripted metadata store that can answer
differently to the list and to the second look."""

from __future__ import annotations

import asyncio
from pathlib import Path

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.gc import GarbageCollector
from magnetar.bookie.ledger_storage import LedgerStorage, StorageError
from magnetar.common.ledger.identity import INSTANCE_ID_KEY
from magnetar.common.ledger.metadata import LEDGER_ID_COUNTER, LEDGERS_PATH, ledger_key
from magnetar.common.metadata import MetadataError, Versioned
from magnetar.common.proto import bookie_pb2 as pb
from tests.support.bookie_storage import StoredAdd, add, gc_over, storage_fixture  # noqa: F401 (fixture)

INSTANCE = "cluster-1"


class ScriptedStore:
    """Answers ``get`` from ``keys``; ``children`` of the ledgers path from ``listed`` (which a
    test may make stale on purpose)."""

    def __init__(self, counter: int | None, ledgers: set[int]) -> None:
        self.keys: dict[str, bytes] = {INSTANCE_ID_KEY: INSTANCE.encode()}
        if counter is not None:
            self.keys[LEDGER_ID_COUNTER] = str(counter).encode()
        for ledger_id in ledgers:
            self.keys[ledger_key(ledger_id)] = b"metadata"
        self.listed = set(ledgers)
        self.fail: bool = False

    async def get(self, key: str) -> Versioned | None:
        if self.fail:
            raise MetadataError("store unreachable")
        value = self.keys.get(key)
        return None if value is None else Versioned(value, 1)

    async def children(self, path: str) -> list[str]:
        assert path == LEDGERS_PATH
        if self.fail:
            raise MetadataError("store unreachable")
        return sorted(str(i) for i in self.listed)


def collector(storage: LedgerStorage, store: ScriptedStore, min_idle_s: float) -> GarbageCollector:
    return gc_over(storage, store, INSTANCE, min_idle_s)


async def status(storage: LedgerStorage, ledger_id: int) -> str:
    try:
        await storage.read(ledger_id, 0)
    except StorageError as e:
        return pb.Status.Name(e.status)
    return "OK"


async def test_only_ledgers_missing_from_the_store_are_collected(storage: LedgerStorage) -> None:
    for ledger_id in (10, 11, 12):
        await add(storage, ledger_id)
    await storage.checkpoint()
    store = ScriptedStore(counter=20, ledgers={10, 12})
    result = await collector(storage, store, 0).run()
    assert result.orphan_ledgers == [11]
    assert result.orphan_scan_skipped is None
    assert await status(storage, 11) == "NO_SUCH_LEDGER"
    assert await status(storage, 10) == "OK" and await status(storage, 12) == "OK"
    # A second round finds nothing more.
    assert (await collector(storage, store, 0).run()).orphan_ledgers == []


async def test_ids_above_the_counter_read_at_the_start_are_left_alone(
    storage: LedgerStorage,
) -> None:
    await add(storage, 25)  # adds reached us before the counter even said 25
    store = ScriptedStore(counter=20, ledgers=set())
    assert await collector(storage, store, 0).collect_orphans() == []
    assert await status(storage, 25) == "OK"


async def test_a_ledger_created_after_the_list_survives_the_second_look(
    storage: LedgerStorage,
) -> None:
    await add(storage, 15)
    store = ScriptedStore(counter=20, ledgers={15})
    store.listed = set()  # the list was taken before its metadata was written
    assert await collector(storage, store, 0).collect_orphans() == []
    assert await status(storage, 15) == "OK"


async def test_recently_added_ledgers_are_not_collected(storage: LedgerStorage) -> None:
    await add(storage, 16)
    store = ScriptedStore(counter=20, ledgers=set())
    assert await collector(storage, store, 30).collect_orphans() == []
    assert await status(storage, 16) == "OK"
    await asyncio.sleep(0.3)
    assert await collector(storage, store, 0.2).collect_orphans() == [16]


async def test_an_untrusted_or_unreachable_store_deletes_nothing(storage: LedgerStorage) -> None:
    await add(storage, 17)
    no_counter = ScriptedStore(counter=None, ledgers=set())
    result = await collector(storage, no_counter, 0).run()
    assert result.orphan_ledgers == [] and "counter" in (result.orphan_scan_skipped or "")
    other_cluster = ScriptedStore(counter=20, ledgers=set())
    other_cluster.keys[INSTANCE_ID_KEY] = b"another-cluster"
    result = await collector(storage, other_cluster, 0).run()
    assert result.orphan_ledgers == [] and "instance id" in (result.orphan_scan_skipped or "")
    failing = ScriptedStore(counter=20, ledgers=set())
    failing.fail = True
    result = await collector(storage, failing, 0).run()
    assert result.orphan_ledgers == [] and "unreachable" in (result.orphan_scan_skipped or "")
    assert await status(storage, 17) == "OK"


async def test_a_collected_ledger_refuses_adds_and_stays_deleted_after_restart(
    tmp_path: Path,
) -> None:
    config = BookieConfig(
        journal_dir=str(tmp_path / "journal"),
        ledger_dir=str(tmp_path / "ledgers"),
        journal_sync=False,
    )
    storage = LedgerStorage(config)
    await storage.start()
    await add(storage, 18)
    store = ScriptedStore(counter=20, ledgers=set())
    assert await collector(storage, store, 0).collect_orphans() == [18]
    failures = await storage.add([StoredAdd(18, 3)])
    assert [pb.Status.Name(s) for _i, s, _m in failures] == ["NO_SUCH_LEDGER"]
    await storage.close()
    storage = LedgerStorage(config)
    await storage.start()
    try:
        assert await status(storage, 18) == "NO_SUCH_LEDGER"
        assert 18 not in await storage.ledger_ids()
    finally:
        await storage.close()
