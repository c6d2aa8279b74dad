"""The one lookup path: which broker serves a topic, for the binary protocol's LOOKUP, the HTTP
lookup and the check every PRODUCER / SUBSCRIBE makes.

Pulsar's rules (TopicLookupBase / NamespaceService.findBrokerServiceUrl):

* the topic's bundle is owned: answer **Connect** to the owner (this broker or another);
* nobody owns it and this broker may decide (it is the load manager's leader, or the client was
  sent here by the leader with ``authoritative``): the leader picks the least-loaded broker; if
  that is this broker it takes the bundle's ownership key and answers Connect to itself,
  otherwise it answers **Redirect** to the chosen broker with ``authoritative`` set, and that
  broker takes the bundle when the client asks it;
* nobody owns it and this broker may not decide: **Redirect** to the leader, not
  authoritative.

A lookup for a bundle whose owner has just gone (its session expired) finds no owner once the
ownership key is gone, and the bundle is assigned again.

A bundle being handed over (its owner unloads it and noted the broker it goes to, see
``OwnershipStore.hand_over``) is looked up as the receiving broker's: **Connect** to it. The
receiving broker itself waits for the release and takes the bundle, so clients the old owner
sent there with the new owner's URL are served without another lookup.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from magnetar.broker.cluster.bundles import BundleRange
from magnetar.broker.cluster.load_manager import LoadManager
from magnetar.broker.cluster.ownership import OwnershipStore, read_unload_note
from magnetar.broker.cluster.registry import BrokerRegistry
from magnetar.broker.model.topic_name import TopicName
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.metadata import MetadataStore


class LookupContext(Protocol):
    """What a lookup reads of the broker it runs on: who it is, its metadata session, and the
    cluster parts it joined with (all set while it is in the cluster)."""

    @property
    def info(self) -> BrokerInfo: ...

    @property
    def store(self) -> MetadataStore | None: ...

    @property
    def configuration_store(self) -> MetadataStore:
        """Where tenants, namespaces and partitioned topics live (``namespace/records.py``)."""
        ...

    @property
    def ownership(self) -> OwnershipStore | None: ...

    @property
    def registry(self) -> BrokerRegistry | None: ...

    @property
    def load_manager(self) -> LoadManager | None: ...

    async def bundle_of(self, name: TopicName) -> BundleRange: ...


class LookupKind(enum.Enum):
    CONNECT = "connect"
    REDIRECT = "redirect"


@dataclass(slots=True, frozen=True)
class LookupAnswer:
    kind: LookupKind
    broker: BrokerInfo
    authoritative: bool
    namespace: str
    bundle: BundleRange


#: Longest the receiving broker of a hand-over waits for the old owner's release.
HANDOVER_WAIT_S = 10.0


class NoLeaderError(Exception):
    """Nobody owns the bundle and no load-manager leader is known yet: ask again shortly."""


async def lookup(
    broker: LookupContext, name: TopicName, authoritative: bool = False
) -> LookupAnswer:
    namespace = name.namespace_name
    bundle = await broker.bundle_of(name)
    me = broker.info
    owner = await broker.ownership.owner(namespace, bundle)
    if owner is not None and owner.broker_id != me.broker_id:
        # Sending a client to another broker: make sure it still owns the bundle (a cached
        # owner that died would send the client to a dead address until the cache catches up).
        owner = await broker.ownership.read_owner(namespace, bundle)
        receiver = await _handed_to(broker, namespace, bundle, owner)
        if receiver is not None and receiver.broker_id == me.broker_id:
            return await _receive(broker, namespace, bundle, owner)
        if receiver is not None:
            return LookupAnswer(LookupKind.CONNECT, receiver, True, namespace, bundle)
    if owner is not None:
        return LookupAnswer(LookupKind.CONNECT, owner, True, namespace, bundle)
    assert broker.store is not None
    note = await read_unload_note(broker.store, namespace, bundle)
    if note is not None and note.to == me.broker_id:  # handed to us, released meanwhile
        winner = await broker.ownership.try_acquire(namespace, bundle)
        return LookupAnswer(LookupKind.CONNECT, winner, True, namespace, bundle)
    manager = broker.load_manager
    if authoritative or manager.is_leader:
        target = me if authoritative else await manager.select(namespace, bundle)
        if target.broker_id == me.broker_id:
            winner = await broker.ownership.try_acquire(namespace, bundle)
            return LookupAnswer(LookupKind.CONNECT, winner, True, namespace, bundle)
        return LookupAnswer(LookupKind.REDIRECT, target, True, namespace, bundle)
    leader = await manager.leader_info()
    if leader is None:
        raise NoLeaderError(f"bundle {namespace}/{bundle} has no owner and no leader is elected")
    if leader.broker_id == me.broker_id:  # elected meanwhile
        return await lookup(broker, name, authoritative)
    return LookupAnswer(LookupKind.REDIRECT, leader, False, namespace, bundle)


async def _handed_to(
    broker: LookupContext, namespace: str, bundle: BundleRange, owner: BrokerInfo | None
) -> BrokerInfo | None:
    """The live broker ``bundle`` is being handed to by ``owner`` (None when unowned: the
    leader honours the note then), or None if no hand-over is under way."""
    if owner is None:
        return None
    assert broker.store is not None and broker.registry is not None
    note = await read_unload_note(broker.store, namespace, bundle)
    if note is None or note.to is None or note.source != owner.broker_id:
        return None
    found = (await broker.registry.active()).get(note.to)
    return found[0] if found is not None else None


async def _receive(
    broker: LookupContext, namespace: str, bundle: BundleRange, owner: BrokerInfo
) -> LookupAnswer:
    """This broker receives the bundle: wait for ``owner`` to release it, then take it."""
    if await broker.ownership.wait_released(namespace, bundle, owner.broker_id, HANDOVER_WAIT_S):
        winner = await broker.ownership.try_acquire(namespace, bundle)
        return LookupAnswer(LookupKind.CONNECT, winner, True, namespace, bundle)
    return LookupAnswer(LookupKind.CONNECT, owner, True, namespace, bundle)
