"""Typed rows from a topic's JSON or AVRO schema: the Spark type of an Avro definition, and
the decoding of payloads into rows of it.

Both schema types carry an Avro definition (the clients generate it from a record class).
AVRO payloads are Avro binary without a container header, decoded with ``fastavro``'s
``schemaless_reader`` from the message's own schema version (the writer's) into the query's
(the reader's), so messages of older compatible versions read as the query's columns. JSON
payloads are JSON documents, decoded with ``json`` and converted along the same definition.

Type mapping (as Pulsar's Spark connector, through spark-avro, maps Avro): boolean, int, long,
float, double, string, bytes (and fixed) as themselves; a union ``["null", T]`` as T; other
unions of int and long as long, of float and double as double, anything else as a string of
JSON text; records as structs, arrays, maps (string keys); enums and uuids as strings;
``timestamp-millis``/``-micros`` as timestamp, ``date`` as date, ``decimal`` as decimal,
``time-millis``/``-micros`` as the number of milli/microseconds of the day.
"""

from __future__ import annotations

import base64
import datetime
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import fastavro
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

#: The message's own columns, after the value's (as in Pulsar's connector).
META_COLUMNS = (
    StructField("__key", StringType()),
    StructField("__topic", StringType()),
    StructField("__messageId", BinaryType()),
    StructField("__publishTime", TimestampType()),
    StructField("__eventTime", TimestampType()),
    StructField("__messageProperties", MapType(StringType(), StringType())),
)
TYPED = frozenset(("JSON", "AVRO"))
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_PRIMITIVE: dict[str, DataType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}


class SchemaMappingError(ValueError):
    """An Avro definition Spark columns cannot hold (a recursive record, say)."""


class PayloadDecodeError(ValueError):
    """A payload that does not decode with the topic's schema."""


@dataclass(slots=True, frozen=True)
class TopicSchema:
    """One version of a topic's schema as the admin API gives it."""

    type: str
    definition: str
    version: int

    @property
    def typed(self) -> bool:
        return self.type in TYPED


class _Avro:
    """A parsed definition and its named types, for walking it."""

    def __init__(self, definition: str) -> None:
        self.named: dict[str, Any] = {}
        try:
            self.parsed = fastavro.parse_schema(json.loads(definition), named_schemas=self.named)
        except Exception as e:  # fastavro raises several kinds for a bad definition
            raise SchemaMappingError(
                f"the topic's schema is not a valid Avro definition: {e}"
            ) from None

    def resolve(self, node: Any) -> Any:
        while True:
            if isinstance(node, str) and node not in _PRIMITIVE and node != "null":
                node = self.named[node]
            elif isinstance(node, dict) and isinstance(node.get("type"), dict | list):
                node = node["type"]
            elif isinstance(node, dict) and node.get("type") in _PRIMITIVE and len(node) == 1:
                node = node["type"]
            else:
                return node


def _non_null(branches: list[Any]) -> list[Any]:
    return [b for b in branches if b != "null"]


def _logical(node: Any) -> str | None:
    return node.get("logicalType") if isinstance(node, dict) else None


def _kind(node: Any) -> str:
    if isinstance(node, list):
        return "union"
    return node if isinstance(node, str) else str(node["type"])


def spark_type(avro: _Avro, node: Any, seen: tuple[str, ...] = ()) -> DataType:
    node = avro.resolve(node)
    kind, logical = _kind(node), _logical(node)
    if kind == "union":
        branches = [avro.resolve(b) for b in _non_null(node)]
        kinds = {_kind(b) for b in branches if _logical(b) is None}
        if len(branches) == 1:
            return spark_type(avro, branches[0], seen)
        if kinds and kinds <= {"int", "long"} and len(kinds) == len(branches):
            return LongType()
        if kinds and kinds <= {"float", "double"} and len(kinds) == len(branches):
            return DoubleType()
        return StringType()
    if logical in ("timestamp-millis", "timestamp-micros"):
        return TimestampType()
    if logical == "date":
        return DateType()
    if logical == "decimal":
        return DecimalType(int(node["precision"]), int(node.get("scale", 0)))
    if kind in _PRIMITIVE:
        return _PRIMITIVE[kind]
    if kind == "null":
        return StringType()  # always null
    if kind in ("enum",):
        return StringType()
    if kind == "fixed":
        return BinaryType()
    if kind == "array":
        return ArrayType(spark_type(avro, node["items"], seen))
    if kind == "map":
        return MapType(StringType(), spark_type(avro, node["values"], seen))
    if kind in ("record", "error"):
        name = str(node["name"])
        if name in seen:
            raise SchemaMappingError(f"record {name} contains itself: no Spark type can hold it")
        return StructType(
            [
                StructField(f["name"], spark_type(avro, f["type"], (*seen, name)))
                for f in node["fields"]
            ]
        )
    raise SchemaMappingError(f"Avro type {kind!r} has no Spark type here")


