"""Admin REST about the broker process itself and the bookies, on Pulsar's paths (superusers
only when authorization is on, as Pulsar's BrokersBase, BrokerStatsBase and BookiesBase):

- ``GET /admin/v2/brokers/version``: the version, as text
- ``GET /admin/v2/brokers/configuration``: the settings changeable at runtime (none: ``[]``);
  ``.../configuration/values`` their values (``{}``); ``.../configuration/runtime`` every setting
  in force, as strings, secrets masked
- ``GET /admin/v2/broker-stats/topics``: the stats of every topic served here, as
  ``{namespace: {bundle: {"persistent"|"non-persistent": {topic: TopicStats}}}}``
- ``GET /admin/v2/broker-stats/load-report``: this broker's last load report
- ``GET /admin/v2/bookies/all``: ``{"bookies": [{"bookieId": "host:port"}]}``, the registered ones
- ``GET /admin/v2/bookies/racks-info``: the rack information, ``{group: {bookie: {"rack",
  "hostname"}}}``; ``GET|POST|DELETE .../racks-info/{bookie}`` (``POST`` with ``?group=`` and
  ``{"rack", "hostname"}``): one bookie's, 404 ``Bookie address not found`` when it has none.
  Stored in the metadata store (``common/ledger/racks.py``), read by the ledger client's
  placement, which prefers distinct racks.
"""

from __future__ import annotations

import dataclasses
import logging
from importlib import metadata
from typing import TYPE_CHECKING, Any

from aiohttp import web

from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.requests import json_body
from magnetar.common.ledger.bookies import list_bookies
from magnetar.common.ledger.racks import (
    BookieRackInfo,
    InvalidRackError,
    RackConfiguration,
    load_racks,
    update_racks,
)

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: Settings whose values are never shown: words in their names.
SECRET_WORDS = ("secret", "password", "authentication_parameters", "basic_auth_conf", "private")
MASK = "********"

log = logging.getLogger(__name__)


def version() -> str:
    try:
        return metadata.version("magnetar")
    except metadata.PackageNotFoundError:
        return "unknown"


def runtime_configuration(config: Any) -> dict[str, str]:
    """Every setting as a string (Pulsar's ``configuration/runtime``), secrets masked."""
    shown: dict[str, str] = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if any(word in item.name for word in SECRET_WORDS) and value:
            shown[item.name] = MASK
        elif isinstance(value, bool):
            shown[item.name] = "true" if value else "false"
        else:
            shown[item.name] = str(value)
    return shown


def add_broker_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get("/admin/v2/brokers/version")
    async def broker_version(request: web.Request) -> web.Response:
        return web.Response(text=version())

    @routes.get("/admin/v2/brokers/configuration")
    async def dynamic_names(request: web.Request) -> web.Response:
        return web.json_response([])

    @routes.get("/admin/v2/brokers/configuration/values")
    async def dynamic_values(request: web.Request) -> web.Response:
        return web.json_response({})

    @routes.get("/admin/v2/brokers/configuration/runtime")
    async def runtime(request: web.Request) -> web.Response:
        return web.json_response(runtime_configuration(broker.config))

    @routes.get("/admin/v2/broker-stats/topics")
    async def topic_stats(request: web.Request) -> web.Response:
        tree: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        for key, topic in sorted(broker.topics.items()):
            name = topic.name
            bundle = str(await broker.bundle_of(name))
            domains = tree.setdefault(name.namespace_name, {}).setdefault(bundle, {})
            domains.setdefault(name.domain, {})[key] = topic.stats()
        return web.json_response(tree)

    @routes.get("/admin/v2/broker-stats/load-report")
    async def load_report(request: web.Request) -> web.Response:
        if broker.registry is None:
            raise AdminError(503, "the broker is not registered in the cluster yet")
        found = (await broker.registry.active()).get(broker.info.broker_id)
        if found is None:
            raise AdminError(503, "the broker is not registered in the cluster yet")
        return web.json_response(found[1].to_dict())

    @routes.get("/admin/v2/bookies/all")
    async def bookies(request: web.Request) -> web.Response:
        assert broker.store is not None
        registered = await list_bookies(broker.store)
        return web.json_response({"bookies": [{"bookieId": b.address} for b in registered]})

    def not_found(address: str) -> AdminError:
        return AdminError(404, f"Bookie address not found: {address}")

    @routes.get("/admin/v2/bookies/racks-info")
    async def racks_info(request: web.Request) -> web.Response:
        assert broker.store is not None
        config, _ = await load_racks(broker.store)
        return web.json_response(config.to_dict())

    @routes.get("/admin/v2/bookies/racks-info/{bookie}")
    async def bookie_rack(request: web.Request) -> web.Response:
        assert broker.store is not None
        address = request.match_info["bookie"]
        found = (await load_racks(broker.store))[0].get(address)
        if found is None:
            raise not_found(address)
        return web.json_response(found.to_dict())

    @routes.post("/admin/v2/bookies/racks-info/{bookie}")
    async def set_bookie_rack(request: web.Request) -> web.Response:
        assert broker.store is not None
        address = request.match_info["bookie"]
        group = request.query.get("group")
        if group is None:
            raise AdminError(412, "Bookie 'group' parameters is missing")
        if not group:
            raise AdminError(412, "Bookie 'group' parameter is empty")
        try:
            info = BookieRackInfo.from_dict(await json_body(request))
        except InvalidRackError as e:
            raise AdminError(412, str(e)) from None
        await update_racks(broker.store, lambda config: config.update(group, address, info))
        log.info("bookie %s: rack information set (group %s, rack %s)", address, group, info.rack)
        return web.Response(status=204)

    @routes.delete("/admin/v2/bookies/racks-info/{bookie}")
    async def delete_bookie_rack(request: web.Request) -> web.Response:
        assert broker.store is not None
        address = request.match_info["bookie"]

        def remove(config: RackConfiguration) -> bool:
            return config.remove(address)

        if not await update_racks(broker.store, remove):
            raise not_found(address)
        log.info("bookie %s: rack information removed", address)
        return web.Response(status=204)
