"""What the Spark tests share: a light local Spark, topics made through the admin API."""

from __future__ import annotations

import json
import urllib.request

from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from magnetar.spark import register
from tests.support.standalone import StandaloneProcess

_shared: SparkSession | None = None


def shared_spark() -> SparkSession:
    """The process's one local[2] Spark, with ``pulsar`` registered; started on first use.

    Every test module of a run shares it (a JVM start costs 10-30 s on a shared 2-core
    machine); ``tests/spark/conftest.py`` stops it when the run ends."""
    global _shared
    if _shared is not None:
        return _shared
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("magnetar-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "768m")
        # A test's JVM lives a minute and computes little: the client compiler alone and the
        # serial collector start it several seconds sooner on two shared cores.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    )
    for attempt in range(3):
        try:
            spark = builder.getOrCreate()
            break
        except PySparkRuntimeError as e:
            # Seen once after ~900 tests of one run: the JVM gateway, forked from a process
            # whose gRPC threads were busy, exited before it gave its port. A new one starts.
            if "JAVA_GATEWAY_EXITED" not in str(e) or attempt == 2:
                raise
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    _shared = spark
    return spark


def stop_shared_spark() -> None:
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


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
