"""Admin REST on the broker's HTTP port, on Pulsar's ``/admin/v2/...`` paths (a first subset):

- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` body: the partition count
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` -> ``{"partitions": N}``
- ``DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions``
- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}`` creates a non-partitioned topic
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}`` lists topics (loaded ones and partitions)
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/partitioned`` lists partitioned topics
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscriptions``
- ``GET    /health`` (also ``/admin/v2/brokers/health``)

Partitioned-topic metadata lives in the metadata store at
``/magnetar/admin/partitioned-topics/<tenant>/<namespace>/<domain>/<topic>`` as
``{"partitions": N}``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.topic import TopicBusyError
from magnetar.broker.topic_name import InvalidTopicNameError, TopicName
from magnetar.common.metadata import NOT_EXISTS, BadVersionError

if TYPE_CHECKING:
    from magnetar.broker.broker import Broker

PARTITIONED_PATH = "/magnetar/admin/partitioned-topics"
TENANTS_PATH = "/magnetar/admin/tenants"
NAMESPACES_PATH = "/magnetar/admin/namespaces"


async def ensure_default_namespace(broker: Broker) -> None:
    """``public/default`` exists from the first start, as in Pulsar."""
    assert broker.store is not None
    for key in (f"{TENANTS_PATH}/public", f"{NAMESPACES_PATH}/public/default"):
        try:
            await broker.store.put(key, b"{}", NOT_EXISTS)
        except BadVersionError:
            pass


async def namespace_exists(broker: Broker, namespace: str) -> bool:
    assert broker.store is not None
    return await broker.store.get(f"{NAMESPACES_PATH}/{namespace}") is not None


def partitioned_key(name: TopicName) -> str:
    return f"{PARTITIONED_PATH}/{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}"


async def partition_count(broker: Broker, name: TopicName) -> int:
    """Partitions of ``name`` (0: not a partitioned topic)."""
    assert broker.store is not None
    found = await broker.store.get(partitioned_key(name))
    return int(json.loads(found.value)["partitions"]) if found is not None else 0


def _error(status: int, reason: str) -> web.Response:
    # Pulsar's admin API answers errors as {"reason": ...}.
    return web.json_response({"reason": reason}, status=status)


def _topic(request: web.Request) -> TopicName:
    m = request.match_info
    return TopicName.parse(f"{m['domain']}://{m['tenant']}/{m['namespace']}/{m['topic']}")


def build_app(broker: Broker) -> web.Application:
    routes = web.RouteTableDef()
    base = "/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}"

    @routes.get("/health")
    @routes.get("/admin/v2/brokers/health")
    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    @routes.get("/admin/v2/tenants")
    async def list_tenants(request: web.Request) -> web.Response:
        assert broker.store is not None
        return web.json_response(await broker.store.children(TENANTS_PATH))

    @routes.put("/admin/v2/tenants/{tenant}")
    async def create_tenant(request: web.Request) -> web.Response:
        assert broker.store is not None
        try:
            await broker.store.put(
                f"{TENANTS_PATH}/{request.match_info['tenant']}", b"{}", NOT_EXISTS
            )
        except BadVersionError:
            return _error(409, "tenant already exists")
        return web.Response(status=204)

    @routes.get("/admin/v2/namespaces/{tenant}")
    async def list_namespaces(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant = request.match_info["tenant"]
        if await broker.store.get(f"{TENANTS_PATH}/{tenant}") is None:
            return _error(404, f"tenant {tenant} does not exist")
        names = await broker.store.children(f"{NAMESPACES_PATH}/{tenant}")
        return web.json_response([f"{tenant}/{n}" for n in names])

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}")
    async def create_namespace(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant, namespace = request.match_info["tenant"], request.match_info["namespace"]
        if await broker.store.get(f"{TENANTS_PATH}/{tenant}") is None:
            return _error(404, f"tenant {tenant} does not exist")
        try:
            await broker.store.put(f"{NAMESPACES_PATH}/{tenant}/{namespace}", b"{}", NOT_EXISTS)
        except BadVersionError:
            return _error(409, "namespace already exists")
        return web.Response(status=204)

    @routes.get(base + "/{topic}/stats")
    async def stats(request: web.Request) -> web.Response:
        try:
            name = _topic(request)
        except InvalidTopicNameError as e:
            return _error(400, str(e))
        topic = broker.topics.get(str(name))
        if topic is None:
            return _error(404, f"topic {name} is not loaded on this broker")
        return web.json_response(topic.stats())

    @routes.delete(base + "/{topic}")
    async def delete_topic(request: web.Request) -> web.Response:
        try:
            name = _topic(request)
        except InvalidTopicNameError as e:
            return _error(400, str(e))
        force = request.query.get("force", "false") == "true"
        try:
            await broker.delete_topic(name, force=force)
        except TopicBusyError as e:
            return _error(412, str(e))
        return web.Response(status=204)

    @routes.put(base + "/{topic}/partitions")
    async def create_partitioned(request: web.Request) -> web.Response:
        try:
            name = _topic(request)
            partitions = int((await request.text()).strip())
        except (InvalidTopicNameError, ValueError) as e:
            return _error(400, f"expected a topic name and a partition count in the body: {e}")
        if partitions < 1:
            return _error(400, "the partition count must be at least 1")
        assert broker.store is not None
        try:
            await broker.store.put(
                partitioned_key(name), json.dumps({"partitions": partitions}).encode(), NOT_EXISTS
            )
        except BadVersionError:
            return _error(409, f"partitioned topic {name} already exists")
        return web.Response(status=204)

    @routes.get(base + "/{topic}/partitions")
    async def get_partitions(request: web.Request) -> web.Response:
        try:
            name = _topic(request)
        except InvalidTopicNameError as e:
            return _error(400, str(e))
        return web.json_response({"partitions": await partition_count(broker, name)})

    @routes.delete(base + "/{topic}/partitions")
    async def delete_partitioned(request: web.Request) -> web.Response:
        try:
            name = _topic(request)
        except InvalidTopicNameError as e:
            return _error(400, str(e))
        assert broker.store is not None
        if await partition_count(broker, name) == 0:
            return _error(404, f"partitioned topic {name} does not exist")
        await broker.store.delete(partitioned_key(name))
        return web.Response(status=204)

    @routes.put(base + "/{topic}")
    async def create_topic(request: web.Request) -> web.Response:
        try:
            name = _topic(request)
        except InvalidTopicNameError as e:
            return _error(400, str(e))
        if not name.persistent:
            return _error(412, "non-persistent topics are not served yet")
        await broker.get_topic(name)
        return web.Response(status=204)

    @routes.get(base)
    async def list_topics(request: web.Request) -> web.Response:
        m = request.match_info
        prefix = f"{m['domain']}://{m['tenant']}/{m['namespace']}/"
        names = {n for n in broker.topics if n.startswith(prefix)}
        for partitioned in await _partitioned(broker, m["tenant"], m["namespace"], m["domain"]):
            count = await partition_count(broker, TopicName.parse(partitioned))
            names.update(str(TopicName.parse(partitioned).partition(i)) for i in range(count))
        return web.json_response(sorted(names))

    @routes.get(base + "/partitioned")
    async def list_partitioned(request: web.Request) -> web.Response:
        m = request.match_info
        return web.json_response(
            await _partitioned(broker, m["tenant"], m["namespace"], m["domain"])
        )

    @routes.get(base + "/{topic}/subscriptions")
    async def subscriptions(request: web.Request) -> web.Response:
        try:
            name = _topic(request)
        except InvalidTopicNameError as e:
            return _error(400, str(e))
        topic = broker.topics.get(str(name))
        if topic is None:
            return _error(404, f"topic {name} is not loaded on this broker")
        return web.json_response(sorted(s for s, sub in topic.subscriptions.items() if sub.durable))

    app = web.Application()
    app.add_routes(routes)
    return app


async def _partitioned(broker: Broker, tenant: str, namespace: str, domain: str) -> list[str]:
    assert broker.store is not None
    names = await broker.store.children(f"{PARTITIONED_PATH}/{tenant}/{namespace}/{domain}")
    return sorted(f"{domain}://{tenant}/{namespace}/{n}" for n in names)
