"""The schema registry: versioned schemas per topic, in the metadata store.

A topic's schemas live under ``/magnetar/schemas/<tenant>/<namespace>/<topic>`` (the topic's
name without a ``-partition-N`` suffix and without its domain, as in Pulsar: the partitions of
a topic share one schema) as one JSON document ``{"versions": [...]}``, each version with its
type, data (base64), properties, timestamp and a ``deleted`` flag. Any broker reads it, so
schemas survive restarts and ownership moves; writers update it by compare-and-set.

Rules (Pulsar's, with its default compatibility strategy, FULL, for AVRO and JSON):

- A producer's schema: stored as version 0 when the topic has none; the version it equals when
  it is identical (type and data) to a stored one; otherwise a new version if it is compatible
  with the latest (AVRO/JSON: FULL, see ``schema_compatibility``; other types: never, since they
  carry no evolvable definition), else refused with IncompatibleSchema.
- A consumer's schema (not AUTO_CONSUME): fine when identical to a stored version or able to
  read the latest (Pulsar checks consumers BACKWARD only). On a topic without a schema it is
  stored if the topic is idle (no producer, no consumer, nothing stored), and refused otherwise.
- Deleting a topic's schema appends a deleted marker as a new version; the next schema then
  starts afresh (version numbers go on growing) and is checked against nothing older.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import parse_document
from magnetar.broker.namespace.records import NAMESPACES_PATH, topic_policies_key
from magnetar.broker.schema import compatibility as avro
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore
from magnetar.common.proto import pulsar_api_pb2 as pb

SCHEMAS_PATH = "/magnetar/schemas"
#: Concurrent writers retry their compare-and-set this many times before giving up.
CAS_ATTEMPTS = 20

#: Wire schema type -> the name Pulsar's admin API uses. The wire's ``None`` is a BYTES schema.
TYPE_NAMES: dict[int, str] = {
    0: "BYTES",  # the wire's ``None`` (a Python keyword, hence the number)
    pb.Schema.String: "STRING",
    pb.Schema.Json: "JSON",
    pb.Schema.Protobuf: "PROTOBUF",
    pb.Schema.Avro: "AVRO",
    pb.Schema.Bool: "BOOLEAN",
    pb.Schema.Int8: "INT8",
    pb.Schema.Int16: "INT16",
    pb.Schema.Int32: "INT32",
    pb.Schema.Int64: "INT64",
    pb.Schema.Float: "FLOAT",
    pb.Schema.Double: "DOUBLE",
    pb.Schema.Date: "DATE",
    pb.Schema.Time: "TIME",
    pb.Schema.Timestamp: "TIMESTAMP",
    pb.Schema.KeyValue: "KEY_VALUE",
    pb.Schema.Instant: "INSTANT",
    pb.Schema.LocalDate: "LOCAL_DATE",
    pb.Schema.LocalTime: "LOCAL_TIME",
    pb.Schema.LocalDateTime: "LOCAL_DATE_TIME",
    pb.Schema.ProtobufNative: "PROTOBUF_NATIVE",
    pb.Schema.AutoConsume: "AUTO_CONSUME",
    pb.Schema.External: "EXTERNAL",
}
WIRE_TYPES = {name: number for number, name in TYPE_NAMES.items()}
#: Types whose data is an Avro record definition, checked for FULL compatibility.
AVRO_BASED = frozenset(("AVRO", "JSON"))


class SchemaError(Exception):
    """Base of the registry's refusals."""


class IncompatibleSchemaError(SchemaError):
    """The schema may not be used on this topic (Pulsar's IncompatibleSchema)."""


class SchemaNotFoundError(SchemaError):
    """The topic has no (such) schema version."""


@dataclass(slots=True, frozen=True)
class SchemaData:
    """A schema as a client or the admin API gives it."""

    type: str
    data: bytes
    properties: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, schema: pb.Schema) -> SchemaData:
        return cls(
            TYPE_NAMES.get(schema.type, str(schema.type)),
            bytes(schema.schema_data),
            {p.key: p.value for p in schema.properties},
        )

    def same_as(self, other: SchemaData) -> bool:
        """Pulsar's identity of schemas: the same type and the same definition bytes."""
        return self.type == other.type and self.data == other.data


@dataclass(slots=True, frozen=True)
class StoredSchema:
    """One version of a topic's schema."""

    version: int
    schema: SchemaData
    timestamp: int
    deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "type": self.schema.type,
            "data": base64.b64encode(self.schema.data).decode(),
            "properties": self.schema.properties,
            "timestamp": self.timestamp,
            "deleted": self.deleted,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StoredSchema:
        return cls(
            int(doc["version"]),
            SchemaData(
                str(doc["type"]),
                base64.b64decode(doc["data"]),
                {str(k): str(v) for k, v in doc.get("properties", {}).items()},
            ),
            int(doc["timestamp"]),
            bool(doc.get("deleted", False)),
        )

    def to_wire(self, name: str) -> pb.Schema:
        return pb.Schema(
            name=name,
            schema_data=self.schema.data,
            type=WIRE_TYPES.get(self.schema.type, 0),  # type: ignore[arg-type]
            properties=[
                pb.KeyValue(key=k, value=v) for k, v in sorted(self.schema.properties.items())
            ],
        )


