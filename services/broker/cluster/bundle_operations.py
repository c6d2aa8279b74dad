"""What one broker does with namespace bundles: which bundle a topic is in (the namespace's
bundles, cached and forgotten when they change), whether this broker serves it now, unloading
and splitting the bundles it owns, and asking another broker (the owner) to do so when the load
manager sheds or splits one of its bundles.

Unloading a bundle disconnects its topics' clients, closes the topics (cursors persisted) and
releases the ownership key; the next owner opens each topic's last ledger with recovery, which
fences this broker out for good. The loaded topics are reached through :class:`BundleTopics`
(the topics room implements it): this room never imports the topics.
"""

from __future__ import annotations

import logging
from typing import Protocol, TypeVar

from aiohttp import ClientSession, ClientTimeout

from magnetar.broker.cluster.bundles import (
    BUNDLES_ROOT,
    BundleRange,
    bundle_for,
    load_or_create,
    replace_with_split,
    split,
    topic_hash,
)
from magnetar.broker.cluster.lookup import LookupContext, LookupKind, lookup
from magnetar.broker.cluster.ownership import OwnershipStore
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import NamespaceNotFoundError, TopicNotOwnedError
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.records import namespace_document
from magnetar.common.auth.client import ClientCredentials
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.metadata import MetadataStore

log = logging.getLogger(__name__)

TopicT = TypeVar("TopicT")


class BundleTopics(Protocol[TopicT]):
    """What bundle operations need of the loaded topics."""

    def topics_in(self, namespace: str, bundle: BundleRange) -> list[TopicT]:
        """The loaded topics of ``bundle``."""
        ...

    async def unload_topic(self, topic: TopicT, receiver: BrokerInfo | None = None) -> None:
        """Stop serving ``topic`` (its clients sent to ``receiver``, if any)."""
        ...

    async def list_topics(self, namespace: str, domains: tuple[str, ...]) -> list[str]:
        """Every topic of ``namespace`` in these domains, stored or loaded."""
        ...


