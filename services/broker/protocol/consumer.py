"""SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, CLOSE_CONSUMER, UNSUBSCRIBE, SEEK and
GET_LAST_MESSAGE_ID: a client's consumers on one connection."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from magnetar.broker.model.message_id import LATEST, to_wire
from magnetar.broker.protocol import errors
from magnetar.broker.protocol.authorization import may_consume
from magnetar.broker.protocol.schema import NO_SCHEMA
from magnetar.broker.schema.registry import IncompatibleSchemaError, SchemaData, SchemaRegistry
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.broker.topics.subscription import Subscription
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.state import ConnectionState

if TYPE_CHECKING:
    from magnetar.broker.model.topic_name import TopicName
    from magnetar.broker.protocol.connection import AnyTopic, ServerConnection

log = logging.getLogger(__name__)
#: How long a reader's subscription waits for the reader to come back after a seek.
READER_RECONNECT_GRACE_S = 30.0


def subscribe(conn: ServerConnection, body: pb.CommandSubscribe, frame: codec.Frame) -> None:
    conn.spawn(_create_consumer(conn, body), body)


async def _create_consumer(conn: ServerConnection, body: pb.CommandSubscribe) -> None:
    name = conn.topic_name(body.topic, body.request_id, pb.CommandError)
    if name is None:
        return
    if not body.subscription:
        conn.error(body.request_id, pb.NotAllowedError, "the subscription name is empty")
        return
    if not await may_consume(conn, body.request_id, name, body.subscription):
        return
    existing = conn.consumers.get(body.consumer_id)
    if existing is not None:
        subscription = existing[0]
        if subscription.topic.name == name and subscription.name == body.subscription:
            conn.send(pb.CommandSuccess(request_id=body.request_id))  # asked again
        else:
            conn.error(
                body.request_id,
                pb.ConsumerBusy,
                f"consumer id {body.consumer_id} is already in use on this connection",
            )
        return
    log.debug("connection %s: SUBSCRIBE %s", conn.peer, body)
    try:
        topic = await conn.broker.get_topic(name, auto=True)
        consumer = Consumer(
            body.consumer_id,
            body.consumer_name,
            conn,
            priority=body.priority_level,
            partition=name.partition_index,
            key_shared_meta=body.keySharedMeta if body.HasField("keySharedMeta") else None,
        )
        if body.HasField("schema") and body.schema.type not in NO_SCHEMA:
            await _check_consumer_schema(conn, name, body.schema, topic)
        start = None
        if not body.durable:  # a reader: start at the given message (or earliest/latest)
            start = body.start_message_id if body.HasField("start_message_id") else to_wire(LATEST)
        # Pulsar ignores replicate_subscription_state when the broker disables the feature.
        replicated = (
            body.replicate_subscription_state and conn.broker.config.enable_replicated_subscriptions
        )
        if isinstance(topic, PersistentTopic):
            subscription = await topic.subscribe(
                consumer,
                body.subscription,
                body.subType,
                body.initialPosition,
                start,
                read_compacted=body.read_compacted,
                replicated=replicated,
            )
        else:
            subscription = await topic.subscribe(
                consumer, body.subscription, body.subType, body.initialPosition, start
            )
    except Exception as e:  # any storage failure: the client gets the reason, not a timeout
        conn.refuse(body.request_id, name, e, errors.SUBSCRIBING, errors.TOPIC_NOT_LOADED)
        return
    if conn.state is ConnectionState.CLOSED:
        conn.drop_consumer(subscription, consumer)
        return
    conn.consumers[body.consumer_id] = (subscription, consumer)
    conn.send(pb.CommandSuccess(request_id=body.request_id))


async def _check_consumer_schema(
    conn: ServerConnection, name: TopicName, schema: pb.Schema, topic: AnyTopic
) -> None:
    assert conn.broker.store is not None
    try:
        await SchemaRegistry(conn.broker.store, conn.broker.configuration_store).check_consumer(
            name, SchemaData.from_wire(schema), _idle(topic)
        )
    except IncompatibleSchemaError as e:
        log.info("topic %s: consumer schema refused: %s", name, e)
        raise


def _idle(topic: AnyTopic) -> bool:
    """Pulsar's idle topic (a consumer's schema may become its first): no producer, no
    consumer, nothing stored."""
    stored = topic.ml.total_size if isinstance(topic, PersistentTopic) else 0
    consumers = any(s.consumers for s in topic.subscriptions.values())
    return stored == 0 and not len(topic.producers) and not consumers


def flow(conn: ServerConnection, body: pb.CommandFlow, frame: codec.Frame) -> None:
    found = conn.consumers.get(body.consumer_id)
    if found is not None:
        found[0].flow(found[1], body.messagePermits)


def ack(conn: ServerConnection, body: pb.CommandAck, frame: codec.Frame) -> None:
    found = conn.consumers.get(body.consumer_id)
    error: str | None = None
    if found is None:
        error = f"unknown consumer id {body.consumer_id}"
    else:
        try:
            found[0].ack(found[1], body.ack_type, list(body.message_id))
        except ValueError as e:  # an ack the subscription refuses (bad position, batch size)
            log.warning("connection %s: ack refused: %s", conn.peer, e)
            error = str(e)
    if body.HasField("request_id"):
        response = pb.CommandAckResponse(consumer_id=body.consumer_id, request_id=body.request_id)
        if error is not None:
            response.error = pb.NotAllowedError
            response.message = error
        conn.send(response)


def redeliver(
    conn: ServerConnection, body: pb.CommandRedeliverUnacknowledgedMessages, frame: codec.Frame
) -> None:
    found = conn.consumers.get(body.consumer_id)
    if found is not None:
        found[0].redeliver(found[1], list(body.message_ids) or None)


def close_consumer(
    conn: ServerConnection, body: pb.CommandCloseConsumer, frame: codec.Frame
) -> None:
    found = conn.consumers.pop(body.consumer_id, None)
    if found is not None:
        conn.drop_consumer(*found)
    conn.send(pb.CommandSuccess(request_id=body.request_id))


def unsubscribe(conn: ServerConnection, body: pb.CommandUnsubscribe, frame: codec.Frame) -> None:
    conn.spawn(_remove_subscription(conn, body), body)


async def _remove_subscription(conn: ServerConnection, body: pb.CommandUnsubscribe) -> None:
    found = conn.consumers.get(body.consumer_id)
    if found is None:
        conn.error(body.request_id, pb.SubscriptionNotFound, "unknown consumer id")
        return
    subscription, consumer = found
    others = [c for c in subscription.consumers if c is not consumer]
    if others:
        # Pulsar: a subscription with other consumers stays, and so does this consumer.
        conn.error(
            body.request_id,
            pb.ConsumerBusy,
            f"subscription {subscription} has {len(others)} other consumer(s)",
        )
        return
    conn.consumers.pop(body.consumer_id, None)
    subscription.remove_consumer(consumer)
    await subscription.topic.unsubscribe(subscription.name)
    conn.send(pb.CommandSuccess(request_id=body.request_id))


def seek(conn: ServerConnection, body: pb.CommandSeek, frame: codec.Frame) -> None:
    conn.spawn(_reset_subscription(conn, body), body)


async def _reset_subscription(conn: ServerConnection, body: pb.CommandSeek) -> None:
    found = conn.consumers.get(body.consumer_id)
    if found is None:
        conn.error(body.request_id, pb.ConsumerNotFound, "unknown consumer id")
        return
    subscription = found[0]
    if not isinstance(subscription, Subscription):
        conn.error(
            body.request_id,
            pb.NotAllowedError,
            f"{subscription.topic.name} is non-persistent: nothing to seek in",
        )
        return
    position = None
    if body.HasField("message_id"):
        position = subscription.topic.position_for(
            body.message_id, compacted=subscription.cursor.read_compacted
        )
    elif not body.HasField("message_publish_time"):
        conn.error(body.request_id, pb.MetadataError, "SEEK needs a message id or a publish time")
        return
    consumers = await subscription.seek(
        position, body.message_publish_time if position is None else None
    )
    # Like Pulsar: the subscription's consumers are disconnected before the seek succeeds;
    # they come back at the new position with nothing stale in their queues.
    for consumer in consumers:
        consumer.connection.reconnect_consumer(consumer)
    conn.send(pb.CommandSuccess(request_id=body.request_id))
    if not subscription.durable:
        # The reader comes back under the same subscription name and must find the cursor
        # where the seek put it (a seek by time has no message id to come back with).
        subscription.topic.remove_subscription_later(subscription, READER_RECONNECT_GRACE_S)


def get_last_message_id(
    conn: ServerConnection, body: pb.CommandGetLastMessageId, frame: codec.Frame
) -> None:
    found = conn.consumers.get(body.consumer_id)
    if found is None:
        conn.error(body.request_id, pb.ConsumerNotFound, "unknown consumer id")
    elif not isinstance(found[0], Subscription):
        conn.error(
            body.request_id,
            pb.NotAllowedError,
            "a non-persistent topic stores no messages: it has no last message id",
        )
    else:
        conn.spawn(_answer_last_message_id(conn, body, found[0]), body)


async def _answer_last_message_id(
    conn: ServerConnection, body: pb.CommandGetLastMessageId, subscription: Subscription
) -> None:
    try:
        last = await subscription.topic.last_message_id(
            compacted=subscription.cursor.read_compacted
        )
    except Exception as e:  # storage failed: an answer, not a client timeout
        conn.refuse(
            body.request_id, subscription.topic.name, e, (), errors.LAST_MESSAGE_ID_UNREADABLE
        )
        return
    conn.send(
        pb.CommandGetLastMessageIdResponse(
            request_id=body.request_id,
            last_message_id=last,
            consumer_mark_delete_position=to_wire(
                subscription.cursor.mark_delete_position,
                subscription.topic.name.partition_index,
            ),
        )
    )
