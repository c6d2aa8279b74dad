"""Admin REST of the schema registry, on Pulsar's paths and JSON shapes:

- ``GET    /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema`` the latest version:
  ``{"version", "type", "timestamp", "data", "properties"}`` (``data``: the definition text)
- ``GET    .../schema/{version}`` one version, same shape
- ``GET    .../schemas`` every live version: ``{"getSchemaResponses": [...]}``
- ``POST   .../schema`` body ``{"type", "schema", "properties"}`` -> ``{"version": N}``;
  409 when the registry's rules refuse it (the same rules as a producer's schema)
- ``DELETE .../schema`` -> ``{"version": N}`` (the deletion marker's version)
- ``POST   .../compatibility`` body as an upload -> ``{"isCompatibility": bool,
  "schemaCompatibilityStrategy": S}``: would the registry take it now (nothing is stored)
- ``POST   .../version`` body as an upload -> ``{"version": N}`` of the live version holding
  that schema, 404 if none does

No schema (or no such version): 404 ``Schema not found``. Any broker answers for any topic: the
registry is read from and written to the metadata store, not the topic's owner.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.schema.registry import (
    WIRE_TYPES,
    IncompatibleSchemaError,
    SchemaData,
    SchemaNotFoundError,
    SchemaRegistry,
    StoredSchema,
)

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker


def _topic(request: web.Request) -> TopicName:
    """The schema paths name no domain: a schema belongs to the persistent topic's name."""
    return requests.topic(request, domain="persistent")


def _data_text(data: bytes) -> str:
    """Pulsar's ``data`` is text: the definition itself, or base64 for binary definitions."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return base64.b64encode(data).decode()


def schema_json(found: StoredSchema) -> dict[str, Any]:
    return {
        "version": found.version,
        "type": found.schema.type,
        "timestamp": found.timestamp,
        "data": _data_text(found.schema.data),
        "properties": found.schema.properties,
    }


def _upload(body: Any) -> SchemaData:
    """Pulsar's PostSchemaPayload: ``{"type": "AVRO", "schema": "<definition>", ...}``."""
    if not isinstance(body, dict):
        raise AdminError(400, 'expected {"type": ..., "schema": ..., "properties": ...}')
    kind, text = body.get("type"), body.get("schema", "")
    if kind not in WIRE_TYPES or kind == "AUTO_CONSUME":
        raise AdminError(400, f"schema type {kind!r} is not one of {sorted(WIRE_TYPES)}")
    properties = body.get("properties") or {}
    if not isinstance(text, str) or not isinstance(properties, dict):
        raise AdminError(400, "schema must be a string and properties an object")
    return SchemaData(kind, text.encode(), {str(k): str(v) for k, v in properties.items()})


def add_schema_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    base = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"

    def registry() -> SchemaRegistry:
        assert broker.store is not None
        return SchemaRegistry(broker.store, broker.configuration_store)

    async def one(topic: TopicName, version: int | None) -> web.Response:
        try:
            found = await registry().get(topic, version)
        except SchemaNotFoundError as e:
            raise AdminError(404, f"Schema not found: {e}") from None
        return web.json_response(schema_json(found))

    @routes.get(f"{base}/schema")
    async def latest(request: web.Request) -> web.Response:
        return await one(_topic(request), None)

    @routes.get(f"{base}/schema/{{version}}")
    async def version(request: web.Request) -> web.Response:
        text = request.match_info["version"]
        try:
            number = int(text)
        except ValueError:
            raise AdminError(400, f"schema version {text!r} is not a number") from None
        return await one(_topic(request), number)

    @routes.get(f"{base}/schemas")
    async def every(request: web.Request) -> web.Response:
        found = await registry().versions(_topic(request))
        if not found:
            raise AdminError(404, f"Schema not found: topic {_topic(request)} has none")
        return web.json_response({"getSchemaResponses": [schema_json(v) for v in found]})

    @routes.post(f"{base}/schema")
    async def upload(request: web.Request) -> web.Response:
        topic = _topic(request)
        await broker.namespace_policies(topic.namespace_name)  # 404 without the namespace
        body = await requests.json_body(request)
        try:
            number = await registry().put_if_absent(topic, _upload(body))
        except IncompatibleSchemaError as e:
            raise AdminError(409, str(e)) from None
        return web.json_response({"version": number})

    @routes.post(f"{base}/compatibility")
    async def compatibility(request: web.Request) -> web.Response:
        topic = _topic(request)
        await broker.namespace_policies(topic.namespace_name)  # 404 without the namespace
        schema = _upload(await requests.json_body(request))
        compatible, strategy = await registry().test_compatibility(topic, schema)
        return web.json_response(
            {"isCompatibility": compatible, "schemaCompatibilityStrategy": strategy}
        )

    @routes.post(f"{base}/version")
    async def version_of(request: web.Request) -> web.Response:
        schema = _upload(await requests.json_body(request))
        try:
            number = await registry().version_of(_topic(request), schema)
        except SchemaNotFoundError as e:
            raise AdminError(404, f"Schema not found: {e}") from None
        return web.json_response({"version": number})

    @routes.delete(f"{base}/schema")
    async def delete(request: web.Request) -> web.Response:
        try:
            number = await registry().delete(_topic(request))
        except SchemaNotFoundError as e:
            raise AdminError(404, f"Schema not found: {e}") from None
        return web.json_response({"version": number})
