"""The ``pulsar`` source: a streaming and a batch reader over Magnetar topic-partitions.

The driver plans: it asks the admin API for each topic-partition's ledgers and turns them into
entry offsets (``offsets.py``). An executor reads one ``(start, end]`` range of one
topic-partition with a non-durable reader of the official client, its own client in its own
process, and stops at ``end`` without reading on.

When the query's first topic has a JSON or AVRO schema, the rows hold its fields as typed
columns in place of ``value`` (``schema.py``); the driver gives each range the schema, and the
executor decodes every payload with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StructField, StructType

from magnetar.spark.admin import Admin, LedgerStats, TopicName
from magnetar.spark.arrow import ARROW_BATCH_ROWS, RowBuffer, collecting_less, micros
from magnetar.spark.offsets import (
    EARLIEST,
    DataLossError,
    EntryPosition,
    OffsetMap,
    advance,
    entries_after,
    entry_at_or_before,
    is_lost,
    last_position,
    normalize,
    parse_starting,
    share_limit,
    split_range,
)
from magnetar.spark.options import OptionError, SourceOptions
from magnetar.spark.schema import (
    META_COLUMNS,
    PayloadDecoder,
    SchemaMappingError,
    TopicSchema,
    row_schema,
)
from magnetar.spark.storage import (
    UNREACHABLE,
    LedgerTrimmedError,
    Segments,
    StorageRead,
    StorageUnavailableError,
    closed_ledgers,
    log_fallback_once,
    storage_split,
)

log = logging.getLogger("magnetar.spark")

#: The rows the source produces.
SCHEMA = (
    "value binary, __key string, __topic string, __messageId binary, "
    "__publishTime timestamp, __eventTime timestamp, __messageProperties map<string,string>"
)

#: ``SCHEMA`` as a StructType (the executors build Arrow batches of it).
UNTYPED = StructType([StructField("value", BinaryType()), *META_COLUMNS])

__all__ = [
    "SCHEMA",
    "DataLossError",
    "LedgerTrimmedError",
    "PulsarBatchReader",
    "PulsarStreamReader",
    "RangePartition",
    "StorageUnavailableError",
]


@dataclass(frozen=True)  # no slots: InputPartition has a __dict__ and is pickled
class RangePartition(InputPartition):
    """One Spark task: the entries of ``topic`` after ``start`` up to and including ``end``."""

    topic: str
    start: EntryPosition
    end: EntryPosition
    options: SourceOptions
    #: The topic's JSON/AVRO schema and the query's typed columns; None: ``value`` is binary.
    value_schema: TopicSchema | None = None
    columns: tuple[str, ...] = ()
    #: Non-empty: a storage task, these (ledger, first, last) entries read from the bookies.
    segments: Segments = ()


def _millis(ms: int) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms > 0 else None


def _row(msg: pulsar.Message, decoder: PayloadDecoder | None) -> tuple[object, ...]:
    if decoder is None:
        value: tuple[object, ...] = (msg.data(),)
    else:
        where = f"message {msg.message_id()} of {msg.topic_name()}"
        # The version as a number (-1: none); the wrapper's schema_version() is a str that
        # cannot hold every byte value.
        value = decoder.decode(msg.data(), msg._message.int_schema_version(), where)
    return (
        *value,
        msg.partition_key() or None,
        msg.topic_name(),
        msg.message_id().serialize(),
        _millis(msg.publish_timestamp()),
        _millis(msg.event_timestamp()),
        dict(msg.properties()),
    )


def _messages(partition: RangePartition) -> Iterator[pulsar.Message]:
    """Every message of the entries in ``(start, end]``, through the broker, in order, then
    stop.

    The reader starts at ``start`` itself and skips it: a batch is one entry, and the client's
    own exclusion would only skip its first message. Whether the range is finished is known
    from the message ids alone, except inside a batch at ``end``, where the reader asks the
    broker whether more is available (its last message id carries the batch index)."""
    opts = partition.options
    quiet = logging.getLogger("pulsar-client")
    quiet.setLevel(logging.WARNING)
    start, end = partition.start, partition.end
    first = (
        pulsar.MessageId.earliest
        if start == EARLIEST
        else pulsar.MessageId(-1, start.ledger, max(start.entry, 0), -1)
    )
    client, reader = _open_reader(partition, first, quiet)
    try:
        while True:
            msg = _read_next(reader, opts.poll_timeout_ms)
            if msg is None:
                _ended_early(partition, "the topic-partition ends before it")
                return
            msg_id = msg.message_id()
            at = EntryPosition(msg_id.ledger_id(), msg_id.entry_id())
            if at <= start:
                continue
            if at > end:
                return
            yield msg
            if at == end and (
                msg_id.batch_index() < 0 or not _has_message_available(reader, opts.poll_timeout_ms)
            ):
                return
    finally:
        client.close()


def read_range(partition: RangePartition) -> Iterator[tuple[object, ...]]:
    """The rows of ``(start, end]`` through the broker as tuples, one by one (``arrow=false``,
    the source before issue 23)."""
    decoder = _decoder(partition)
    for msg in _messages(partition):
        yield _row(msg, decoder)


def read_range_arrow(partition: RangePartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    """The rows of ``(start, end]`` through the broker as Arrow batches, built column-wise."""
    decoder = _decoder(partition)
    buffer = RowBuffer(schema)
    value, keys, topics, ids = buffer.value, buffer.keys, buffer.topics, buffer.message_ids
    publish, event, properties = buffer.publish_us, buffer.event_us, buffer.properties
    for msg in _messages(partition):
        if decoder is None:
            value.append(msg.data())
        else:
            where = f"message {msg.message_id()} of {msg.topic_name()}"
            buffer.append_values(
                decoder.decode(msg.data(), msg._message.int_schema_version(), where)
            )
        keys.append(msg.partition_key() or None)
        topics.append(msg.topic_name())
        ids.append(msg.message_id().serialize())
        publish.append(micros(msg.publish_timestamp()))
        event.append(micros(msg.event_timestamp()))
        properties.append(msg.properties())
        if len(keys) >= ARROW_BATCH_ROWS:
            yield buffer.take()
            value, keys, topics, ids = buffer.value, buffer.keys, buffer.topics, buffer.message_ids
            publish, event, properties = buffer.publish_us, buffer.event_us, buffer.properties
    if len(buffer):
        yield buffer.take()


def read_from_storage(partition: RangePartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    """A storage task's rows from the bookies; with ``readFromStorage=auto``, from the broker
    when the store or the bookies cannot be reached before the task produced a row."""
    opts = partition.options
    assert opts.metadata_url is not None
    read = StorageRead(
        opts.metadata_url, partition.topic, partition.segments, RowBuffer(schema),
        _decoder(partition), metadata_tls=opts.metadata_tls, bookkeeper_tls=opts.bookkeeper_tls,
    )  # fmt: skip
    try:
        yield from read.batches()
    except LedgerTrimmedError as e:
        if opts.fail_on_data_loss:
            raise LedgerTrimmedError(f"{e}; set failOnDataLoss=false to skip lost data") from None
        log.warning("%s; skipped (failOnDataLoss=false)", e)
    except UNREACHABLE as e:
        if opts.read_from_storage == "always" or read.rows:
            raise
        log_fallback_once(f"task of {partition.topic} could not read from storage: {e}")
        yield from read_range_arrow(partition, schema)


def read_partition(
    partition: InputPartition, schema: StructType | None
) -> Iterator[tuple[object, ...]] | Iterator[pa.RecordBatch]:
    """One Spark task: a storage task, or a broker range as Arrow batches or tuples."""
    assert isinstance(partition, RangePartition)
    schema = UNTYPED if schema is None else schema
    if partition.segments:
        return _collecting_less(read_from_storage(partition, schema))
    if partition.options.arrow:
        return _collecting_less(read_range_arrow(partition, schema))
    return read_range(partition)


def _collecting_less(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    with collecting_less():
        yield from batches


#: What a reader's broker call can meet while its topic moves to another broker (the broker
#: closed the reader as the call went out, or the reader is reconnecting): ask again.
_MOVING = (pulsar.ConsumerNotFound, pulsar.NotConnected, pulsar.ServiceUnitNotReady, pulsar.Timeout)

#: Operation timeout of a reader's client unless ``pulsar.client.operationTimeoutSeconds`` says
#: otherwise: a reader that could not be created in time is created again, by a new client.
READER_OPEN_TIMEOUT_S = 10


def _open_reader(
    partition: RangePartition, first: pulsar.MessageId, quiet: logging.Logger
) -> tuple[pulsar.Client, pulsar.Reader]:
    """A client and its reader at ``first``; created again (new client, new lookups) while the
    topic is moving between brokers, until the poll timeout."""
    opts = partition.options
    settings = {"operation_timeout_seconds": READER_OPEN_TIMEOUT_S, **opts.client}
    deadline = time.monotonic() + opts.poll_timeout_ms / 1000
    while True:
        client = pulsar.Client(opts.service_url, logger=quiet, **settings)  # type: ignore[arg-type]
        try:
            reader = client.create_reader(
                partition.topic, first, start_message_id_inclusive=True, **opts.reader
            )
            return client, reader
        except _MOVING as e:
            client.close()
            if time.monotonic() > deadline:
                raise
            quiet.warning("reader on %s not created (%s); creating it again", partition.topic, e)
        except BaseException:
            client.close()
            raise


#: How long a read waits for the next message before it asks the broker whether there is one.
READ_WAIT_MS = 1000


def _read_next(reader: pulsar.Reader, timeout_ms: int) -> pulsar.Message | None:
    """The next message, or None when the broker says the topic-partition has no more.

    A range's entries exist when it is planned, so the next one is nearly always already in
    the reader's queue: asking the broker first (``has_message_available``) for every message
    cost a sixth of the read. It is asked only when no message came within ``READ_WAIT_MS``;
    until ``timeout_ms`` while the broker says more is coming."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        wait = max(1, min(READ_WAIT_MS, int((deadline - time.monotonic()) * 1000)))
        try:
            return reader.read_next(wait)
        except pulsar.Timeout:
            if not _has_message_available(reader, timeout_ms):
                return None
            if time.monotonic() > deadline:
                raise