def encode_version(version: int) -> bytes:
    """Pulsar's schema version on the wire: a Java long, 8 bytes big-endian."""
    return version.to_bytes(8, "big", signed=True)


def decode_version(data: bytes) -> int:
    if len(data) != 8:
        raise SchemaNotFoundError(f"schema version {data.hex() or '(empty)'} is not 8 bytes")
    return int.from_bytes(data, "big", signed=True)


def schema_key(name: TopicName) -> str:
    base = name.partitioned_topic_name
    return f"{SCHEMAS_PATH}/{base.tenant}/{base.namespace}/{base.local_name}"


def _live(versions: list[StoredSchema]) -> list[StoredSchema]:
    """The versions after the last deletion marker: the ones that count."""
    for i in range(len(versions) - 1, -1, -1):
        if versions[i].deleted:
            return versions[i + 1 :]
    return versions


def _parse_avro(schema: SchemaData, whose: str) -> avro.AvroSchema:
    try:
        return avro.parse(schema.data)
    except avro.InvalidSchemaError as e:
        raise IncompatibleSchemaError(f"{whose} {schema.type} schema is not valid: {e}") from None


def _check_new_version(
    topic: TopicName, new: SchemaData, live: list[StoredSchema], strategy: str
) -> None:
    """Compatibility with the live versions under the namespace's strategy (Pulsar's default,
    FULL, when it set none), or a refusal that says why."""
    latest = live[-1]
    old = latest.schema
    if strategy == "ALWAYS_COMPATIBLE":
        return
    shown = avro.DEFAULT_STRATEGY if strategy == "UNDEFINED" else strategy
    default = " (Pulsar's default strategy)" if strategy == "UNDEFINED" else ""
    if new.type != old.type:
        raise IncompatibleSchemaError(
            f"topic {topic}: a {new.type} schema is incompatible with the topic's {old.type} "
            f"schema (version {latest.version}); the strategy {shown} allows no change of type"
        )
    if new.type not in AVRO_BASED:
        raise IncompatibleSchemaError(
            f"topic {topic}: the {new.type} schema differs from the topic's version "
            f"{latest.version}; only AVRO and JSON schemas may evolve"
        )
    problems = avro.evolution_problems(
        strategy,
        _parse_avro(new, "the new"),
        [
            _parse_avro(v.schema, f"stored version {v.version}:")
            for v in live
            if v.schema.type == new.type
        ],
    )
    if problems:
        raise IncompatibleSchemaError(
            f"topic {topic}: the {new.type} schema is not {shown} compatible with version "
            f"{latest.version}{default}: " + "; ".join(problems)
        )


