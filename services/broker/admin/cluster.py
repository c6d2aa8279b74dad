"""Admin REST of the cluster, on Pulsar's paths and JSON shapes: clusters (registered in the
configuration store, Pulsar's ClusterData; the local one answered even if not registered), brokers, the
leader, a namespace's bundles, unloading and splitting bundles, unloading a topic, and the HTTP
lookup. Errors go through the admin app's one error middleware (``errors.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.cluster import bundles as bundle_math
from magnetar.broker.cluster.lookup import LookupKind, lookup
from magnetar.broker.namespace.clusters import (
    ClusterData,
    ClusterDataError,
    cluster_key,
    cluster_names,
    read_cluster,
)
from magnetar.broker.namespace.records import valid_name
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker


async def bundle_named(broker: AdminBroker, namespace: str, text: str) -> bundle_math.BundleRange:
    try:
        wanted = bundle_math.BundleRange.parse(text)
    except ValueError as e:
        raise AdminError(412, f"Bundle range is not valid: {text!r} ({e})") from None
    if wanted not in await broker.namespace_bundles(namespace):
        broker.forget_bundles(namespace)  # split elsewhere meanwhile? read them again
        if wanted not in await broker.namespace_bundles(namespace):
            raise AdminError(404, f"Bundle {namespace}/{text} does not exist")
    return wanted


def add_cluster_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    def owner_url(info_http_url: str, request: web.Request) -> str:
        return f"{info_http_url}{request.path_qs}"

    def configuration_store() -> MetadataStore:
        store = broker.configuration_store
        assert store is not None
        return store

    def local_cluster() -> dict[str, object]:
        info = broker.info
        document: dict[str, object] = {
            "serviceUrl": info.http_url,
            "brokerServiceUrl": info.service_url,
        }
        if info.service_url_tls:
            document["brokerServiceUrlTls"] = info.service_url_tls
        return document

    @routes.get("/admin/v2/clusters")
    async def clusters(request: web.Request) -> web.Response:
        registered = await cluster_names(configuration_store())
        return web.json_response(sorted({*registered, broker.config.cluster_name}))

    @routes.get("/admin/v2/clusters/{cluster}")
    async def cluster(request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        found = await read_cluster(configuration_store(), name)
        if found is not None:
            return web.json_response(found.to_json())
        if name != broker.config.cluster_name:
            raise AdminError(404, "Cluster does not exist")
        return web.json_response(local_cluster())

    async def cluster_body(request: web.Request) -> ClusterData:
        try:
            data = ClusterData.from_json(await request.json())
            data.check_urls()
            return data
        except (ValueError, ClusterDataError) as e:
            raise AdminError(400, f"Invalid ClusterData: {e}") from None

    @routes.put("/admin/v2/clusters/{cluster}")
    async def create_cluster(request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        if not valid_name(name):
            raise AdminError(412, f"Invalid cluster name: {name!r}")
        data = await cluster_body(request)
        try:
            await configuration_store().put(cluster_key(name), data.to_bytes(), NOT_EXISTS)
        except BadVersionError:
            raise AdminError(409, "Cluster already exists") from None
        return web.Response(status=204)

    @routes.post("/admin/v2/clusters/{cluster}")
    async def update_cluster(request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        data = await cluster_body(request)
        store = configuration_store()
        found = await store.get(cluster_key(name))
        if found is None:
            raise AdminError(404, "Cluster does not exist")
        try:
            await store.put(cluster_key(name), data.to_bytes(), found.version)
        except BadVersionError:
            raise AdminError(409, "Cluster was changed meanwhile; try again") from None
        return web.Response(status=204)

    @routes.delete("/admin/v2/clusters/{cluster}")
    async def delete_cluster(request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        store = configuration_store()
        found = await store.get(cluster_key(name))
        if found is None:
            raise AdminError(404, "Cluster does not exist")
        try:
            await store.delete(cluster_key(name), found.version)
        except BadVersionError:
            raise AdminError(409, "Cluster was changed meanwhile; try again") from None
        return web.Response(status=204)

    @routes.get("/admin/v2/brokers/leaderBroker")
    async def leader(request: web.Request) -> web.Response:
        assert broker.load_manager is not None
        info = await broker.load_manager.leader_info()
        if info is None:
            raise AdminError(404, "No leader broker is elected")
        return web.json_response({"serviceUrl": info.http_url, "brokerId": info.broker_id})

    @routes.get("/admin/v2/brokers/{cluster}")
    async def brokers(request: web.Request) -> web.Response:
        if request.match_info["cluster"] != broker.config.cluster_name:
            raise AdminError(404, f"Cluster {request.match_info['cluster']} does not exist")
        assert broker.registry is not None
        return web.json_response(sorted(await broker.registry.active()))

    @routes.get("/admin/v2/brokers/{cluster}/{broker_id}/ownedNamespaces")
    async def owned_namespaces(request: web.Request) -> web.Response:
        assert broker.ownership is not None
        wanted = request.match_info["broker_id"]
        owned: dict[str, dict[str, object]] = {}
        for (namespace, bundle), info in sorted(broker.ownership.owners().items()):
            if info.broker_id == wanted:
                owned[f"{namespace}/{bundle}"] = {
                    "broker_assignment": "primary",
                    "is_controlled": False,
                    "is_active": True,
                }
        return web.json_response(owned)

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/bundles")
    async def namespace_bundles(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await broker.namespace_policies(namespace)  # 404 for an unknown namespace
        broker.forget_bundles(namespace)
        ranges = await broker.namespace_bundles(namespace)
        # Pulsar's BundlesData: {"boundaries": ["0x00000000", ...], "numBundles": n}
        return web.Response(body=bundle_math.encode(ranges), content_type="application/json")

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}/unload")
    async def unload_namespace(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        await broker.namespace_policies(namespace)
        assert broker.ownership is not None
        for (ns, bundle), info in broker.ownership.owners().items():
            if ns == namespace:
                await broker.request_unload(info, ns, bundle)
        return web.Response(status=204)

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/unload")
    async def unload_bundle(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        bundle = await bundle_named(broker, namespace, request.match_info["bundle"])
        assert broker.ownership is not None
        owner = await broker.ownership.owner(namespace, bundle)
        if owner is None:
            return web.Response(status=204)  # nobody serves it: nothing to unload
        if owner.broker_id != broker.info.broker_id:
            raise web.HTTPTemporaryRedirect(owner_url(owner.http_url, request))
        receiver = None
        destination = request.query.get("destinationBroker")
        if destination:
            assert broker.registry is not None
            found = (await broker.registry.active()).get(destination)
            if found is None:
                raise AdminError(404, f"Broker {destination} is not active")
            if destination == broker.info.broker_id:
                raise AdminError(
                    412, f"The bundle is already owned by destination broker {destination}"
                )
            receiver = found[0]
        await broker.unload_bundle(namespace, bundle, receiver)
        return web.Response(status=204)

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/split")
    async def split_bundle(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        bundle = await bundle_named(broker, namespace, request.match_info["bundle"])
        algorithm = request.query.get("splitAlgorithmName", "range_equally_divide")
        if algorithm not in ("range_equally_divide", "topic_count_equally_divide"):
            raise AdminError(412, f"Unsupported split algorithm: {algorithm}")
        unload = requests.flag(request, "unload")
        assert broker.ownership is not None
        owner = await broker.ownership.owner(namespace, bundle)
        if owner is not None and owner.broker_id != broker.info.broker_id:
            raise web.HTTPTemporaryRedirect(owner_url(owner.http_url, request))
        try:
            await broker.split_bundle(namespace, bundle, algorithm, unload=unload)
        except bundle_math.BundleError as e:
            raise AdminError(412, f"Bundle {namespace}/{bundle} cannot be split: {e}") from None
        return web.Response(status=204)

    @routes.put("/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}/{topic}/unload")
    async def unload_topic(request: web.Request) -> web.Response:
        name = requests.topic(request)
        topic = broker.topics.get(str(name))
        if topic is None:
            answer = await lookup(broker, name)
            if answer.broker.broker_id != broker.info.broker_id:
                raise web.HTTPTemporaryRedirect(owner_url(answer.broker.http_url, request))
            return web.Response(status=204)  # not loaded here: nothing to unload
        await broker.unload_topic(topic)
        return web.Response(status=204)

    @routes.get("/lookup/v2/topic/{domain:persistent|non-persistent}/{tenant}/{namespace}/{topic}")
    async def http_lookup(request: web.Request) -> web.Response:
        name = requests.topic(request)
        policies = await broker.namespace_policies(name.namespace_name)  # 404 if unknown
        missing = policies.missing_cluster(broker.config.cluster_name, name.namespace_name)
        if missing is not None:
            raise AdminError(412, missing)
        authoritative = requests.flag(request, "authoritative")
        counts = broker.metrics.lookup_counts
        with counts.measure():
            answer = await lookup(broker, name, authoritative)
        counts.answered(redirect=answer.kind is LookupKind.REDIRECT)
        if answer.kind is LookupKind.REDIRECT:
            target = f"{answer.broker.http_url}{request.path}"
            if answer.authoritative:
                target += "?authoritative=true"
            raise web.HTTPTemporaryRedirect(target)
        return web.json_response(
            {
                "brokerUrl": answer.broker.service_url,
                "httpUrl": answer.broker.http_url,
                "nativeUrl": answer.broker.service_url,
                "brokerUrlTls": answer.broker.service_url_tls,
                "httpUrlTls": answer.broker.https_url,
            }
        )
