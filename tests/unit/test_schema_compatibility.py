"""Avro schema resolution (``schema_compatibility``) on the cases of the Avro specification's
"Schema Resolution" section, and FULL compatibility as Pulsar's default strategy uses it."""

from __future__ import annotations

import json

import pytest

from magnetar.broker.schema.compatibility import (
    InvalidSchemaError,
    check_strategy,
    evolution_problems,
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
        (
            "long",
            "int",
            "type mismatch at /: reader type: int not compatible with writer type: long",
        ),
        (
            "double",
            "float",
            "type mismatch at /: reader type: float not compatible with writer type: double",
        ),
        (
            ["null", "string"],
            ["null", "int"],
            "missing union branch at /1: reader union lacking writer type: STRING",
        ),
        (
            {"type": "fixed", "name": "F", "size": 4},
            {"type": "fixed", "name": "F", "size": 8},
            "fixed size mismatch at /size: expected: 4, found: 8",
        ),
        (
            {"type": "enum", "name": "E", "symbols": ["A", "B"]},
            {"type": "enum", "name": "E", "symbols": ["A"]},
            "missing enum symbols at /symbols: {'B'}",
        ),
        (
            record(NAME, name="A"),
            record(NAME, name="B"),
            "name mismatch at /, /name: expected: A",
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
        "the new schema cannot read old data: reader field missing default value at /fields/2: "
        "email"
    ]
    assert full_problems(v0, v1) == [
        "the old schema cannot read new data: reader field missing default value at /fields/2: "
        "email"
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
        "type mismatch at /, /fields/0/type: reader type: int not compatible with writer type: long"
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


# --------------------------------------------------------------------------------------------
# Evolutions x strategies, as Pulsar decides them (Avro's reader/writer resolution, BACKWARD:
# the new schema reads old data, FORWARD: the old schema reads new data, FULL: both).
# --------------------------------------------------------------------------------------------

A_INT = {"name": "a", "type": "int"}
B_OPTIONAL = {"name": "b", "type": ["null", "string"], "default": None}
B_REQUIRED = {"name": "b", "type": "string"}
# The official client's required_default=True: a non-null field that carries a default.
B_REQUIRED_DEFAULT = {"name": "b", "type": "int", "default": 0}

EVOLUTIONS = {
    "add optional field": (record(A_INT), record(A_INT, B_OPTIONAL)),
    "add required field": (record(A_INT), record(A_INT, B_REQUIRED)),
    "add required_default field": (record(A_INT), record(A_INT, B_REQUIRED_DEFAULT)),
    "remove optional field": (record(A_INT, B_OPTIONAL), record(A_INT)),
    "remove required field": (record(A_INT, B_REQUIRED), record(A_INT)),
    "widen int to long": (record(A_INT), record({"name": "a", "type": "long"})),
    "change int to string": (record(A_INT), record({"name": "a", "type": "string"})),
    "union widening": (
        record({"name": "a", "type": ["null", "int"]}),
        record({"name": "a", "type": ["null", "int", "string"]}),
    ),
}

#: evolution -> (BACKWARD, FORWARD, FULL) allowed
DECISIONS = {
    "add optional field": (True, True, True),
    "add required field": (False, True, False),
    "add required_default field": (True, True, True),
    "remove optional field": (True, True, True),
    "remove required field": (True, False, False),
    "widen int to long": (True, False, False),
    "change int to string": (False, False, False),
    "union widening": (True, False, False),
}


@pytest.mark.parametrize("evolution", sorted(EVOLUTIONS))
@pytest.mark.parametrize(
    "strategy",
    [
        "ALWAYS_COMPATIBLE",
        "ALWAYS_INCOMPATIBLE",
        "BACKWARD",
        "FORWARD",
        "FULL",
        "UNDEFINED",
        "BACKWARD_TRANSITIVE",
        "FORWARD_TRANSITIVE",
        "FULL_TRANSITIVE",
    ],
)
def test_evolution_table(evolution: str, strategy: str) -> None:
    old, new = (schema(d) for d in EVOLUTIONS[evolution])
    backward, forward, full = DECISIONS[evolution]
    expected = {
        "ALWAYS_COMPATIBLE": True,
        "ALWAYS_INCOMPATIBLE": False,
        "BACKWARD": backward,
        "FORWARD": forward,
        "FULL": full,
        "UNDEFINED": full,  # Pulsar's broker default
    }[strategy.removesuffix("_TRANSITIVE")]
    # With one existing version, the transitive forms decide as the plain ones.
    assert (evolution_problems(strategy, new, [old]) == []) is expected


def test_transitive_forms_check_every_version() -> None:
    v1 = schema(record(A_INT))
    v2 = schema(record(A_INT, B_OPTIONAL))
    v3 = schema(record(A_INT, {"name": "b", "type": ["null", "string"]}))  # default dropped
    assert evolution_problems("BACKWARD", v3, [v1, v2]) == []
    problems = evolution_problems("BACKWARD_TRANSITIVE", v3, [v1, v2])
    assert problems == [
        "the new schema cannot read version -2 data: reader field missing default value at "
        "/fields/1: b"
    ]
    # FORWARD: v1 and v2 both read v3's data.
    assert evolution_problems("FORWARD_TRANSITIVE", v3, [v1, v2]) == []


def test_aliases_and_namespaces_are_judged_by_avro() -> None:
    old = schema({"type": "record", "name": "User", "namespace": "a", "fields": [A_INT]})
    renamed = {"type": "record", "name": "Person", "namespace": "b", "aliases": ["a.User"]}
    new = schema({**renamed, "fields": [{"name": "count", "type": "int", "aliases": ["a"]}]})
    assert reading_problems(new, old) == []


@pytest.mark.parametrize("value", ["full", "BACKWARD_TRANSITIVE", "UNDEFINED"])
def test_strategy_names(value: str) -> None:
    assert check_strategy(value) == value.upper()


@pytest.mark.parametrize("value", ["SOMETIMES", 3, None])
def test_unknown_strategy(value: object) -> None:
    with pytest.raises(ValueError, match="must be one of"):
        check_strategy(value)