class SchemaRegistry:
    """Reads and updates the schema documents; stateless, so any broker may serve a call.
    Schemas are the cluster's own (``store``, the local metadata store, as Pulsar keeps them);
    the namespace's strategy is read from ``configuration`` (where namespaces live; default:
    ``store``)."""

    def __init__(self, store: MetadataStore, configuration: MetadataStore | None = None) -> None:
        self.store = store
        self.configuration = configuration or store

    async def _load(self, topic: TopicName) -> tuple[list[StoredSchema], int]:
        found = await self.store.get(schema_key(topic))
        if found is None:
            return [], NOT_EXISTS
        doc = json.loads(found.value)
        return [StoredSchema.from_json(v) for v in doc["versions"]], found.version

    async def versions(self, topic: TopicName) -> list[StoredSchema]:
        """The live versions, oldest first (empty: no schema)."""
        return _live((await self._load(topic))[0])

    async def get(self, topic: TopicName, version: int | None = None) -> StoredSchema:
        """The latest live version, or the given one; SchemaNotFoundError if there is none."""
        versions, _ = await self._load(topic)
        if version is None:
            live = _live(versions)
            if not live:
                raise SchemaNotFoundError(f"topic {topic} has no schema")
            return live[-1]
        for v in versions:
            if v.version == version and not v.deleted:
                return v
        raise SchemaNotFoundError(f"topic {topic} has no schema version {version}")

    async def strategy(self, topic: TopicName) -> str:
        """The schemaCompatibilityStrategy in force: the topic's (a partitioned topic's for its
        partitions), else its namespace's (UNDEFINED: neither set one, Pulsar's FULL)."""
        own = await self.store.get(topic_policies_key(topic))
        if own is not None:
            chosen = parse_document(own.value).get("schema_compatibility_strategy")
            if chosen and chosen != "UNDEFINED":
                return str(chosen)
        found = await self.configuration.get(f"{NAMESPACES_PATH}/{topic.namespace_name}")
        document = parse_document(found.value if found is not None else None)
        return str(document.get("schema_compatibility_strategy") or "UNDEFINED")

    async def put_if_absent(self, topic: TopicName, schema: SchemaData) -> int:
        """The version of ``schema`` for a producer (or an upload): existing, or new if the
        namespace's strategy allows; IncompatibleSchemaError otherwise."""
        if schema.type in AVRO_BASED:
            _parse_avro(schema, "the")
        strategy = await self.strategy(topic)
        for _ in range(CAS_ATTEMPTS):
            all_versions, stored_at = await self._load(topic)
            live = _live(all_versions)
            for v in live:
                if v.schema.same_as(schema):
                    return v.version
            if live:
                _check_new_version(topic, schema, live, strategy)
            version = all_versions[-1].version + 1 if all_versions else 0
            if await self._try_append(topic, all_versions, stored_at, version, schema):
                return version
        raise IncompatibleSchemaError(f"topic {topic}: too many concurrent schema updates")

    async def test_compatibility(self, topic: TopicName, schema: SchemaData) -> tuple[bool, str]:
        """Whether ``schema`` could be registered now (the topic's current versions, the
        namespace's strategy), and that strategy as Pulsar names it (UNDEFINED shown as FULL)."""
        strategy = await self.strategy(topic)
        shown = avro.DEFAULT_STRATEGY if strategy == "UNDEFINED" else strategy
        live = await self.versions(topic)
        if not live or any(v.schema.same_as(schema) for v in live):
            return True, shown
        try:
            if schema.type in AVRO_BASED:
                _parse_avro(schema, "the")
            _check_new_version(topic, schema, live, strategy)
        except IncompatibleSchemaError:
            return False, shown
        return True, shown

    async def version_of(self, topic: TopicName, schema: SchemaData) -> int:
        """The live version holding ``schema`` (SchemaNotFoundError if none does)."""
        for v in await self.versions(topic):
            if v.schema.same_as(schema):
                return v.version
        raise SchemaNotFoundError(f"topic {topic} has no version with this schema")

    async def _try_append(
        self,
        topic: TopicName,
        versions: list[StoredSchema],
        stored_at: int,
        version: int,
        schema: SchemaData,
        deleted: bool = False,
    ) -> bool:
        entry = StoredSchema(version, schema, int(time.time() * 1000), deleted)
        doc = {"versions": [v.to_json() for v in [*versions, entry]]}
        try:
            await self.store.put(schema_key(topic), json.dumps(doc).encode(), stored_at)
        except BadVersionError:
            return False  # someone else updated it meanwhile: decide again on what is there
        return True

    async def check_consumer(self, topic: TopicName, schema: SchemaData, idle: bool) -> None:
        """May a consumer with ``schema`` read the topic? On an idle topic without a schema,
        the consumer's schema becomes version 0."""
        live = await self.versions(topic)
        if not live:
            if not idle:
                raise IncompatibleSchemaError(
                    f"topic {topic} has no schema to check the consumer's {schema.type} schema "
                    f"against, and is in use (producers, consumers or stored messages)"
                )
            await self.put_if_absent(topic, schema)
            return
        if any(v.schema.same_as(schema) for v in live):
            return
        latest = live[-1]
        if schema.type != latest.schema.type or schema.type not in AVRO_BASED:
            raise IncompatibleSchemaError(
                f"topic {topic}: the consumer's {schema.type} schema differs from the topic's "
                f"{latest.schema.type} schema (version {latest.version})"
            )
        problems = avro.reading_problems(
            _parse_avro(schema, "the consumer's"),
            _parse_avro(latest.schema, f"stored version {latest.version}:"),
        )
        if problems:
            raise IncompatibleSchemaError(
                f"topic {topic}: the consumer's {schema.type} schema cannot read version "
                f"{latest.version}: " + "; ".join(problems)
            )

    async def delete(self, topic: TopicName) -> int:
        """Mark the topic's schema deleted; the marker's version (SchemaNotFoundError if the
        topic has no live schema)."""
        for _ in range(CAS_ATTEMPTS):
            all_versions, stored_at = await self._load(topic)
            if not _live(all_versions):
                raise SchemaNotFoundError(f"topic {topic} has no schema")
            version = all_versions[-1].version + 1
            marker = SchemaData(all_versions[-1].schema.type, b"")
            if await self._try_append(topic, all_versions, stored_at, version, marker, True):
                return version
        raise IncompatibleSchemaError(f"topic {topic}: too many concurrent schema updates")
