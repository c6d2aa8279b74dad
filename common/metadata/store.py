"""The metadata store contract shared by every Magnetar service.

Two implementations exist: ``etcd://`` (a real etcd cluster, through aetcd) and ``local://``
(an embedded SQLite file used by standalone mode). Both pass
``tests/integration/test_metadata_contract.py``.

Keys are ``/``-separated paths such as ``/magnetar/bookies/available/127.0.0.1:3181``.
Values are bytes. Every stored key has a *version*: a positive integer that changes on every
write of that key (etcd's mod_revision; a store-wide counter in the local store), so it can be
used for compare-and-set.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

#: ``expected_version`` value meaning "the key must not exist" (create only).
NOT_EXISTS = -1


class MetadataError(Exception):
    """Base class of metadata store errors."""


class BadVersionError(MetadataError):
    """A compare-and-set failed: the key's version is not the expected one (or it exists/doesn't)."""


class NoSuchKeyError(MetadataError):
    """The key does not exist (raised by delete with an expected version)."""


class SessionLostError(MetadataError):
    """The store's session (etcd lease) is gone; ephemeral keys of it have vanished."""


class StoreClosedError(MetadataError):
    """The store was closed."""


@dataclass(slots=True, frozen=True)
class Versioned:
    value: bytes
    version: int


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(slots=True, frozen=True)
class WatchEvent:
    type: EventType
    key: str
    value: bytes | None
    version: int


class MetadataStore(abc.ABC):
    """Async key-value store with CAS, ephemeral keys, watches and leader election."""

    @abc.abstractmethod
    async def get(self, key: str) -> Versioned | None: ...

    @abc.abstractmethod
    async def put(
        self,
        key: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
    ) -> int:
        """Write ``key``; return its new version.

        ``expected_version``: None writes unconditionally, ``NOT_EXISTS`` requires the key to be
        absent, a positive int requires that exact version. A mismatch raises BadVersionError.
        ``ephemeral`` binds the key to this store's session: it vanishes when the session ends.
        """

    @abc.abstractmethod
    async def delete(self, key: str, expected_version: int | None = None) -> None:
        """Delete ``key``. Unconditional delete of a missing key is a no-op; a conditional one
        raises NoSuchKeyError (missing) or BadVersionError (version differs)."""

    @abc.abstractmethod
    async def children(self, path: str) -> list[str]:
        """Sorted names of the direct children of ``path`` (``/a`` has child ``b`` if ``/a/b``
        or ``/a/b/c`` exists)."""

    @abc.abstractmethod
    async def scan(self, prefix: str) -> dict[str, Versioned]:
        """Every key starting with ``prefix`` with its value and version."""

    @abc.abstractmethod
    def watch(self, key: str, *, prefix: bool = False) -> AsyncIterator[WatchEvent]:
        """Events for ``key`` (or every key under the prefix) from now on, in order."""

    @abc.abstractmethod
    def add_session_listener(self, callback: Callable[[], None]) -> None:
        """``callback`` runs (once) when the session is lost."""

    @property
    @abc.abstractmethod
    def session_lost(self) -> bool: ...

    @abc.abstractmethod
    def election(self, name: str) -> LeaderElection: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session (ephemeral keys vanish) and release resources."""

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LeaderElection(abc.ABC):
    """Leader election under ``/magnetar/elections/<name>``."""

    @abc.abstractmethod
    async def campaign(self, value: bytes) -> None:
        """Wait until this session is the leader; ``value`` is what observers see."""

    @abc.abstractmethod
    async def leader(self) -> bytes | None:
        """The current leader's value, or None."""

    @abc.abstractmethod
    def observe(self) -> AsyncIterator[bytes | None]:
        """The current leader's value now and at every change (None: no leader)."""

    @abc.abstractmethod
    async def resign(self) -> None:
        """Give up leadership (no-op when not the leader)."""

    @property
    @abc.abstractmethod
    def is_leader(self) -> bool: ...
