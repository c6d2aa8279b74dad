"""GET_SCHEMA, GET_OR_CREATE_SCHEMA, and the schema a producer brings (stored if new)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.protocol import errors
from magnetar.broker.protocol.authorization import may_look_up, may_produce
from magnetar.broker.schema.registry import (
    IncompatibleSchemaError,
    SchemaData,
    SchemaRegistry,
    decode_version,
    encode_version,
)
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

if TYPE_CHECKING:
    from magnetar.broker.protocol.connection import ServerConnection

log = logging.getLogger(__name__)
#: Wire schema types that mean "no schema to check": BYTES (``None``) and AUTO_CONSUME.
NO_SCHEMA = (0, pb.Schema.AutoConsume)


class Answered(Exception):
    """The request was refused and answered already; the handler stops."""


def get_schema(conn: ServerConnection, body: pb.CommandGetSchema, frame: codec.Frame) -> None:
    conn.spawn(_answer_get_schema(conn, body), body, pb.CommandGetSchemaResponse)


async def _answer_get_schema(conn: ServerConnection, body: pb.CommandGetSchema) -> None:
    reply = pb.CommandGetSchemaResponse
    name = conn.topic_name(body.topic, body.request_id, reply)
    if name is None or not await may_look_up(conn, body.request_id, name, reply, "GetSchema"):
        return
    assert conn.broker.store is not None
    try:
        version = decode_version(body.schema_version) if body.HasField("schema_version") else None
        found = await SchemaRegistry(conn.broker.store, conn.broker.configuration_store).get(
            name, version
        )
    except Exception as e:  # the store failed, or a damaged record: an answer, not a timeout
        conn.refuse(body.request_id, name, e, errors.GET_SCHEMA, errors.SCHEMA_UNREADABLE, reply)
        return
    conn.send(
        reply(
            request_id=body.request_id,
            schema=found.to_wire(name.partitioned_topic_name.local_name),
            schema_version=encode_version(found.version),
        )
    )


def get_or_create_schema(
    conn: ServerConnection, body: pb.CommandGetOrCreateSchema, frame: codec.Frame
) -> None:
    reply = pb.CommandGetOrCreateSchemaResponse
    conn.spawn(_answer_get_or_create_schema(conn, body), body, reply)


async def _answer_get_or_create_schema(
    conn: ServerConnection, body: pb.CommandGetOrCreateSchema
) -> None:
    reply = pb.CommandGetOrCreateSchemaResponse
    name = conn.topic_name(body.topic, body.request_id, reply)
    if name is None or not await may_produce(conn, body.request_id, name, reply):
        return
    assert conn.broker.store is not None
    try:
        version = await SchemaRegistry(
            conn.broker.store, conn.broker.configuration_store
        ).put_if_absent(name, SchemaData.from_wire(body.schema))
    except Exception as e:
        conn.refuse(body.request_id, name, e, errors.PUT_SCHEMA, errors.SCHEMA_UNREADABLE, reply)
        return
    conn.send(reply(request_id=body.request_id, schema_version=encode_version(version)))


async def producer_schema_version(
    conn: ServerConnection, body: pb.CommandProducer, name: TopicName
) -> bytes | None:
    """The version of the producer's schema (stored if new and allowed); None without a
    schema. A refusal is answered here and raises Answered."""
    if not body.HasField("schema") or body.schema.type in NO_SCHEMA:
        return None
    assert conn.broker.store is not None
    try:
        version = await SchemaRegistry(
            conn.broker.store, conn.broker.configuration_store
        ).put_if_absent(name, SchemaData.from_wire(body.schema))
    except Exception as e:
        if isinstance(e, IncompatibleSchemaError):
            log.info("topic %s: producer schema refused: %s", name, e)
        conn.refuse(body.request_id, name, e, errors.PUT_SCHEMA, errors.PRODUCER_SCHEMA_FAILED)
        raise Answered from None
    return encode_version(version)