def _has_message_available(reader: pulsar.Reader, timeout_ms: int) -> bool:
    """``reader.has_message_available()``, asked again (with growing pauses, up to
    ``timeout_ms``) while the topic is moving between brokers."""
    deadline = time.monotonic() + timeout_ms / 1000
    pause = 0.05
    while True:
        try:
            return reader.has_message_available()
        except _MOVING:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


def _decoder(partition: RangePartition) -> PayloadDecoder | None:
    """The payload decoder of a typed range; messages of other schema versions are decoded
    from their own version, asked from the admin API once per version."""
    if partition.value_schema is None:
        return None
    admin = Admin(partition.options.admin_url)
    topic = TopicName.parse(partition.topic)
    return PayloadDecoder(
        partition.value_schema,
        partition.columns,
        lambda version: admin.topic_schema(topic, version),
    )


def first_topic_schema(options: SourceOptions) -> TopicSchema | None:
    """The JSON or AVRO schema of the query's first topic-partition (None: untyped rows)."""
    names = _Planner(options).partitions()
    if not names:
        return None
    found = Admin(options.admin_url).topic_schema(TopicName.parse(names[0]))
    return found if found is not None and found.typed else None


def source_schema(options: Mapping[str, str]) -> StructType | str:
    """The rows of a read with ``options``: typed from the first topic's JSON or AVRO schema,
    else ``SCHEMA``. Options that are not a read's (a sink's) get ``SCHEMA``."""
    try:
        parsed = SourceOptions.parse(options, streaming=False)
    except OptionError:
        return SCHEMA
    found = first_topic_schema(parsed)
    return SCHEMA if found is None else row_schema(found)


