"""Namespace replication (Pulsar's ``replication_clusters``):

- ``GET  /admin/v2/namespaces/{tenant}/{namespace}/replication``: the list
- ``POST /admin/v2/namespaces/{tenant}/{namespace}/replication`` (body: ``["a", "b"]``): set it;
  every cluster must be allowed by the tenant (``allowedClusters``; 403 otherwise, as Pulsar)
  and registered (or the local one; 412 otherwise)

Topics pick the list up at once on this broker (a policy round on the others) and start or stop
their replicators (``topics/replicator.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.namespaces import (
    _policy_document,
    _update_policies,
    checked_replication_clusters,
)
from magnetar.broker.namespace.records import NAMESPACES_PATH

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker


def add_replication_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/replication")
    async def get_replication(request: web.Request) -> web.Response:
        document = await _policy_document(broker, request)
        return web.json_response(document.get("replication_clusters") or [])

    @routes.post("/admin/v2/namespaces/{tenant}/{namespace}/replication")
    async def set_replication(request: web.Request) -> web.Response:
        assert broker.store is not None
        namespace = requests.namespace(request)
        try:
            clusters = await request.json()
        except ValueError:
            clusters = None
        unique = await checked_replication_clusters(broker, request.match_info["tenant"], clusters)
        await _update_policies(
            broker, f"{NAMESPACES_PATH}/{namespace}", "replication_clusters", unique
        )
        broker.policies_changed()
        return web.Response(status=204)
