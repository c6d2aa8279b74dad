"""The ``pulsar`` sink: each Spark task produces its rows with batching and flushes before it
reports success.

With ``arrow`` (the default) the writer is a ``DataSourceArrowWriter``: Spark hands each task
its rows as Arrow ``RecordBatch``es, the columns are taken out of each batch at once, every
row is sent with the client's batching, and the producers are flushed once per batch (no
``Row`` object per row). ``arrow=false`` keeps the row-by-row writer of before.

At least once: a micro-batch whose commit Spark never recorded (the query died after a task
flushed) is written again when the query restarts, so a message may be stored twice; nothing
Spark counts as written is missing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import _pulsar
import pulsar
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Row
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from magnetar.spark.arrow import ARROW_BATCH_ROWS, collecting_less
from magnetar.spark.options import SinkOptions

log = logging.getLogger("magnetar.spark")


class SinkError(RuntimeError):
    """A row could not be written: no topic for it, a bad value, or the broker refused it."""


@dataclass
class WrittenMessages(WriterCommitMessage):
    """What one task wrote: how many messages it stored."""

    count: int


def _value(value: object) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise SinkError(f"column value must be binary or string, got {type(value).__name__}")


def write_rows(options: SinkOptions, rows: Iterator[Row]) -> WrittenMessages:
    """Send every row (``value``; optional ``__topic``, ``__key``, ``__messageProperties``,
    ``__eventTime``) and wait until the broker stored all of them."""
    quiet = logging.getLogger("pulsar-client")
    quiet.setLevel(logging.WARNING)
    client = pulsar.Client(options.service_url, logger=quiet, **options.client)  # type: ignore[arg-type]
    producers: dict[str, pulsar.Producer] = {}
    failures: list[str] = []
    lock = threading.Lock()

    def done(result: pulsar.Result, _msg_id: pulsar.MessageId) -> None:
        if result != pulsar.Result.Ok:
            with lock:
                failures.append(str(result))

    count = 0
    try:
        for row in rows:
            fields = row.asDict()
            topic = options.topic or fields.get("__topic")
            if not topic:
                raise SinkError("no topic for a row: set the option topic or a __topic column")
            producer = producers.get(topic)
            if producer is None:
                producer = client.create_producer(
                    topic,
                    **{"batching_enabled": True, "block_if_queue_full": True, **options.producer},  # type: ignore[arg-type]
                )
                producers[topic] = producer
            extra: dict[str, object] = {}
            if fields.get("__key") is not None:
                extra["partition_key"] = str(fields["__key"])
            if fields.get("__messageProperties"):
                extra["properties"] = {
                    str(k): str(v) for k, v in fields["__messageProperties"].items()
                }
            event_time = fields.get("__eventTime")
            if isinstance(event_time, datetime):
                extra["event_timestamp"] = int(event_time.timestamp() * 1000)
            producer.send_async(_value(fields["value"]), done, **extra)  # type: ignore[arg-type]
            count += 1
        for producer in producers.values():
            producer.flush()
    finally:
        client.close()
    if failures:
        raise SinkError(f"{len(failures)} of {count} messages were not stored: {failures[0]}")
    return WrittenMessages(count)


def _column(batch: pa.RecordBatch, name: str) -> list[object] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def _event_millis(batch: pa.RecordBatch) -> list[int | None] | None:
    index = batch.schema.get_field_index("__eventTime")
    if index < 0:
        return None
    column = batch.column(index)
    if not pa.types.is_timestamp(column.type):
        raise SinkError(f"column __eventTime must be a timestamp, got {column.type}")
    micros = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
    return pc.floor_divide(micros, 1000).to_pylist()


#: Messages per producer batch on the path with a receipt per producer batch (the client's
#: default batch size).
RECEIPT_EVERY = 1_000
#: That path only for Arrow batches whose values are at most this large: a producer batch of
#: RECEIPT_EVERY of them stays far below the client's byte cut (BATCH_BYTES), so the client cuts
#: batches by count alone.
SPARSE_MAX_VALUE_BYTES = 1_000
BATCH_BYTES = 4 * 1024 * 1024
#: Producer settings that decide where the client cuts its batches or which partition a
#: message goes to: when the options set any, every message gets its own receipt (and the
#: client routes it as told).
BATCH_SHAPING = frozenset(
    {
        "message_routing_mode",
        "hashing_scheme",
        "message_router",
        "batching_enabled",
        "batching_max_messages",
        "batching_max_allowed_size_in_bytes",
        "batching_max_publish_delay_ms",
        "batching_type",
        "block_if_queue_full",
        "chunking_enabled",
    }
)


def _sparse_topic(batch: pa.RecordBatch, options: SinkOptions) -> str | None:
    """The one topic of ``batch`` when its messages may share one receipt per producer batch:
    no keys or properties (the sink routes them over the partitions itself, and their
    metadata stays small), small values, a single topic, and no batching settings of the
    user's. None: one receipt per message."""
    if options.producer.keys() & BATCH_SHAPING or batch.num_rows == 0:
        return None
    index = batch.schema.get_field_index("__key")
    if index >= 0 and batch.column(index).null_count != batch.num_rows:
        return None
    index = batch.schema.get_field_index("__messageProperties")
    if index >= 0:
        properties = batch.column(index)
        if not pa.types.is_map(properties.type):
            return None
        offsets = properties.offsets  # entries of every map, null ones counted as they lie
        if offsets[len(offsets) - 1].as_py() != offsets[0].as_py():
            return None
    values = batch.column(batch.schema.get_field_index("value"))
    if not (pa.types.is_binary(values.type) or pa.types.is_string(values.type)):
        return None
    longest = pc.max(pc.binary_length(values)).as_py()
    if longest is not None and longest > SPARSE_MAX_VALUE_BYTES:
        return None
    if options.topic:
        return options.topic
    index = batch.schema.get_field_index("__topic")
    if index < 0:
        return None
    topics = pc.unique(batch.column(index))
    return topics[0].as_py() if len(topics) == 1 and topics[0].is_valid else None


