"""Where a topic's managed ledger keeps its ledger list in the metadata store: the contract
between the broker, which writes it, and the bookie's garbage collector, which reads which
ledgers a topic still lists. A leaf module.

The whole topic name is percent-encoded (``urllib.parse.quote(name, safe="")``), so
``persistent://t/ns/topic`` becomes ``persistent%3A%2F%2Ft%2Fns%2Ftopic``: one path segment,
reversible, and never a prefix of another topic's key, which matters because the cursors live
*under* it."""

from __future__ import annotations

import urllib.parse

MANAGED_LEDGERS_PATH = "/magnetar/managed-ledgers"


def encode_name(name: str) -> str:
    """One key-safe, reversible path segment for a topic or cursor name."""
    return urllib.parse.quote(name, safe="")


def decode_name(segment: str) -> str:
    return urllib.parse.unquote(segment)


def managed_ledger_key(name: str) -> str:
    return f"{MANAGED_LEDGERS_PATH}/{encode_name(name)}"