class BundleHost(LookupContext, Protocol):
    """The broker as bundle operations see it: what a lookup reads, and its configuration."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def client_credentials(self) -> ClientCredentials: ...


class BundleOperations:
    """Bundles of one broker (see the module docstring)."""

    def __init__(self, host: BundleHost, topics: BundleTopics[TopicT]) -> None:
        self._host = host
        self._topics = topics
        self._bundles: dict[str, list[BundleRange]] = {}
        #: Bundles being unloaded: their topics are not loaded again meanwhile.
        self._unloading: set[tuple[str, BundleRange]] = set()

    @property
    def _ownership(self) -> OwnershipStore:
        """The ownership store of the current session (a new one after a rejoin)."""
        ownership = self._host.ownership
        assert ownership is not None
        return ownership

    # -- which bundle ----------------------------------------------------------------------------

    async def follow(self, store: MetadataStore) -> None:
        """Forget a namespace's cached bundles as soon as they change (a split anywhere)."""
        try:
            async for event in store.watch(BUNDLES_ROOT + "/", prefix=True):
                namespace = event.key[len(BUNDLES_ROOT) + 1 :]
                self._bundles.pop(namespace, None)
        except Exception as e:  # the session ended: rejoining starts a new watch
            log.info("bundles watch ended: %s", e)
            self._bundles.clear()

    async def namespace_bundles(self, namespace: str) -> list[BundleRange]:
        ranges = self._bundles.get(namespace)
        if ranges is None:
            store = self._host.store
            assert store is not None
            ranges = await load_or_create(store, namespace, await self._first_count(namespace))
            self._bundles[namespace] = ranges
        return ranges

    async def _first_count(self, namespace: str) -> int:
        """How many bundles this cluster's first layout of ``namespace`` has: the count it was
        created with (``bundles.numBundles`` of its record in the configuration store, where
        another cluster may have made it), else ``default_number_of_namespace_bundles``."""
        default = self._host.config.default_number_of_namespace_bundles
        try:
            document = await namespace_document(self._host.configuration_store, namespace)
        except NamespaceNotFoundError:
            return default
        bundles = document.get("bundles")
        count = bundles.get("numBundles") if isinstance(bundles, dict) else None
        if isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 1024:
            return count
        return default

    def forget_bundles(self, namespace: str) -> None:
        """The namespace's bundles changed (split): read them again."""
        self._bundles.pop(namespace, None)

    async def bundle_of(self, name: TopicName) -> BundleRange:
        return bundle_for(await self.namespace_bundles(name.namespace_name), str(name))

    async def check_owner(self, name: TopicName) -> None:
        """Raise TopicNotOwnedError unless this broker serves ``name`` now (taking the bundle
        if the load manager gives it to this broker)."""
        host = self._host
        me = host.info.broker_id
        ownership = host.ownership
        if ownership is None:
            raise TopicNotOwnedError(f"broker {me} is not in the cluster yet")
        namespace = name.namespace_name
        bundle = await self.bundle_of(name)
        if (namespace, bundle) in self._unloading:
            raise TopicNotOwnedError(
                f"its bundle {namespace}/{bundle} is unloading from this broker"
            )
        if self._ownership.owns(namespace, bundle):
            return
        answer = await lookup(host, name)
        if answer.kind is LookupKind.CONNECT and answer.broker.broker_id == me:
            return
        raise TopicNotOwnedError(
            f"topic {name} is served by {answer.broker.broker_id}, not {me}", answer.broker
        )

    # -- unload and split ------------------------------------------------------------------------

    async def unload_bundle(
        self, namespace: str, bundle: BundleRange, receiver: BrokerInfo | None = None
    ) -> int:
        """Unload a bundle and hand it to ``receiver`` (default: the least loaded other broker,
        if any). The hand-over is noted first; then each topic's clients are told to reconnect
        to the receiver (CLOSE_PRODUCER / CLOSE_CONSUMER with its URL), the topic closes
        (cursors persisted, ledgers closed); last the ownership key is released, and the
        receiver, which was waiting for that, takes the bundle. Returns the topics."""
        load_manager = self._host.load_manager
        assert self._host.ownership is not None and load_manager is not None
        key = (namespace, bundle)
        self._unloading.add(key)
        handed = False
        try:
            if receiver is None:
                receiver = await load_manager.select_receiver(self._host.info.broker_id)
            if receiver is not None:
                await self._ownership.hand_over(namespace, bundle, receiver.broker_id)
                handed = True
            topics = self._topics.topics_in(namespace, bundle)
            for topic in topics:
                await self._topics.unload_topic(topic, receiver)
            to = receiver.broker_id if receiver is not None else None
            await self._ownership.release(namespace, bundle, to)
            handed = False
            log.info(
                "bundle %s/%s unloaded (%d topics)%s",
                namespace,
                bundle,
                len(topics),
                f", handed to {to}" if to else "",
            )
            return len(topics)
        finally:
            self._unloading.discard(key)
            if handed:  # failed before the release: the note must not send clients away
                await self._ownership.release_note(namespace, bundle)

    async def split_bundle(
        self, namespace: str, bundle: BundleRange, algorithm: str, *, unload: bool
    ) -> tuple[BundleRange, BundleRange]:
        """Split a bundle in two (Pulsar's split algorithms). Owned here: both halves stay ours
        in the same transaction as the split (then unloaded if asked); owned by nobody: only
        the namespace's bundles change."""
        store = self._host.store
        assert store is not None and self._host.ownership is not None
        hashes = [
            topic_hash(name)
            for name in await self._topics.list_topics(namespace, ("persistent", "non-persistent"))
            if bundle.contains(topic_hash(name))
        ]
        pair = split(bundle, algorithm=algorithm, topic_hashes=hashes)  # type: ignore[arg-type]
        if self._ownership.owns(namespace, bundle):
            await self._ownership.split(namespace, bundle, pair)
        else:
            await replace_with_split(store, namespace, bundle, pair)
        self.forget_bundles(namespace)
        log.info("bundle %s/%s split into %s and %s", namespace, bundle, *pair)
        if unload:
            for half in pair:
                if self._ownership.owns(namespace, half):
                    await self.unload_bundle(namespace, half)
        return pair

    # -- asked by the load manager ---------------------------------------------------------------

    async def request_unload(self, owner: BrokerInfo, namespace: str, bundle: BundleRange) -> None:
        """The load manager sheds a bundle: its owner unloads it (through its admin API)."""
        if owner.broker_id == self._host.info.broker_id:
            await self.unload_bundle(namespace, bundle)
            return
        url = f"{owner.http_url}/admin/v2/namespaces/{namespace}/{bundle}/unload"
        await _owner_call(url, f"unload of {namespace}/{bundle}", owner, self._host)

    async def request_split(self, owner: BrokerInfo, namespace: str, bundle: BundleRange) -> None:
        """The load manager splits a hot bundle: its owner splits it, keeps both halves in the
        same transaction, then unloads them (so they can move) through its admin API."""
        if owner.broker_id == self._host.info.broker_id:
            await self.split_bundle(namespace, bundle, "range_equally_divide", unload=True)
            return
        url = (
            f"{owner.http_url}/admin/v2/namespaces/{namespace}/{bundle}/split"
            "?unload=true&splitAlgorithmName=range_equally_divide"
        )
        await _owner_call(url, f"split of {namespace}/{bundle}", owner, self._host)


async def _owner_call(url: str, what: str, owner: BrokerInfo, host: BundleHost) -> None:
    """An admin call to the owning broker, authenticated as this broker
    (``broker_client_authentication_*``)."""
    headers = host.client_credentials.http_headers()
    async with ClientSession(timeout=ClientTimeout(total=30), headers=headers) as session:
        async with session.put(url) as response:
            if response.status >= 300:
                raise RuntimeError(f"{what} at {owner.broker_id}: HTTP {response.status}")
