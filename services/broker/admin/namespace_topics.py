"""Admin REST acting on every topic of a namespace (or of one of its bundles), on Pulsar's paths:

- ``GET    /admin/v2/namespaces/{tenant}/{namespace}/topics`` its topics (both domains)
- ``DELETE /admin/v2/namespaces/{tenant}/{namespace}`` (``?force``): refused (409) while it has
  topics; ``force`` deletes them first
- ``POST   /admin/v2/namespaces/{tenant}/{namespace}/clearBacklog`` (and ``.../clearBacklog/{sub}``):
  every subscription (or ``sub``) of every topic acknowledges everything stored
- ``POST   /admin/v2/namespaces/{tenant}/{namespace}/unsubscribe/{sub}``: ``sub`` deleted from
  every topic (412 while it has consumers)
- the same two per bundle: ``.../{tenant}/{namespace}/{bundle}/clearBacklog[/{sub}]`` and
  ``.../{bundle}/unsubscribe/{sub}``

As in Pulsar, these act on the topics loaded by the bundles' owners: a bundle call is answered by
the bundle's owner (307 from another broker); the namespace call does its own bundles here and asks
each other owner for theirs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aiohttp import ClientError, ClientSession, ClientTimeout, web
from yarl import URL

from magnetar.broker.admin import requests
from magnetar.broker.admin.cluster import bundle_named
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.partitioned import delete_partitioned_topic
from magnetar.broker.errors import SubscriptionBusyError, TopicBusyError, TopicNotOwnedError
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.clusters import read_cluster
from magnetar.broker.namespace.policies import parse_document
from magnetar.broker.namespace.records import (
    NAMESPACES_PATH,
    TOPIC_POLICIES_PATH,
    partitioned_topics,
)
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.common.metadata import NoSuchKeyError

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker
    from magnetar.broker.cluster.bundles import BundleRange
    from magnetar.broker.topics.service import Topic

NS = "/admin/v2/namespaces/{tenant}/{namespace}"
#: How long the namespace-wide calls wait on another bundle owner.
FORWARD_TIMEOUT_S = 30.0


async def _local_topics(
    broker: AdminBroker, namespace: str, bundle: BundleRange | None
) -> list[Topic]:
    found = []
    for topic in list(broker.topics.values()):
        if topic.name.namespace_name != namespace:
            continue
        if bundle is None or await broker.bundle_of(topic.name) == bundle:
            found.append(topic)
    return found


async def _clear_backlog(topics: list[Topic], subscription: str | None) -> None:
    for topic in topics:
        if not isinstance(topic, PersistentTopic):
            continue
        for name, sub in list(topic.subscriptions.items()):
            if sub.durable and subscription in (None, name):
                sub.clear_backlog()


async def _unsubscribe(topics: list[Topic], subscription: str) -> None:
    for topic in topics:
        if subscription in topic.subscriptions:
            try:
                await topic.delete_subscription(subscription, force=False)
            except SubscriptionBusyError as e:
                raise AdminError(412, str(e)) from None


async def _each_bundle(broker: AdminBroker, request: web.Request, action: str) -> list[str]:
    """Run ``action`` (the path after the bundle) for each bundle: here for ours, at the owner
    for others'; unowned bundles have no loaded topic. Returns the bundles done here."""
    namespace = requests.namespace(request)
    assert broker.ownership is not None
    local: list[str] = []
    async with ClientSession(
        timeout=ClientTimeout(total=FORWARD_TIMEOUT_S),
        headers=broker.client_credentials.http_headers(),
    ) as http:
        for bundle in await broker.namespace_bundles(namespace):
            owner = await broker.ownership.owner(namespace, bundle)
            if owner is None:
                continue
            if owner.broker_id == broker.info.broker_id:
                local.append(str(bundle))
                continue
            url = URL(owner.http_url).joinpath(
                "admin", "v2", "namespaces", *namespace.split("/"), str(bundle), *action.split("/")
            )
            try:
                async with http.post(url) as response:
                    if response.status not in (204, 404):
                        text = await response.text()
                        try:
                            reason = json.loads(text)["reason"]
                        except (ValueError, KeyError, TypeError):
                            reason = text[:200]
                        raise AdminError(response.status, f"bundle {bundle}: {reason}")
            except (ClientError, TimeoutError) as e:
                raise AdminError(
                    503, f"bundle {bundle}: its owner {owner.broker_id} did not answer ({e!r})"
                ) from None
    return local


async def _owned_bundle(broker: AdminBroker, request: web.Request) -> BundleRange:
    """The path's bundle, which this broker must own (307 to its owner otherwise)."""
    namespace = requests.namespace(request)
    bundle = await bundle_named(broker, namespace, request.match_info["bundle"])
    assert broker.ownership is not None
    owner = await broker.ownership.owner(namespace, bundle)
    if owner is not None and owner.broker_id != broker.info.broker_id:
        raise web.HTTPTemporaryRedirect(f"{owner.http_url}{request.path_qs}")
    return bundle


