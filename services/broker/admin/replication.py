"""Namespace replication (Pulsar's ``replication_clusters``):

- ``GET  /admin/v2/namespaces/{tenant}/{namespace}/replication``: the list
- ``POST /admin/v2/namespaces/{tenant}/{namespace}/replication`` (body: ``["a", "b"]``): set it;
  every cluster must be allowed by the tenant (``allowedClusters``; 403 otherwise, as Pulsar)
  and registered (or the local one; 412 otherwise)

Topics pick the list up at once on this broker (a policy round on the others) and start or stop
their replicators (``topics/replicator.py``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.namespaces import _update_policies
from magnetar.broker.namespace.clusters import read_cluster
from magnetar.broker.namespace.policies import parse_document
from magnetar.broker.namespace.records import NAMESPACES_PATH, TENANTS_PATH

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker


def add_replication_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/replication")
    async def get_replication(request: web.Request) -> web.Response:
        assert broker.store is not None
        namespace = requests.namespace(request)
        found = await broker.configuration_store.get(f"{NAMESPACES_PATH}/{namespace}")
        if found is None:
            raise AdminError(404, f"Namespace does not exist: {namespace}")
        document = parse_document(found.value)
        return web.json_response(document.get("replication_clusters") or [])

    @routes.post("/admin/v2/namespaces/{tenant}/{namespace}/replication")
    async def set_replication(request: web.Request) -> web.Response:
        assert broker.store is not None
        namespace = requests.namespace(request)
        try:
            clusters = await request.json()
        except ValueError:
            clusters = None
        if not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters):
            raise AdminError(412, 'expected a list of cluster names: ["a", "b"]')
        if not clusters:  # Pulsar's rule and words
            raise AdminError(412, "ClusterIds should not be null or empty")
        tenant = request.match_info["tenant"]
        found = await broker.configuration_store.get(f"{TENANTS_PATH}/{tenant}")
        if found is None:
            raise AdminError(404, f"Tenant does not exist: {tenant}")
        allowed = json.loads(found.value or b"{}").get("allowedClusters") or []
        local = broker.config.cluster_name
        store = broker.configuration_store
        for cluster in clusters:
            if cluster not in allowed:
                raise AdminError(
                    403, f"Cluster {cluster} is not in the list of allowed clusters of {tenant}"
                )
            if cluster != local and await read_cluster(store, cluster) is None:
                raise AdminError(412, f"Cluster {cluster} is not registered")
        unique = list(dict.fromkeys(clusters))
        await _update_policies(
            broker, f"{NAMESPACES_PATH}/{namespace}", "replication_clusters", unique
        )
        broker.policies_changed()
        return web.Response(status=204)
