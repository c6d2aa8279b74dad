"""The source's storage path: closed ledgers read straight from the bookies, no broker.

Pulsar's SQL connector reads this way; here the Spark source does, for a batch read and for
the part of a streaming micro-batch that lies in closed ledgers (a catch-up). The open
ledger's tail stays with the broker, which alone knows where it ends.

- The driver reads each topic-partition's ledger list from the metadata store
  (``managed_ledger_list``) and cuts the part of a range that lies in *closed* ledgers into
  tasks of about ``STORAGE_TASK_BYTES`` of stored entries, by ledger and entry range
  (``storage_split``): parallelism follows the data, not the partition count. What comes from
  the first ledger that is not closed on goes to the broker as before.
- An executor opens the metadata store (etcd for a cluster; a standalone's SQLite file
  read-only), reads each ledger's metadata and its entries through the ledger client (any
  replica, the next one asked when the first is slow or fails), and decodes the stored entries
  (``stored_entry``: batches, compression, schema versions) into the same rows, with the same
  serialized message ids, as the broker path gives.
- A ledger deleted while a task reads it (retention) is ``LedgerTrimmedError``, a
  ``DataLossError``: never rows silently missing.

``readFromStorage``: ``never`` reads everything through the broker; ``always`` refuses to plan
when the storage cannot be reached; ``auto`` (the default) uses the storage path when
``metadata.url`` is set and the store answers, and falls back to the broker (logged once per
process) when the store or, before a task has produced rows, the bookies cannot be reached.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from magnetar.common.ledger.bookie_client import BookieTls
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.errors import LedgerError, NoSuchEntryError, NoSuchLedgerError
from magnetar.common.ledger.managed_ledger_list import LedgerInfo, read_ledger_list
from magnetar.common.metadata import MetadataError, MetadataStore, open_store
from magnetar.common.metadata.etcd import EtcdTls
from magnetar.common.metadata.readonly_local import ReadOnlyLocalStore
from magnetar.common.protocol.stored_entry import schema_version, split_entry_columns
from magnetar.spark.arrow import ARROW_BATCH_ROWS, RowBuffer, micros
from magnetar.spark.offsets import DataLossError, EntryPosition, LedgerExtent
from magnetar.spark.schema import PayloadDecoder

log = logging.getLogger("magnetar.spark")

#: Stored bytes per storage task (a ledger larger than this is cut), by each ledger's mean
#: entry size; entries per task where a ledger's size is unknown.
STORAGE_TASK_BYTES = 32 * 1024 * 1024
STORAGE_TASK_ENTRIES = 1_000
#: At most this many entries per storage task, however small they are.
STORAGE_TASK_MAX_ENTRIES = 20_000
#: Entries asked of the bookies at once by a task (64 in flight, as the ledger client reads).
READ_CHUNK_ENTRIES = 256

#: A storage task: (ledger id, first entry, last entry) segments, in log order.
Segments = tuple[tuple[int, int, int], ...]

#: What makes ``auto`` fall back to the broker: the store or the bookies cannot be reached.
UNREACHABLE = (MetadataError, LedgerError, OSError)

_fallback_logged = False


class StorageUnavailableError(RuntimeError):
    """``readFromStorage=always`` but the metadata store or the bookies cannot be reached."""


def log_fallback_once(why: str) -> None:
    """The ``auto`` fallback to the broker path, logged once per process."""
    global _fallback_logged
    if not _fallback_logged:
        _fallback_logged = True
        log.warning("readFromStorage=auto: reading through the brokers instead: %s", why)


async def open_metadata_store(url: str, tls: EtcdTls | None = None) -> MetadataStore:
    """``etcd://...`` as the brokers open it (over TLS with ``tls``); ``local:///abs/meta.db``
    (a standalone's store) opened read-only, next to the standalone that owns it."""
    if url.startswith("local://"):
        return ReadOnlyLocalStore(Path(url.removeprefix("local://")))
    return await open_store(url, tls=tls)


async def closed_ledgers(
    url: str, topics: Sequence[str], tls: EtcdTls | None = None
) -> dict[str, frozenset[int]]:
    """For each topic-partition, the ledgers its list records as closed."""
    store = await open_metadata_store(url, tls)
    try:
        out = {}
        for topic in topics:
            listed: tuple[LedgerInfo, ...] = await read_ledger_list(store, topic) or ()
            out[topic] = frozenset(ledger.ledger_id for ledger in listed if ledger.closed)
        return out
    finally:
        await store.close()


def storage_split(
    begin: EntryPosition,
    until: EntryPosition,
    ledgers: Sequence[LedgerExtent],
    closed: frozenset[int],
    max_entries: int = STORAGE_TASK_ENTRIES,
    max_bytes: int = STORAGE_TASK_BYTES,
) -> tuple[list[Segments], EntryPosition | None]:
    """``(begin, until]`` cut into storage tasks over closed ledgers, in log order, and the
    position after which the broker reads the rest up to ``until`` (None when the closed
    ledgers hold all of it). Everything from the first ledger that is not closed on is the
    broker's, so the two parts never interleave.

    A task holds about ``max_bytes`` of stored entries, by each ledger's mean entry size
    (between 1 and ``STORAGE_TASK_MAX_ENTRIES`` entries of it), so a backlog of small entries
    is not cut into many small tasks that each pay a task's start; an entry of a ledger whose
    size is unknown counts as ``max_bytes / max_entries``."""
    segments: list[tuple[int, int, int, float]] = []
    broker_from: EntryPosition | None = None
    for extent in ledgers:
        if extent.entries == 0 or not begin.ledger <= extent.ledger <= until.ledger:
            continue
        first = begin.entry + 1 if extent.ledger == begin.ledger else 0
        last = until.entry if extent.ledger == until.ledger else extent.entries - 1
        if first > last:
            continue
        if broker_from is None and extent.ledger in closed:
            per_task = max_entries
            if extent.size > 0:
                mean = extent.size / extent.entries
                per_task = min(max(int(max_bytes / mean), 1), STORAGE_TASK_MAX_ENTRIES)
            segments.append((extent.ledger, first, last, max_bytes / per_task))
        elif broker_from is None:
            broker_from = EntryPosition(extent.ledger, first - 1)
    tasks: list[Segments] = []
    current: list[tuple[int, int, int]] = []
    room = float(max_bytes)
    for ledger, first, last, cost in segments:
        while first <= last:
            take = min(int(room / cost + 1e-9), last - first + 1)
            if take == 0 and not current:
                take = 1
            if take > 0:
                current.append((ledger, first, first + take - 1))
                first += take
                room -= take * cost
            if take == 0 or room < cost * (1 - 1e-9):
                tasks.append(tuple(current))
                current, room = [], float(max_bytes)
    if current:
        tasks.append(tuple(current))
    return tasks, broker_from


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def message_id_prefix(ledger: int, entry: int, partition: int) -> bytes:
    """The start of a serialized ``MessageIdData`` (what ``MessageId.serialize()`` gives):
    ledgerId (1), entryId (2) and, for a partition of a partitioned topic, partition (3)."""
    prefix = b"\x08" + _varint(ledger) + b"\x10" + _varint(entry)
    return prefix + b"\x18" + _varint(partition) if partition >= 0 else prefix


@functools.cache
def batch_suffixes(size: int) -> tuple[bytes, ...]:
    """batch_index (4) and batch_size (6) of each message of a batch of ``size``: the end of
    its serialized message id."""
    tail = b"\x30" + _varint(size)
    return tuple(b"\x20" + _varint(index) + tail for index in range(size))


def partition_index(topic: str) -> int:
    """The partition number of ``...-partition-N``; -1 for a topic that is not a partition."""
    name, sep, number = topic.rpartition("-partition-")
    return int(number) if sep and name and number.isdigit() else -1


class LedgerTrimmedError(DataLossError):
    """A ledger a task was reading was deleted (retention) before the task read all of it."""


#: The properties of a message without any: one shared empty dict (never changed), not one
#: per message.
_NO_PROPERTIES: dict[str, str] = {}


def append_entry(
    buffer: RowBuffer,
    stored: bytes,
    topic: str,
    prefix: bytes,
    decoder: PayloadDecoder | None,
) -> None:
    """The messages of one stored entry as rows of ``buffer``: what the official client gives
    for them (a batch's message takes its key, properties and event time from its own
    metadata, its publish time and schema version from the entry's)."""
    metadata, messages = split_entry_columns(stored)
    publish = micros(metadata.publish_time)
    version = schema_version(metadata)  # the entry's, once, not once per message
    if isinstance(messages, bytes):
        _append(
            buffer, decoder, version, messages, topic, prefix, metadata.partition_key or None,
            publish, micros(metadata.event_time), metadata.properties,
        )  # fmt: skip
        return
    singles, payloads = messages
    suffixes = batch_suffixes(len(singles))
    if decoder is not None:
        for single, data, suffix in zip(singles, payloads, suffixes, strict=True):
            event = single.event_time if single.HasField("event_time") else metadata.event_time
            _append(
                buffer, decoder, version, data, topic, prefix + suffix,
                single.partition_key or None, publish, micros(event), single.properties,
            )  # fmt: skip
        return
    # The untyped rows, column by column: these run once per message of the backlog, so each
    # is a comprehension or a C-level extend rather than a loop of appends.
    count = len(singles)
    entry_event = micros(metadata.event_time)
    buffer.value.extend(payloads)
    buffer.topics.extend([topic] * count)
    buffer.publish_us.extend([publish] * count)
    buffer.message_ids.extend(map(prefix.__add__, suffixes))
    buffer.keys.extend([single.partition_key or None for single in singles])
    buffer.event_us.extend(
        [single.event_time * 1000 if single.event_time > 0 else entry_event for single in singles]
    )
    buffer.properties.extend(
        [
            {p.key: p.value for p in single.properties} if single.properties else _NO_PROPERTIES
            for single in singles
        ]
    )


def _append(
    buffer: RowBuffer,
    decoder: PayloadDecoder | None,
    version: int,
    data: bytes,
    topic: str,
    msg_id: bytes,
    key: str | None,
    publish: int | None,
    event: int | None,
    properties: object,
) -> None:
    if decoder is None:
        buffer.value.append(data)
    else:
        where = f"message {msg_id.hex()} of {topic}"
        buffer.append_values(decoder.decode(data, version, where))  # type: ignore[arg-type]
    buffer.keys.append(key)
    buffer.topics.append(topic)
    buffer.message_ids.append(msg_id)
    buffer.publish_us.append(publish)
    buffer.event_us.append(event)
    buffer.properties.append({p.key: p.value for p in properties})  # type: ignore[attr-defined]


class StorageRead:
    """One storage task's read: its own event loop, metadata store and ledger client, in the
    executor's Python worker; ``batches`` yields RecordBatches as the entries arrive."""

    def __init__(
        self,
        metadata_url: str,
        topic: str,
        segments: Segments,
        buffer: RowBuffer,
        decoder: PayloadDecoder | None,
        *,
        metadata_tls: EtcdTls | None = None,
        bookkeeper_tls: BookieTls | None = None,
    ) -> None:
        self.metadata_url = metadata_url
        self.metadata_tls = metadata_tls
        self.bookkeeper_tls = bookkeeper_tls
        self.topic = topic
        self.segments = segments
        self.buffer = buffer
        self.decoder = decoder
        self.rows = 0  # rows handed out so far (a fallback is possible only before the first)

    def batches(self) -> Iterator[pa.RecordBatch]:
        loop = asyncio.new_event_loop()
        store: MetadataStore | None = None
        client: LedgerClient | None = None
        try:
            store = loop.run_until_complete(
                open_metadata_store(self.metadata_url, self.metadata_tls)
            )
            client = LedgerClient(store, tls=self.bookkeeper_tls)
            index = partition_index(self.topic)
            for ledger, first, last in self.segments:
                try:
                    handle = loop.run_until_complete(client.open_ledger(ledger, recovery=False))
                except NoSuchLedgerError:
                    raise self._trimmed(ledger, first, last) from None
                entry = first
                while entry <= last:
                    stop = min(last, entry + READ_CHUNK_ENTRIES - 1)
                    try:
                        entries = loop.run_until_complete(handle.read_batch(entry, stop))
                    except NoSuchEntryError:
                        raise self._trimmed(ledger, entry, last) from None
                    for read in entries:
                        prefix = message_id_prefix(ledger, read.entry_id, index)
                        append_entry(self.buffer, read.payload, self.topic, prefix, self.decoder)
                    entry = stop + 1
                    if len(self.buffer) >= ARROW_BATCH_ROWS:
                        self.rows += len(self.buffer)
                        yield self.buffer.take()
            if len(self.buffer):
                self.rows += len(self.buffer)
                yield self.buffer.take()
        finally:
            if client is not None:
                loop.run_until_complete(client.close())
            if store is not None:
                loop.run_until_complete(store.close())
            loop.close()

    def _trimmed(self, ledger: int, first: int, last: int) -> LedgerTrimmedError:
        return LedgerTrimmedError(
            f"topic-partition {self.topic}: ledger {ledger} was deleted (retention trimmed it, "
            f"or the topic was deleted) while this task read it from the bookies; its entries "
            f"{first}..{last} were planned but are gone"
        )
