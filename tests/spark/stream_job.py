"""A streaming query in its own process, for the kill/restart test: topic -> parquet files.

    python -m tests.spark.stream_job SERVICE_URL ADMIN_URL TOPIC SINK CHECKPOINT {run|drain}

``run`` runs until killed; ``drain`` reads what exists (Trigger.AvailableNow) and exits.
"""

from __future__ import annotations

import sys

from tests.spark.helpers import local_spark


def main(
    service_url: str, admin_url: str, topic: str, sink: str, checkpoint: str, mode: str
) -> None:
    for spark in local_spark("stream-job"):
        writer = (
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
        if mode == "drain":
            writer.trigger(availableNow=True).start().awaitTermination()
        else:
            writer.trigger(processingTime="300 milliseconds").start().awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:7])
