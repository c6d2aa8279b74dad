"""Typed columns from a topic's JSON or AVRO schema, read by a batch query (issue 12).

- A JSON-schema topic (a ``pulsar.schema`` record with a nested record, an array, a map and a
  null field) gives the record's fields as typed columns, then the message's own columns.
- An AVRO-schema topic (a hand-written definition: enum, nested record, logical types
  timestamp-millis and date, a union of int and long) decodes to exact values, messages of an
  older compatible schema version included (read as the latest version's columns).
- A topic without a schema keeps ``value`` binary.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pulsar
import pytest
from pulsar.schema import Array, AvroSchema, Double, Integer, JsonSchema, Map, Record, String
from pyspark.sql import DataFrame, SparkSession

from tests.spark.helpers import source_options
from tests.support.raw_client import module_standalone
from tests.support.standalone import StandaloneProcess

UTC = datetime.UTC


class Address(Record):
    city = String()
    zip = Integer()


class Person(Record):
    name = String()
    age = Integer()
    score = Double(required=True)
    address = Address()
    tags = Array(String())
    attrs = Map(String())


ORDER_V0 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "due", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
                },
            },
        },
        {"name": "amount", "type": ["int", "long"]},
    ],
}
#: Version 1: a field added with a default (FULL compatible).
ORDER_V1 = {
    **ORDER_V0,
    "fields": [*ORDER_V0["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("spark-schema") / "standalone")


def read(spark: SparkSession, node: StandaloneProcess, topic: str) -> DataFrame:
    return spark.read.format("pulsar").options(**source_options(node)).option("topic", topic).load()


META = ["__key", "__topic", "__messageId", "__publishTime", "__eventTime", "__messageProperties"]


def test_json_schema_gives_typed_columns(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess
) -> None:
    topic = "persistent://public/default/spark-json-schema"
    producer = pc.create_producer(topic, schema=JsonSchema(Person))
    producer.send(
        Person(
            name="ada",
            age=36,
            score=1.5,
            address=Address(city="London", zip=1),
            tags=["math", "engines"],
            attrs={"born": "1815"},
        ),
        partition_key="k0",
    )
    producer.send(Person(name="alan", age=None, score=-2.25, tags=[], attrs={}))
    producer.close()
    df = read(spark, node, topic)
    assert df.schema.simpleString() == (
        "struct<name:string,age:int,score:double,address:struct<city:string,zip:int>,"
        "tags:array<string>,attrs:map<string,string>,__key:string,__topic:string,"
        "__messageId:binary,__publishTime:timestamp,__eventTime:timestamp,"
        "__messageProperties:map<string,string>>"
    )
    rows = df.orderBy("score").collect()
    assert [r.asDict(recursive=True) | {m: None for m in META} for r in rows] == [
        {
            "name": "alan",
            "age": None,
            "score": -2.25,
            "address": {"city": None, "zip": None},  # the client writes an empty Address
            "tags": [],
            "attrs": {},
            **{m: None for m in META},
        },
        {
            "name": "ada",
            "age": 36,
            "score": 1.5,
            "address": {"city": "London", "zip": 1},
            "tags": ["math", "engines"],
            "attrs": {"born": "1815"},
            **{m: None for m in META},
        },
    ]
    assert [(r["__key"], r["__topic"]) for r in rows] == [(None, topic), ("k0", topic)]


def test_avro_schema_gives_typed_columns_across_versions(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess
) -> None:
    topic = "persistent://public/default/spark-avro-schema"
    placed = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    old = pc.create_producer(topic, schema=AvroSchema(None, schema_definition=ORDER_V0))
    old.send(
        {
            "id": 1,
            "status": "NEW",
            "placed": placed,
            "due": datetime.date(2024, 6, 1),
            "lines": [{"sku": "a", "qty": 2}],
            "amount": 7,
        }
    )
    old.close()
    new = pc.create_producer(topic, schema=AvroSchema(None, schema_definition=ORDER_V1))
    new.send(
        {
            "id": 2,
            "status": "PAID",
            "placed": placed,
            "due": None,
            "lines": [],
            "amount": 2**40,
            "note": "gift",
        }
    )
    new.close()
    df = read(spark, node, topic)
    assert df.schema.simpleString().startswith(
        "struct<id:bigint,status:string,placed:timestamp,due:date,"
        "lines:array<struct<sku:string,qty:int>>,amount:bigint,note:string,__key:string,"
    )
    rows = [r.asDict(recursive=True) for r in df.orderBy("id").collect()]
    for r in rows:
        # Spark gives timestamps back as naive local times: compare as instants.
        r["placed"] = r["placed"].astimezone(UTC)
        for m in META:
            r.pop(m)
    assert rows == [
        {
            "id": 1,
            "status": "NEW",
            "placed": placed,
            "due": datetime.date(2024, 6, 1),
            "lines": [{"sku": "a", "qty": 2}],
            "amount": 7,
            "note": None,  # version 0 has no note: the latest version's default
        },
        {
            "id": 2,
            "status": "PAID",
            "placed": placed,
            "due": None,
            "lines": [],
            "amount": 2**40,
            "note": "gift",
        },
    ]


def test_a_topic_without_schema_keeps_binary_value(
    spark: SparkSession, pc: pulsar.Client, node: StandaloneProcess
) -> None:
    topic = "persistent://public/default/spark-no-schema"
    producer = pc.create_producer(topic)
    producer.send(b"raw")
    producer.close()
    df = read(spark, node, topic)
    assert df.schema.fieldNames() == ["value", *META]
    assert [bytes(r.value) for r in df.collect()] == [b"raw"]
