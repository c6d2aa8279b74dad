"""Bundle ownership: a broker owns a bundle while it holds the bundle's ephemeral key.

The rule (Pulsar's ``OwnershipCache`` on ZooKeeper, here on the metadata store):

- The owner of bundle ``B`` of namespace ``tenant/ns`` is whoever created
  ``/magnetar/ownership/tenant/ns/B`` with "must not exist", as an ephemeral key of its
  session; the value is the owner's :class:`BrokerInfo` JSON (what a lookup answers).
- Of concurrent claimants exactly one create succeeds; the others read the winner.
- Ownership ends when the owner deletes its key (``release``, after unloading the bundle) or
  when its session ends (close, lease expiry): the key vanishes with the session and the bundle
  is free for any broker.
- A broker stops serving as soon as it may have lost its session (``owns()`` turns False and the
  lost listeners run): another broker can take a bundle only after the key is gone, and the
  new owner fences the topics' ledgers (recovery open), so a broker that noticed too late
  (paused past its TTL) still cannot append.

:class:`PrefixCache` (a scan plus a prefix watch) keeps a local copy of every ownership key,
so ``owner()`` answers lookups without a store read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from magnetar.broker.cluster.bundles import BundleRange, bundles_key, split_document
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.metadata import (
    NOT_EXISTS,
    BadVersionError,
    Delete,
    Expect,
    MetadataError,
    MetadataStore,
    NoSuchKeyError,
    Put,
)
from magnetar.common.metadata.prefix_cache import PrefixCache
from magnetar.common.tasks import wait_set

log = logging.getLogger(__name__)

#: Ownership is taken as gone, and the broker stops serving, this long before the metadata
#: session could expire.
SESSION_SAFETY_MARGIN_S = 1.0

OWNERSHIP_ROOT = "/magnetar/ownership"
UNLOADED_ROOT = "/magnetar/unloaded"
#: How long a released bundle avoids the broker that released it.
UNLOADED_MEMORY_S = 60


def _bundle_key(root: str, namespace: str, bundle: BundleRange) -> str:
    # bundles_key checks the namespace is tenant/ns.
    return root + bundles_key(namespace).removeprefix("/magnetar/bundles") + f"/{bundle}"


def ownership_key(namespace: str, bundle: BundleRange) -> str:
    return _bundle_key(OWNERSHIP_ROOT, namespace, bundle)


def unloaded_key(namespace: str, bundle: BundleRange) -> str:
    """Where a release notes which broker the bundle left (the leader places it elsewhere)."""
    return _bundle_key(UNLOADED_ROOT, namespace, bundle)


@dataclass(slots=True, frozen=True)
class UnloadNote:
    """Where a bundle is going: written when its owner starts unloading it (``to`` is the
    broker it is handed to, when one was chosen) and kept after the release, so the leader
    places it elsewhere and the chosen broker may take it while clients reconnect to it."""

    source: str  # broker id it leaves
    to: str | None  # broker id it is handed to, if chosen
    at_ms: int

    def to_json(self) -> bytes:
        return json.dumps({"from": self.source, "to": self.to, "atMs": self.at_ms}).encode()


async def read_unload_note(
    store: MetadataStore, namespace: str, bundle: BundleRange
) -> UnloadNote | None:
    """The bundle's unload note, if it was written less than a minute ago."""
    found = await store.get(unloaded_key(namespace, bundle))
    if found is None:
        return None
    try:
        note = json.loads(found.value)
        at_ms = int(note["atMs"])
        to = note.get("to")
        if time.time() * 1000 - at_ms < UNLOADED_MEMORY_S * 1000:
            return UnloadNote(str(note["from"]), str(to) if to else None, at_ms)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def parse_ownership_key(key: str) -> tuple[str, BundleRange]:
    """``/magnetar/ownership/t/ns/0x..._0x...`` to ``("t/ns", range)``."""
    parts = key.removeprefix(OWNERSHIP_ROOT + "/").split("/")
    if len(parts) != 3:
        raise ValueError(f"not an ownership key: {key!r}")
    return f"{parts[0]}/{parts[1]}", BundleRange.parse(parts[2])


