"""A read-only look into a ``local://`` metadata store owned by another process.

The standalone owns its SQLite file (``local.py``: an exclusive lock, watches in its process
only). A reader in another process that only needs to *read* keys (the Spark source reading a
topic's ledger list and its ledgers' metadata to go to the bookie itself) opens the file
read-only instead: SQLite's WAL mode lets readers see every committed write while the owner
keeps writing, and a read-only connection can change nothing. Writes, watches and sessions
are refused.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from magnetar.common.metadata.store import (
    LeaderElection,
    MetadataError,
    MetadataStore,
    Operation,
    Versioned,
    WatchEvent,
)

__all__ = ["ReadOnlyLocalStore", "ReadOnlyStoreError"]


class ReadOnlyStoreError(MetadataError):
    """A write, watch or session asked of a read-only store; or the file cannot be opened."""


class ReadOnlyLocalStore(MetadataStore):
    """``get``, ``children`` and ``scan`` of the SQLite file at ``path``, opened read-only;
    every call runs on a worker thread, never on the event loop."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ReadOnlyStoreError(f"no metadata store at {self.path}")
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise ReadOnlyStoreError(f"metadata store {self.path}: {e}") from None

    def _query(self, sql: str, args: tuple[object, ...]) -> list[tuple]:
        with self._lock:
            try:
                return self._conn.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise ReadOnlyStoreError(f"metadata store {self.path}: {e}") from None

    async def get(self, key: str) -> Versioned | None:
        rows = await asyncio.to_thread(
            self._query, "SELECT value, version FROM kv WHERE key = ?", (key.encode(),)
        )
        return Versioned(rows[0][0], rows[0][1]) if rows else None

    async def scan(self, prefix: str) -> dict[str, Versioned]:
        rows = await asyncio.to_thread(
            self._query,
            "SELECT key, value, version FROM kv WHERE substr(key, 1, ?) = ?",
            (len(prefix.encode()), prefix.encode()),
        )
        return {k.decode(): Versioned(v, ver) for k, v, ver in rows}

    async def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        found = await self.scan(prefix)
        return sorted({k[len(prefix) :].split("/", 1)[0] for k in found})

    def _refuse(self, what: str) -> ReadOnlyStoreError:
        return ReadOnlyStoreError(f"metadata store {self.path} is open read-only: no {what}")

    async def put(
        self, key: str, value: bytes, expected_version: int | None = None, *, ephemeral=False
    ) -> int:
        raise self._refuse("put")

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        raise self._refuse("delete")

    async def transaction(self, conditions: Sequence[object], operations: Sequence[Operation]):
        raise self._refuse("transaction")

    def watch(self, key: str, *, prefix: bool = False) -> AsyncIterator[WatchEvent]:
        raise self._refuse("watch")

    def add_session_listener(self, callback: Callable[[], None]) -> None:
        raise self._refuse("session")

    def election(self, name: str) -> LeaderElection:
        raise self._refuse("leader election")

    @property
    def session_lost(self) -> bool:
        return False

    async def close(self) -> None:
        with self._lock:
            self._conn.close()
