"""What the protocol room uses of the broker, as a Protocol: the composition root (``broker.py``)
provides it, and the room never imports the root.

It includes what a lookup reads (``cluster/lookup.py``'s ``LookupContext``): LOOKUP hands the
same object to ``lookup``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from magnetar.broker.cluster.lookup import LookupContext
from magnetar.broker.config import BrokerConfig
from magnetar.broker.model.counts import ConnectionCounts, LookupCounts
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.authorization import AuthorizationService
from magnetar.broker.namespace.policies import Policies
from magnetar.broker.topics.nonpersistent import NonPersistentTopic
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.common.auth.service import AuthenticationService

if TYPE_CHECKING:
    from magnetar.broker.protocol.connection import ServerConnection


class Increment(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class LabelledCounter(Protocol):
    def labels(self, *values: str) -> Increment: ...


class ProtocolMetrics(Protocol):
    """The counters the protocol room touches."""

    @property
    def send_errors(self) -> LabelledCounter: ...

    @property
    def connection_counts(self) -> ConnectionCounts: ...

    @property
    def lookup_counts(self) -> LookupCounts: ...


class BrokerService(LookupContext, Protocol):
    """The broker, as its client connections see it."""

    config: BrokerConfig
    #: The open client connections (for stats and for closing them at shutdown).
    connections: set[ServerConnection]
    #: Advertised listener names a LOOKUP may ask for.
    listener_names: frozenset[str]
    authentication: AuthenticationService
    authorization: AuthorizationService
    #: Roles of proxies (``proxy_roles``): such a connection names the client it relays.
    proxy_roles: frozenset[str]

    @property
    def metrics(self) -> ProtocolMetrics: ...

    async def get_topic(
        self, name: TopicName, *, auto: bool = False
    ) -> PersistentTopic | NonPersistentTopic: ...

    async def partitions_for_client(self, name: TopicName) -> int: ...

    async def namespace_policies(self, namespace: str) -> Policies: ...

    async def list_topics(self, namespace: str, domains: tuple[str, ...]) -> list[str]: ...

    def may_serve(self) -> bool: ...

    def topic_fenced(self, topic: PersistentTopic | NonPersistentTopic) -> None: ...
