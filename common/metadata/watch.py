"""The object ``MetadataStore.watch()`` returns, shared by both stores.

A plain async generator cannot tell its consumer when the watch is actually registered, so a
caller could write a key and miss the event of its own write. ``WatchStream`` registers on
``async with`` (or on the first ``__anext__``), which gives callers a point after which no
event is lost: leader election relies on it ("watch, then check, then wait").
"""

from __future__ import annotations

import abc
import enum
from types import TracebackType

from magnetar.common.metadata.store import WatchEvent


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class WatchStream(abc.ABC):
    """Events of one key or prefix, in commit order.

    Use it as ``async with store.watch(key) as events: ... async for ev in events``: entering
    the block registers the watch, leaving it cancels the watch at the server. Iterating without
    the block also works (registration happens on the first ``__anext__``) but then call
    ``aclose()`` when done. Iteration ends when the store is closed.
    """

    def __init__(self, key: str, prefix: bool) -> None:
        self.key = key
        self.prefix = prefix
        self._state = _State.NEW

    @abc.abstractmethod
    async def _register(self) -> None:
        """Start receiving events at the server (or in-process)."""

    @abc.abstractmethod
    async def _receive(self) -> WatchEvent | None:
        """The next event; None when the store ended the watch."""

    @abc.abstractmethod
    async def _unregister(self) -> None:
        """Stop receiving events; must tolerate an already closed store."""

    def matches(self, key: str) -> bool:
        return key.startswith(self.key) if self.prefix else key == self.key

    async def start(self) -> WatchStream:
        """Register the watch now; events of every write that commits afterwards are seen."""
        if self._state is _State.NEW:
            await self._register()
            self._state = _State.OPEN
        return self

    async def aclose(self) -> None:
        if self._state is _State.OPEN:
            self._state = _State.CLOSED
            await self._unregister()
        self._state = _State.CLOSED

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._state is _State.CLOSED:
            raise StopAsyncIteration
        await self.start()
        event = await self._receive()
        if event is None:
            await self.aclose()
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> WatchStream:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
