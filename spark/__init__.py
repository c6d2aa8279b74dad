"""PySpark source and sink for Magnetar (and Pulsar) topics: ``format("pulsar")``.

    from magnetar.spark import register
    register(spark)
    spark.readStream.format("pulsar").option("service.url", ...).option("admin.url", ...)

See docs/spark.md for the options, the rows and the delivery guarantees. Only the registration
lives here, and it imports pyspark when called: ``magnetar.spark.offsets`` and the other pure
modules import without pyspark installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Make ``format("pulsar")`` available in ``spark``."""
    from magnetar.spark.datasource import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)
