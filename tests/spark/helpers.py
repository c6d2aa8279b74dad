"""What the Spark tests share: a light local Spark, topics made through the admin API."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

from pyspark.sql import SparkSession

from magnetar.spark import register
from tests.support.standalone import StandaloneProcess


def local_spark(name: str) -> Iterator[SparkSession]:
    """Generator body for a module-scoped fixture: a local[2] Spark with ``pulsar`` registered."""
    spark = (
        SparkSession.builder.master("local[2]")
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "768m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        yield spark
    finally:
        spark.stop()


def admin(node: StandaloneProcess, method: str, path: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{node.admin_url}/{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def create_partitioned(node: StandaloneProcess, topic: str, partitions: int) -> None:
    admin(node, "PUT", f"persistent/public/default/{topic}/partitions", partitions)


def update_partitions(node: StandaloneProcess, topic: str, partitions: int) -> None:
    admin(node, "POST", f"persistent/public/default/{topic}/partitions", partitions)


def ledgers(node: StandaloneProcess, topic: str) -> list[dict[str, int]]:
    stats = admin(node, "GET", f"persistent/public/default/{topic}/internalStats")
    assert isinstance(stats, dict)
    return list(stats["ledgers"])


def source_options(node: StandaloneProcess) -> dict[str, str]:
    return {"service.url": node.url, "admin.url": node.admin_url}
