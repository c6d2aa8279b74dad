"""Admin REST on the broker's HTTP port, on Pulsar's ``/admin/v2/...`` paths (a first subset):

- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` body: the partition count
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` -> ``{"partitions": N}``
- ``DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions``
- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}`` creates a non-partitioned topic
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}`` lists topics (loaded ones and partitions)
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/partitioned`` lists partitioned topics
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscriptions``
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats`` and ``.../internalStats``
- ``GET    /admin/v2/namespaces/{tenant}/{namespace}`` the namespace's policy document
- ``GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/{policy}`` one policy, for
  ``retention``, ``messageTTL``, ``deduplication``, ``autoTopicCreation`` (see ``policies``)
- ``GET    /health`` (also ``/admin/v2/brokers/health``)

Partitioned-topic metadata lives in the metadata store at
``/magnetar/admin/partitioned-topics/<tenant>/<namespace>/<domain>/<topic>`` as
``{"partitions": N}``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from magnetar.broker import policies
from magnetar.broker.policies import parse_document
from magnetar.broker.topic import PersistentTopic, TopicBusyError
from magnetar.broker.topic_name import InvalidTopicNameError, TopicName
from magnetar.common.metadata import NOT_EXISTS, BadVersionError

if TYPE_CHECKING:
    from magnetar.broker.broker import Broker
    from magnetar.broker.nonpersistent import NonPersistentTopic

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


class AdminError(Exception):
    """Answered as ``{"reason": ...}`` with this HTTP status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except InvalidTopicNameError as e:
        return _error(400, str(e))
    except AdminError as e:
        return _error(e.status, e.reason)


def _loaded(broker: Broker, name: TopicName) -> PersistentTopic | NonPersistentTopic:
    topic = broker.topics.get(str(name))
    if topic is None:
        raise AdminError(404, f"topic {name} is not loaded on this broker")
    return topic


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

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}")
    async def get_policies(request: web.Request) -> web.Response:
        return web.json_response(await _policy_document(broker, request))

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/{policy}")
    async def get_policy(request: web.Request) -> web.Response:
        key, _check = _policy_field(request)
        return web.json_response((await _policy_document(broker, request)).get(key))

    @routes.post("/admin/v2/namespaces/{tenant}/{namespace}/{policy}")
    @routes.delete("/admin/v2/namespaces/{tenant}/{namespace}/{policy}")
    async def set_policy(request: web.Request) -> web.Response:
        key, check = _policy_field(request)
        value = None
        if request.method == "POST":
            try:
                value = check(json.loads(await request.text()))
            except ValueError as e:  # bad JSON or a PolicyError
                return _error(400, f"{request.match_info['policy']}: {e}")
        try:
            await _update_policies(broker, _namespace_key(request), key, value)
        except KeyError:
            return _error(404, "namespace does not exist")
        broker.policies_changed()
        return web.Response(status=204)

    @routes.get(base + "/{topic}/stats")
    async def stats(request: web.Request) -> web.Response:
        name = _topic(request)
        topic = _loaded(broker, name)
        return web.json_response(topic.stats())

    @routes.get(base + "/{topic}/internalStats")
    async def internal_stats(request: web.Request) -> web.Response:
        name = _topic(request)
        topic = _loaded(broker, name)
        if not isinstance(topic, PersistentTopic):
            return _error(412, f"topic {name} is non-persistent: it has no storage")
        return web.json_response(topic.internal_stats())

    @routes.delete(base + "/{topic}")
    async def delete_topic(request: web.Request) -> web.Response:
        name = _topic(request)
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
        name = _topic(request)
        return web.json_response({"partitions": await partition_count(broker, name)})

    @routes.delete(base + "/{topic}/partitions")
    async def delete_partitioned(request: web.Request) -> web.Response:
        name = _topic(request)
        assert broker.store is not None
        if await partition_count(broker, name) == 0:
            return _error(404, f"partitioned topic {name} does not exist")
        await broker.store.delete(partitioned_key(name))
        return web.Response(status=204)

    @routes.put(base + "/{topic}")
    async def create_topic(request: web.Request) -> web.Response:
        name = _topic(request)
        await broker.get_topic(name)
        return web.Response(status=204)

    @routes.get(base)
    async def list_topics(request: web.Request) -> web.Response:
        m = request.match_info
        namespace = f"{m['tenant']}/{m['namespace']}"
        return web.json_response(await broker.list_topics(namespace, (m["domain"],)))

    @routes.get(base + "/partitioned")
    async def list_partitioned(request: web.Request) -> web.Response:
        m = request.match_info
        return web.json_response(
            await partitioned_topics(broker, m["tenant"], m["namespace"], m["domain"])
        )

    @routes.get(base + "/{topic}/subscriptions")
    async def subscriptions(request: web.Request) -> web.Response:
        name = _topic(request)
        topic = _loaded(broker, name)
        persistent = topic.name.persistent  # readers' subscriptions are not listed
        return web.json_response(
            sorted(s for s, sub in topic.subscriptions.items() if sub.durable or not persistent)
        )

    app = web.Application(middlewares=[_errors])
    app.add_routes(routes)
    return app


#: Admin path segment -> (field in the namespace's policy document, value check).
POLICY_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "retention": ("retention_policies", policies.check_retention),
    "messageTTL": ("message_ttl_in_seconds", policies.check_ttl),
    "deduplication": ("deduplicationEnabled", lambda v: policies.check_bool(v, "deduplication")),
    "autoTopicCreation": ("autoTopicCreationOverride", policies.check_auto_topic_creation),
}


def _policy_field(request: web.Request) -> tuple[str, Callable[[Any], Any]]:
    field = POLICY_FIELDS.get(request.match_info["policy"])
    if field is None:
        raise AdminError(404, f"unknown namespace policy {request.match_info['policy']!r}")
    return field


async def _policy_document(broker: Broker, request: web.Request) -> dict[str, Any]:
    assert broker.store is not None
    found = await broker.store.get(_namespace_key(request))
    if found is None:
        raise AdminError(404, "namespace does not exist")
    return parse_document(found.value)


def _namespace_key(request: web.Request) -> str:
    return f"{NAMESPACES_PATH}/{request.match_info['tenant']}/{request.match_info['namespace']}"


async def _update_policies(broker: Broker, key: str, field: str, value: Any) -> None:
    """Set (or remove, for None) one field of a namespace's policy document, by CAS."""
    assert broker.store is not None
    while True:
        found = await broker.store.get(key)
        if found is None:
            raise KeyError(key)
        document = parse_document(found.value)
        if value is None:
            document.pop(field, None)
        else:
            document[field] = value
        try:
            await broker.store.put(key, json.dumps(document).encode(), found.version)
            return
        except BadVersionError:
            continue  # changed meanwhile: apply to the new version


async def partitioned_topics(broker: Broker, tenant: str, namespace: str, domain: str) -> list[str]:
    assert broker.store is not None
    names = await broker.store.children(f"{PARTITIONED_PATH}/{tenant}/{namespace}/{domain}")
    return sorted(f"{domain}://{tenant}/{namespace}/{n}" for n in names)
