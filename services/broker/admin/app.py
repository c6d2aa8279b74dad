"""Admin REST on the broker's HTTP port, on Pulsar's ``/admin/v2/...`` paths (a first subset):

- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` body: the partition count
- ``POST   /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` body: a larger count
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` -> ``{"partitions": N}``
- ``DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` (``?force``): every
  partition's data, then the metadata (``delete_partitioned_topic``)
- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}`` creates a non-partitioned topic
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}`` lists topics (loaded ones and partitions)
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/partitioned`` lists partitioned topics
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscriptions``
- ``DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{sub}`` (``?force``)
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats`` and ``.../internalStats``
- ``GET    /admin/v2/namespaces/{tenant}/{namespace}`` the namespace's policy document
- ``GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/{policy}`` one policy, for
  ``retention``, ``messageTTL``, ``deduplication``, ``autoTopicCreation`` (see ``policies``)
- ``GET    /health`` (also ``/admin/v2/brokers/health``)
- the cluster's routes (``admin_cluster``) and the schema registry's (``admin_schemas``)

Partitioned-topic metadata lives in the metadata store at
``/magnetar/admin/partitioned-topics/<tenant>/<namespace>/<domain>/<topic>`` as
``{"partitions": N}``, with ``"deleted": true`` while a delete is under way
(``policies.PartitionedTopicRecord``).

Errors are Pulsar's: its status codes and a ``{"reason": ...}`` body, produced in one place (the
``_errors`` middleware): handlers raise ``AdminError``; an unexpected exception is logged once
with the request and answered 500 with a reason, so every request gets an answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aiohttp import ClientError, ClientResponse, ClientSession, ClientTimeout, web
from prometheus_client import generate_latest
from yarl import URL

from magnetar.broker.admin.cluster import ClusterAdminError, add_cluster_routes
from magnetar.broker.admin.schemas import SchemaAdminError, add_schema_routes
from magnetar.broker.cluster.bundles import load_or_create
from magnetar.broker.cluster.lookup import lookup
from magnetar.broker.config import TopicSettings
from magnetar.broker.errors import (
    NamespaceNotFoundError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    TopicBusyError,
    TopicNotFoundError,
    TopicNotOwnedError,
)
from magnetar.broker.model.broker_info import BrokerInfo
from magnetar.broker.model.keys import MANAGED_LEDGERS_PATH, decode_name, managed_ledger_key
from magnetar.broker.model.topic_name import PARTITION_SUFFIX, InvalidTopicNameError, TopicName
from magnetar.broker.namespace import policies
from magnetar.broker.namespace.policies import (
    PartitionCountError,
    PartitionedMetadataError,
    PartitionedTopicRecord,
    PolicyError,
    parse_document,
)
from magnetar.broker.namespace.records import (
    NAMESPACES_PATH,
    TENANTS_PATH,
    partitioned_key,
    partitioned_topics,
    read_partitioned,
    valid_name,
)
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.common.metadata import NOT_EXISTS, BadVersionError

if TYPE_CHECKING:
    from magnetar.broker.broker import Broker
    from magnetar.broker.topics.nonpersistent import NonPersistentTopic

log = logging.getLogger(__name__)


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    # Pulsar's admin API answers errors as {"reason": ...}.
    return web.json_response({"reason": reason}, status=status, headers=headers)


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
    """The one error path: every failure becomes Pulsar's status and ``{"reason": ...}``."""
    try:
        return await handler(request)
    except (AdminError, ClusterAdminError, SchemaAdminError) as e:
        return _error(e.status, e.reason)
    except InvalidTopicNameError as e:
        return _error(412, f"Topic name is not valid: {e}")
    except NamespaceNotFoundError as e:  # deleted between our check and the topic's load
        return _error(404, f"Namespace does not exist: {e}")
    except TopicNotFoundError as e:
        return _error(404, str(e))
    except TopicNotOwnedError as e:
        # Pulsar: a topic's admin calls are answered by its owner; others redirect there.
        if e.owner is None:
            return _error(503, str(e))
        raise web.HTTPTemporaryRedirect(f"{e.owner.http_url}{request.path_qs}") from None
    except web.HTTPException as e:
        if e.status < 400:
            raise
        # aiohttp's own answers (no such path, method not allowed, body too large), same shape.
        allow = e.headers.get("Allow")
        return _error(e.status, e.reason, {"Allow": allow} if allow else None)
    except Exception as e:
        log.exception("admin %s %s failed", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}: {e}")


