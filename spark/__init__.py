"""PySpark source and sink for Magnetar (and Pulsar) topics: ``format("pulsar")``.

    from magnetar.spark import register
    register(spark)
    spark.readStream.format("pulsar").option("service.url", ...).option("admin.url", ...)

See docs/spark.md for the options, the rows and the delivery guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from magnetar.spark.options import SinkOptions, SourceOptions
from magnetar.spark.sink import PulsarBatchWriter, PulsarStreamWriter
from magnetar.spark.source import SCHEMA, PulsarBatchReader, PulsarStreamReader, source_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SCHEMA", "PulsarDataSource", "register"]


class PulsarDataSource(DataSource):
    """The ``pulsar`` data source: streaming and batch reads, streaming and batch writes."""

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def schema(self) -> StructType | str:
        # Typed columns when the first topic has a JSON or AVRO schema (docs/spark.md "Rows").
        return source_schema(self.options)

    def reader(self, schema: StructType) -> PulsarBatchReader:
        return PulsarBatchReader(SourceOptions.parse(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> PulsarStreamReader:
        return PulsarStreamReader(SourceOptions.parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return PulsarBatchWriter(SinkOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return PulsarStreamWriter(SinkOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("pulsar")`` available in ``spark``."""
    spark.dataSource.register(PulsarDataSource)