def typed_columns(
    options: SourceOptions, schema: StructType
) -> tuple[TopicSchema | None, tuple[str, ...]]:
    """The decoding a reader with the row ``schema`` needs: the first topic's schema and the
    columns before the message's own; none when ``schema`` has a binary ``value``."""
    names = tuple(schema.fieldNames())
    if names[:1] == ("value",) and schema["value"].dataType.typeName() == "binary":
        return None, ()
    found = first_topic_schema(options)
    if found is None:
        raise SchemaMappingError(
            f"the query's rows are typed ({', '.join(names[:3])}, ...) but its first topic has "
            "no JSON or AVRO schema now (deleted after the query was defined?)"
        )
    meta = {f.name for f in META_COLUMNS}
    return found, tuple(n for n in names if n not in meta)


def _ended_early(partition: RangePartition, why: str) -> None:
    text = (
        f"topic-partition {partition.topic}: entries up to {partition.end} were planned but "
        f"{why}; they were deleted (retention, or the topic deleted) after planning"
    )
    if partition.options.fail_on_data_loss:
        raise DataLossError(text + "; set failOnDataLoss=false to skip lost data")
    log.warning("%s; skipped (failOnDataLoss=false)", text)


class _Planner:
    """What the driver knows about the topics: their partitions and ledgers, asked fresh."""

    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.admin = Admin(options.admin_url)
        self.value_schema, self.columns = (
            (None, ()) if schema is None else typed_columns(options, schema)
        )

    def partitions(self) -> list[str]:
        """The topic-partitions read now; new partitions and matching topics appear here."""
        topics = (
            self.admin.matching_topics(self.options.topics_pattern)
            if self.options.topics_pattern
            else [str(TopicName.parse(t)) for t in self.options.topics]
        )
        return sorted(p for t in topics for p in self.admin.topic_partitions(TopicName.parse(t)))

    def stats(self, names: list[str]) -> dict[str, LedgerStats]:
        return {name: self.admin.ledger_stats(name) for name in names}

    def resolve(self, text: str, stats: dict[str, LedgerStats]) -> dict[str, EntryPosition]:
        """``startingOffsets``/``endingOffsets`` as positions, ``latest`` as the last entry."""
        given = parse_starting(text, sorted(stats))
        out = {}
        for name, value in given.items():
            if name not in stats:
                continue
            if value == "earliest":
                out[name] = EARLIEST
            elif value == "latest":
                out[name] = normalize(last_position(stats[name].ledgers), stats[name].ledgers)
            else:
                assert isinstance(value, EntryPosition)
                out[name] = value
        return out

    def check_loss(self, name: str, start: EntryPosition, stats: LedgerStats) -> None:
        if not is_lost(start, stats.ledgers):
            return
        text = (
            f"topic-partition {name}: the query's offset {start} points into ledger "
            f"{start.ledger}, which the topic no longer has (retention deleted it, or the topic "
            f"was deleted); the entries after it that the query had not read are lost"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(
                text + "; set failOnDataLoss=false to go on from the earliest stored entry"
            )
        log.warning("%s; going on from the earliest stored entry (failOnDataLoss=false)", text)

    def ranges(
        self, start: dict[str, EntryPosition], end: dict[str, EntryPosition]
    ) -> list[RangePartition]:
        """One input partition per topic-partition with entries in ``(start, end]``; with
        ``minPartitions``, ranges are cut so that there are at least that many (each piece
        holds at most total / minPartitions entries, rounded up)."""
        stats = self.stats(sorted(end))
        counts = {
            name: entries_after(start.get(name, EARLIEST), stats[name].ledgers)
            - entries_after(stop, stats[name].ledgers)
            for name, stop in end.items()
        }
        total = sum(max(n, 0) for n in counts.values())
        wanted = self.options.min_partitions
        size = -(-total // wanted) if wanted and total > 0 else max(total, 1)
        closed = self.closed_ledgers([n for n, count in counts.items() if count > 0])
        out = []
        for name, stop in sorted(end.items()):
            if counts[name] <= 0:
                continue
            ledgers = stats[name].ledgers
            for begin, until in split_range(start.get(name, EARLIEST), stop, ledgers, size):
                if closed is None:
                    out.append(self._range(name, begin, entry_at_or_before(until, ledgers)))
                    continue
                tasks, broker_from = storage_split(begin, until, ledgers, closed[name])
                for segments in tasks:
                    (first_ledger, first, _), (last_ledger, _, last) = segments[0], segments[-1]
                    out.append(
                        self._range(
                            name,
                            EntryPosition(first_ledger, first - 1),
                            EntryPosition(last_ledger, last),
                            segments,
                        )
                    )
                if broker_from is not None:
                    out.append(self._range(name, broker_from, entry_at_or_before(until, ledgers)))
        return out

    def _range(
        self, name: str, begin: EntryPosition, until: EntryPosition, segments: Segments = ()
    ) -> RangePartition:
        return RangePartition(
            name, begin, until, self.options, self.value_schema, self.columns, segments
        )

    def closed_ledgers(self, names: list[str]) -> dict[str, frozenset[int]] | None:
        """The closed ledgers of each topic-partition from the metadata store, when the storage
        path is on (``readFromStorage`` and ``metadata.url``); None: read through the broker."""
        opts = self.options
        if not names or opts.read_from_storage == "never" or opts.metadata_url is None:
            return None
        try:
            return asyncio.run(closed_ledgers(opts.metadata_url, names, opts.metadata_tls))
        except UNREACHABLE as e:
            why = f"the metadata store {opts.metadata_url} could not be read: {e}"
            if opts.read_from_storage == "always":
                raise StorageUnavailableError(f"readFromStorage=always but {why}") from e
            log_fallback_once(why)
            return None


def _positions(offsets: dict) -> dict[str, EntryPosition]:
    return {name: EntryPosition.from_json(value) for name, value in offsets.items()}


def _offsets(positions: dict[str, EntryPosition]) -> OffsetMap:
    return {name: position.to_json() for name, position in sorted(positions.items())}


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over entry offsets kept in Spark's checkpoint (see ``offsets.py``).

    ``latestOffset`` respects the engine's ``ReadLimit``: ``maxEntriesPerTrigger`` is a
    ``ReadMaxRows`` counted in entries, ``maxBytesPerTrigger`` a ``ReadMaxBytes`` turned into
    entries by each topic-partition's mean entry size; ``Trigger.AvailableNow`` fixes a target
    in ``prepareForTriggerAvailableNow`` and never goes past it."""

    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.schema = schema
        self.planner = _Planner(options, schema)
        self.target: dict[str, EntryPosition] | None = None

    def initialOffset(self) -> dict:
        stats = self.planner.stats(self.planner.partitions())
        return _offsets(self.planner.resolve(self.options.starting_offsets, stats))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_entries_per_trigger is not None:
            return ReadMaxRows(self.options.max_entries_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        stats = self.planner.stats(self.planner.partitions())
        self.target = {
            name: normalize(last_position(s.ledgers), s.ledgers) for name, s in stats.items()
        }

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _positions(start)
        stats = self.planner.stats(self.planner.partitions())
        for name in begin.keys() - stats.keys():  # a topic no longer matched keeps its offset
            log.info("topic-partition %s is no longer read", name)
        latest: dict[str, EntryPosition] = {}
        available: dict[str, int] = {}
        for name, s in stats.items():
            here = begin.get(name, EARLIEST)
            self.planner.check_loss(name, here, s)
            last = normalize(last_position(s.ledgers), s.ledgers)
            if self.target is not None:
                last = min(last, self.target.get(name, here))
            latest[name] = max(last, here)
            available[name] = entries_after(here, s.ledgers) - entries_after(
                latest[name], s.ledgers
            )
        budget = self._budget(limit, available, stats)
        if budget is not None:
            shares = share_limit(budget, available)
            for name, share in shares.items():
                if share < available[name]:
                    here = begin.get(name, EARLIEST)
                    latest[name] = advance(here, share, stats[name].ledgers)
        ends = {name: normalize(position, stats[name].ledgers) for name, position in latest.items()}
        return _offsets({**begin, **ends})

    @staticmethod
    def _budget(
        limit: ReadLimit, available: dict[str, int], stats: dict[str, LedgerStats]
    ) -> int | None:
        """The most entries this micro-batch may read; ``None`` for no limit."""
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows
        if isinstance(limit, ReadMaxBytes):
            wanted = [n for n, count in available.items() if count > 0]
            if not wanted:
                return None
            mean = sum(stats[n].bytes_per_entry for n in wanted) / len(wanted)
            return max(1, int(limit.max_bytes // max(mean, 1.0)))
        return None

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        return self.planner.ranges(_positions(start), _positions(end))

    def read(
        self, partition: InputPartition
    ) -> Iterator[tuple[object, ...]] | Iterator[pa.RecordBatch]:
        return read_partition(partition, self.schema)


class PulsarBatchReader(DataSourceReader):
    """A batch read of ``(startingOffsets, endingOffsets]``, planned when the query starts."""

    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[RangePartition]:
        planner = _Planner(self.options, self.schema)
        stats = planner.stats(planner.partitions())
        start = planner.resolve(self.options.starting_offsets, stats)
        end = planner.resolve(self.options.ending_offsets, stats)
        for name, position in start.items():
            planner.check_loss(name, position, stats[name])
        return planner.ranges(start, {n: max(end[n], start[n]) for n in end})

    def read(
        self, partition: InputPartition
    ) -> Iterator[tuple[object, ...]] | Iterator[pa.RecordBatch]:
        return read_partition(partition, self.schema)
