"""Avro schema resolution (``schema_compatibility``) on the cases of the Avro specification's
"Schema Resolution" section, and FULL compatibility as Pulsar's default strategy uses it."""

from __future__ import annotations

import json

import pytest

from magnetar.broker.schema.compatibility import (
    InvalidSchemaError,
    full_problems,
    parse,
    reading_problems,
)


def schema(definition: object) -> object:
    return parse(json.dumps(definition).encode())


def record(*fields: dict, name: str = "User") -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


NAME = {"name": "name", "type": ["null", "string"]}
AGE = {"name": "age", "type": ["null", "int"]}
EMAIL_DEFAULT = {"name": "email", "type": ["null", "string"], "default": None}
EMAIL = {"name": "email", "type": ["null", "string"]}


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        ("int", "long"),
        ("int", "double"),
        ("long", "float"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
        ("int", ["null", "long"]),
        (["null", "int"], ["null", "long", "string"]),
        ({"type": "long", "logicalType": "timestamp-millis"}, "long"),
    ],
)
def test_promotions_and_unions_read(writer: object, reader: object) -> None:
    assert reading_problems(schema(reader), schema(writer)) == []


@pytest.mark.parametrize(
    ("writer", "reader", "problem"),
    [
        ("long", "int", "the top level: the writer's long cannot be read as int"),
        ("double", "float", "the top level: the writer's double cannot be read as float"),
        (
            ["null", "string"],
            ["null", "int"],
            "<branch 1>: no branch of the reader's union reads the writer's string",
        ),
        (
            {"type": "fixed", "name": "F", "size": 4},
            {"type": "fixed", "name": "F", "size": 8},
            "the top level: fixed size 4 cannot be read as size 8",
        ),
        (
            {"type": "enum", "name": "E", "symbols": ["A", "B"]},
            {"type": "enum", "name": "E", "symbols": ["A"]},
            "the top level: enum symbols ['B'] are unknown to the reader",
        ),
        (
            record(NAME, name="A"),
            record(NAME, name="B"),
            "the top level: record A cannot be read as record B",
        ),
    ],
)
def test_what_does_not_read(writer: object, reader: object, problem: str) -> None:
    assert reading_problems(schema(reader), schema(writer)) == [problem]


def test_a_field_with_a_default_may_come_and_go() -> None:
    v0, v1 = schema(record(NAME, AGE)), schema(record(NAME, AGE, EMAIL_DEFAULT))
    assert full_problems(v1, v0) == []
    assert full_problems(v0, v1) == []


def test_a_field_without_a_default_breaks_full_compatibility() -> None:
    v0, v1 = schema(record(NAME, AGE)), schema(record(NAME, AGE, EMAIL))
    assert full_problems(v1, v0) == [
        "the new schema cannot read old data: field email: missing in the writer and without "
        "a default"
    ]
    assert full_problems(v0, v1) == [
        "the old schema cannot read new data: field email: missing in the writer and without "
        "a default"
    ]


def test_nested_records_named_references_and_recursion() -> None:
    node = {
        "type": "record",
        "name": "Node",
        "namespace": "t",
        "fields": [
            {"name": "value", "type": "int"},
            {"name": "next", "type": ["null", "Node"]},
            {
                "name": "tags",
                "type": {"type": "map", "values": {"type": "array", "items": "t.Node"}},
            },
        ],
    }
    wider = json.loads(json.dumps(node))
    wider["fields"][0]["type"] = "long"
    assert reading_problems(schema(wider), schema(node)) == []
    # Reported once: the nested occurrences of Node are the same comparison again.
    assert reading_problems(schema(node), schema(wider)) == [
        "value: the writer's long cannot be read as int"
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "schema definition is not JSON"),
        (b'{"type": "record", "name": "R"}', "schema: record R needs a list of fields"),
        (
            b'{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]}',
            "R.a: unknown type 'Nope'",
        ),
        (b'"strnig"', "schema: unknown type 'strnig'"),
    ],
)
def test_invalid_definitions_say_why(data: bytes, message: str) -> None:
    with pytest.raises(InvalidSchemaError) as e:
        parse(data)
    assert message in str(e.value)
