"""``etcd://`` metadata store on aetcd.

Mapping of the contract onto etcd:

- version = the key's ``mod_revision``; ``NOT_EXISTS`` = ``create_revision == 0``; CAS is one
  etcd transaction (compare, then put/delete, then read back the new revision). A multi-key
  transaction is one etcd Txn too: compares on ``mod_revision``/``create_revision``, then the
  puts and deletes, all at one revision; on failure the compared keys are read back in the
  same Txn to say which condition failed.
- session = one lease of ``session_ttl`` seconds kept alive every ttl/3. The session is lost
  when etcd says the lease is gone (TTL 0 on keepalive, "lease not found" on a put) or when
  no etcd member answered keepalives for a whole TTL: from then on nobody can promise our
  ephemeral keys exist, so we say so loudly (log + listeners) instead of carrying on.
- endpoints: aetcd talks to one host:port, so the store keeps the URL's list itself and talks
  to one member at a time. When that member fails (connection refused or reset, timeout), the
  store moves to the next member that answers a linearizable read, the way etcd's own client
  balances. The lease belongs to the cluster, not the member, so the session survives the
  move as long as some keepalive lands within the TTL. After a move:
  - reads, watch registrations and keepalives are retried on the new member;
  - writes are retried only if the failed attempt never reached a member (the connection was
    refused), the rule of etcd's clientv3 ``isSafeRetryMutableRPC``. A write whose answer was
    lost in flight raises OutcomeUnknownError: it may or may not have been applied, and
    retrying a compare-and-set blindly could report a conflict with itself;
  - watches re-register on the new member from the revision after the last event delivered
    (every watch starts at a known revision), so no event is lost or repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.rtypes
import aetcd.utils
import aetcd.watcher
import grpc

from magnetar.common.grpc_tls import GrpcClientTls
from magnetar.common.metadata.election import StoreLeaderElection, cancel_and_wait
from magnetar.common.metadata.store import (
    NOT_EXISTS,
    BadVersionError,
    EventType,
    Expect,
    LeaderElection,
    MetadataError,
    MetadataStore,
    NoSuchKeyError,
    Operation,
    OutcomeUnknownError,
    Put,
    SessionLostError,
    StoreClosedError,
    Versioned,
    WatchEvent,
    check_transaction,
    condition_failure,
)
from magnetar.common.metadata.watch import WatchStream

log = logging.getLogger(__name__)

T = TypeVar("T")

# Pause between keepalive attempts while etcd does not answer (shorter than ttl/3 so a short
# outage does not eat the whole TTL).
_KEEPALIVE_RETRY_SECONDS = 0.5
_FAILOVER_PASS_PAUSE_SECONDS = 0.2  # between passes over the members while none answers

# gRPC channel options of every member connection.
_CHANNEL_OPTIONS = {
    # gRPC shares one subchannel per address across channels by default, with its reconnect
    # backoff: a fresh client to a restarted member would inherit "failed, retry in 20 s".
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 2000,
}

# Error texts of gRPC/etcd meaning the request never reached a member (safe to resend).
_NOT_SENT = ("failed to connect to all addresses", "Connection refused", "DNS resolution failed")


@dataclass(slots=True, frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class EtcdTlsConfigError(ValueError):
    """A TLS file for etcd cannot be used; the message names the file."""


@dataclass(slots=True, frozen=True)
class EtcdTls(GrpcClientTls):
    """TLS to etcd (etcd's client ``--cacert``, ``--cert``, ``--key``).

    - ``trust_certs_file``: PEM CA certificates the members' certificates must chain to (empty:
      gRPC's bundled public roots).
    - ``certificate_file`` / ``key_file``: a PEM client certificate and its unencrypted key, for
      members started with ``--client-cert-auth``; both or neither.

    Hostname verification is gRPC's and always on: a member's certificate must name the host the
    metadata URL gives for it (DNS name or IP address in its subjectAltName).
    """

    PEER = "etcd"
    ERROR = EtcdTlsConfigError


class _TlsClient(aetcd.Client):
    """aetcd's client on a TLS channel: its ``connect`` with ``secure_channel`` in place of
    ``insecure_channel`` (aetcd 1.0 takes no credentials; user/password auth is not used here)."""

    def __init__(self, *args: Any, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            self.channel = aetcd.rpc.secure_channel(
                f"{self._host}:{self._port}", self._credentials, options=self._options.items()
            )
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def _new_client(
    endpoint: Endpoint,
    request_timeout: float,
    credentials: grpc.ChannelCredentials | None = None,
) -> aetcd.Client:
    if credentials is not None:
        return _TlsClient(
            endpoint.host,
            endpoint.port,
            timeout=request_timeout,
            options=dict(_CHANNEL_OPTIONS),
            credentials=credentials,
        )
    return aetcd.Client(
        endpoint.host, endpoint.port, timeout=request_timeout, options=dict(_CHANNEL_OPTIONS)
    )


async def _revision(client: aetcd.Client) -> int:
    """The cluster's current revision, by a linearizable read of an (empty) key range: it
    also proves the member is part of a quorum, not just alive."""
    result = await client.get_range(b"\0", b"\0\0")
    return result.header.revision


class EtcdMetadataStore(MetadataStore):
    """Metadata store on an etcd cluster; open it with :meth:`connect`."""

    def __init__(
        self,
        client: aetcd.Client,
        endpoints: Sequence[Endpoint],
        index: int,
        lease_id: int,
        session_ttl: int,
        request_timeout: float,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._client = client
        self._credentials = credentials  # TLS to every member, or None
        self._endpoints = list(endpoints)
        self._index = index  # of the member self._client talks to
        self._failover_lock = asyncio.Lock()
        self._lease_id = lease_id
        self._ttl = session_ttl
        self._request_timeout = request_timeout
        # Per keepalive attempt and per failover probe. A member that hangs (paused, cut off)
        # costs one keepalive interval (ttl/3) plus this before the move, plus this again per
        # member probed: ttl/6 leaves a keepalive on the next member well inside the TTL.
        self._probe_timeout = min(request_timeout, max(session_ttl / 6, 0.5))
        self._listeners: list[Callable[[], None]] = []
        self._lost = False
        self._closed = False
        # The lease was granted just before this store was built: valid for a TTL from then.
        self._valid_until = time.monotonic() + session_ttl
        self._keepalive_task = asyncio.create_task(
            self._keepalive(), name=f"etcd-lease-keepalive-{lease_id:x}"
        )
        self._keepalive_task.add_done_callback(self._keepalive_ended)

    @property
    def endpoint(self) -> Endpoint:
        """The member this store talks to now."""
        return self._endpoints[self._index]

    @property
    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[tuple[str, int]],
        *,
        session_ttl: int = 10,
        request_timeout: float = 10.0,
        tls: EtcdTls | None = None,
    ) -> EtcdMetadataStore:
        """Connect to the first endpoint that answers and open a session (lease) there; with
        ``tls``, over TLS to every member."""
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        credentials = None if tls is None else tls.channel_credentials()
        members = [Endpoint(host, port) for host, port in endpoints]
        errors: list[str] = []
        for index, endpoint in enumerate(members):
            client = _new_client(endpoint, request_timeout, credentials)
            try:
                # Granting the lease is the first RPC: it proves the endpoint answers.
                lease = await asyncio.wait_for(client.lease(session_ttl), request_timeout)
            except (aetcd.exceptions.ClientError, TimeoutError) as e:
                errors.append(f"{endpoint}: {_describe(e)}")
                await client.close()
                continue
            log.info(
                "metadata session opened on etcd %s (lease %x, ttl %ss, members %s)",
                endpoint,
                lease.id,
                lease.ttl,
                ",".join(map(str, members)),
            )
            return cls(client, members, index, lease.id, session_ttl, request_timeout, credentials)
        hint = (
            "check that etcd is running and the metadata URL lists the right host:port pairs"
            if tls is None
            else "check that etcd is running, serves TLS, and its certificate chains to "
            "etcd_tls_trust_certs_file_path and names the host given in the metadata URL"
        )
        over = "" if tls is None else " over TLS"
        raise MetadataError(
            f"cannot reach any etcd endpoint{over} (" + "; ".join(errors) + f"); {hint}"
        )

    # -- reads ---------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned | None:
        k = _bytes(key)
        result = await self._call(key, lambda c: c.get(k), idempotent=True)
        if result is None:
            return None
        return Versioned(result.value, result.mod_revision)

    async def scan(self, prefix: str) -> dict[str, Versioned]:
        result = await self._call(
            prefix, lambda c: _range(c, prefix, keys_only=False), idempotent=True
        )
        return {kv.key.decode(): Versioned(kv.value, kv.mod_revision) for kv in result}

    async def children(self, path: str) -> list[str]:
        parent = path.rstrip("/") + "/"
        result = await self._call(
            path, lambda c: _range(c, parent, keys_only=True), idempotent=True
        )
        names = {kv.key.decode()[len(parent) :].split("/", 1)[0] for kv in result}
        names.discard("")
        return sorted(names)

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
        if ephemeral:
            self._check_session(key)
        k = _bytes(key)
        lease = self._lease_id if ephemeral else None
        compare = _compare(key, expected_version)

        def request(client: aetcd.Client) -> Awaitable[Any]:
            tx = client.transactions
            return client.transaction(
                compare=[c(tx) for c in compare],
                success=[tx.put(k, value, lease=lease), tx.get(k)],
                failure=[tx.get(k)],
            )

        ok, responses = await self._call(key, request, idempotent=False)
        if not ok:
            raise BadVersionError(
                _mismatch(key, expected_version, _read_back(responses[0])), key=key
            )
        written = _read_back(responses[1])
        assert written is not None  # read in the same transaction as the put
        return written.mod_revision

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        self._check_open()
        k = _bytes(key)
        if expected_version is None:
            await self._call(key, lambda c: c.delete(k), idempotent=False)
            return
        if expected_version <= 0:
            raise ValueError(f"delete of {key}: expected_version must be positive or None")

        def request(client: aetcd.Client) -> Awaitable[Any]:
            tx = client.transactions
            return client.transaction(
                compare=[tx.mod(k) == expected_version],
                success=[tx.delete(k)],
                failure=[tx.get(k)],
            )

        ok, responses = await self._call(key, request, idempotent=False)
        if ok:
            return
        current = _read_back(responses[0])
        if current is None:
            raise NoSuchKeyError(f"cannot delete {key} at version {expected_version}: no such key")
        raise BadVersionError(_mismatch(key, expected_version, current), key=key)

    async def transaction(
        self, conditions: Sequence[Expect], operations: Sequence[Operation]
    ) -> int:
        self._check_open()
        check_transaction(conditions, operations)
        what = "transaction on " + ", ".join(
            dict.fromkeys([c.key for c in conditions] + [o.key for o in operations])
        )
        if any(isinstance(o, Put) and o.ephemeral for o in operations):
            self._check_session(what)
        conditions, operations = list(conditions), list(operations)

        def request(client: aetcd.Client) -> Awaitable[Any]:
            tx = client.transactions
            compare = [
                tx.create(_bytes(c.key)) == 0
                if c.version == NOT_EXISTS
                else tx.mod(_bytes(c.key)) == c.version
                for c in conditions
            ]
            success = [
                tx.put(_bytes(o.key), o.value, lease=self._lease_id if o.ephemeral else None)
                if isinstance(o, Put)
                else tx.delete(_bytes(o.key))
                for o in operations
            ]
            failure = [tx.get(_bytes(c.key)) for c in conditions]
            return client.transaction(compare=compare, success=success, failure=failure)

        ok, responses = await self._call(what, request, idempotent=False)
        if not ok:
            for condition, response in zip(conditions, responses, strict=True):
                current = _read_back(response)
                failure = condition_failure(
                    condition,
                    None if current is None else Versioned(current.value, current.mod_revision),
                )
                if failure is not None:
                    raise failure
            # Every condition holds on the read-back: a concurrent write changed a key between
            # the compare and the read; still nothing was applied.
            raise BadVersionError(f"{what}: not applied, a condition failed (keys changed since)")
        if not responses:
            return await self._call(what, _revision, idempotent=True)
        first = responses[0]
        return getattr(first, first.WhichOneof("response")).header.revision

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

    @property
    def session_valid_until(self) -> float:
        return -1.0 if self._lost or self._closed else self._valid_until

    def election(self, name: str) -> LeaderElection:
        return StoreLeaderElection(self, name)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._keepalive_task)
        async with self._failover_lock:  # no member switch half-done under our feet
            pass
        if not self._lost:
            try:
                # Revoking makes our ephemeral keys vanish now instead of after the TTL.
                await _bounded(self._client.revoke_lease(self._lease_id), self._request_timeout)
            except (aetcd.exceptions.ClientError, TimeoutError) as e:
                log.warning(
                    "could not revoke etcd lease %x on close (%s); its ephemeral keys vanish "
                    "within %ss",
                    self._lease_id,
                    _describe(e),
                    self._ttl,
                )
        await _close_client(self._client)
        log.info("metadata session on etcd %s closed (lease %x)", self.endpoint, self._lease_id)

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the etcd metadata store is closed")

    def _check_session(self, what: str) -> None:
        if self._lost:
            raise SessionLostError(
                f"cannot put ephemeral key(s) of {what}: the etcd session "
                f"(lease {self._lease_id:x}) was lost"
            )

    async def _call(
        self,
        what: str,
        request: Callable[[aetcd.Client], Awaitable[T]],
        *,
        idempotent: bool,
        timeout: float | None = None,
    ) -> T:
        """Run one etcd request on the current member, moving to another member when it
        fails (see the module docstring for which requests are resent), and translate aetcd
        errors into MetadataError subclasses."""
        self._check_open()
        failures: list[str] = []
        while True:
            client, endpoint = self._client, self.endpoint
            try:
                return await _bounded(request(client), timeout or self._request_timeout)
            except (aetcd.exceptions.ClientError, TimeoutError) as e:
                if self._closed:
                    raise StoreClosedError("the etcd metadata store is closed") from e
                if "lease not found" in str(e):
                    self._lose_session(f"etcd no longer knows lease {self._lease_id:x}")
                    raise SessionLostError(
                        f"{what}: the etcd session (lease {self._lease_id:x}) was lost"
                    ) from e
                if not _member_failed(e) and client is self._client:
                    raise MetadataError(f"{what}: etcd {endpoint} failed: {_describe(e)}") from e
                if not idempotent and not _never_sent(e):
                    # Move on now, so the caller's read-back goes to a member that answers.
                    with contextlib.suppress(MetadataError):
                        await self._failover(client, _describe(e))
                    raise OutcomeUnknownError(
                        f"{what}: etcd {endpoint} failed while the write was in flight "
                        f"({_describe(e)}); it may or may not have been applied: read the "
                        "key(s) back before retrying"
                    ) from e
                failures.append(f"{endpoint}: {_describe(e)}")
                if len(failures) > len(self._endpoints):
                    raise MetadataError(
                        f"{what}: no etcd member answers ({'; '.join(failures)}); check that "
                        "a quorum of the cluster is up"
                    ) from e
                await self._failover(client, _describe(e))

    async def _failover(self, failed: aetcd.Client, reason: str) -> None:
        """Move from the member of ``failed`` to the next one that answers (a no-op if another
        task already moved). Raises MetadataError when no member answers."""
        async with self._failover_lock:
            if self._client is not failed or self._closed:
                return
            old = self.endpoint
            # A killed leader leaves the others without a quorum until they elect a new one
            # (etcd's election timeout, a second or more on a loaded machine): keep probing
            # for up to one session TTL, past which the session is lost anyway.
            deadline = time.monotonic() + self._ttl
            while True:
                found, errors = await self._probe_members()
                if found is not None or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(_FAILOVER_PASS_PAUSE_SECONDS)
            if found is not None:
                client, index = found
                endpoint = self._endpoints[index]
                self._client, self._index = client, index
                log.warning(
                    "etcd %s failed (%s); metadata session (lease %x) %s etcd %s",
                    old,
                    reason,
                    self._lease_id,
                    "reconnected to" if endpoint == old else "moved to",
                    endpoint,
                )
                # Ends the watches on it; they re-register on the new member.
                await _close_client(failed)
                return
            raise MetadataError(
                f"etcd {old} failed ({reason}) and no other member answered within "
                f"{self._ttl}s ({'; '.join(errors)}); check that a quorum of the cluster is up"
            )

    async def _probe_members(self) -> tuple[tuple[aetcd.Client, int] | None, list[str]]:
        """One pass over the members: the others in URL order after the current one, then
        the current one last (it may be back, or be the only one). Returns the first that
        answers a linearizable read (client, index), and what the others said."""
        errors: list[str] = []
        for step in range(1, len(self._endpoints) + 1):
            index = (self._index + step) % len(self._endpoints)
            endpoint = self._endpoints[index]
            client = _new_client(endpoint, self._request_timeout, self._credentials)
            try:
                await _bounded(_revision(client), self._probe_timeout)
            except (aetcd.exceptions.ClientError, TimeoutError) as e:
                errors.append(f"{endpoint}: {_describe(e)}")
                await _close_client(client)
                continue
            return (client, index), errors
        return None, errors

    async def _keepalive(self) -> None:
        """Refresh the lease every ttl/3 until it is gone or etcd was silent for a whole TTL."""
        last_ok = time.monotonic()
        failing = False  # inside an outage: retry faster, warn only once
        while True:
            await asyncio.sleep(_KEEPALIVE_RETRY_SECONDS if failing else self._ttl / 3)
            if self._closed:
                return
            sent = time.monotonic()
            try:
                reply = await self._call(
                    "lease keepalive",
                    lambda c: c.refresh_lease(self._lease_id),
                    idempotent=True,
                    timeout=self._probe_timeout,
                )
            except SessionLostError:
                return
            except MetadataError as e:
                if self._closed:
                    return
                silent = time.monotonic() - last_ok
                if silent >= self._ttl:
                    self._lose_session(
                        f"no etcd member answered keepalives for {silent:.1f}s "
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
            # etcd renews the lease when the keepalive arrives, which is after it was sent.
            self._valid_until = sent + reply.TTL

    def _keepalive_ended(self, task: asyncio.Task[None]) -> None:
        # Without keepalives the lease runs out silently: a keepalive loop that died of a bug
        # must be as loud as a lost session, because in a TTL it is one.
        if self._closed or self._lost:
            return
        failure = "was cancelled" if task.cancelled() else f"failed: {task.exception()!r}"
        log.error("etcd lease %x keepalive loop %s", self._lease_id, failure)
        self._lose_session(f"the keepalive loop {failure}")

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
    """A watch that survives member failover: it starts at a known revision and, when its
    member's stream breaks, re-registers on the store's current member from the revision
    after the last event it delivered."""

    def __init__(self, store: EtcdMetadataStore, key: str, prefix: bool) -> None:
        super().__init__(key, prefix)
        self._store = store
        self._client: aetcd.Client | None = None  # the member connection the watch lives on
        self._watch: aetcd.rtypes.Watch | None = None
        self._events: Any = None
        self._next_revision: int | None = None

    async def _register(self) -> None:
        store = self._store
        if self._next_revision is None:
            # "From now on" made explicit, so a re-registration can resume at the same point.
            self._next_revision = await store._call(self.key, _revision, idempotent=True) + 1
        k = _bytes(self.key)
        start = self._next_revision

        async def request(client: aetcd.Client) -> tuple[aetcd.Client, aetcd.rtypes.Watch]:
            if self.prefix:
                return client, await client.watch_prefix(k, start_revision=start)
            return client, await client.watch(k, start_revision=start)

        registration = asyncio.ensure_future(store._call(self.key, request, idempotent=True))
        try:
            # Shielded: aetcd hands the server's answer to a create whose caller was
            # cancelled half-way to the *next* watch created on the client (wrong key), and
            # its wait_for can swallow our cancellation. Let it finish, then cancel it.
            self._client, self._watch = await asyncio.shield(registration)
        except asyncio.CancelledError:
            registration.add_done_callback(_cancel_orphan_watch)
            raise
        self._events = aiter(self._watch)

    async def _receive(self) -> WatchEvent | None:
        while True:
            try:
                event = await anext(self._events, None)
            except aetcd.exceptions.ClientError as e:
                if self._store._closed:
                    return None
                if not _member_failed(e) and self._client is self._store._client:
                    raise MetadataError(f"watch on {self.key} broke: {_describe(e)}") from e
                await self._resume(_describe(e))
                continue
            if event is None:
                if self._store._closed:
                    return None
                # Our member connection was closed by a failover: continue on the new one.
                await self._resume("member connection closed")
                continue
            kv = event.kv
            self._next_revision = kv.mod_revision + 1
            if event.kind == aetcd.rtypes.EventKind.PUT:
                return WatchEvent(EventType.PUT, kv.key.decode(), kv.value, kv.mod_revision)
            # A DELETE's mod_revision is the revision of the deletion.
            return WatchEvent(EventType.DELETE, kv.key.decode(), None, kv.mod_revision)

    async def _resume(self, reason: str) -> None:
        assert self._client is not None
        if self._client is self._store._client:
            await self._store._failover(self._client, f"watch on {self.key}: {reason}")
        log.info(
            "watch on %s resumes on etcd %s from revision %s",
            self.key,
            self._store.endpoint,
            self._next_revision,
        )
        await self._register()

    async def _unregister(self) -> None:
        if self._watch is None or self._store._closed or self._client is not self._store._client:
            return  # closing the client already ended every watch
        await _cancel_quietly(self._watch)


# Requests abandoned after their timeout whose cancellation has not finished yet.
_abandoned: set[asyncio.Task[Any]] = set()


async def _bounded(request: Awaitable[T], timeout: float) -> T:
    """``request`` or TimeoutError after ``timeout`` seconds, without waiting for the request's
    cancellation to finish: a gRPC stream to a paused member (LeaseKeepAlive) can take forever
    to cancel, and ``asyncio.wait_for`` would wait for it, stalling keepalives past the TTL."""
    task = asyncio.ensure_future(request)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        if task.cancelled():
            # Not us: gRPC cancels the RPCs of a channel that is closed (a failover retired
            # the member connection), and that must not cancel the caller.
            raise aetcd.exceptions.ConnectionFailedError(
                "the request was cancelled: its member connection was closed"
            )
        return task.result()
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_forget_abandoned)
    raise TimeoutError(f"no answer within {timeout:g}s")


def _forget_abandoned(task: asyncio.Task[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned etcd request ended with %s", task.exception())


async def _close_client(client: aetcd.Client) -> None:
    try:
        await asyncio.wait_for(client.close(), 5)
    except Exception as e:  # a dead member's channel: nothing left to release cleanly
        log.debug("closing an etcd member connection: %s", e)


def _range(client: aetcd.Client, prefix: str, *, keys_only: bool) -> Awaitable[Any]:
    if prefix:
        return client.get_prefix(_bytes(prefix), keys_only=keys_only)
    # An empty prefix has no range end; b"\0"..b"\0" is etcd's "every key".
    return client.get_all(keys_only=keys_only)


def _member_failed(e: BaseException) -> bool:
    """Did the member (or our connection to it) fail, rather than the request?"""
    return isinstance(
        e,
        TimeoutError
        | aetcd.exceptions.ConnectionFailedError
        | aetcd.exceptions.ConnectionTimeoutError,
    )


def _never_sent(e: BaseException) -> bool:
    return isinstance(e, aetcd.exceptions.ConnectionFailedError) and any(
        text in str(e) for text in _NOT_SENT
    )


# Strong references to cleanup tasks, so they are not garbage-collected mid-flight.
_cleanups: set[asyncio.Task[None]] = set()


def _cancel_orphan_watch(
    registration: asyncio.Future[tuple[aetcd.Client, aetcd.rtypes.Watch]],
) -> None:
    if registration.cancelled() or registration.exception() is not None:
        return
    task = asyncio.ensure_future(_cancel_quietly(registration.result()[1]))
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


def _compare(key: str, expected_version: int | None) -> list[Callable[[Any], Any]]:
    """The compare of a CAS as builders (each attempt builds it on its member's client)."""
    k = _bytes(key)
    if expected_version is None:
        return []
    if expected_version == NOT_EXISTS:
        return [lambda tx: tx.create(k) == 0]
    if expected_version <= 0:
        raise ValueError(
            f"expected_version must be positive, NOT_EXISTS or None, not {expected_version}"
        )
    return [lambda tx: tx.mod(k) == expected_version]


def _read_back(range_response: list[tuple[bytes, aetcd.rtypes.Get]]) -> aetcd.rtypes.Get | None:
    """The key read by a ``tx.get`` inside a transaction (None: it does not exist)."""
    return range_response[0][1] if range_response else None


def _mismatch(key: str, expected: int | None, current: aetcd.rtypes.Get | None) -> str:
    actual = "it does not exist" if current is None else f"it is at version {current.mod_revision}"
    wanted = "to not exist" if expected == NOT_EXISTS else f"at version {expected}"
    return f"{key}: expected {wanted} but {actual}"


def _describe(e: BaseException) -> str:
    return str(e) or type(e).__name__
