"""Where managed ledgers and their cursors live in the metadata store. A leaf module.

The managed ledger's key and its encoding are shared with the bookie's garbage collector
(``magnetar.common.ledger.managed_ledger_keys``); a cursor's record lives under it
(``<key>/cursors/<encoded cursor name>``)."""

from __future__ import annotations

from magnetar.common.ledger.managed_ledger_keys import (
    MANAGED_LEDGERS_PATH,
    decode_name,
    encode_name,
    managed_ledger_key,
)

__all__ = ["MANAGED_LEDGERS_PATH", "cursor_key", "decode_name", "encode_name", "managed_ledger_key"]


def cursor_key(managed_ledger_key: str, name: str) -> str:
    return f"{managed_ledger_key}/cursors/{encode_name(name)}"
