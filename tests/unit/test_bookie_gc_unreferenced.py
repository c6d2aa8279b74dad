"""Unreferenced ledgers in the bookie's garbage collector (services/bookie/gc.py): a ledger with
entries here that no topic refers to (its topic's list lost it, its topic lost its list, or the
store lost its metadata and counter) is reported and never collected. A real LedgerStorage in a
tmp directory, and a dictionary for a metadata store."""

from __future__ import annotations

import json
import logging

import pytest

from magnetar.bookie.gc import (
    GarbageCollector,
    Unreferenced,
    UnreferencedLedger,
    listed_ledgers,
    managed_ledger_key,
)
from magnetar.bookie.ledger_storage import LedgerStorage, StorageError
from magnetar.broker.model.keys import managed_ledger_key as brokers_managed_ledger_key
from magnetar.common.ledger.identity import INSTANCE_ID_KEY
from magnetar.common.ledger.managed_ledger_list import LedgerInfo
from magnetar.common.ledger.metadata import (
    LEDGER_ID_COUNTER,
    Fragment,
    LedgerMetadata,
    ledger_key,
)
from magnetar.common.metadata import Versioned
from tests.support.bookie_storage import add, gc_over, storage_fixture  # noqa: F401 (fixture)

INSTANCE = "cluster-1"
#: Managed-ledger names, as the broker gives them (``tenant/namespace/domain/topic``).
TOPIC = "t/ns/persistent/orders"
OTHER = "t/ns/persistent/gone"


class DictStore:
    """``get`` and ``children`` over a dictionary of keys."""

    def __init__(self, counter: int | None) -> None:
        self.keys: dict[str, bytes] = {INSTANCE_ID_KEY: INSTANCE.encode()}
        if counter is not None:
            self.set_counter(counter)

    def set_counter(self, counter: int) -> None:
        self.keys[LEDGER_ID_COUNTER] = str(counter).encode()

    def ledger(self, ledger_id: int, **custom: bytes) -> None:
        metadata = LedgerMetadata(
            ensemble_size=1,
            write_quorum=1,
            ack_quorum=1,
            fragments=(Fragment(0, ("127.0.0.1:3181",)),),
            custom_metadata=dict(custom),
        )
        self.keys[ledger_key(ledger_id)] = metadata.to_bytes()

    def topic(self, name: str, ledger_ids: list[int]) -> None:
        doc = {
            "name": name,
            "ledgers": [LedgerInfo(i, entries=3, closed=True).to_json() for i in ledger_ids],
            "properties": {},
        }
        self.keys[managed_ledger_key(name)] = json.dumps(doc).encode()

    async def get(self, key: str) -> Versioned | None:
        value = self.keys.get(key)
        return None if value is None else Versioned(value, 1)

    async def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted({k[len(prefix) :].split("/")[0] for k in self.keys if k.startswith(prefix)})


def collector(storage: LedgerStorage, store: DictStore, min_idle_s: float = 0) -> GarbageCollector:
    return gc_over(storage, store, INSTANCE, min_idle_s)


async def holds(storage: LedgerStorage, ledger_id: int) -> bool:
    try:
        await storage.read(ledger_id, 0)
    except StorageError:
        return False
    return True


def gauge(gc: GarbageCollector, reason: Unreferenced) -> float:
    value = gc.metrics.registry.get_sample_value(
        "magnetar_bookie_unreferenced_ledgers", {"reason": reason.value}
    )
    assert value is not None
    return value


