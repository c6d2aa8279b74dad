"""Admin REST of a topic's bundle, properties and trimming, on Pulsar's paths (``{topic}`` is
``/admin/v2/{domain}/{tenant}/{namespace}/{topic}``):

- ``GET    {topic}/bundle``: the bundle range serving it, ``"0x00000000_0x40000000"``
- ``GET    {topic}/properties``: its properties; ``PUT {topic}/properties`` (body: ``{k: v}``)
  adds or changes some; ``DELETE {topic}/properties?key=k`` removes one. They are kept with the
  topic's managed ledger (persistent topics only), beside Magnetar's own, which are not shown.
- ``POST   {topic}/trim``: ledgers every subscription is done with and that retention no longer
  keeps are deleted now, instead of at the next policy round
- ``DELETE {topic}/truncate``: every subscription moves to the end and every closed ledger is
  deleted (the one being written stays), as Pulsar's truncate
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.subscriptions import TOPIC_PATH, persistent_topic

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: Prefix of the user's topic properties among the managed ledger's.
USER_PROPERTY = "user:"


def add_topic_housekeeping_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get(TOPIC_PATH + "/bundle")
    async def bundle(request: web.Request) -> web.Response:
        name = requests.topic(request)
        await requests.require_namespace(broker, name.namespace_name)
        return web.json_response(str(await broker.bundle_of(name)))

    @routes.get(TOPIC_PATH + "/properties")
    async def properties(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        return web.json_response(
            {
                key.removeprefix(USER_PROPERTY): value
                for key, value in sorted(topic.ml.properties.items())
                if key.startswith(USER_PROPERTY)
            }
        )

    @routes.put(TOPIC_PATH + "/properties")
    async def update_properties(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        body = await requests.json_body(request)
        if not isinstance(body, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in body.items()
        ):
            raise AdminError(412, 'expected the properties as {"key": "value", ...}')
        await topic.ml.update_properties({USER_PROPERTY + k: v for k, v in body.items()})
        return web.Response(status=204)

    @routes.delete(TOPIC_PATH + "/properties")
    async def remove_property(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        key = request.query.get("key")
        if not key:
            raise AdminError(412, "give the property to remove: ?key=...")
        await topic.ml.update_properties({USER_PROPERTY + key: None})
        return web.Response(status=204)

    @routes.post(TOPIC_PATH + "/trim")
    async def trim(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        retention = (await broker.namespace_policies(topic.name.namespace_name)).retention
        await topic.ml.trim_retained(retention.time_minutes, retention.size_mb)
        return web.Response(status=204)

    @routes.delete(TOPIC_PATH + "/truncate")
    async def truncate(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        await topic.truncate()
        return web.Response(status=204)
