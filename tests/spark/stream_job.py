"""A streaming query in its own process, for the kill/restart test: topic -> parquet files.

    python -m tests.spark.stream_job SERVICE_URL ADMIN_URL TOPIC SINK CHECKPOINT

Runs (a micro-batch every 300 ms) until killed. ``stream`` builds the same query for the
test's in-process drain, so both read and write exactly alike.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter

from tests.spark.helpers import shared_spark


def stream(
    spark: SparkSession, service_url: str, admin_url: str, topic: str, sink: str, checkpoint: str
) -> DataStreamWriter:
    """The query: ``topic`` from ``earliest`` into parquet files at ``sink``."""
    return (
        spark.readStream.format("pulsar")
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


def main(service_url: str, admin_url: str, topic: str, sink: str, checkpoint: str) -> None:
    writer = stream(shared_spark(), service_url, admin_url, topic, sink, checkpoint)
    writer.trigger(processingTime="300 milliseconds").start().awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])
