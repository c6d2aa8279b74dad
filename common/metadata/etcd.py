"""``etcd://`` metadata store on aetcd.

Mapping of the contract onto etcd:

- version = the key's ``mod_revision``; ``NOT_EXISTS`` = ``create_revision == 0``; CAS is one
  etcd transaction (compare, then put/delete, then read back the new revision).
- session = one lease of ``session_ttl`` seconds kept alive every ttl/3. The session is lost
  when etcd says the lease is gone (TTL 0 on keepalive, "lease not found" on a put) or when
  etcd stayed unreachable for a whole TTL: from then on nobody can promise our ephemeral keys
  exist, so we say so loudly (log + listeners) instead of carrying on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rtypes
import aetcd.utils

from magnetar.common.metadata.election import StoreLeaderElection, cancel_and_wait
from magnetar.common.metadata.store import (
    NOT_EXISTS,
    BadVersionError,
    EventType,
    LeaderElection,
    MetadataError,
    MetadataStore,
    NoSuchKeyError,
    SessionLostError,
    StoreClosedError,
    Versioned,
    WatchEvent,
)
from magnetar.common.metadata.watch import WatchStream

log = logging.getLogger(__name__)

T = TypeVar("T")

# Pause between keepalive attempts while etcd does not answer (shorter than ttl/3 so a short
# outage does not eat the whole TTL).
_KEEPALIVE_RETRY_SECONDS = 0.5


@dataclass(slots=True, frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class EtcdMetadataStore(MetadataStore):
    """Metadata store on an etcd cluster; open it with :meth:`connect`."""

    def __init__(
        self,
        client: aetcd.Client,
        endpoint: Endpoint,
        lease_id: int,
        session_ttl: int,
        request_timeout: float,
    ) -> None:
        self._client = client
        self.endpoint = endpoint
        self._lease_id = lease_id
        self._ttl = session_ttl
        self._request_timeout = request_timeout
        self._listeners: list[Callable[[], None]] = []
        self._lost = False
        self._closed = False
        self._keepalive_task = asyncio.create_task(
            self._keepalive(), name=f"etcd-lease-keepalive-{lease_id:x}"
        )

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[tuple[str, int]],
        *,
        session_ttl: int = 10,
        request_timeout: float = 10.0,
    ) -> EtcdMetadataStore:
        """Connect to the first endpoint that answers and open a session (lease) there."""
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        errors: list[str] = []
        for host, port in endpoints:
            endpoint = Endpoint(host, port)
            client = aetcd.Client(endpoint.host, endpoint.port, timeout=request_timeout)
            try:
                # Granting the lease is the first RPC: it proves the endpoint answers.
                lease = await asyncio.wait_for(client.lease(session_ttl), request_timeout)
            except (aetcd.exceptions.ClientError, TimeoutError) as e:
                errors.append(f"{endpoint}: {_describe(e)}")
                await client.close()
                continue
            log.info(
                "metadata session opened on etcd %s (lease %x, ttl %ss)",
                endpoint,
                lease.id,
                lease.ttl,
            )
            return cls(client, endpoint, lease.id, session_ttl, request_timeout)
        raise MetadataError(
            "cannot reach any etcd endpoint (" + "; ".join(errors) + "); check that etcd is "
            "running and the metadata URL lists the right host:port pairs"
        )

    # -- reads ---------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned | None:
        result = await self._call(key, self._client.get(_bytes(key)))
        if result is None:
            return None
        return Versioned(result.value, result.mod_revision)

    async def scan(self, prefix: str) -> dict[str, Versioned]:
        result = await self._call(prefix, self._range(prefix, keys_only=False))
        return {kv.key.decode(): Versioned(kv.value, kv.mod_revision) for kv in result}

    async def children(self, path: str) -> list[str]:
        parent = path.rstrip("/") + "/"
        result = await self._call(path, self._range(parent, keys_only=True))
        names = {kv.key.decode()[len(parent) :].split("/", 1)[0] for kv in result}
        names.discard("")
        return sorted(names)

    def _range(self, prefix: str, *, keys_only: bool) -> Awaitable[aetcd.rtypes.GetRange]:
        if prefix:
            return self._client.get_prefix(_bytes(prefix), keys_only=keys_only)
        # An empty prefix has no range end; b"\0"..b"\0" is etcd's "every key".
        return self._client.get_all(keys_only=keys_only)

    # -- writes --------------------------------------------------------------------------

    async def put(
        self,
        key: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
    ) -> int:
        self._check_open()
        if ephemeral and self._lost:
            raise SessionLostError(
                f"cannot put ephemeral key {key}: the etcd session (lease {self._lease_id:x}) "
                "was lost"
            )
        k = _bytes(key)
        tx = self._client.transactions
        lease = self._lease_id if ephemeral else None
        ok, responses = await self._call(
            key,
            self._client.transaction(
                compare=_compare(tx, k, expected_version),
                success=[tx.put(k, value, lease=lease), tx.get(k)],
                failure=[tx.get(k)],
            ),
        )
        if not ok:
            raise BadVersionError(_mismatch(key, expected_version, _read_back(responses[0])))
        written = _read_back(responses[1])
        assert written is not None  # read in the same transaction as the put
        return written.mod_revision

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        self._check_open()
        k = _bytes(key)
        if expected_version is None:
            await self._call(key, self._client.delete(k))
            return
        if expected_version <= 0:
            raise ValueError(f"delete of {key}: expected_version must be positive or None")
        tx = self._client.transactions
        ok, responses = await self._call(
            key,
            self._client.transaction(
                compare=[tx.mod(k) == expected_version],
                success=[tx.delete(k)],
                failure=[tx.get(k)],
            ),
        )
        if ok:
            return
        current = _read_back(responses[0])
        if current is None:
            raise NoSuchKeyError(f"cannot delete {key} at version {expected_version}: no such key")
        raise BadVersionError(_mismatch(key, expected_version, current))

    # -- watches, sessions, elections ----------------------------------------------------

    def watch(self, key: str, *, prefix: bool = False) -> WatchStream:
        self._check_open()
        return _EtcdWatch(self, key, prefix)

    def add_session_listener(self, callback: Callable[[], None]) -> None:
        if self._lost:
            # Joined late: still tell it, or it would wait for an event that already happened.
            asyncio.get_running_loop().call_soon(self._notify_listener, callback)
            return
        self._listeners.append(callback)

    @property
    def session_lost(self) -> bool:
        return self._lost or self._closed

    def election(self, name: str) -> LeaderElection:
        return StoreLeaderElection(self, name)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._keepalive_task)
        if not self._lost:
            try:
                # Revoking makes our ephemeral keys vanish now instead of after the TTL.
                await asyncio.wait_for(
                    self._client.revoke_lease(self._lease_id), self._request_timeout
                )
            except (aetcd.exceptions.ClientError, TimeoutError) as e:
                log.warning(
                    "could not revoke etcd lease %x on close (%s); its ephemeral keys vanish "
                    "within %ss",
                    self._lease_id,
                    _describe(e),
                    self._ttl,
                )
        await self._client.close()
        log.info("metadata session on etcd %s closed (lease %x)", self.endpoint, self._lease_id)

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the etcd metadata store is closed")

    async def _call(self, what: str, request: Awaitable[T]) -> T:
        """Run one etcd request, translating aetcd errors into MetadataError subclasses."""
        if self._closed:
            _close_unawaited(request)
            raise StoreClosedError("the etcd metadata store is closed")
        try:
            return await request
        except aetcd.exceptions.ClientError as e:
            if "lease not found" in str(e):
                self._lose_session(f"etcd no longer knows lease {self._lease_id:x}")
                raise SessionLostError(
                    f"{what}: the etcd session (lease {self._lease_id:x}) was lost"
                ) from e
            raise MetadataError(f"{what}: etcd {self.endpoint} failed: {_describe(e)}") from e

    async def _keepalive(self) -> None:
        """Refresh the lease every ttl/3 until it is gone or etcd was silent for a whole TTL."""
        last_ok = time.monotonic()
        failing = False  # inside an outage: retry faster, warn only once
        while True:
            await asyncio.sleep(_KEEPALIVE_RETRY_SECONDS if failing else self._ttl / 3)
            if self._closed:
                return
            try:
                reply = await asyncio.wait_for(
                    self._client.refresh_lease(self._lease_id), self._ttl / 3
                )
            except (aetcd.exceptions.ClientError, TimeoutError) as e:
                if self._closed:
                    return
                silent = time.monotonic() - last_ok
                if silent >= self._ttl:
                    self._lose_session(
                        f"etcd {self.endpoint} did not answer keepalives for {silent:.1f}s "
                        f"(ttl {self._ttl}s, last error: {_describe(e)})"
                    )
                    return
                if not failing:
                    log.warning(
                        "etcd lease %x keepalive failed (%s); retrying for up to %ss",
                        self._lease_id,
                        _describe(e),
                        self._ttl,
                    )
                failing = True
                continue
            if self._closed:
                return
            if reply is None or reply.TTL <= 0:
                self._lose_session(f"etcd says lease {self._lease_id:x} expired")
                return
            if failing:
                log.info("etcd lease %x keepalive works again", self._lease_id)
            failing = False
            last_ok = time.monotonic()

    def _lose_session(self, reason: str) -> None:
        if self._lost or self._closed:
            return
        self._lost = True
        log.error(
            "metadata session LOST: %s; the ephemeral keys of this session are gone and "
            "ephemeral puts will fail until the store is reopened",
            reason,
        )
        listeners, self._listeners = self._listeners, []
        for callback in listeners:
            self._notify_listener(callback)

    @staticmethod
    def _notify_listener(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("metadata session listener %r failed", callback)


class _EtcdWatch(WatchStream):
    def __init__(self, store: EtcdMetadataStore, key: str, prefix: bool) -> None:
        super().__init__(key, prefix)
        self._store = store
        self._watch: aetcd.rtypes.Watch | None = None
        self._events: Any = None

    async def _register(self) -> None:
        client = self._store._client
        k = _bytes(self.key)
        request = client.watch_prefix(k) if self.prefix else client.watch(k)
        registration = asyncio.ensure_future(self._store._call(self.key, request))
        try:
            # Shielded: aetcd hands the server's answer to a create whose caller was
            # cancelled half-way to the *next* watch created on the client (wrong key), and
            # its wait_for can swallow our cancellation. Let it finish, then cancel it.
            self._watch = await asyncio.shield(registration)
        except asyncio.CancelledError:
            registration.add_done_callback(_cancel_orphan_watch)
            raise
        self._events = aiter(self._watch)

    async def _receive(self) -> WatchEvent | None:
        try:
            event = await anext(self._events, None)
        except aetcd.exceptions.ClientError as e:
            raise MetadataError(f"watch on {self.key} broke: {_describe(e)}") from e
        if event is None:
            return None
        kv = event.kv
        if event.kind == aetcd.rtypes.EventKind.PUT:
            return WatchEvent(EventType.PUT, kv.key.decode(), kv.value, kv.mod_revision)
        # A DELETE's mod_revision is the revision of the deletion.
        return WatchEvent(EventType.DELETE, kv.key.decode(), None, kv.mod_revision)

    async def _unregister(self) -> None:
        if self._watch is None or self._store._closed:
            return  # closing the client already ended every watch
        await _cancel_quietly(self._watch)


# Strong references to cleanup tasks, so they are not garbage-collected mid-flight.
_cleanups: set[asyncio.Task[None]] = set()


def _cancel_orphan_watch(registration: asyncio.Future[aetcd.rtypes.Watch]) -> None:
    if registration.cancelled() or registration.exception() is not None:
        return
    task = asyncio.ensure_future(_cancel_quietly(registration.result()))
    _cleanups.add(task)
    task.add_done_callback(_cleanups.discard)


async def _cancel_quietly(watch: aetcd.rtypes.Watch) -> None:
    try:
        await watch.cancel()
    except Exception as e:  # the client may be closed or its stream broken: nothing to cancel
        log.debug("cancelling an orphaned etcd watch: %s", e)


def _bytes(key: str) -> bytes:
    if not key:
        raise ValueError("metadata keys must be non-empty")
    return key.encode()


def _compare(tx: Any, key: bytes, expected_version: int | None) -> list[Any]:
    if expected_version is None:
        return []
    if expected_version == NOT_EXISTS:
        return [tx.create(key) == 0]
    if expected_version <= 0:
        raise ValueError(
            f"expected_version must be positive, NOT_EXISTS or None, not {expected_version}"
        )
    return [tx.mod(key) == expected_version]


def _read_back(range_response: list[tuple[bytes, aetcd.rtypes.Get]]) -> aetcd.rtypes.Get | None:
    """The key read by a ``tx.get`` inside a transaction (None: it does not exist)."""
    return range_response[0][1] if range_response else None


def _mismatch(key: str, expected: int | None, current: aetcd.rtypes.Get | None) -> str:
    actual = "it does not exist" if current is None else f"it is at version {current.mod_revision}"
    wanted = "to not exist" if expected == NOT_EXISTS else f"at version {expected}"
    return f"{key}: expected {wanted} but {actual}"


def _describe(e: BaseException) -> str:
    return str(e) or type(e).__name__


def _close_unawaited(request: Awaitable[Any]) -> None:
    # Avoid "coroutine was never awaited" warnings for requests refused before sending.
    close = getattr(request, "close", None)
    if close is not None:
        close()
