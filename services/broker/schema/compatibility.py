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

PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))
NAMED = frozenset(("record", "error", "enum", "fixed"))
#: Writer type -> the reader types it is promoted to.
PROMOTIONS = {
    "int": frozenset(("long", "float", "double")),
    "long": frozenset(("float", "double")),
    "float": frozenset(("double",)),
    "string": frozenset(("bytes",)),
    "bytes": frozenset(("string",)),
}


class InvalidSchemaError(ValueError):
    """Schema data that is not an Avro schema definition."""


@dataclass(slots=True)
class AvroSchema:
    """A parsed definition and its named types by full name (for references by name)."""

    root: Any
    named: dict[str, dict[str, Any]] = field(default_factory=dict)


def parse(data: bytes) -> AvroSchema:
    """Parse and check an Avro definition (JSON text); InvalidSchemaError says what is wrong."""
    try:
        root = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise InvalidSchemaError(f"schema definition is not JSON: {e}") from None
    schema = AvroSchema(root)
    _collect(root, "", schema.named, "schema")
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


def _resolve(node: Any, schema: AvroSchema) -> Any:
    """A type with references by name and ``{"type": X}`` wrappers replaced by X itself."""
    while True:
        if isinstance(node, str) and node not in PRIMITIVES:
            found = schema.named.get(node)
            if found is None:  # a short name inside a namespace
                matches = [v for k, v in schema.named.items() if k.rpartition(".")[2] == node]
                if not matches:
                    raise InvalidSchemaError(f"unknown type {node!r}")
                found = matches[0]
            return found
        if isinstance(node, dict) and node.get("type") not in NAMED | {"array", "map"}:
            node = node.get("type")
            continue
        return node


def _kind(node: Any) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, str):
        return node
    kind = node["type"]
    return "record" if kind == "error" else kind


def _short(node: dict[str, Any]) -> str:
    return str(node["name"]).rpartition(".")[2]


def reading_problems(reader: AvroSchema, writer: AvroSchema) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    problems: list[str] = []
    _check(reader.root, writer.root, reader, writer, "", problems, set())
    return problems


def _check(
    r: Any,
    w: Any,
    rs: AvroSchema,
    ws: AvroSchema,
    path: str,
    problems: list[str],
    seen: set[tuple[int, int]],
) -> None:
    r, w = _resolve(r, rs), _resolve(w, ws)
    rk, wk = _kind(r), _kind(w)
    at = path or "the top level"
    if wk == "union":
        for i, branch in enumerate(w):
            _check(r, branch, rs, ws, f"{path}<branch {i}>", problems, seen)
        return
    if rk == "union":
        for branch in r:
            attempt: list[str] = []
            _check(branch, w, rs, ws, path, attempt, seen)
            if not attempt:
                return
        problems.append(f"{at}: no branch of the reader's union reads the writer's {wk}")
        return
    if rk != wk:
        if wk in PROMOTIONS and rk in PROMOTIONS[wk]:
            return
        problems.append(f"{at}: the writer's {wk} cannot be read as {rk}")
        return
    if rk in PRIMITIVES:
        return
    if rk == "array":
        _check(r["items"], w["items"], rs, ws, f"{path}[]", problems, seen)
        return
    if rk == "map":
        _check(r["values"], w["values"], rs, ws, f"{path}{{}}", problems, seen)
        return
    if _short(r) != _short(w) and _short(w) not in r.get("aliases", []):
        problems.append(f"{at}: {rk} {_short(w)} cannot be read as {rk} {_short(r)}")
        return
    if rk == "fixed":
        if r["size"] != w["size"]:
            problems.append(f"{at}: fixed size {w['size']} cannot be read as size {r['size']}")
        return
    if rk == "enum":
        missing = [s for s in w["symbols"] if s not in r["symbols"]]
        if missing and "default" not in r:
            problems.append(f"{at}: enum symbols {missing} are unknown to the reader")
        return
    pair = (id(r), id(w))
    if pair in seen:  # a recursive record: already being compared further up
        return
    seen.add(pair)
    written = {f["name"]: f for f in w["fields"]}
    for f in r["fields"]:
        name = f["name"]
        source = written.get(name) or next(
            (written[a] for a in f.get("aliases", []) if a in written), None
        )
        where = f"{path}.{name}" if path else name
        if source is None:
            if "default" not in f:
                problems.append(f"field {where}: missing in the writer and without a default")
            continue
        _check(f["type"], source["type"], rs, ws, where, problems, seen)


def full_problems(new: AvroSchema, latest: AvroSchema) -> list[str]:
    """FULL compatibility of ``new`` with ``latest``: each reads the other's data."""
    backward = [f"the new schema cannot read old data: {p}" for p in reading_problems(new, latest)]
    forward = [f"the old schema cannot read new data: {p}" for p in reading_problems(latest, new)]
    return backward + forward
