"""Avro schema resolution: can data written with one schema be read with another?

Pulsar's JSON and AVRO schemas are both Avro record definitions (the clients generate them from
a record class), so both are checked by Avro's resolution rules (Avro specification, "Schema
Resolution"): a reader schema R reads data written with a writer schema W when

- both are the same primitive, or W's is promoted to R's: int -> long, float, double;
  long -> float, double; float -> double; string <-> bytes;
- both are records of the same (unqualified) name, and every field of R is either a field of W
  (by name or one of R's field aliases) whose type R's field reads, or has a default;
  fields of W that R lacks are skipped;
- both are enums of the same name, and every symbol of W is one of R's (or R has a default);
- both are fixed of the same name and size; arrays whose items, maps whose values resolve;
- W is a union and R reads every branch of it; or R is a union (W not) and one branch reads W.

Pulsar's default compatibility strategy for these types is FULL: a new schema must read data
of the latest version (BACKWARD) and the latest version must read data of the new one
(FORWARD). A consumer's schema must only read the latest version. Logical types are not
compared (Avro does not either): they annotate the same encoding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from avro.errors import AvroException

PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))
NAMED = frozenset(("record", "error", "enum", "fixed"))
_CHECKER = ReaderWriterCompatibilityChecker()


class InvalidSchemaError(ValueError):
    """Schema data that is not an Avro schema definition."""


@dataclass(slots=True)
class AvroSchema:
    """A parsed definition and its named types by full name (for references by name)."""

    root: Any
    named: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The same definition parsed by the Avro library, which judges compatibility.
    parsed: Any = None


def parse(data: bytes) -> AvroSchema:
    """Parse and check an Avro definition (JSON text); InvalidSchemaError says what is wrong."""
    try:
        root = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise InvalidSchemaError(f"schema definition is not JSON: {e}") from None
    schema = AvroSchema(root)
    _collect(root, "", schema.named, "schema")
    try:
        schema.parsed = avro.schema.parse(data.decode("utf-8"))
    except (AvroException, UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
        raise InvalidSchemaError(f"not an Avro schema definition: {e}") from None
    return schema


def _full_name(node: dict[str, Any], namespace: str) -> str:
    name = node.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidSchemaError(f"a {node.get('type')} type needs a name")
    if "." in name:
        return name
    space = node.get("namespace", namespace)
    return f"{space}.{name}" if space else name


def _collect(node: Any, namespace: str, named: dict[str, dict[str, Any]], where: str) -> None:
    """Check the structure and register named types, as Avro parsers do."""
    if isinstance(node, str):
        if node not in PRIMITIVES and node not in named and f"{namespace}.{node}" not in named:
            raise InvalidSchemaError(f"{where}: unknown type {node!r}")
        return
    if isinstance(node, list):
        for i, branch in enumerate(node):
            if isinstance(branch, list):
                raise InvalidSchemaError(f"{where}: a union may not hold a union")
            _collect(branch, namespace, named, f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        raise InvalidSchemaError(f"{where}: {node!r} is not a type")
    kind = node.get("type")
    if kind in PRIMITIVES:
        return
    if kind in NAMED:
        full = _full_name(node, namespace)
        named[full] = node
        inner = full.rpartition(".")[0]
        if kind in ("record", "error"):
            fields = node.get("fields")
            if not isinstance(fields, list):
                raise InvalidSchemaError(f"{where}: record {full} needs a list of fields")
            for f in fields:
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise InvalidSchemaError(f"{where}: record {full} has a field without a name")
                if "type" not in f:
                    raise InvalidSchemaError(f"{where}: field {full}.{f['name']} has no type")
                _collect(f["type"], inner, named, f"{full}.{f['name']}")
        elif kind == "enum":
            if not isinstance(node.get("symbols"), list):
                raise InvalidSchemaError(f"{where}: enum {full} needs a list of symbols")
        elif not isinstance(node.get("size"), int):
            raise InvalidSchemaError(f"{where}: fixed {full} needs an integer size")
        return
    if kind == "array":
        _collect(node.get("items"), namespace, named, f"{where}.items")
        return
    if kind == "map":
        _collect(node.get("values"), namespace, named, f"{where}.values")
        return
    if isinstance(kind, dict | list) or (isinstance(kind, str) and kind not in NAMED):
        _collect(kind, namespace, named, where)  # {"type": "string"} or {"type": {...}}
        return
    raise InvalidSchemaError(f"{where}: unknown type {kind!r}")


def reading_problems(reader: AvroSchema, writer: AvroSchema) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can).

    Decided by Apache Avro's own ``ReaderWriterCompatibilityChecker`` (the Python port of the
    Java ``SchemaCompatibility`` that Pulsar's ``AvroSchemaBasedCompatibilityCheck`` calls), so
    defaults, unions, aliases and namespaces are judged as Pulsar judges them."""
    result = _CHECKER.get_compatibility(reader.parsed, writer.parsed)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted(i.value.replace("_", " ") for i in result.incompatibilities))
    where = ", ".join(sorted(result.locations))
    return [f"{kinds} at {where}: " + "; ".join(sorted(result.messages))]


def full_problems(new: AvroSchema, latest: AvroSchema) -> list[str]:
    """FULL compatibility of ``new`` with ``latest``: each reads the other's data."""
    return evolution_problems("FULL", new, [latest])


#: Pulsar's SchemaCompatibilityStrategy values. UNDEFINED (a namespace that set none) means the
#: broker's default, FULL, as Pulsar's schemaCompatibilityStrategy setting has it.
STRATEGIES = (
    "UNDEFINED",
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
)
DEFAULT_STRATEGY = "FULL"


def check_strategy(value: Any) -> str:
    """A strategy name as an admin call gives it (a JSON string, any case)."""
    if not isinstance(value, str) or value.upper() not in STRATEGIES:
        raise ValueError(f"schema compatibility strategy must be one of {', '.join(STRATEGIES)}")
    return value.upper()


def evolution_problems(strategy: str, new: AvroSchema, existing: list[AvroSchema]) -> list[str]:
    """Why ``new`` may not follow ``existing`` (oldest first) under ``strategy`` (empty: it may).

    As Pulsar's ``AvroSchemaBasedCompatibilityCheck``: BACKWARD, the new schema reads data
    written with the existing one(s); FORWARD, the existing one(s) read data written with the
    new; FULL, both. The plain forms compare with the latest version, the ``_TRANSITIVE``
    forms with every version."""
    strategy = DEFAULT_STRATEGY if strategy == "UNDEFINED" else strategy
    if strategy == "ALWAYS_COMPATIBLE" or not existing:
        return []
    if strategy == "ALWAYS_INCOMPATIBLE":
        return ["the strategy ALWAYS_INCOMPATIBLE allows no new version"]
    base = strategy.removesuffix("_TRANSITIVE")
    against = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    problems: list[str] = []
    for n, old in enumerate(reversed(against)):
        which = "old" if len(against) == 1 else f"version -{n + 1}"
        if base in ("BACKWARD", "FULL"):
            problems += [
                f"the new schema cannot read {which} data: {p}" for p in reading_problems(new, old)
            ]
        if base in ("FORWARD", "FULL"):
            problems += [
                f"the {which} schema cannot read new data: {p}" for p in reading_problems(old, new)
            ]
    return problems
