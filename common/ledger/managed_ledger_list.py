"""A managed ledger's ledgers as stored: one ``LedgerInfo`` per ledger, in the record the
metadata store keeps at the managed ledger's key (``managed_ledger_key``), as JSON::

    {"name": "persistent://t/ns/topic",
     "ledgers": [{"ledger_id": 7, "entries": 100, "size": 5120, "ctime_ms": ..., "closed": true},
                 {"ledger_id": 9, "entries": 0, "size": 0, "ctime_ms": ..., "closed": false}],
     "properties": {}}

A terminated managed ledger (Pulsar's ``terminatedPosition``) also has
``"terminated_at": [ledger_id, entry_id]``, its last entry for good; it has no open ledger.

The broker writes it (its managed ledger); the bookie's GC reads which ledgers it lists, and
the Spark source's storage path which ledgers a topic has and which are closed with how many
entries. The last ledger is usually the open one: its entries count only once it is closed,
so its end is the broker's to tell. A managed ledger of ``persistent://tenant/ns/topic`` is
named ``tenant/ns/persistent/topic`` (``managed_ledger_name``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from magnetar.common.ledger.managed_ledger_keys import managed_ledger_key
from magnetar.common.ledger.metadata import LedgerMetadata
from magnetar.common.metadata import MetadataStore

__all__ = [
    "LedgerInfo",
    "LedgerListError",
    "ManagedLedgerRecord",
    "managed_ledger_name",
    "parse_ledger_list",
    "read_ledger_list",
    "referenced_ledger_ids",
]


class LedgerListError(ValueError):
    """The stored record is not a ledger list this reader understands."""


@dataclass(slots=True, frozen=True)
class LedgerInfo:
    ledger_id: int
    entries: int = 0  # final count once closed; 0 for the ledger still open for writes
    size: int = 0
    ctime_ms: int = 0
    closed: bool = False
    closed_ms: int = 0  # when the broker closed it (0: unknown, use ctime_ms)

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "entries": self.entries,
            "size": self.size,
            "ctime_ms": self.ctime_ms,
            "closed": self.closed,
            "closed_ms": self.closed_ms,
        }

    def closed_as(self, metadata: LedgerMetadata) -> LedgerInfo:
        """This ledger closed, with the end its (closed or recovered) metadata gives."""
        return replace(
            self,
            entries=metadata.last_entry_id + 1,
            size=metadata.length,
            closed=True,
            closed_ms=int(time.time() * 1000),
        )

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LedgerInfo:
        return cls(
            int(d["ledger_id"]),
            int(d["entries"]),
            int(d["size"]),
            int(d["ctime_ms"]),
            bool(d["closed"]),
            int(d.get("closed_ms", 0)),
        )


@dataclass(slots=True)
class ManagedLedgerRecord:
    """The managed ledger's stored record: its ledgers in order, its properties, and where it
    was terminated (None: it was not).

    ``{"name": ..., "ledgers": [LedgerInfo.to_json(), ...], "properties": {...}}``"""

    name: str
    ledgers: list[LedgerInfo] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    terminated_at: tuple[int, int] | None = None

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "name": self.name,
            "ledgers": [i.to_json() for i in self.ledgers],
            "properties": self.properties,
        }
        if self.terminated_at is not None:
            doc["terminated_at"] = list(self.terminated_at)
        return json.dumps(doc).encode()

    @classmethod
    def from_bytes(cls, name: str, data: bytes) -> ManagedLedgerRecord:
        doc = json.loads(data)
        terminated = doc.get("terminated_at")
        return cls(
            name,
            [LedgerInfo.from_json(d) for d in doc["ledgers"]],
            dict(doc.get("properties", {})),
            None if terminated is None else (int(terminated[0]), int(terminated[1])),
        )


#: Properties naming a topic's compacted ledgers (the broker's compactor writes them): the
#: recorded one, and one a run created and has not recorded yet (the next run deletes it).
COMPACTED_LEDGER_PROPERTIES = ("CompactedTopicLedger", "CompactionPendingLedger")


def referenced_ledger_ids(data: bytes) -> set[int]:
    """Every ledger a stored record refers to: its list and its compacted ledgers."""
    try:
        doc = json.loads(data)
        ids = {info.ledger_id for info in _listed(doc)}
        properties = doc.get("properties") or {}
        ids.update(int(properties[k]) for k in COMPACTED_LEDGER_PROPERTIES if k in properties)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise LedgerListError(f"not a managed ledger record: {e}") from None
    return ids


def parse_ledger_list(data: bytes) -> tuple[LedgerInfo, ...]:
    """The ledgers a stored record lists, oldest first (``LedgerListError`` if it is not one)."""
    try:
        return _listed(json.loads(data))
    except (ValueError, KeyError, TypeError) as e:
        raise LedgerListError(f"not a managed ledger record: {e}") from None


def _listed(doc: Any) -> tuple[LedgerInfo, ...]:
    return tuple(LedgerInfo.from_json(d) for d in doc["ledgers"])


def managed_ledger_name(topic: str) -> str:
    """``persistent://tenant/ns/topic`` as its managed ledger is named:
    ``tenant/ns/persistent/topic``."""
    domain, sep, rest = topic.partition("://")
    parts = rest.split("/", 2)
    if not sep or len(parts) != 3:
        raise ValueError(f"topic {topic!r}: expected domain://tenant/namespace/topic")
    tenant, namespace, local = parts
    return f"{tenant}/{namespace}/{domain}/{local}"


async def read_ledger_list(store: MetadataStore, topic: str) -> tuple[LedgerInfo, ...] | None:
    """The ledgers ``topic`` (a full topic-partition name) lists, oldest first; None when the
    store has no list for it (never created, or deleted)."""
    found = await store.get(managed_ledger_key(managed_ledger_name(topic)))
    return None if found is None else parse_ledger_list(found.value)
