"""Admin REST of non-partitioned topics (and partitions), on Pulsar's paths:

- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}`` creates a non-partitioned topic
- ``DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}`` (``?force``)
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}`` lists topics (loaded ones and partitions)
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats`` and ``.../internalStats``
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscriptions``
- ``DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{sub}`` (``?force``)

A topic's calls are answered by its owner; another broker redirects there (``TopicNotOwnedError``
in the error middleware).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.errors import SubscriptionBusyError, SubscriptionNotFoundError, TopicBusyError
from magnetar.broker.namespace.records import (
    delete_topic_policies,
    partitioned_key,
    read_partitioned,
)
from magnetar.broker.topics.persistent import PersistentTopic

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: A namespace's topics, in one domain.
NAMESPACE_PATH = "/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}"


def add_topic_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    base = NAMESPACE_PATH

    @routes.get(base + "/{topic}/stats")
    async def stats(request: web.Request) -> web.Response:
        topic = await requests.existing_topic(broker, requests.topic(request))
        return web.json_response(topic.stats())

    @routes.get(base + "/{topic}/internalStats")
    async def internal_stats(request: web.Request) -> web.Response:
        name = requests.topic(request)
        topic = await requests.existing_topic(broker, name)
        if not isinstance(topic, PersistentTopic):
            raise AdminError(412, f"topic {name} is non-persistent: it has no storage")
        return web.json_response(topic.internal_stats())

    @routes.delete(base + "/{topic}")
    async def delete_topic(request: web.Request) -> web.Response:
        name = requests.topic(request)
        await requests.require_namespace(broker, name.namespace_name)
        if not await requests.stored_or_loaded(broker, name):
            raise AdminError(404, f"Topic {name} not found")
        try:
            await broker.delete_topic(name, force=requests.flag(request, "force"))
        except TopicBusyError as e:
            raise AdminError(412, str(e)) from None
        if name.partition_index < 0:
            await delete_topic_policies(broker.store, name)
        return web.Response(status=204)

    @routes.put(base + "/{topic}")
    async def create_topic(request: web.Request) -> web.Response:
        name = requests.topic(request)
        await requests.require_namespace(broker, name.namespace_name)
        assert broker.store is not None
        if await broker.configuration_store.get(partitioned_key(name)) is not None:
            raise AdminError(409, f"This topic already exists: {name} is a partitioned topic")
        if name.partition_index >= 0:
            parent = name.partitioned_topic_name
            record = await read_partitioned(broker.configuration_store, parent)
            if record is not None and record.deleted:
                raise AdminError(409, f"Topic {name} cannot be created: {parent} is being deleted")
        if await requests.stored_or_loaded(broker, name):
            raise AdminError(409, f"This topic already exists: {name}")
        await broker.get_topic(name)
        return web.Response(status=204)

    @routes.get(base)
    async def list_topics(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await requests.require_namespace(broker, namespace)
        return web.json_response(
            await broker.list_topics(namespace, (request.match_info["domain"],))
        )

    @routes.get(base + "/{topic}/subscriptions")
    async def subscriptions(request: web.Request) -> web.Response:
        topic = await requests.existing_topic(broker, requests.topic(request))
        persistent = topic.name.persistent  # readers' subscriptions are not listed
        return web.json_response(
            sorted(s for s, sub in topic.subscriptions.items() if sub.durable or not persistent)
        )

    @routes.delete(base + "/{topic}/subscription/{subscription}")
    async def delete_subscription(request: web.Request) -> web.Response:
        topic = await requests.existing_topic(broker, requests.topic(request))
        try:
            await topic.delete_subscription(
                request.match_info["subscription"], force=requests.flag(request, "force")
            )
        except SubscriptionNotFoundError as e:
            raise AdminError(404, str(e)) from None
        except SubscriptionBusyError as e:
            raise AdminError(412, str(e)) from None
        return web.Response(status=204)
