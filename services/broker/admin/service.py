"""What the admin API needs of the broker, as Protocols: the admin room never imports the
composition root (``broker.py``) nor the metrics binding (``metrics.py``); the broker satisfies
:class:`AdminBroker` by its shape. Each member is one the admin routes read or call, beside what
``cluster.lookup`` reads (``LookupContext``: the routes look topics up with the broker)."""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import TYPE_CHECKING, Protocol

from magnetar.broker.cluster.lookup import LookupContext

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from magnetar.broker.cluster.bundles import BundleRange
    from magnetar.broker.config import BrokerConfig
    from magnetar.broker.model.topic_name import TopicName
    from magnetar.broker.namespace.authorization import AuthorizationService
    from magnetar.broker.namespace.policies import Policies
    from magnetar.broker.topics.service import Topic
    from magnetar.common.auth.client import ClientCredentials
    from magnetar.common.auth.service import AuthenticationService
    from magnetar.common.cluster.broker_info import BrokerInfo


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class AdminMetrics(Protocol):
    """The broker's metrics as ``/metrics`` uses them: four gauges set at scrape time, then
    the registry rendered."""

    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def topics(self) -> Gauge: ...
    @property
    def connections(self) -> Gauge: ...
    @property
    def entries_in(self) -> Gauge: ...
    @property
    def bytes_in(self) -> Gauge: ...


class AdminBroker(LookupContext, Protocol):
    """The broker as the admin API sees it (``info``, ``store``, ``ownership``, ``registry``,
    ``load_manager`` and ``bundle_of`` come with ``LookupContext``)."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def topics(self) -> Mapping[str, Topic]: ...
    @property
    def connections(self) -> Sized: ...
    @property
    def metrics(self) -> AdminMetrics: ...
    @property
    def authentication(self) -> AuthenticationService: ...
    @property
    def proxy_roles(self) -> frozenset[str]: ...
    @property
    def client_credentials(self) -> ClientCredentials: ...
    @property
    def authorization(self) -> AuthorizationService: ...

    def may_serve(self) -> bool: ...
    def policies_changed(self) -> None: ...
    async def namespace_policies(self, namespace: str) -> Policies: ...

    # topics
    async def get_topic(self, name: TopicName, *, auto: bool = False) -> Topic: ...
    async def topic_exists(self, name: TopicName) -> bool: ...
    async def delete_topic(self, name: TopicName, *, force: bool) -> None: ...
    async def list_topics(self, namespace: str, domains: tuple[str, ...]) -> list[str]: ...
    async def unload_topic(self, topic: Topic, receiver: BrokerInfo | None = None) -> None: ...

    # bundles
    async def namespace_bundles(self, namespace: str) -> list[BundleRange]: ...
    def forget_bundles(self, namespace: str) -> None: ...
    async def request_unload(
        self, owner: BrokerInfo, namespace: str, bundle: BundleRange
    ) -> None: ...
    async def unload_bundle(
        self, namespace: str, bundle: BundleRange, receiver: BrokerInfo | None = None
    ) -> int: ...
    async def split_bundle(
        self, namespace: str, bundle: BundleRange, algorithm: str, *, unload: bool
    ) -> tuple[BundleRange, BundleRange]: ...
