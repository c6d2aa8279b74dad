"""Every key under a prefix of the metadata store with its value, kept current by a watch: what
a broker reads of bundle ownership and broker registrations, and what a proxy reads of the
registered brokers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from magnetar.common.metadata import EventType, MetadataError, MetadataStore
from magnetar.common.metadata.election import cancel_and_wait

log = logging.getLogger(__name__)


class PrefixCache:
    """Every key under ``prefix`` with its value, kept current by a watch.

    ``start()`` registers the watch first and scans second, so no write is missed; events are
    applied only when newer (by version) than what is held, so the scan and the events that
    raced it settle on the newest state. Deletions leave a tombstone with their version for the
    same reason. ``on_change(key, value, version)`` runs for every applied change (value None:
    deleted); ``on_end()`` runs if the watch ends while the cache is open (store closed or
    broken): from then on the copy may be stale.
    """

    def __init__(
        self,
        store: MetadataStore,
        prefix: str,
        *,
        on_change: Callable[[str, bytes | None, int], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.prefix = prefix
        self._store = store
        self._entries: dict[str, tuple[int, bytes | None]] = {}
        self._on_change = on_change
        self._on_end = on_end
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.started = False

    async def start(self) -> None:
        if self.started:
            return
        watch = self._store.watch(self.prefix, prefix=True)
        await watch.start()
        try:
            for key, current in (await self._store.scan(self.prefix)).items():
                self.apply(key, current.value, current.version)
        except BaseException:
            await watch.aclose()
            raise
        self.started = True
        self._task = asyncio.create_task(self._follow(watch), name=f"prefix-cache {self.prefix}")

    def apply(self, key: str, value: bytes | None, version: int) -> bool:
        """Take a state of ``key`` known from elsewhere (a write of ours); False if older."""
        held = self._entries.get(key)
        if held is not None and held[0] >= version:
            return False
        self._entries[key] = (version, value)
        if self._on_change is not None:
            try:
                self._on_change(key, value, version)
            except Exception:
                log.exception("change listener of %s failed on %s", self.prefix, key)
        return True

    def get(self, key: str) -> bytes | None:
        held = self._entries.get(key)
        return held[1] if held is not None else None

    def version(self, key: str) -> int | None:
        """Version of the key's current value (None: absent)."""
        held = self._entries.get(key)
        return held[0] if held is not None and held[1] is not None else None

    def items(self) -> dict[str, bytes]:
        return {k: v for k, (_, v) in self._entries.items() if v is not None}

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _follow(self, watch: Any) -> None:
        try:
            async with watch:
                async for event in watch:
                    value = event.value if event.type is EventType.PUT else None
                    self.apply(event.key, value, event.version)
        except MetadataError as e:
            log.warning("watch of %s failed: %s", self.prefix, e)
        if not self._closed and self._on_end is not None:
            self._on_end()