def add_namespace_topic_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get(NS + "/topics")
    async def topics(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await requests.require_namespace(broker, namespace)
        return web.json_response(
            await broker.list_topics(namespace, ("persistent", "non-persistent"))
        )

    @routes.delete(NS)
    async def delete_namespace(request: web.Request) -> web.Response:
        assert broker.store is not None
        namespace = requests.namespace(request)
        record = await requests.require_namespace(broker, namespace)
        await _check_replication_before_delete(broker, request, namespace, record)
        force = requests.flag(request, "force")
        tenant, local = namespace.split("/")
        partitioned = [
            name
            for domain in ("persistent", "non-persistent")
            for name in await partitioned_topics(broker.configuration_store, tenant, local, domain)
        ]
        plain = [
            name
            for name in await broker.list_topics(namespace, ("persistent", "non-persistent"))
            if TopicName.parse(name).partition_index < 0
        ]
        if (partitioned or plain) and not force:
            raise AdminError(409, "Cannot delete non empty namespace")
        for name in partitioned:
            await delete_partitioned_topic(broker, TopicName.parse(name), force=True)
        for name in plain:
            try:
                await broker.delete_topic(TopicName.parse(name), force=True)
            except TopicNotOwnedError as e:
                raise AdminError(
                    409, f"Cannot delete namespace: topic {name} is served by another broker ({e})"
                ) from None
            except TopicBusyError as e:
                raise AdminError(412, str(e)) from None
        for key in await broker.store.scan(f"{TOPIC_POLICIES_PATH}/{namespace}/"):
            try:  # topics' own policies left by topics deleted outside the admin API
                await broker.store.delete(key)
            except NoSuchKeyError:
                pass
        try:
            await broker.configuration_store.delete(f"{NAMESPACES_PATH}/{namespace}")
        except NoSuchKeyError:
            raise AdminError(404, f"Namespace does not exist: {namespace}") from None
        broker.policies_changed()
        return web.Response(status=204)

    @routes.post(NS + "/clearBacklog")
    async def clear_backlog(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await requests.require_namespace(broker, namespace)
        await _each_bundle(broker, request, "clearBacklog")
        await _clear_backlog(await _local_topics(broker, namespace, None), None)
        return web.Response(status=204)

    @routes.post(NS + "/clearBacklog/{subscription}")
    async def clear_subscription_backlog(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await requests.require_namespace(broker, namespace)
        subscription = request.match_info["subscription"]
        await _each_bundle(broker, request, f"clearBacklog/{subscription}")
        await _clear_backlog(await _local_topics(broker, namespace, None), subscription)
        return web.Response(status=204)

    @routes.post(NS + "/unsubscribe/{subscription}")
    async def unsubscribe(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await requests.require_namespace(broker, namespace)
        subscription = request.match_info["subscription"]
        await _each_bundle(broker, request, f"unsubscribe/{subscription}")
        await _unsubscribe(await _local_topics(broker, namespace, None), subscription)
        return web.Response(status=204)

    @routes.post(NS + "/{bundle}/clearBacklog")
    async def clear_bundle_backlog(request: web.Request) -> web.Response:
        bundle = await _owned_bundle(broker, request)
        topics = await _local_topics(broker, requests.namespace(request), bundle)
        await _clear_backlog(topics, None)
        return web.Response(status=204)

    @routes.post(NS + "/{bundle}/clearBacklog/{subscription}")
    async def clear_bundle_subscription_backlog(request: web.Request) -> web.Response:
        bundle = await _owned_bundle(broker, request)
        topics = await _local_topics(broker, requests.namespace(request), bundle)
        await _clear_backlog(topics, request.match_info["subscription"])
        return web.Response(status=204)

    @routes.post(NS + "/{bundle}/unsubscribe/{subscription}")
    async def unsubscribe_bundle(request: web.Request) -> web.Response:
        bundle = await _owned_bundle(broker, request)
        topics = await _local_topics(broker, requests.namespace(request), bundle)
        await _unsubscribe(topics, request.match_info["subscription"])
        return web.Response(status=204)


async def _check_replication_before_delete(
    broker: AdminBroker, request: web.Request, namespace: str, record: bytes
) -> None:
    """Pulsar's rule for a namespace in the shared configuration store: it is deleted only
    where it is replicated to one cluster at most. Replicated to several, 412; to one other
    cluster only, the call goes there (307 to its ``serviceUrl``), whose topics it deletes."""
    clusters = list(parse_document(record).get("replication_clusters") or [])
    if len(clusters) > 1:
        raise AdminError(
            412,
            f"Cannot delete the global namespace {namespace}. There are still more than one "
            "replication clusters configured.",
        )
    if clusters and clusters[0] != broker.config.cluster_name:
        data = await read_cluster(broker.configuration_store, clusters[0])
        url = data.service_url or data.service_url_tls if data is not None else ""
        if not url:
            raise AdminError(
                412, f"Namespace {namespace} is replicated to {clusters[0]} only, not registered"
            )
        raise web.HTTPTemporaryRedirect(f"{url}{request.path_qs}")
