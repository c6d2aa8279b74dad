"""Avro definitions to Spark row types, and payloads to row values (``magnetar.spark.schema``),
without a Spark session: the mapping table of docs/spark.md, case by case."""

from __future__ import annotations

import datetime
import io
import json
from decimal import Decimal

import fastavro
import pytest

from magnetar.spark.schema import PayloadDecoder, SchemaMappingError, TopicSchema, row_schema

META = (
    "__key:string,__topic:string,__messageId:binary,__publishTime:timestamp,"
    "__eventTime:timestamp,__messageProperties:map<string,string>"
)


def record(*fields: tuple[str, object]) -> dict:
    return {
        "type": "record",
        "name": "R",
        "fields": [{"name": name, "type": kind} for name, kind in fields],
    }


@pytest.mark.parametrize(
    ("kind", "spark"),
    [
        ("boolean", "boolean"),
        ("int", "int"),
        ("long", "bigint"),
        ("float", "float"),
        ("double", "double"),
        ("bytes", "binary"),
        ("string", "string"),
        ({"type": "fixed", "name": "F", "size": 4}, "binary"),
        (["null", "string"], "string"),
        (["int", "long"], "bigint"),
        (["null", "float", "double"], "double"),
        (["int", "string"], "string"),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, "string"),
        ({"type": "string", "logicalType": "uuid"}, "string"),
        ({"type": "long", "logicalType": "timestamp-millis"}, "timestamp"),
        ({"type": "long", "logicalType": "timestamp-micros"}, "timestamp"),
        ({"type": "int", "logicalType": "date"}, "date"),
        ({"type": "int", "logicalType": "time-millis"}, "int"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3}, "decimal(9,3)"),
        ({"type": "array", "items": ["null", "int"]}, "array<int>"),
        ({"type": "map", "values": "long"}, "map<string,bigint>"),
        (record(("a", "int")), "struct<a:int>"),
    ],
)
def test_avro_types_to_spark_types(kind: object, spark: str) -> None:
    schema = TopicSchema("AVRO", json.dumps({**record(("x", kind)), "name": "Top"}), 0)
    assert row_schema(schema).simpleString() == f"struct<x:{spark},{META}>"


def test_a_definition_that_is_not_a_record_is_one_value_column() -> None:
    assert row_schema(TopicSchema("JSON", '"long"', 0)).simpleString() == (
        f"struct<value:bigint,{META}>"
    )


def test_recursive_records_and_clashing_names_are_refused() -> None:
    recursive = {"type": "record", "name": "N", "fields": [{"name": "n", "type": ["null", "N"]}]}
    with pytest.raises(SchemaMappingError, match="record N contains itself"):
        row_schema(TopicSchema("AVRO", json.dumps(recursive), 0))
    with pytest.raises(SchemaMappingError, match=r"fields \['__key'\] clash"):
        row_schema(TopicSchema("AVRO", json.dumps(record(("__key", "string"))), 0))


V0 = record(
    ("id", "long"),
    ("at", {"type": "long", "logicalType": "timestamp-micros"}),
    ("t", {"type": "int", "logicalType": "time-millis"}),
    ("u", ["int", "string"]),
)
V1 = {**V0, "fields": [*V0["fields"], {"name": "n", "type": "int", "default": 7}]}


def avro(definition: dict, value: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(definition), value)
    return out.getvalue()


def test_avro_payloads_decode_from_their_own_version() -> None:
    at = datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)
    asked = []

    def writer(version: int) -> TopicSchema | None:
        asked.append(version)
        return TopicSchema("AVRO", json.dumps(V0), 0) if version == 0 else None

    decoder = PayloadDecoder(
        TopicSchema("AVRO", json.dumps(V1), 1), ("id", "at", "t", "u", "n", "gone"), writer
    )
    old = avro(V0, {"id": 1, "at": at, "t": datetime.time(0, 0, 1, 500000), "u": 3})
    new = avro(V1, {"id": 2, "at": at, "t": 0, "u": "x", "n": 9})
    assert decoder.decode(old, 0, "m0") == (1, at, 1500, "3", 7, None)  # JSON text
    assert decoder.decode(new, 1, "m1") == (2, at, 0, '"x"', 9, None)
    assert decoder.decode(old, 0, "m2")[0] == 1
    assert asked == [0]  # asked once per version, never for the query's own
    assert decoder.decode(b"", -1, "tombstone") == (None,) * 6
    with pytest.raises(ValueError, match="m3 does not decode with the topic's AVRO schema"):
        decoder.decode(b"\x01", -1, "m3")


def test_json_payloads_convert_along_the_definition() -> None:
    definition = record(
        ("at", {"type": "long", "logicalType": "timestamp-millis"}),
        ("day", {"type": "int", "logicalType": "date"}),
        ("raw", "bytes"),
        ("price", {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}),
        ("ratio", "double"),
        ("nested", ["null", {**record(("k", "string")), "name": "Inner"}]),
    )
    decoder = PayloadDecoder(
        TopicSchema("JSON", json.dumps(definition), 0),
        ("at", "day", "raw", "price", "ratio", "nested"),
        lambda version: None,
    )
    payload = {"at": 1000, "day": 2, "raw": "AAE=", "price": 1.25, "ratio": 3, "nested": {}}
    assert decoder.decode(json.dumps(payload).encode(), 0, "m") == (
        datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=datetime.UTC),
        datetime.date(1970, 1, 3),
        b"\x00\x01",
        Decimal("1.25"),
        3.0,
        (None,),
    )
    with pytest.raises(ValueError, match="m2 does not decode with the topic's JSON schema"):
        decoder.decode(b"{not json", 0, "m2")
