"""The ``pulsar`` data source: PySpark's Python Data Source API bound to the source and sink."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from magnetar.spark.options import SinkOptions, SourceOptions
from magnetar.spark.sink import (
    PulsarBatchArrowWriter,
    PulsarBatchWriter,
    PulsarStreamArrowWriter,
    PulsarStreamWriter,
)
from magnetar.spark.source import PulsarBatchReader, PulsarStreamReader, source_schema


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
        options = SinkOptions.parse(self.options)
        if options.arrow:
            return PulsarBatchArrowWriter(options)  # type: ignore[return-value]
        return PulsarBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = SinkOptions.parse(self.options)
        if options.arrow:
            return PulsarStreamArrowWriter(options)
        return PulsarStreamWriter(options)