async def test_a_ledger_its_topic_does_not_list_is_reported_and_kept(
    storage: LedgerStorage, caplog: pytest.LogCaptureFixture
) -> None:
    for ledger_id in (10, 11, 12, 13, 14):
        await add(storage, ledger_id)
    store = DictStore(counter=20)
    store.ledger(10, **{"managed-ledger": TOPIC.encode()})  # listed
    store.ledger(11, **{"managed-ledger": TOPIC.encode()})  # the list lost it
    store.ledger(12, **{"managed-ledger": OTHER.encode()})  # its topic lost its list
    store.ledger(13, **{"managed-ledger": TOPIC.encode(), "cursor": b"sub"})  # a cursor's
    store.ledger(14)  # no topic's at all
    store.topic(TOPIC, [10])
    gc = collector(storage, store)
    with caplog.at_level(logging.WARNING, logger="magnetar.bookie.gc"):
        first = await gc.run()
        second = await gc.run()
    expected = [
        UnreferencedLedger(11, Unreferenced.UNLISTED, TOPIC, 2),
        UnreferencedLedger(12, Unreferenced.TOPIC_MISSING, OTHER, 2),
    ]
    assert sorted(first.unreferenced, key=lambda u: u.ledger_id) == expected
    assert sorted(second.unreferenced, key=lambda u: u.ledger_id) == expected
    assert first.orphan_ledgers == second.orphan_ledgers == []
    for ledger_id in (10, 11, 12, 13, 14):
        assert await holds(storage, ledger_id)
    assert gauge(gc, Unreferenced.UNLISTED) == 1 and gauge(gc, Unreferenced.TOPIC_MISSING) == 1
    # Logged once each, naming the ledger, its topic and the way forward.
    warnings = [r.getMessage() for r in caplog.records if "ledger 11 " in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert TOPIC in warnings[0] and "magnetar bk deleteledger 11" in warnings[0]

    # Adopted into its topic's list: no longer reported, and the gauge says so.
    store.topic(TOPIC, [10, 11])
    assert [u.ledger_id for u in (await gc.run()).unreferenced] == [12]
    assert gauge(gc, Unreferenced.UNLISTED) == 0


async def test_a_ledger_the_store_forgot_with_its_counter_is_reported_and_kept(
    storage: LedgerStorage,
) -> None:
    """The store went back to before ledgers 30 and 31 were created: no metadata, and a counter
    below their ids. They are kept, also once the counter has moved past them; a real orphan
    (15: at most the counter, no metadata) is still collected."""
    for ledger_id in (15, 30, 31):
        await add(storage, ledger_id)
    store = DictStore(counter=20)
    gc = collector(storage, store)
    result = await gc.run()
    assert result.orphan_ledgers == [15]
    assert [(u.ledger_id, u.reason) for u in result.unreferenced] == [
        (30, Unreferenced.ABOVE_COUNTER),
        (31, Unreferenced.ABOVE_COUNTER),
    ]
    assert gauge(gc, Unreferenced.ABOVE_COUNTER) == 2
    store.set_counter(40)  # new ledgers took ids past them
    result = await gc.run()
    assert result.orphan_ledgers == []
    assert [u.ledger_id for u in result.unreferenced] == [30, 31]
    assert await holds(storage, 30) and await holds(storage, 31)


async def test_a_store_without_a_counter_reports_every_unknown_ledger(
    storage: LedgerStorage,
) -> None:
    await add(storage, 17)
    gc = collector(storage, DictStore(counter=None))
    result = await gc.run()
    assert "counter" in (result.orphan_scan_skipped or "")
    assert [(u.ledger_id, u.reason) for u in result.unreferenced] == [
        (17, Unreferenced.ABOVE_COUNTER)
    ]
    assert await holds(storage, 17)


async def test_the_topic_record_is_the_brokers() -> None:
    """gc.py reads the broker's managed-ledger record without importing the broker: the key
    (shared through magnetar.common.ledger.managed_ledger_keys) and the document must stay the
    broker's."""
    for name in (TOPIC, "t/ns/persistent/a b%c", "persistent://t/ns/x"):
        assert managed_ledger_key(name) == brokers_managed_ledger_key(name)
    store = DictStore(counter=1)
    store.topic(TOPIC, [4, 7])
    assert await listed_ledgers(store, TOPIC) == {4, 7}  # type: ignore[arg-type]
    assert await listed_ledgers(store, OTHER) is None  # type: ignore[arg-type]