async def _json_body(request: web.Request) -> Any:
    """The request body as JSON; anything unparseable (bad UTF-8, bad JSON, nesting deep
    enough to exhaust the parser's recursion) is the client's error: 400."""
    try:
        return json.loads(await request.text())
    except RecursionError:
        raise AdminError(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise AdminError(400, f"request body is not valid JSON: {e}") from None


def _tenant(request: web.Request) -> str:
    tenant = request.match_info["tenant"]
    if not valid_name(tenant):
        raise AdminError(412, f"Tenant name is not valid: {tenant!r}")
    return tenant


def _namespace(request: web.Request) -> str:
    """``tenant/namespace`` from the path; Pulsar answers 412 for an invalid part of either."""
    tenant, namespace = request.match_info["tenant"], request.match_info["namespace"]
    if not valid_name(tenant) or not valid_name(namespace):
        raise AdminError(412, f"Namespace name is not valid: {tenant}/{namespace}")
    return f"{tenant}/{namespace}"


def _topic(request: web.Request) -> TopicName:
    m = request.match_info
    _namespace(request)
    return TopicName.parse(f"{m['domain']}://{m['tenant']}/{m['namespace']}/{m['topic']}")


async def _require_namespace(broker: Broker, namespace: str) -> None:
    assert broker.store is not None
    if await broker.store.get(f"{NAMESPACES_PATH}/{namespace}") is None:
        raise AdminError(404, f"Namespace does not exist: {namespace}")


async def _stored_or_loaded(broker: Broker, name: TopicName) -> bool:
    """A non-partitioned topic that exists as such: loaded here, or (persistent) stored."""
    assert broker.store is not None
    if str(name) in broker.topics:
        return True
    if not name.persistent:
        return False
    return await broker.store.get(managed_ledger_key(name.managed_ledger_name)) is not None


async def _existing_topic(broker: Broker, name: TopicName) -> PersistentTopic | NonPersistentTopic:
    """The topic, loaded if it is stored but not loaded yet; 404 if it does not exist (nothing
    is created). A partition of an existing partitioned topic exists, as in Pulsar."""
    topic = broker.topics.get(str(name))
    if topic is not None:
        return topic
    if not name.persistent or not await broker.topic_exists(name):
        raise AdminError(404, f"Topic {name} not found")
    return await broker.get_topic(name)


async def _bundle_count_body(request: web.Request) -> int | None:
    """``bundles.numBundles`` of a namespace-creation body, if one was sent (1..1024)."""
    if not request.can_read_body:
        return None
    body = await _json_body(request)
    bundles = body.get("bundles") if isinstance(body, dict) else None
    if bundles is None:
        return None
    count = bundles.get("numBundles") if isinstance(bundles, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1024:
        raise AdminError(412, f"bundles.numBundles must be between 1 and 1024, got {count!r}")
    return count


def _limit(broker: Broker) -> int:
    return broker.config.max_num_partitions_per_partitioned_topic


def _partition_count_body(value: Any, limit: int) -> int:
    try:
        return policies.check_partition_count(value, limit)
    except PartitionCountError as e:
        raise AdminError(406, str(e)) from None
    except PolicyError as e:
        raise AdminError(400, str(e)) from None


def build_app(broker: Broker) -> web.Application:
    routes = web.RouteTableDef()
    base = "/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}"
    add_cluster_routes(routes, broker)  # first: their paths are more specific than policies'
    add_schema_routes(routes, broker)

    @routes.get("/health")
    @routes.get("/admin/v2/brokers/health")
    async def health(request: web.Request) -> web.Response:
        # Unhealthy once this broker can no longer write safely: its metadata session may
        # have expired (its bundles may be someone else's).
        if not broker.may_serve():
            raise AdminError(503, "the broker's metadata session expired or is not open")
        return web.Response(text="ok")

    @routes.get("/admin/v2/tenants")
    async def list_tenants(request: web.Request) -> web.Response:
        assert broker.store is not None
        return web.json_response(await broker.store.children(TENANTS_PATH))

    @routes.put("/admin/v2/tenants/{tenant}")
    async def create_tenant(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant = _tenant(request)
        try:
            await broker.store.put(f"{TENANTS_PATH}/{tenant}", b"{}", NOT_EXISTS)
        except BadVersionError:
            raise AdminError(409, "Tenant already exists") from None
        return web.Response(status=204)

    @routes.get("/admin/v2/namespaces/{tenant}")
    async def list_namespaces(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant = _tenant(request)
        if await broker.store.get(f"{TENANTS_PATH}/{tenant}") is None:
            raise AdminError(404, f"Tenant does not exist: {tenant}")
        names = await broker.store.children(f"{NAMESPACES_PATH}/{tenant}")
        return web.json_response([f"{tenant}/{n}" for n in names])

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}")
    async def create_namespace(request: web.Request) -> web.Response:
        assert broker.store is not None
        namespace = _namespace(request)
        tenant = request.match_info["tenant"]
        if await broker.store.get(f"{TENANTS_PATH}/{tenant}") is None:
            raise AdminError(404, f"Tenant does not exist: {tenant}")
        count = await _bundle_count_body(request)
        try:
            await broker.store.put(f"{NAMESPACES_PATH}/{namespace}", b"{}", NOT_EXISTS)
        except BadVersionError:
            raise AdminError(409, "Namespace already exists") from None
        if count is not None:  # Pulsar's policies body: {"bundles": {"numBundles": n}}
            await load_or_create(broker.store, namespace, count)
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
        namespace = _namespace(request)
        key, check = _policy_field(request)
        value = None
        if request.method == "POST":
            body = await _json_body(request)
            try:
                value = check(body, broker.config)
            except PartitionCountError as e:
                raise AdminError(406, str(e)) from None
            except PolicyError as e:
                raise AdminError(400, f"{request.match_info['policy']}: {e}") from None
        await _update_policies(broker, f"{NAMESPACES_PATH}/{namespace}", key, value)
        broker.policies_changed()
        return web.Response(status=204)

    @routes.get(base + "/{topic}/stats")
    async def stats(request: web.Request) -> web.Response:
        topic = await _existing_topic(broker, _topic(request))
        return web.json_response(topic.stats())

    @routes.get(base + "/{topic}/internalStats")
    async def internal_stats(request: web.Request) -> web.Response:
        name = _topic(request)
        topic = await _existing_topic(broker, name)
        if not isinstance(topic, PersistentTopic):
            raise AdminError(412, f"topic {name} is non-persistent: it has no storage")
        return web.json_response(topic.internal_stats())

    @routes.delete(base + "/{topic}")
    async def delete_topic(request: web.Request) -> web.Response:
        name = _topic(request)
        force = request.query.get("force", "false") == "true"
        await _require_namespace(broker, name.namespace_name)
        if not await _stored_or_loaded(broker, name):
            raise AdminError(404, f"Topic {name} not found")
        try:
            await broker.delete_topic(name, force=force)
        except TopicBusyError as e:
            raise AdminError(412, str(e)) from None
        return web.Response(status=204)

    @routes.put(base + "/{topic}/partitions")
    async def create_partitioned(request: web.Request) -> web.Response:
        name = _topic(request)
        if PARTITION_SUFFIX in name.local_name:
            raise AdminError(412, f"Partitioned Topic Name should not contain '{PARTITION_SUFFIX}'")
        partitions = _partition_count_body(await _json_body(request), _limit(broker))
        await create_partitioned_topic(broker, name, partitions)
        return web.Response(status=204)

    @routes.post(base + "/{topic}/partitions")
    async def update_partitioned(request: web.Request) -> web.Response:
        name = _topic(request)
        partitions = _partition_count_body(await _json_body(request), _limit(broker))
        await update_partitioned_topic(broker, name, partitions)
        return web.Response(status=204)

    @routes.get(base + "/{topic}/partitions")
    async def get_partitions(request: web.Request) -> web.Response:
        record = await read_partitioned(broker.store, _topic(request))
        if record is None:
            return web.json_response({"partitions": 0})
        answer: dict[str, Any] = {"partitions": record.partitions}
        if record.deleted:  # an interrupted delete: the next DELETE finishes it
            answer["deleted"] = True
        return web.json_response(answer)

    #: Partitioned topics being deleted by this broker: a second DELETE waits for the first.
    deleting: dict[str, asyncio.Event] = {}

    @routes.delete(base + "/{topic}/partitions")
    async def delete_partitioned(request: web.Request) -> web.Response:
        name = _topic(request)
        force = request.query.get("force", "false") == "true"
        await _require_namespace(broker, name.namespace_name)
        key = str(name)
        while key in deleting:
            await deleting[key].wait()
        done = deleting[key] = asyncio.Event()
        try:
            await delete_partitioned_topic(broker, name, force=force)
        finally:
            del deleting[key]
            done.set()
        return web.Response(status=204)

    @routes.put(base + "/{topic}")
    async def create_topic(request: web.Request) -> web.Response:
        name = _topic(request)
        await _require_namespace(broker, name.namespace_name)
        assert broker.store is not None
        if await broker.store.get(partitioned_key(name)) is not None:
            raise AdminError(409, f"This topic already exists: {name} is a partitioned topic")
        if name.partition_index >= 0:
            parent = name.partitioned_topic_name
            record = await read_partitioned(broker.store, parent)
            if record is not None and record.deleted:
                raise AdminError(409, f"Topic {name} cannot be created: {parent} is being deleted")
        if await _stored_or_loaded(broker, name):
            raise AdminError(409, f"This topic already exists: {name}")
        await broker.get_topic(name)
        return web.Response(status=204)

    @routes.get(base)
    async def list_topics(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        await _require_namespace(broker, namespace)
        return web.json_response(
            await broker.list_topics(namespace, (request.match_info["domain"],))
        )

    @routes.get(base + "/partitioned")
    async def list_partitioned(request: web.Request) -> web.Response:
        m = request.match_info
        await _require_namespace(broker, _namespace(request))
        return web.json_response(
            await partitioned_topics(broker.store, m["tenant"], m["namespace"], m["domain"])
        )

    @routes.get(base + "/{topic}/subscriptions")
    async def subscriptions(request: web.Request) -> web.Response:
        topic = await _existing_topic(broker, _topic(request))
        persistent = topic.name.persistent  # readers' subscriptions are not listed
        return web.json_response(
            sorted(s for s, sub in topic.subscriptions.items() if sub.durable or not persistent)
        )

    @routes.delete(base + "/{topic}/subscription/{subscription}")
    async def delete_subscription(request: web.Request) -> web.Response:
        topic = await _existing_topic(broker, _topic(request))
        force = request.query.get("force", "false") == "true"
        try:
            await topic.delete_subscription(request.match_info["subscription"], force=force)
        except SubscriptionNotFoundError as e:
            raise AdminError(404, str(e)) from None
        except SubscriptionBusyError as e:
            raise AdminError(412, str(e)) from None
        return web.Response(status=204)

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        m = broker.metrics
        m.topics.set(len(broker.topics))
        m.connections.set(len(broker.connections))
        m.entries_in.set(sum(t.msg_in for t in broker.topics.values()))
        m.bytes_in.set(sum(t.bytes_in for t in broker.topics.values()))
        return web.Response(body=generate_latest(m.registry), content_type="text/plain")

    app = web.Application(middlewares=[_errors])
    app.add_routes(routes)
    return app


async def create_partitioned_topic(broker: Broker, name: TopicName, partitions: int) -> None:
    """Store a partitioned topic's metadata, as Pulsar refuses it: 404 without the namespace,
    409 over an existing non-partitioned topic (its backlog would hide behind the partitions)
    or partitioned one. ``partitions`` is already bounded."""
    assert broker.store is not None
    await _require_namespace(broker, name.namespace_name)
    if await _stored_or_loaded(broker, name):
        raise AdminError(409, f"This topic already exists: {name} is a non-partitioned topic")
    try:
        await broker.store.put(
            partitioned_key(name), PartitionedTopicRecord(partitions).to_bytes(), NOT_EXISTS
        )
    except BadVersionError:
        existing = await read_partitioned(broker.store, name)
        if existing is not None and existing.deleted:
            raise AdminError(
                409,
                f"Partitioned topic already exists: {name} is being deleted (a delete was "
                "interrupted): DELETE it again to finish, then create it",
            ) from None
        raise AdminError(409, f"Partitioned topic already exists: {name}") from None
    log.info("partitioned topic %s created (%d partitions)", name, partitions)


async def update_partitioned_topic(broker: Broker, name: TopicName, partitions: int) -> None:
    """Grow a partitioned topic (Pulsar never shrinks one: 422 otherwise), by CAS."""
    assert broker.store is not None
    while True:
        found = await broker.store.get(partitioned_key(name))
        if found is None:
            raise AdminError(404, f"Partitioned topic {name} does not exist")
        record = PartitionedTopicRecord.from_bytes(found.value, str(name))
        if record.deleted:
            raise AdminError(
                409, f"Partitioned topic {name} is being deleted: DELETE it again to finish"
            )
        current = record.partitions
        if partitions <= current:
            raise AdminError(
                422,
                "Number of new partitions must be greater than existing number of partitions "
                f"({current})",
            )
        try:
            await broker.store.put(
                partitioned_key(name),
                replace(record, partitions=partitions).to_bytes(),
                found.version,
            )
        except BadVersionError:
            continue  # changed meanwhile: check against the new count
        log.info("partitioned topic %s grown from %d to %d partitions", name, current, partitions)
        return


#: Longest one partition's delete, or the count of its clients, may take at its owner.
PARTITION_DELETE_TIMEOUT_S = 60.0
#: Times a partition that moved to another broker while being deleted is followed.
PARTITION_DELETE_ATTEMPTS = 3


class PartitionBusyError(Exception):
    """A partition still has producers or consumers (delete without force)."""


async def delete_partitioned_topic(broker: Broker, name: TopicName, *, force: bool) -> None:
    """Delete a partitioned topic: every partition's data (managed ledger, ledgers, cursors),
    then its metadata, in Pulsar's order (``internalDeletePartitionedTopic``):

    1. Without ``force``, the partitions' producers and consumers are counted, each partition
       at the broker that serves it: any at all is 412 and nothing changes.
    2. The record is marked ``deleted`` (CAS). From then on no client gets a partition
       (``Broker.check_partition``), none is created, the topic cannot grow, and
       PARTITIONED_METADATA answers TopicNotFound: what is deleted stays deleted.
    3. Each partition goes through the plain topic delete (``Broker.delete_topic``; with
       ``force`` its clients are closed first) at the broker owning its bundle: this one if it
       owns it, or takes it because nobody does; else the plain DELETE is sent to the owner,
       which alone knows the partition's clients and may have it loaded, so its data is never
       deleted behind the owner's back. Partitions already gone are skipped.
    4. The record goes last, once every partition is gone, so there is never a partition
       without its parent.

    Interrupted anywhere (a crash, an owner unreachable, a client that connected between 1 and
    2), the record stays, marked: the topic is still listed as partitioned, refuses clients, and
    the next DELETE (``force`` or not) carries on from where this one stopped.
    """
    assert broker.store is not None
    key = partitioned_key(name)
    while True:
        found = await broker.store.get(key)
        if found is None:
            raise AdminError(404, f"Partitioned topic {name} does not exist")
        try:
            record = PartitionedTopicRecord.from_bytes(found.value, str(name))
        except PartitionedMetadataError as e:
            log.warning("%s; deleting the partitions stored for it", e)
            record = PartitionedTopicRecord(0)
        partitions = await _partitions_to_delete(broker, name, record.partitions)
        if record.deleted:
            log.info("partitioned topic %s: finishing an interrupted delete", name)
            break
        if not force:
            await _refuse_if_busy(broker, name, partitions)
        try:
            await broker.store.put(key, replace(record, deleted=True).to_bytes(), found.version)
        except BadVersionError:
            continue  # grown or marked meanwhile: look again
        log.info(
            "partitioned topic %s: marked deleted; deleting %d partitions", name, len(partitions)
        )
        break
    async with ClientSession(timeout=ClientTimeout(total=PARTITION_DELETE_TIMEOUT_S)) as http:
        for partition in partitions:
            await _delete_partition(broker, http, name, partition, force)
        # A client that passed the partition check just before the mark may have stored its
        # partition after that partition was looked at: look once more before the record goes.
        for partition in await _partitions_to_delete(broker, name, 0):
            await _delete_partition(broker, http, name, partition, force)
    await broker.store.delete(key)
    log.info("partitioned topic %s deleted (%d partitions)", name, len(partitions))


async def _partitions_to_delete(broker: Broker, name: TopicName, count: int) -> list[TopicName]:
    """Partitions 0..``count``-1 (a count beyond ``max_num_partitions_per_partitioned_topic``, a
    damaged record, is not walked), and every partition stored beyond them."""
    assert broker.store is not None
    indexes = set(range(count)) if 0 < count <= _limit(broker) else set()
    prefix = f"{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}{PARTITION_SUFFIX}"
    for segment in await broker.store.children(MANAGED_LEDGERS_PATH):
        stored = decode_name(segment)
        index = stored.removeprefix(prefix)
        if stored.startswith(prefix) and index.isdigit() and str(int(index)) == index:
            indexes.add(int(index))
    return [name.partition(i) for i in sorted(indexes)]


async def _owner_of(broker: Broker, name: TopicName) -> BrokerInfo | None:
    """The broker serving ``name``'s bundle as the store says now (None: nobody)."""
    assert broker.ownership is not None
    return await broker.ownership.read_owner(name.namespace_name, await broker.bundle_of(name))


def _clients_in(stats: dict[str, Any]) -> int:
    """Producers and consumers in a topic's stats (``publishers`` is a count in Magnetar's
    stats, a list in Pulsar's)."""
    publishers = stats.get("publishers", 0)
    count = len(publishers) if isinstance(publishers, list) else int(publishers)
    return count + sum(len(s.get("consumers", ())) for s in stats.get("subscriptions", {}).values())


async def _refuse_if_busy(broker: Broker, name: TopicName, partitions: list[TopicName]) -> None:
    """412 if any partition has a producer or consumer, counted where the partition is served
    (a partition loaded nowhere has none)."""
    busy: dict[str, int] = {}
    async with ClientSession(timeout=ClientTimeout(total=PARTITION_DELETE_TIMEOUT_S)) as http:
        for partition in partitions:
            topic = broker.topics.get(str(partition))
            if topic is not None:
                clients = _clients_in(topic.stats())
            else:
                owner = await _owner_of(broker, partition)
                if owner is None or owner.broker_id == broker.info.broker_id:
                    continue  # served nowhere, or here and not loaded
                clients = await _remote_clients(http, owner, partition)
            if clients:
                busy[partition.local_name] = clients
    if busy:
        raise AdminError(
            412,
            f"Partitioned topic {name} has {sum(busy.values())} producer(s)/consumer(s) "
            f"connected (on {', '.join(sorted(busy))}); use force=true",
        )


def _topic_url(owner: BrokerInfo, name: TopicName) -> URL:
    return URL(owner.http_url).joinpath(
        "admin", "v2", name.domain, name.tenant, name.namespace, name.local_name
    )


async def _remote_clients(http: ClientSession, owner: BrokerInfo, name: TopicName) -> int:
    """Clients of ``name`` at ``owner`` (its stats; redirects to a newer owner followed)."""
    try:
        async with http.get(_topic_url(owner, name) / "stats") as response:
            if response.status == 404:
                return 0
            if response.status != 200:
                raise AdminError(
                    503,
                    f"partition {name}: its clients cannot be counted at {owner.broker_id} "
                    f"(HTTP {response.status}: {await _reason(response)}); nothing was deleted",
                )
            return _clients_in(await response.json())
    except (ClientError, TimeoutError) as e:
        raise AdminError(
            503,
            f"partition {name}: its owner {owner.broker_id} did not answer ({e!r}); "
            "nothing was deleted",
        ) from None


async def _reason(response: ClientResponse) -> str:
    text = await response.text()
    try:
        return str(json.loads(text)["reason"])
    except (ValueError, KeyError, TypeError):
        return text[:200]


async def _delete_partition(
    broker: Broker, http: ClientSession, parent: TopicName, name: TopicName, force: bool
) -> None:
    """Delete one partition where it is served (see ``delete_partitioned_topic``); a partition
    that is gone already is fine."""
    try:
        for _ in range(PARTITION_DELETE_ATTEMPTS):
            if name.persistent and not await _stored_or_loaded(broker, name):
                return
            if not name.persistent and str(name) not in broker.topics:
                if await _owner_of(broker, name) is None:
                    return  # served nowhere: a non-persistent partition exists only where served
            # authoritative: an unowned bundle is taken here rather than placed by the leader.
            served_by = (await lookup(broker, name, authoritative=True)).broker
            if served_by.broker_id != broker.info.broker_id:
                await _forward_delete(http, served_by, name, force)
                return
            try:
                if await _stored_or_loaded(broker, name):
                    await broker.delete_topic(name, force=force)
                return
            except TopicNotOwnedError:
                continue  # moved meanwhile: follow it
        raise AdminError(
            503,
            f"partition {name} kept moving between brokers while being deleted; partitioned "
            f"topic {parent} stays marked deleted: DELETE it again to finish",
        )
    except (TopicBusyError, PartitionBusyError) as e:
        raise AdminError(
            412,
            f"{e}: it connected while partitioned topic {parent} was being deleted; the topic "
            "stays marked deleted and refuses new clients: DELETE it again to finish (force=true "
            "closes the clients)",
        ) from None


async def _forward_delete(
    http: ClientSession, owner: BrokerInfo, name: TopicName, force: bool
) -> None:
    """The plain topic DELETE at ``owner`` (redirects to a newer owner followed)."""
    url = _topic_url(owner, name).with_query(force="true" if force else "false")
    try:
        async with http.delete(url) as response:
            if response.status in (204, 404):  # deleted, or gone already
                return
            reason = await _reason(response)
            if response.status == 412:
                raise PartitionBusyError(reason)
            raise AdminError(
                503,
                f"partition {name} was not deleted at {owner.broker_id} (HTTP {response.status}: "
                f"{reason}); partitioned topic {name.partitioned_topic_name} stays marked "
                "deleted: DELETE it again to finish",
            )
    except (ClientError, TimeoutError) as e:
        raise AdminError(
            503,
            f"partition {name}: its owner {owner.broker_id} did not answer ({e!r}); partitioned "
            f"topic {name.partitioned_topic_name} stays marked deleted: DELETE it again to finish",
        ) from None


#: Admin path segment -> (field in the namespace's policy document, value check).
POLICY_FIELDS: dict[str, tuple[str, Callable[[Any, TopicSettings], Any]]] = {
    "retention": ("retention_policies", lambda v, _: policies.check_retention(v)),
    "messageTTL": ("message_ttl_in_seconds", lambda v, _: policies.check_ttl(v)),
    "deduplication": (
        "deduplicationEnabled",
        lambda v, _: policies.check_bool(v, "deduplication"),
    ),
    "autoTopicCreation": (
        "autoTopicCreationOverride",
        lambda v, limits: policies.check_auto_topic_creation(
            v, limits.max_num_partitions_per_partitioned_topic
        ),
    ),
}


def _policy_field(request: web.Request) -> tuple[str, Callable[[Any, TopicSettings], Any]]:
    field = POLICY_FIELDS.get(request.match_info["policy"])
    if field is None:
        raise AdminError(404, f"unknown namespace policy {request.match_info['policy']!r}")
    return field


async def _policy_document(broker: Broker, request: web.Request) -> dict[str, Any]:
    assert broker.store is not None
    namespace = _namespace(request)
    found = await broker.store.get(f"{NAMESPACES_PATH}/{namespace}")
    if found is None:
        raise AdminError(404, f"Namespace does not exist: {namespace}")
    return parse_document(found.value)


async def _update_policies(broker: Broker, key: str, field: str, value: Any) -> None:
    """Set (or remove, for None) one field of a namespace's policy document, by CAS."""
    assert broker.store is not None
    while True:
        found = await broker.store.get(key)
        if found is None:
            raise AdminError(
                404, f"Namespace does not exist: {key.removeprefix(NAMESPACES_PATH + '/')}"
            )
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