class OwnershipStore:
    """This broker's view of bundle ownership: whose each bundle is, and which are its own.

    ``namespace`` is ``"tenant/namespace"``. Call :meth:`start` before serving (it fills the
    cache and starts the watch); ``owner()`` before ``start()`` reads the store.
    """

    def __init__(self, store: MetadataStore, me: BrokerInfo) -> None:
        self.me = me
        self._store = store
        self._cache = PrefixCache(
            store, OWNERSHIP_ROOT + "/", on_change=self._changed, on_end=self._watch_ended
        )
        #: Bundles we hold: (namespace, bundle) -> version of our ownership key.
        self._owned: dict[tuple[str, BundleRange], int] = {}
        self._lost = False
        self._closed = False
        self._lost_listeners: list[Callable[[], None]] = []
        self._bundle_lost_listeners: list[Callable[[str, BundleRange], None]] = []
        #: Set (and replaced) on every change of an ownership key: wait_released waits on it.
        self._change = asyncio.Event()
        #: One claim at a time per bundle: concurrent lookups of an unowned bundle must not
        #: take each other's fresh key for one left by a previous session.
        self._claims: dict[tuple[str, BundleRange], asyncio.Lock] = {}
        store.add_session_listener(self._session_lost)

    async def start(self) -> None:
        await self._cache.start()

    # -- queries --------------------------------------------------------------------------

    async def owner(self, namespace: str, bundle: BundleRange) -> BrokerInfo | None:
        """The bundle's owner (from the watched cache once started), or None if unowned."""
        key = ownership_key(namespace, bundle)
        if self._cache.started:
            value = self._cache.get(key)
        else:
            current = await self._store.get(key)
            value = current.value if current is not None else None
        return _decode(key, value)

    async def read_owner(self, namespace: str, bundle: BundleRange) -> BrokerInfo | None:
        """The owner as the store says now, not as the cache last heard."""
        key = ownership_key(namespace, bundle)
        found = await self._store.get(key)
        if found is None:
            return None  # the cache's watch delivers the delete too
        self._cache.apply(key, found.value, found.version)
        return _decode(key, found.value)

    def owners(self) -> dict[tuple[str, BundleRange], BrokerInfo]:
        """Every owned bundle of the cluster with its owner (from the cache; empty before
        ``start()``)."""
        result: dict[tuple[str, BundleRange], BrokerInfo] = {}
        for key, value in self._cache.items().items():
            try:
                info = _decode(key, value)
                if info is not None:
                    result[parse_ownership_key(key)] = info
            except (ValueError, MetadataError) as e:
                log.warning("ignoring unreadable ownership key %s: %s", key, e)
        return result

    def owned(self) -> set[tuple[str, BundleRange]]:
        """The bundles this broker holds (empty once the session may be lost)."""
        if self.session_may_be_lost:
            return set()
        return set(self._owned)

    def owns(self, namespace: str, bundle: BundleRange) -> bool:
        """True while this broker holds the bundle's key in a live session."""
        return not self.session_may_be_lost and (namespace, bundle) in self._owned

    @property
    def session_may_be_lost(self) -> bool:
        return (
            self._lost
            or self._closed
            or self._store.session_lost
            or time.monotonic() >= self._store.session_valid_until - SESSION_SAFETY_MARGIN_S
        )

    # -- changes --------------------------------------------------------------------------

    async def try_acquire(self, namespace: str, bundle: BundleRange) -> BrokerInfo:
        """Claim the bundle; return its owner: ``me`` if the claim won, else the holder.

        A key holding our own broker id that we did not create in this session is left over
        from a previous session of this broker (restarted before its lease expired): it is
        rebound to our session by a compare-and-set, since that old session serves nothing.
        """
        claim = self._claims.setdefault((namespace, bundle), asyncio.Lock())
        async with claim:
            return await self._claim(namespace, bundle)

    async def _claim(self, namespace: str, bundle: BundleRange) -> BrokerInfo:
        key = ownership_key(namespace, bundle)
        if (namespace, bundle) in self._owned and not self.session_may_be_lost:
            return self.me
        value = self.me.to_json()
        while True:
            try:
                version = await self._store.put(key, value, NOT_EXISTS, ephemeral=True)
            except BadVersionError:
                current = await self._store.get(key)
                if current is None:
                    continue  # released between our put and our read: claim again
                holder = BrokerInfo.from_json(current.value)
                if holder.broker_id != self.me.broker_id:
                    self._cache.apply(key, current.value, current.version)
                    return holder
                try:
                    version = await self._store.transaction(
                        [Expect(key, current.version)], [Put(key, value, ephemeral=True)]
                    )
                except BadVersionError:
                    continue
                log.warning(
                    "bundle %s/%s: took over the ownership key a previous session of this "
                    "broker (%s) left",
                    namespace,
                    bundle,
                    self.me.broker_id,
                )
            self._owned[(namespace, bundle)] = version
            self._cache.apply(key, value, version)
            log.info("bundle %s/%s: now owned by this broker", namespace, bundle)
            return self.me

    async def split(
        self, namespace: str, bundle: BundleRange, new_pair: tuple[BundleRange, BundleRange]
    ) -> list[BundleRange]:
        """Split a bundle we own and keep both halves (Pulsar's ``splitAndOwnBundle``); return
        the namespace's new bundles.

        One transaction: the bundles document is replaced (CAS), our key of ``bundle`` is
        deleted on the condition that it is still ours, and the halves' keys are created
        (must not exist) under our session. Topics keep being served here; unload the halves
        afterwards to let them move. BadVersionError if ``bundle`` is no longer ours.
        """
        version = self._owned.get((namespace, bundle))
        if version is None or self.session_may_be_lost:
            raise BadVersionError(f"bundle {namespace}/{bundle} is not owned by this broker")
        old_key = ownership_key(namespace, bundle)
        new_keys = [ownership_key(namespace, half) for half in new_pair]
        value = self.me.to_json()
        # Not ours while the transaction runs: its delete event must not look like a theft.
        del self._owned[(namespace, bundle)]
        try:
            updated, revision = await split_document(
                self._store,
                namespace,
                bundle,
                new_pair,
                conditions=[Expect(old_key, version), *(Expect(k, NOT_EXISTS) for k in new_keys)],
                operations=[Delete(old_key), *(Put(k, value, ephemeral=True) for k in new_keys)],
            )
        except BaseException:
            if self._cache.version(old_key) == version and not self.session_may_be_lost:
                self._owned[(namespace, bundle)] = version
            raise
        for half, key in zip(new_pair, new_keys, strict=True):
            self._owned[(namespace, half)] = revision
            self._cache.apply(key, value, revision)
        self._cache.apply(old_key, None, revision)
        log.info("bundle %s/%s: split into %s and %s, both kept", namespace, bundle, *new_pair)
        return updated

    async def release(self, namespace: str, bundle: BundleRange, to: str | None = None) -> None:
        """Give up the bundle (after unloading it): delete its key if it is ours, and note that
        it left this broker (``unloaded_key``) so the leader places it on another one: on
        broker ``to`` if the unload handed it there."""
        key = ownership_key(namespace, bundle)
        version = self._owned.pop((namespace, bundle), None)
        if version is None:
            current = await self._store.get(key)
            holder = _decode(key, current.value) if current is not None else None
            if current is None or holder is None or holder.broker_id != self.me.broker_id:
                return
            version = current.version
        if self._store.session_lost:
            return  # the key went with the session
        note = UnloadNote(self.me.broker_id, to, int(time.time() * 1000)).to_json()
        with contextlib.suppress(BadVersionError, NoSuchKeyError):
            await self._store.transaction(
                [Expect(key, version)],
                [Delete(key), Put(unloaded_key(namespace, bundle), note)],
            )
            log.info("bundle %s/%s: released", namespace, bundle)

    async def hand_over(self, namespace: str, bundle: BundleRange, to: str) -> None:
        """Note, before unloading ``bundle``, that it goes to broker ``to``: clients told to
        reconnect there find it ready to take the bundle as soon as we release it."""
        note = UnloadNote(self.me.broker_id, to, int(time.time() * 1000))
        await self._store.put(unloaded_key(namespace, bundle), note.to_json())

    async def release_note(self, namespace: str, bundle: BundleRange) -> None:
        """Withdraw a hand-over note (the unload failed before the release): lookups go to
        the owner again. Best effort: a note expires after a minute anyway."""
        try:
            await self._store.delete(unloaded_key(namespace, bundle))
        except (NoSuchKeyError, MetadataError) as e:
            log.warning("bundle %s/%s: hand-over note not withdrawn: %s", namespace, bundle, e)

    async def wait_released(
        self, namespace: str, bundle: BundleRange, holder: str, timeout_s: float
    ) -> bool:
        """Wait until broker ``holder`` no longer owns ``bundle`` (as the watch tells);
        False if it still does after ``timeout_s``."""
        key = ownership_key(namespace, bundle)
        deadline = time.monotonic() + timeout_s
        while True:
            current = _decode(key, self._cache.get(key))
            if current is None or current.broker_id != holder:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await wait_set(self._change, left)

    def add_lost_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` runs once when the session may be lost (this broker must stop serving
        every bundle it owned at once). Runs soon if that already happened."""
        if self._lost:
            asyncio.get_running_loop().call_soon(self._notify, callback)
            return
        self._lost_listeners.append(callback)

    def add_bundle_lost_listener(self, callback: Callable[[str, BundleRange], None]) -> None:
        """``callback(namespace, bundle)`` runs when one of our keys is deleted or overwritten
        by someone else (say an operator, or a lease that expired at the server before this
        broker noticed): stop serving that bundle."""
        self._bundle_lost_listeners.append(callback)

    async def close(self, *, release: bool = True) -> None:
        """Stop watching; with ``release``, first delete the keys of the bundles still held."""
        if self._closed:
            return
        if release and not self._store.session_lost:
            for namespace, bundle in list(self._owned):
                with contextlib.suppress(MetadataError):
                    await self.release(namespace, bundle)
        self._closed = True
        self._owned.clear()
        await self._cache.close()

    # -- internals ------------------------------------------------------------------------

    def _changed(self, key: str, value: bytes | None, version: int) -> None:
        self._change.set()
        self._change = asyncio.Event()
        try:
            namespace, bundle = parse_ownership_key(key)
        except ValueError:
            return
        ours = self._owned.get((namespace, bundle))
        if ours is None or ours == version:
            return
        del self._owned[(namespace, bundle)]
        log.error(
            "bundle %s/%s: our ownership key was %s behind our back; no longer serving it",
            namespace,
            bundle,
            "deleted" if value is None else "overwritten",
        )
        for callback in list(self._bundle_lost_listeners):
            try:
                callback(namespace, bundle)
            except Exception:
                log.exception("bundle lost listener failed")

    def _watch_ended(self) -> None:
        if not self._closed:
            self._session_lost()

    def _session_lost(self) -> None:
        if self._lost or self._closed:
            return
        self._lost = True
        owned, self._owned = self._owned, {}
        log.error(
            "metadata session lost: no longer serving the %d bundles this broker owned (%s)",
            len(owned),
            ", ".join(f"{ns}/{b}" for ns, b in sorted(owned)) or "none",
        )
        listeners, self._lost_listeners = self._lost_listeners, []
        for callback in listeners:
            self._notify(callback)

    @staticmethod
    def _notify(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("ownership lost listener failed")


def _decode(key: str, value: bytes | None) -> BrokerInfo | None:
    if value is None:
        return None
    try:
        return BrokerInfo.from_json(value)
    except ValueError as e:
        raise MetadataError(f"{key}: unreadable ownership data ({e})") from e
