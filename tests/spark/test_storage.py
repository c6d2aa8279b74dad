"""The source's storage path against a real standalone (issue 23): closed ledgers read from the
bookie, the open ledger's tail from the broker.

- The same read through the broker only (``readFromStorage=never``) and with the storage path
  (``always``, the standalone's metadata store opened read-only) gives identical rows, every
  column and every message id, for unbatched and batched producers, each compression type,
  a partitioned topic and an AVRO schema of two versions; the ranges cross ledger rollovers
  (every 7 entries) and the plans do hold storage tasks.
- A ledger deleted by retention while a storage task reads it fails the task with
  ``LedgerTrimmedError`` naming the ledger, not with rows missing.
- ``auto`` with a metadata store it cannot read falls back to the broker path.
- The Arrow sink (the default) and the row-by-row one store the same messages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pulsar
import pytest
from pulsar.schema import AvroSchema
from pyspark.sql import SparkSession

from magnetar.common.ledger.metadata import ledger_key
from magnetar.common.metadata.readonly_local import ReadOnlyLocalStore
from magnetar.spark import storage
from magnetar.spark.offsets import EARLIEST, EntryPosition, LedgerExtent
from magnetar.spark.options import SourceOptions
from magnetar.spark.source import (
    UNTYPED,
    LedgerTrimmedError,
    PulsarBatchReader,
    RangePartition,
    read_partition,
)
from magnetar.spark.storage import message_id_prefix, partition_index, storage_split
from tests.spark.helpers import admin, create_partitioned, source_options
from tests.spark.test_schema import ORDER_V0, ORDER_V1
from tests.support.raw_client import assert_log_clean, module_standalone
from tests.support.standalone import StandaloneProcess


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(
        tmp_path_factory.mktemp("spark-storage") / "standalone",
        extra=[
            "--max-entries-per-ledger", "7",
            "--default-retention-time-minutes", "-1",
            "--default-retention-size-mb", "-1",
            "--policy-check-interval-seconds", "1",
        ],
    )  # fmt: skip


def storage_options(node: StandaloneProcess, mode: str = "always") -> dict[str, str]:
    return {
        **source_options(node),
        "readFromStorage": mode,
        "metadata.url": f"local://{(node.data_dir / 'meta.db').resolve()}",
    }


def produce(
    pc: pulsar.Client, topic: str, count: int, *, batched: bool, compression: str = "NONE"
) -> None:
    producer = pc.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=5,
        batching_max_publish_delay_ms=1000,
        compression_type=getattr(pulsar.CompressionType, compression),
        block_if_queue_full=True,
    )
    for i in range(count):
        extra: dict[str, object] = {"properties": {"i": str(i), "topic": topic}}
        if i % 3:
            extra["partition_key"] = f"k{i % 4}"
        if i % 2:
            extra["event_timestamp"] = 1_700_000_000_000 + i
        producer.send_async(f"{topic}-{i:05d}".encode() * (1 + i % 7), None, **extra)
    producer.flush()
    producer.close()


def rows(spark: SparkSession, options: dict[str, str], topic: str) -> list[tuple]:
    frame = spark.read.format("pulsar").options(**options).option("topic", topic).load()
    out = [tuple(r) for r in frame.collect()]
    return sorted(out, key=lambda r: bytes(r[frame.columns.index("__messageId")]))


def storage_tasks(options: dict[str, str], topic: str) -> int:
    reader = PulsarBatchReader(SourceOptions.parse({**options, "topic": topic}, streaming=False))
    return sum(1 for p in reader.partitions() if p.segments)


def assert_same_rows(spark: SparkSession, node: StandaloneProcess, topic: str, count: int) -> None:
    through_broker = rows(spark, {**source_options(node), "readFromStorage": "never"}, topic)
    from_storage = rows(spark, storage_options(node), topic)
    assert len(through_broker) == count
    assert from_storage == through_broker
    assert storage_tasks(storage_options(node), topic) > 0, "no storage task was planned"


@pytest.mark.parametrize("compression", ["NONE", "LZ4", "ZLib", "ZSTD", "SNAPPY"])
def test_batched_entries_read_the_same_from_storage(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess, compression: str
) -> None:
    topic = f"persistent://public/default/storage-batched-{compression.lower()}"
    produce(pc, topic, 83, batched=True, compression=compression)
    assert_same_rows(spark, node, topic, 83)


def test_unbatched_and_partitioned_topics_read_the_same_from_storage(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess
) -> None:
    plain = "persistent://public/default/storage-plain"
    produce(pc, plain, 30, batched=False)
    assert_same_rows(spark, node, plain, 30)
    create_partitioned(node, "storage-partitioned", 2)
    partitioned = "persistent://public/default/storage-partitioned"
    produce(pc, partitioned, 60, batched=True)
    produce(pc, f"{partitioned}-partition-1", 20, batched=False)
    assert_same_rows(spark, node, partitioned, 80)


def test_schema_versions_read_the_same_from_storage(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess
) -> None:
    topic = "persistent://public/default/storage-avro"
    for version, definition in enumerate((ORDER_V0, ORDER_V1)):
        producer = pc.create_producer(
            topic,
            schema=AvroSchema(None, schema_definition=definition),
            batching_enabled=version == 1,
            batching_max_messages=4,
            batching_max_publish_delay_ms=1000,
        )
        for i in range(12):
            order = {
                "id": version * 100 + i,
                "status": "NEW",
                "placed": 1_700_000_000_000 + i,
                "due": None,
                "lines": [{"sku": f"s{i}", "qty": i}],
                "amount": i,
            }
            if version:
                order["note"] = f"n{i}"
            producer.send_async(order, None)
        producer.flush()
        producer.close()
    assert_same_rows(spark, node, topic, 24)


def test_auto_falls_back_to_the_broker_when_the_store_cannot_be_read(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess
) -> None:
    topic = "persistent://public/default/storage-fallback"
    produce(pc, topic, 20, batched=False)
    options = {**storage_options(node, "auto"), "metadata.url": "local:///nonexistent/meta.db"}
    assert storage_tasks(options, topic) == 0
    assert len(rows(spark, options, topic)) == 20


def test_a_ledger_trimmed_during_a_storage_read_is_named(
    pc: pulsar.Client, node: StandaloneProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task is read here, in the test's process, so that retention can run between its
    first ledger and the next: one batch per 256-entry chunk (ARROW_BATCH_ROWS = 1)."""
    admin(node, "PUT", "namespaces/public/trimmed", {})
    topic = "persistent://public/trimmed/storage-trim"
    produce(pc, topic, 30, batched=False)  # ledgers of 7, 7, 7, 7, then the open one
    options = SourceOptions.parse({**storage_options(node), "topic": topic}, streaming=False)
    [task] = [p for p in PulsarBatchReader(options).partitions() if p.segments]
    assert len(task.segments) == 4
    monkeypatch.setattr(storage, "READ_CHUNK_ENTRIES", 7)
    monkeypatch.setattr(storage, "ARROW_BATCH_ROWS", 1)
    batches = iter(read_partition(task, UNTYPED))
    assert next(batches).num_rows == 7  # the first ledger read
    admin(
        node,
        "POST",
        "namespaces/public/trimmed/retention",
        {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
    )
    gone = task.segments[1][0]
    deadline = time.monotonic() + 30
    # The broker drops a ledger from the topic's list first, then deletes it: wait for both.
    while any(x["ledgerId"] == gone for x in ledgers_of(node, topic)) or ledger_exists(node, gone):
        assert time.monotonic() < deadline, "retention did not delete the ledgers"
        time.sleep(0.2)
    with pytest.raises(LedgerTrimmedError, match=f"ledger {gone} was deleted"):
        list(batches)


def ledger_exists(node: StandaloneProcess, ledger: int) -> bool:
    async def read() -> bool:
        store = ReadOnlyLocalStore(node.data_dir / "meta.db")
        try:
            return await store.get(ledger_key(ledger)) is not None
        finally:
            await store.close()

    return asyncio.run(read())


def ledgers_of(node: StandaloneProcess, topic: str) -> list[dict[str, int]]:
    stats = admin(node, "GET", f"{topic.replace('://', '/')}/internalStats")
    assert isinstance(stats, dict)
    return list(stats["ledgers"])


def test_arrow_and_row_sinks_store_the_same_messages(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess
) -> None:
    frame = spark.createDataFrame(
        [(f"v{i}".encode(), f"k{i}" if i % 2 else None, {"i": str(i)}) for i in range(50)],
        "value binary, __key string, __messageProperties map<string,string>",
    )
    read = {}
    for arrow in ("true", "false"):
        topic = f"persistent://public/default/storage-sink-{arrow}"
        frame.write.format("pulsar").option("service.url", node.url).option("topic", topic).option(
            "arrow", arrow
        ).mode("append").save()
        got = rows(spark, source_options(node), topic)
        read[arrow] = sorted((r[0], r[1], r[6]) for r in got)
    assert read["true"] == read["false"]
    assert len(read["true"]) == 50
    assert (b"v3", "k3", {"i": "3"}) in read["true"]
    # Rows without keys or properties: one receipt per producer batch, the rows sent in runs
    # of 1,000 over the partitions (2 tasks of 2,250 rows: runs of 1,000, 1,000 and 250).
    create_partitioned(node, "storage-sink-runs", 3)
    topic = "persistent://public/default/storage-sink-runs"
    spark.range(0, 4500, 1, 2).selectExpr(
        "CAST(CAST(id AS STRING) AS BINARY) AS value"
    ).write.format("pulsar").option("service.url", node.url).option("topic", topic).mode(
        "append"
    ).save()
    got = rows(spark, source_options(node), topic)
    assert sorted(r[0] for r in got) == sorted(str(i).encode() for i in range(4500))
    assert {r[2] for r in got} == {f"{topic}-partition-{n}" for n in range(3)}


def test_storage_split_cuts_closed_ledgers_and_leaves_the_rest_to_the_broker() -> None:
    extents = (LedgerExtent(1, 5), LedgerExtent(2, 0), LedgerExtent(3, 4), LedgerExtent(4, 3))
    tasks, rest = storage_split(EARLIEST, EntryPosition(4, 1), extents, frozenset({1, 3}), 6)
    assert tasks == [((1, 0, 4), (3, 0, 0)), ((3, 1, 3),)]
    assert rest == EntryPosition(4, -1)
    tasks, rest = storage_split(EntryPosition(1, 2), EntryPosition(3, 1), extents, frozenset({1}))
    assert tasks == [((1, 3, 4),)]
    # With the ledgers' sizes: about 32 MiB a task, whatever the entries' size.
    sized = (LedgerExtent(1, 10, 10 * 4 << 20), LedgerExtent(2, 6250, 6250 * 2200))
    tasks, _ = storage_split(EARLIEST, EntryPosition(2, 6249), sized, frozenset({1, 2}))
    assert tasks == [((1, 0, 7),), ((1, 8, 9), (2, 0, 6249))]
    assert rest == EntryPosition(3, -1)
    assert storage_split(EntryPosition(3, -1), EntryPosition(3, 3), extents, frozenset({3})) == (
        [((3, 0, 3),)],
        None,
    )


def test_message_ids_are_serialized_as_the_official_client_does() -> None:
    for partition in (-1, 0, 3):
        for ledger, entry in ((7, 0), (1838733020203008, 300)):
            ours = message_id_prefix(ledger, entry, partition)
            assert ours == pulsar.MessageId(partition, ledger, entry, -1).serialize()
    assert partition_index("persistent://a/b/c-partition-12") == 12
    assert partition_index("persistent://a/b/c") == -1


def test_range_partitions_pickle_with_their_segments() -> None:
    import pickle

    options = SourceOptions.parse(
        {"service.url": "pulsar://x:1", "admin.url": "http://x:2", "topic": "t"}, False
    )
    part = RangePartition("t", EARLIEST, EntryPosition(1, 4), options, segments=((1, 0, 4),))
    assert pickle.loads(pickle.dumps(part)) == part


def test_standalone_log_is_clean(node: StandaloneProcess) -> None:
    """Runs last: the module's standalone logged no traceback and no ERROR line."""
    assert_log_clean(node)
