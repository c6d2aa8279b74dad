"""Leader election on top of any store's CAS, ephemeral keys and watches.

The rule (the classic ZooKeeper/etcd recipe, without a queue of candidates): the leader is
whoever created ``/magnetar/elections/<name>/leader`` with ``NOT_EXISTS`` as an ephemeral key
of its session. Losers watch that key and retry when it is deleted, which happens when the
leader resigns (delete with its version) or its session ends (the key vanishes with it).
Candidates are not ordered: after a handover any waiting candidate may win.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from magnetar.common.metadata.store import (
    NOT_EXISTS,
    BadVersionError,
    EventType,
    LeaderElection,
    MetadataError,
    NoSuchKeyError,
    StoreClosedError,
    Versioned,
)
from magnetar.common.metadata.watch import WatchStream

log = logging.getLogger(__name__)

ELECTIONS_ROOT = "/magnetar/elections"


class ElectionStore(Protocol):
    """The part of a MetadataStore an election needs (both stores provide it)."""

    @property
    def session_lost(self) -> bool: ...

    async def get(self, key: str) -> Versioned | None: ...

    async def put(
        self,
        key: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
    ) -> int: ...

    async def delete(self, key: str, expected_version: int | None = None) -> None: ...

    def watch(self, key: str, *, prefix: bool = False) -> WatchStream: ...


def leader_key(name: str) -> str:
    if not name or "/" in name:
        raise ValueError(f"election name must be non-empty and contain no '/': {name!r}")
    return f"{ELECTIONS_ROOT}/{name}/leader"


class StoreLeaderElection(LeaderElection):
    """One candidate in election ``name``; several may share a store (in-process contenders)."""

    def __init__(self, store: ElectionStore, name: str) -> None:
        self.name = name
        self.key = leader_key(name)
        self._store = store
        # Version of the leader key we created; None while we are not the leader.
        self._version: int | None = None
        self._monitor: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        return self._version is not None and not self._store.session_lost

    async def leader(self) -> bytes | None:
        current = await self._store.get(self.key)
        return current.value if current is not None else None

    async def campaign(self, value: bytes) -> None:
        if self.is_leader:
            return
        while True:
            try:
                version = await self._store.put(self.key, value, NOT_EXISTS, ephemeral=True)
            except BadVersionError:
                await self._wait_until_vacant()
                continue
            self._became_leader(version)
            return

    async def resign(self) -> None:
        version, self._version = self._version, None
        await self._stop_monitor()
        if version is None or self._store.session_lost:
            # Not the leader, or our session (and with it the leader key) is already gone.
            return
        with contextlib.suppress(BadVersionError, NoSuchKeyError):
            # Either error means the key is no longer ours: nothing left to give up.
            await self._store.delete(self.key, version)
        log.info("resigned leadership of election %s", self.name)

    async def observe(self) -> AsyncIterator[bytes | None]:
        async with self._store.watch(self.key) as events:
            # The watch is registered before the read, so no change after the read is missed;
            # events older than what the read showed are skipped by version.
            current = await self._store.get(self.key)
            seen = current.version if current is not None else 0
            last = current.value if current is not None else None
            yield last
            async for event in events:
                if event.version <= seen:
                    continue
                value = event.value if event.type is EventType.PUT else None
                if value != last:
                    last = value
                    yield value

    async def _wait_until_vacant(self) -> None:
        async with self._store.watch(self.key) as events:
            # Check after registering: a delete between our failed put and the watch would
            # otherwise be missed and we would wait forever.
            if await self._store.get(self.key) is None:
                return
            async for event in events:
                if event.type is EventType.DELETE:
                    return
        raise StoreClosedError(f"metadata store closed while campaigning in election {self.name}")

    def _became_leader(self, version: int) -> None:
        self._version = version
        log.info("became leader of election %s", self.name)
        self._monitor = asyncio.create_task(
            self._watch_own_key(version), name=f"election-monitor-{self.name}"
        )

    async def _watch_own_key(self, version: int) -> None:
        """Notice when our leader key is deleted or overwritten behind our back."""
        try:
            async with self._store.watch(self.key) as events:
                current = await self._store.get(self.key)
                if current is None or current.version != version:
                    self._lost_leadership(version)
                    return
                async for event in events:
                    if event.version != version:
                        self._lost_leadership(version)
                        return
        except MetadataError as e:
            # The store is closing or broken; is_leader also consults session_lost.
            log.debug("election %s: leader key monitor stopped: %s", self.name, e)

    def _lost_leadership(self, version: int) -> None:
        if self._version == version:
            self._version = None
            log.warning(
                "lost leadership of election %s: leader key %s was deleted or overwritten",
                self.name,
                self.key,
            )

    async def _stop_monitor(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            await cancel_and_wait(monitor)


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has really ended.

    Python 3.11's ``asyncio.wait_for`` (used inside aetcd and grpc helpers) loses a
    cancellation that arrives as its inner future completes, so one ``cancel()`` is not
    enough: repeat it until the task is done.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())