def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> WrittenMessages:
    """Send the rows of every batch (columns as ``write_rows`` takes them), with one flush of
    the producers per batch, and wait until the broker stored all of them.

    Messages are built with the client's ``MessageBuilder`` and sent by its producer directly:
    the wrapper's ``send_async`` checks the types of ten keyword arguments per message, which
    cost more than the send itself here, and the columns' types are known per batch.

    Receipts: a send callback costs more than the rest of a send (the client calls it on its
    own thread, which takes the GIL and makes a message id object for each message). A
    producer batch is one entry, stored or failed whole, and the client fails whole batches
    (a timeout, a closed or fenced producer fails every one pending). So where the sink knows
    where the client cuts its batches it asks for one receipt per producer batch: batches of
    exactly RECEIPT_EVERY messages (count cut only: small values, no publish-delay cut, no
    user batching settings, blocking when the queue is full so no send fails alone), each
    ending with the one message that carries the callback; messages without keys go to the
    partitions in runs of RECEIPT_EVERY, through one producer per partition. Anything else
    (keys, properties, large values, several topics in a batch) gets a receipt per message."""
    # The client's own logger: a Python logger is called back for every message it logs at
    # any level, twice per message sent, which costs as much as building the message.
    client = pulsar.Client(
        options.service_url,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        **options.client,  # type: ignore[arg-type]
    )
    producers: dict[str, object] = {}
    partition_producers: dict[str, list[object]] = {}
    # Every send's outcome, as result -> the id of the last message with it. The callback is a
    # builtin (dict.__setitem__): a Python function called back from the client's thread for
    # each message halves what the task can send (each call takes the GIL and a frame).
    outcomes: dict[object, object] = {}
    done = outcomes.__setitem__

    settings = {
        "batching_enabled": True,
        "block_if_queue_full": True,
        # A whole Arrow batch in flight before its flush: with the client's default of
        # 1,000 pending messages, one producer batch at a time waits for its receipt.
        "max_pending_messages": ARROW_BATCH_ROWS,
        **options.producer,
    }
    # The producers of a topic's partitions: the same, with batching set by the sink.
    partition_settings = {
        **settings,
        "batching_enabled": True,
        "batching_max_messages": RECEIPT_EVERY,
        "batching_max_allowed_size_in_bytes": BATCH_BYTES,
        # Never cut by time: the flush at the end of each Arrow batch sends the rest.
        "batching_max_publish_delay_ms": 3_600_000,
        "block_if_queue_full": True,
    }

    def producer_of(topic: str | None) -> object:
        if not topic:
            raise SinkError("no topic for a row: set the option topic or a __topic column")
        producer = producers.get(topic)
        if producer is None:
            producer = producers[topic] = client.create_producer(topic, **settings)._producer  # type: ignore[arg-type]
        return producer

    def partitions_of(topic: str) -> list[object]:
        found = partition_producers.get(topic)
        if found is None:
            found = partition_producers[topic] = [
                client.create_producer(name, **partition_settings)._producer  # type: ignore[arg-type]
                for name in client.get_topic_partitions(topic)
            ]
        return found

    count = 0
    turn = 0  # the partition the next run of messages goes to
    try:
        for batch in batches:
            values = _column(batch, "value")
            if values is None:
                raise SinkError("the rows have no value column (binary or string)")
            event_ms = _event_millis(batch)
            sparse = _sparse_topic(batch, options)
            if sparse is not None:
                targets = partitions_of(sparse)
                for start in range(0, len(values), RECEIPT_EVERY):
                    producer = targets[turn % len(targets)]
                    turn += 1
                    last = min(len(values), start + RECEIPT_EVERY) - 1
                    for i in range(start, last + 1):
                        builder = _pulsar.MessageBuilder()
                        value = values[i]
                        builder.content(value if isinstance(value, bytes) else _value(value))
                        if event_ms is not None and event_ms[i]:
                            builder.event_timestamp(event_ms[i])
                        producer.send_async(builder.build(), done if i == last else None)  # type: ignore[attr-defined]
                count += len(values)
                for producer in targets:
                    producer.flush()  # type: ignore[attr-defined]
                continue
            topics = None if options.topic else _column(batch, "__topic")
            keys = _column(batch, "__key")
            properties = _column(batch, "__messageProperties")
            fixed = producer_of(options.topic) if options.topic else None
            for i, value in enumerate(values):
                builder = _pulsar.MessageBuilder()
                if isinstance(value, bytes):
                    builder.content(value)
                elif isinstance(value, str):
                    builder.content(value.encode())
                else:
                    builder.content(_value(value))
                if keys is not None and keys[i] is not None:
                    builder.partition_key(str(keys[i]))
                if properties is not None and properties[i]:
                    for k, v in properties[i]:
                        builder.property(str(k), str(v))
                if event_ms is not None and event_ms[i]:
                    builder.event_timestamp(event_ms[i])
                producer = (
                    fixed if fixed is not None else producer_of(topics[i] if topics else None)
                )
                producer.send_async(builder.build(), done)  # type: ignore[attr-defined]
            count += len(values)
            for producer in producers.values():
                producer.flush()  # type: ignore[attr-defined]
    finally:
        client.close()
    failures = sorted(str(result) for result in outcomes if result != _pulsar.Result.Ok)
    if failures:
        raise SinkError(f"messages of the {count} sent were not stored: {', '.join(failures)}")
    return WrittenMessages(count)


class PulsarBatchArrowWriter(DataSourceArrowWriter):
    """``df.write.format("pulsar")`` with Arrow batches (the default): every task flushes once
    per batch and before it reports."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenMessages:
        with collecting_less():
            return write_batches(self.options, iterator)


class PulsarBatchWriter(DataSourceWriter):
    """``df.write.format("pulsar")``: every task flushes before it reports."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WrittenMessages:
        return write_rows(self.options, iterator)


class PulsarStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("pulsar")``: a micro-batch is committed once all its tasks have
    flushed; nothing is held back for a later commit (at least once, see the module doc)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WrittenMessages:
        return write_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        written = sum(m.count for m in messages if isinstance(m, WrittenMessages))
        log.info("micro-batch %d: %d messages written", batchId, written)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("micro-batch %d aborted: what its tasks flushed stays written", batchId)


class PulsarStreamArrowWriter(DataSourceStreamArrowWriter, PulsarStreamWriter):
    """``df.writeStream.format("pulsar")`` with Arrow batches (the default); commits as
    ``PulsarStreamWriter`` does."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenMessages:  # type: ignore[override]
        with collecting_less():
            return write_batches(self.options, iterator)
