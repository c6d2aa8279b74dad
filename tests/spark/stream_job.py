"""A streaming query in its own process, for the kill/restart test: topic -> parquet files.

    python -m tests.spark.stream_job SERVICE_URL ADMIN_URL TOPIC SINK CHECKPOINT [--on-cue]
        [--metadata-url URL]

Runs (a micro-batch every 300 ms) until killed. ``stream`` builds the same query for the
test's in-process drain, so both read and write exactly alike.

With ``--on-cue`` the process gets ready first: it starts Spark and reads the topic once as a
batch (no checkpoint, no subscription: it only loads the source into Spark's Python workers),
then waits for a line on stdin before it starts the query. A fresh Spark takes 15-20 s to its
first micro-batch on two cores; a test can have the next process get ready while the one it
will kill still runs, and start the query (from the checkpoint) once that one is dead.

With ``--metadata-url`` the query reads closed ledgers from storage (``metadata.url``).
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter

from tests.spark.helpers import shared_spark


def stream(
    spark: SparkSession,
    service_url: str,
    admin_url: str,
    topic: str,
    sink: str,
    checkpoint: str,
    metadata_url: str | None = None,
) -> DataStreamWriter:
    """The query: ``topic`` from ``earliest`` into parquet files at ``sink``; closed ledgers
    from storage when ``metadata_url`` is given."""
    storage = {} if metadata_url is None else {"metadata.url": metadata_url}
    return (
        spark.readStream.format("pulsar")
        .options(**storage)
        .option("service.url", service_url)
        .option("admin.url", admin_url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS value", "__topic", "__messageId")
        .writeStream.format("parquet")
        .option("path", sink)
        .option("checkpointLocation", checkpoint)
    )


def get_ready(spark: SparkSession, service_url: str, admin_url: str, topic: str) -> None:
    """Read ``topic`` once as a batch, so the query's first micro-batch finds warm workers."""
    (
        spark.read.format("pulsar")
        .option("service.url", service_url)
        .option("admin.url", admin_url)
        .option("topic", topic)
        .load()
        .count()
    )


def main(
    service_url: str,
    admin_url: str,
    topic: str,
    sink: str,
    checkpoint: str,
    on_cue: bool,
    metadata_url: str | None,
) -> None:
    spark = shared_spark()
    if on_cue:
        get_ready(spark, service_url, admin_url, topic)
        sys.stdin.readline()
    writer = stream(spark, service_url, admin_url, topic, sink, checkpoint, metadata_url)
    writer.trigger(processingTime="300 milliseconds").start().awaitTermination()


if __name__ == "__main__":
    flags = sys.argv[6:]
    metadata = flags[flags.index("--metadata-url") + 1] if "--metadata-url" in flags else None
    main(*sys.argv[1:6], on_cue="--on-cue" in flags, metadata_url=metadata)
