"""The ``pulsar`` sink: each Spark task produces its rows with batching and flushes before it
reports success.

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

import pulsar
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

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