def value_columns(schema: TopicSchema) -> list[StructField]:
    """The columns a typed schema gives in place of ``value``: a record's fields, or one
    ``value`` column of the definition's type."""
    avro = _Avro(schema.definition)
    root = avro.resolve(avro.parsed)
    mapped = spark_type(avro, root)
    if isinstance(mapped, StructType) and _kind(root) in ("record", "error"):
        return list(mapped.fields)
    return [StructField("value", mapped)]


def row_schema(schema: TopicSchema) -> StructType:
    """The source's row: the value's typed columns, then the message's own."""
    fields = value_columns(schema)
    clash = {f.name for f in fields} & {f.name for f in META_COLUMNS}
    if clash:
        raise SchemaMappingError(f"the schema's fields {sorted(clash)} clash with the source's")
    return StructType([*fields, *META_COLUMNS])


class _Converter:
    """Decoded values (fastavro's, or JSON's) into what Spark takes for the mapped type."""

    def __init__(self, avro: _Avro) -> None:
        self.avro = avro

    def __call__(self, node: Any, value: Any) -> Any:
        if value is None:
            return None
        node = self.avro.resolve(node)
        kind, logical = _kind(node), _logical(node)
        if kind == "union":
            branches = [self.avro.resolve(b) for b in _non_null(node)]
            mapped = spark_type(self.avro, node)
            if len(branches) == 1:
                return self(branches[0], value)
            if isinstance(mapped, LongType):
                return int(value)
            if isinstance(mapped, DoubleType):
                return float(value)
            return json.dumps(value, default=str, sort_keys=True)
        if logical in ("timestamp-millis", "timestamp-micros"):
            if isinstance(value, datetime.datetime):
                return value
            unit = 1000 if logical == "timestamp-millis" else 1_000_000
            return _EPOCH + datetime.timedelta(seconds=value / unit)
        if logical == "date":
            if isinstance(value, datetime.date):
                return value
            return datetime.date(1970, 1, 1) + datetime.timedelta(days=int(value))
        if logical in ("time-millis", "time-micros") and isinstance(value, datetime.time):
            micros = (value.hour * 3600 + value.minute * 60 + value.second) * 1_000_000
            micros += value.microsecond
            return micros // 1000 if logical == "time-millis" else micros
        if logical == "decimal":
            return value if isinstance(value, Decimal) else Decimal(str(value))
        if kind in ("bytes", "fixed"):
            if isinstance(value, str):  # JSON carries bytes as base64 (Jackson's way)
                return base64.b64decode(value)
            return bytes(value)
        if kind in ("float", "double"):
            return float(value)
        if kind == "string":
            return str(value)  # uuids come back as UUID objects
        if kind == "array":
            return [self(node["items"], v) for v in value]
        if kind == "map":
            return {str(k): self(node["values"], v) for k, v in value.items()}
        if kind in ("record", "error"):
            return tuple(self(f["type"], value.get(f["name"])) for f in node["fields"])
        return value


WriterLookup = Callable[[int], TopicSchema | None]


class PayloadDecoder:
    """Payloads of one topic into the values of ``columns`` (the query's typed columns, by
    name: a column the record lacks is null)."""

    def __init__(
        self, schema: TopicSchema, columns: tuple[str, ...], writer_schema: WriterLookup
    ) -> None:
        self.schema = schema
        self.columns = columns
        self.avro = _Avro(schema.definition)
        self.convert = _Converter(self.avro)
        self.writer_schema = writer_schema
        self._writers: dict[int, Any] = {}
        root = self.avro.resolve(self.avro.parsed)
        self.is_record = _kind(root) in ("record", "error")
        self.root = root

    def _writer(self, version: int) -> Any:
        """The parsed writer's schema of ``version`` (None: the query's own)."""
        if version < 0 or version == self.schema.version:
            return None
        if version not in self._writers:
            found = self.writer_schema(version)
            self._writers[version] = (
                None
                if found is None or found.definition == self.schema.definition
                else fastavro.parse_schema(json.loads(found.definition))
            )
        return self._writers[version]

    def decode(self, payload: bytes, version: int, where: str) -> tuple[Any, ...]:
        if not payload:
            return (None,) * len(self.columns)
        try:
            if self.schema.type == "JSON":
                value = json.loads(payload)
            else:
                writer = self._writer(version)
                stream = io.BytesIO(payload)
                if writer is None:
                    value = fastavro.schemaless_reader(stream, self.avro.parsed, None)
                else:
                    value = fastavro.schemaless_reader(stream, writer, self.avro.parsed)
        except Exception as e:  # fastavro and json raise several kinds for bad input
            raise PayloadDecodeError(
                f"{where} does not decode with the topic's {self.schema.type} schema "
                f"(version {self.schema.version}): {type(e).__name__}: {e}"
            ) from None
        if not self.is_record:
            return (self.convert(self.root, value),)
        if not isinstance(value, dict):
            raise PayloadDecodeError(f"{where}: expected a record, got {type(value).__name__}")
        fields = {f["name"]: f["type"] for f in self.root["fields"]}
        return tuple(
            self.convert(fields[c], value.get(c)) if c in fields else None for c in self.columns
        )
