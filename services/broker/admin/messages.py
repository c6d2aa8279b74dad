"""Admin REST that reads a persistent topic's messages without consuming them, on Pulsar's paths
(``{topic}`` is ``/admin/v2/persistent/{tenant}/{namespace}/{topic}``):

- ``GET {topic}/subscription/{sub}/position/{n}``: peek, the ``n``-th unacknowledged message
- ``GET {topic}/examinemessage?initialPosition=earliest|latest&messagePosition=n``
- ``GET {topic}/ledger/{ledgerId}/entry/{entryId}``: one message by id
- ``GET {topic}/lastMessageId`` -> ``{"ledgerId", "entryId", "partitionIndex"}``
- ``GET {topic}/messageid/{timestamp}``: the first message published at or after it

A message is answered as Pulsar answers it: the payload as the body (a batch's whole payload,
which Pulsar's admin clients split), its metadata in ``X-Pulsar-*`` headers (message id, publish
time, producer name, sequence id, properties, batch size, replicated-from, marker type). 404
when there is no such message.
"""

from __future__ import annotations

import datetime
import zlib
from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.subscriptions import (
    SUBSCRIPTION_PATH,
    TOPIC_PATH,
    persistent_topic,
    positive,
    subscription_of,
)
from magnetar.broker.model.entry import entry_metadata, entry_payload
from magnetar.broker.model.message_id import from_wire
from magnetar.broker.model.position import Position
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker


def _time(ms: int) -> str:
    """Pulsar's DateFormatter: ISO 8601 with milliseconds."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_response(position: Position, stored: bytes) -> web.Response:
    metadata = entry_metadata(stored)
    payload = entry_payload(stored)
    if metadata.compression == pb.ZLIB:
        payload = zlib.decompress(payload)
    elif metadata.compression != pb.NONE:
        raise AdminError(
            412,
            f"message {position} is compressed with {pb.CompressionType.Name(metadata.compression)}"
            ", which this broker does not decode: consume it with a client instead",
        )
    headers = {
        "X-Pulsar-Message-ID": f"{position.ledger_id}:{position.entry_id}",
        "X-Pulsar-publish-time": _time(metadata.publish_time),
        "X-Pulsar-producer-name": metadata.producer_name,
        "X-Pulsar-sequence-id": str(metadata.sequence_id),
    }
    if metadata.event_time:
        headers["X-Pulsar-event-time"] = _time(metadata.event_time)
    if metadata.HasField("num_messages_in_batch"):
        headers["X-Pulsar-num-batch-message"] = str(metadata.num_messages_in_batch)
        headers["X-Pulsar-batch-size"] = str(len(payload))
    for prop in metadata.properties:
        headers[f"X-Pulsar-PROPERTY-{prop.key}"] = prop.value
    if metadata.partition_key:
        headers["X-Pulsar-partition-key"] = metadata.partition_key
    if metadata.HasField("replicated_from"):
        headers["X-Pulsar-replicated-from"] = metadata.replicated_from
    if metadata.HasField("marker_type"):
        headers["X-Pulsar-marker-type"] = str(metadata.marker_type)
    return web.Response(body=payload, headers=headers, content_type="application/octet-stream")


def message_id_json(position: Position, partition: int, batch_index: int = -1) -> dict[str, int]:
    document = {
        "ledgerId": position.ledger_id,
        "entryId": position.entry_id,
        "partitionIndex": partition,
    }
    if batch_index >= 0:
        document["batchIndex"] = batch_index
    return document


def add_message_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get(SUBSCRIPTION_PATH + "/position/{messagePosition}")
    async def peek(request: web.Request) -> web.Response:
        n = positive(request, "messagePosition")
        if n < 1:
            raise AdminError(412, "messagePosition must be at least 1")
        found = await subscription_of(await persistent_topic(broker, request), request).peek(n)
        if found is None:
            raise AdminError(404, "Message not found")
        return message_response(*found)

    @routes.get(TOPIC_PATH + "/examinemessage")
    async def examine(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        initial = request.query.get("initialPosition", "latest")
        if initial not in ("earliest", "latest"):
            raise AdminError(412, f"initialPosition must be earliest or latest, got {initial!r}")
        try:
            n = int(request.query.get("messagePosition", "1"))
        except ValueError:
            raise AdminError(412, "messagePosition must be a number") from None
        if n < 1:
            raise AdminError(412, "messagePosition must be at least 1")
        extents = topic.ml.ledger_extents()
        if initial == "latest":
            extents = [(ledger, -count) for ledger, count in reversed(extents)]
        position = None
        for ledger, count in extents:
            if n <= abs(count):
                entry = n - 1 if count > 0 else -count - n
                position = Position(ledger, entry)
                break
            n -= abs(count)
        found = None if position is None else await topic.message_at(position)
        if found is None:
            raise AdminError(404, "Message not found")
        return message_response(*found)

    @routes.get(TOPIC_PATH + "/ledger/{ledgerId}/entry/{entryId}")
    async def by_id(request: web.Request) -> web.Response:
        position = Position(positive(request, "ledgerId"), positive(request, "entryId"))
        found = await (await persistent_topic(broker, request)).message_at(position)
        if found is None:
            raise AdminError(404, f"Message not found: {position.ledger_id}:{position.entry_id}")
        return message_response(*found)

    @routes.get(TOPIC_PATH + "/lastMessageId")
    async def last_message_id(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        last = await topic.last_message_id()
        position = from_wire(last)
        return web.json_response(
            message_id_json(position, topic.name.partition_index, last.batch_index)
        )

    @routes.get(TOPIC_PATH + "/messageid/{timestamp}")
    async def message_id_at(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        found = await topic.message_id_at(positive(request, "timestamp"))
        if found is None:
            raise AdminError(404, "Message ID not found")
        return web.json_response(message_id_json(found, topic.name.partition_index))
