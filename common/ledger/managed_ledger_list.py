"""A topic's ledger list read from the metadata store, for readers that go to the bookies
without a broker (the Spark source's storage path). Read-only.

The broker's managed ledger of ``persistent://tenant/ns/topic`` is named
``tenant/ns/persistent/topic`` (``magnetar.broker.model.topic_name.TopicName.
managed_ledger_name``) and writes the list at ``managed_ledger_key(name)`` as JSON
(``magnetar.broker.ledger.ledger_info.ManagedLedgerRecord``)::

    {"name": ..., "ledgers": [{"ledger_id": 7, "entries": 100, "closed": true, ...}, ...], ...}

Only the fields a reader needs are read here: which ledgers, in order, and which are closed
with how many entries. The last ledger is usually the open one; its entries count only once
it is closed, so its end is the broker's to tell.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from magnetar.common.ledger.managed_ledger_keys import managed_ledger_key
from magnetar.common.metadata import MetadataStore

__all__ = [
    "LedgerListError",
    "ListedLedger",
    "managed_ledger_name",
    "parse_ledger_list",
    "read_ledger_list",
]


class LedgerListError(ValueError):
    """The stored record is not a ledger list this reader understands."""


@dataclass(slots=True, frozen=True)
class ListedLedger:
    """One ledger of a topic as its list records it."""

    ledger_id: int
    entries: int
    closed: bool


def parse_ledger_list(data: bytes) -> tuple[ListedLedger, ...]:
    try:
        doc = json.loads(data)
        return tuple(
            ListedLedger(int(d["ledger_id"]), int(d["entries"]), bool(d["closed"]))
            for d in doc["ledgers"]
        )
    except (ValueError, KeyError, TypeError) as e:
        raise LedgerListError(f"not a managed ledger record: {e}") from None


def managed_ledger_name(topic: str) -> str:
    """``persistent://tenant/ns/topic`` as its managed ledger is named:
    ``tenant/ns/persistent/topic``."""
    domain, sep, rest = topic.partition("://")
    parts = rest.split("/", 2)
    if not sep or len(parts) != 3:
        raise ValueError(f"topic {topic!r}: expected domain://tenant/namespace/topic")
    tenant, namespace, local = parts
    return f"{tenant}/{namespace}/{domain}/{local}"


async def read_ledger_list(store: MetadataStore, topic: str) -> tuple[ListedLedger, ...] | None:
    """The ledgers ``topic`` (a full topic-partition name) lists, oldest first; None when the
    store has no list for it (never created, or deleted)."""
    found = await store.get(managed_ledger_key(managed_ledger_name(topic)))
    return None if found is None else parse_ledger_list(found.value)
