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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

#: ``expected_version`` value meaning "the key must not exist" (create only).
NOT_EXISTS = -1


class MetadataError(Exception):
    """Base class of metadata store errors."""


class BadVersionError(MetadataError):
    """A compare-and-set failed: the key's version is not the expected one (or it exists/doesn't).

    ``key`` names the key whose condition failed when the store knows it (None otherwise).
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class NoSuchKeyError(MetadataError):
    """The key does not exist (raised by delete with an expected version)."""


class SessionLostError(MetadataError):
    """The store's session (etcd lease) is gone; ephemeral keys of it have vanished."""


class StoreClosedError(MetadataError):
    """The store was closed."""


class MetadataDamagedError(MetadataError):
    """The store's files are damaged (not a format the store can read); the message names the
    file and the way forward."""


class OutcomeUnknownError(MetadataError):
    """A write was sent but its answer was lost (the etcd member failed mid-request): it may or
    may not have been applied. Read the keys back before deciding to retry."""


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


@dataclass(slots=True, frozen=True)
class Expect:
    """Transaction condition: ``key`` is at ``version`` (positive), or absent (``NOT_EXISTS``)."""

    key: str
    version: int


@dataclass(slots=True, frozen=True)
class Put:
    """Transaction operation: write ``value`` to ``key`` (bound to the session if ephemeral)."""

    key: str
    value: bytes
    ephemeral: bool = False


@dataclass(slots=True, frozen=True)
class Delete:
    """Transaction operation: delete ``key`` (a no-op when it does not exist)."""

    key: str


Operation = Put | Delete


def check_transaction(conditions: Sequence[Expect], operations: Sequence[Operation]) -> None:
    """Refuse malformed transactions the same way in every store (ValueError)."""
    for condition in conditions:
        if not condition.key:
            raise ValueError("metadata keys must be non-empty")
        if condition.version != NOT_EXISTS and condition.version <= 0:
            raise ValueError(
                f"transaction condition on {condition.key}: version must be positive or "
                f"NOT_EXISTS, not {condition.version}"
            )
    seen: set[str] = set()
    for operation in operations:
        if not isinstance(operation, Put | Delete):
            raise TypeError(f"transaction operations are Put or Delete, not {operation!r}")
        if not operation.key:
            raise ValueError("metadata keys must be non-empty")
        if operation.key in seen:
            # etcd refuses it too: the outcome of two writes of one key in one step is undefined.
            raise ValueError(f"transaction writes {operation.key} more than once")
        seen.add(operation.key)


def condition_failure(condition: Expect, current: Versioned | None) -> BadVersionError | None:
    """The error for ``condition`` given the key's ``current`` state (None: it holds)."""
    if condition.version == NOT_EXISTS:
        if current is None:
            return None
        actual = f"it is at version {current.version}"
        wanted = "to not exist"
    else:
        if current is not None and current.version == condition.version:
            return None
        actual = "it does not exist" if current is None else f"it is at version {current.version}"
        wanted = f"at version {condition.version}"
    return BadVersionError(
        f"transaction not applied: {condition.key}: expected {wanted} but {actual}",
        key=condition.key,
    )


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
    async def transaction(
        self, conditions: Sequence[Expect], operations: Sequence[Operation]
    ) -> int:
        """Apply every operation if every condition holds, atomically; return the revision.

        All or nothing: if one condition fails, nothing is applied and BadVersionError is
        raised, its ``key`` naming the (first) failing condition's key. Every key the
        transaction puts gets the returned revision as its version; watchers see the changes
        in the order of ``operations``, all at that revision. An operation key may appear
        once. ``Put(..., ephemeral=True)`` binds the key to this store's session, as ``put``
        does. Example (bundle split): ``transaction([Expect(a, v), Expect(b, NOT_EXISTS)],
        [Delete(a), Put(b, ...)])``.
        """

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

    @property
    def session_valid_until(self) -> float:
        """``time.monotonic()`` before which the session surely still holds its ephemeral keys
        (the last keepalive's send time plus the TTL). Past it, another process may already own
        what this session held, even before ``session_lost`` says so. Sessions that cannot
        expire while the process runs (the local store) never end."""
        return float("inf")

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
