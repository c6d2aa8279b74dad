"""PRODUCER, SEND and CLOSE_PRODUCER: a client's producers on one connection."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from typing import TYPE_CHECKING

from magnetar.broker.errors import TopicUnloadingError
from magnetar.broker.ledger.errors import (
    EntryTooLargeForLedgerError,
    ManagedLedgerFencedError,
    ManagedLedgerTerminatedError,
)
from magnetar.broker.model.markers import is_marker
from magnetar.broker.model.message_id import EARLIEST
from magnetar.broker.model.position import Position
from magnetar.broker.protocol import errors
from magnetar.broker.protocol.authorization import may_produce
from magnetar.broker.protocol.schema import Answered, producer_schema_version
from magnetar.broker.topics.replicator import is_replicator_cursor
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.state import ConnectionState

if TYPE_CHECKING:
    from magnetar.broker.protocol.connection import AnyTopic, ServerConnection

log = logging.getLogger(__name__)


def producer(conn: ServerConnection, body: pb.CommandProducer, frame: codec.Frame) -> None:
    conn.spawn(_create_producer(conn, body), body)


async def _create_producer(conn: ServerConnection, body: pb.CommandProducer) -> None:
    name = conn.topic_name(body.topic, body.request_id, pb.CommandError)
    if name is None or not await may_produce(conn, body.request_id, name):
        return
    existing = conn.producers.get(body.producer_id)
    if existing is not None:
        if existing[0].name == name:  # the client asked again: same answer
            try:
                schema_version = await producer_schema_version(conn, body, name)
            except Answered:
                return
            _producer_success(conn, body, existing[0], existing[1], None, schema_version)
        else:
            conn.error(
                body.request_id,
                pb.ProducerBusy,
                f"producer id {body.producer_id} is already in use on this connection",
            )
        return
    try:
        topic = await conn.broker.get_topic(name, auto=True)
    except Exception as e:  # any storage failure: the client gets the reason, not a timeout
        conn.refuse(body.request_id, name, e, errors.TOPIC_LOADING, errors.TOPIC_NOT_LOADED)
        return
    try:
        topic.admit_producer()
    except errors.PRODUCER_ADMISSION as e:
        conn.refuse(body.request_id, name, e, errors.PRODUCER_ADMISSION)
        return
    try:
        schema_version = await producer_schema_version(conn, body, name)
    except Answered:
        return
    producer_name = body.producer_name or f"magnetar-{uuid.uuid4().hex[:12]}"
    mode = body.producer_access_mode
    if mode == pb.WaitForExclusive and len(topic.producers):
        # Pulsar's protocol: "pending" now, the real success when the topic is ours.
        conn.send(
            pb.CommandProducerSuccess(
                request_id=body.request_id, producer_name=producer_name, producer_ready=False
            )
        )
    epoch = body.topic_epoch if body.HasField("topic_epoch") else None
    try:
        epoch = await topic.producers.add(
            (id(conn), body.producer_id),
            mode,
            lambda assigned_url: _fence_producer(conn, body.producer_id, assigned_url),
            epoch,
            name=producer_name,
        )
    except errors.PRODUCER_ACCESS as e:
        conn.refuse(body.request_id, name, e, errors.PRODUCER_ACCESS)
        return
    try:
        topic.admit_producer()  # again: a WaitForExclusive producer may have waited long
    except errors.PRODUCER_ADMISSION as e:
        topic.producers.remove((id(conn), body.producer_id))
        conn.refuse(body.request_id, name, e, errors.PRODUCER_ADMISSION)
        return
    if mode != pb.Shared:
        try:
            await topic.store_epoch(epoch)
        except Exception as e:  # the epoch must survive a move before the producer has it
            topic.producers.remove((id(conn), body.producer_id))
            conn.refuse(body.request_id, name, e, (), errors.EPOCH_NOT_STORED)
            return
    if conn.state is ConnectionState.CLOSED:
        topic.producers.remove((id(conn), body.producer_id))
        return
    conn.producers[body.producer_id] = (topic, producer_name)
    conn.closed_by_broker.discard(body.producer_id)
    _producer_success(conn, body, topic, producer_name, epoch, schema_version)


def _producer_success(
    conn: ServerConnection,
    body: pb.CommandProducer,
    topic: AnyTopic,
    producer_name: str,
    epoch: int | None,
    schema_version: bytes | None,
) -> None:
    success = pb.CommandProducerSuccess(
        request_id=body.request_id,
        producer_name=producer_name,
        last_sequence_id=(
            topic.deduplication.last_sequence_id(producer_name)
            if topic.deduplication is not None
            else -1
        ),
    )
    success.topic_epoch = topic.producers.topic_epoch if epoch is None else epoch
    if schema_version is not None:
        success.schema_version = schema_version
    conn.send(success)


def _fence_producer(conn: ServerConnection, producer_id: int, assigned_url: str | None) -> None:
    """Another producer took the topic with ExclusiveWithFencing, or the topic went away
    (to the broker at ``assigned_url``, when it was handed over)."""
    if conn.producers.pop(producer_id, None) is not None:
        conn.closed_by_broker.add(producer_id)
        close = pb.CommandCloseProducer(producer_id=producer_id, request_id=0)
        if assigned_url is not None and conn.knows_assigned_broker:
            close.assignedBrokerServiceUrl = assigned_url
        conn.send(close)


def close_producer(
    conn: ServerConnection, body: pb.CommandCloseProducer, frame: codec.Frame
) -> None:
    found = conn.producers.pop(body.producer_id, None)
    if found is not None:
        found[0].producers.remove((id(conn), body.producer_id))
    conn.send(pb.CommandSuccess(request_id=body.request_id))


def send_run(conn: ServerConnection, frames: list[codec.Frame]) -> None:
    """The SENDs of one producer read in one slice, in their order, gathered because its topic
    takes runs (``takes_runs``: no deduplication, no publish rate, not unloading). Plain ones
    (the usual: no chunk, not a geo-replicator's) go to the topic as one run
    (``publish_run``): the producer, the broker's right to serve and the counters are looked at
    once, not per message. Else each is served on its own (``send_message``)."""
    found = conn.producers.get(frames[0].body.producer_id)  # type: ignore[union-attr]
    if (
        found is not None
        and len(frames) > 1
        and not is_replicator_cursor(found[1])
        and conn.broker.may_serve()
    ):
        topic, producer_name = found
        run = []
        messages = size = 0
        for frame in frames:
            body: pb.CommandSend = frame.body  # type: ignore[assignment]
            if body.is_chunk:
                break
            stored = frame.headers_and_payload
            highest = body.highest_sequence_id if body.HasField("highest_sequence_id") else None
            run.append(
                (stored, functools.partial(_receipt, conn, topic, body, body.sequence_id, highest))
            )
            messages += max(body.num_messages, 1)
            size += len(stored)
        else:
            topic.publish_run(producer_name, run, messages, size)  # type: ignore[union-attr]
            return
    for frame in frames:
        try:
            send_message(conn, frame.body, frame)  # type: ignore[arg-type]
        except Exception:
            log.exception("connection %s: error handling a SEND", conn.peer)
            conn.frame_failed(frame)


def send_message(conn: ServerConnection, body: pb.CommandSend, frame: codec.Frame) -> None:
    producer_id = body.producer_id
    found = conn.producers.get(producer_id)
    if found is None:
        if producer_id in conn.closed_by_broker:
            # Sent before the client read our CLOSE_PRODUCER: it sends them again where it
            # reconnects (Pulsar ignores these too, rather than close the connection).
            return
        conn.send_error(
            body,
            pb.NotAllowedError,
            f"unknown producer id {producer_id} on this connection",
        )
        return
    topic, producer_name = found
    if not conn.broker.may_serve():
        # Our bundles may belong to another broker already: store nothing more here.
        conn.send_error(body, pb.ServiceNotReady, "the broker's metadata session expired")
        return
    stored = frame.headers_and_payload
    sequence_id = body.sequence_id
    highest = body.highest_sequence_id if body.HasField("highest_sequence_id") else None
    dedup_name, dedup_sequence, dedup_highest = producer_name, sequence_id, highest
    marker = False
    chunk: tuple[int, int] | None = None  # (chunk id, chunks of its message)
    if is_replicator_cursor(producer_name):
        # A geo-replicator: deduplicate by the original producer and sequence id (Pulsar's
        # rule for replicated messages), so a resend after a replicator restart is dropped.
        # A remote's marker: stored as a marker (never deduplicated, never counted).
        metadata = frame.metadata  # checked when the frame was decoded, made now
        assert metadata is not None
        marker = is_marker(metadata)
        dedup_name, dedup_sequence = metadata.producer_name, metadata.sequence_id
        dedup_highest = (
            metadata.highest_sequence_id if metadata.HasField("highest_sequence_id") else None
        )
        if metadata.HasField("chunk_id"):
            chunk = (metadata.chunk_id, metadata.num_chunks_from_msg)
    elif body.is_chunk:
        metadata = frame.metadata
        assert metadata is not None
        chunk = (metadata.chunk_id, metadata.num_chunks_from_msg)
    # Every chunk of a message carries its sequence id: deduplication looks at the last chunk
    # only, and records nothing for the others (Pulsar's rule).
    deduplicate = chunk is None or chunk[0] == chunk[1] - 1
    messages = max(body.num_messages, 1)
    topic.publish(
        stored,
        dedup_name,
        dedup_sequence,
        -1 if dedup_highest is None else dedup_highest,
        messages,
        marker=marker,
        deduplicate=deduplicate,
        on_stored=functools.partial(_receipt, conn, topic, body, sequence_id, highest),
    )
    pause = topic.publish_throttle.published(messages, len(stored))
    if pause > 0:
        conn.hold_reading(pause)  # the rest of the second: nothing more read from this client


def _receipt(
    conn: ServerConnection,
    topic: AnyTopic,
    body: pb.CommandSend,
    sequence_id: int,
    highest: int | None,
    done: asyncio.Future[Position | None],
) -> None:
    """A SEND's answer, once its entry is stored (or could not be)."""
    try:
        position = done.result()
    except asyncio.CancelledError:
        return
    except Exception as error:
        _refused(conn, topic, body, error)
        return
    # A duplicate is acknowledged with Pulsar's (-1, -1): it was not stored again.
    ledger_id, entry_id = position or EARLIEST
    conn.write(
        codec.encode_send_receipt(body.producer_id, sequence_id, ledger_id, entry_id, highest)
    )


def _refused(
    conn: ServerConnection, topic: AnyTopic, body: pb.CommandSend, error: Exception
) -> None:
    """A SEND's answer when its entry could not be stored."""
    if isinstance(error, TopicUnloadingError):
        return  # nothing stored: CLOSE_PRODUCER follows, and the client sends it again
    if isinstance(error, ManagedLedgerTerminatedError):
        # Pulsar's answer: the client fails this producer's messages (TopicTerminated).
        conn.send_error(body, pb.TopicTerminatedError, f"topic {topic.name} was terminated")
        return
    if isinstance(error, ManagedLedgerFencedError):
        conn.broker.topic_fenced(topic)
    log.warning("topic %s: send failed: %s", topic.name, error)
    conn.broker.metrics.send_errors.labels(type(error).__name__).inc()
    conn.send_error(
        body,
        pb.NotAllowedError
        if isinstance(error, EntryTooLargeForLedgerError)
        else pb.PersistenceError,
        str(error),
    )
