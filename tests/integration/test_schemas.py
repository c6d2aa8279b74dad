"""The schema registry with the official client against a real standalone.

- JSON and AVRO producers store their schema as version 0; consumers with the same schema get
  typed records; PRODUCER_SUCCESS and each message carry the version.
- The admin REST answers Pulsar's shapes (latest, by version, every version, upload, delete).
- A FULL compatible change (a field added with a default) is a new version; an incompatible
  one (a field's type changed) is refused to producers, consumers and uploads, with a message
  that says why; GET_SCHEMA and GET_OR_CREATE_SCHEMA answer from the registry.
- The namespace's schemaCompatibilityStrategy (PUT/GET/DELETE as Pulsar's admin calls it)
  decides what a producer may register, a topic's own strategy over it; a schema can be tested (compatibility) and its version
  found (version) without storing it; schemaValidationEnforced is a namespace policy.
- The schemas survive a restart of the standalone; its log holds no traceback and no ERROR.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pulsar
import pytest
from pulsar.schema import AvroSchema, Double, Integer, JsonSchema, Record, String

from magnetar.common.proto import pulsar_api_pb2 as pb
from tests.support.raw_client import RawConnection, admin, module_standalone
from tests.support.standalone import StandaloneProcess, client

Type = pb.BaseCommand.Type


class User(Record):
    name = String()
    age = Integer()
    score = Double(required=True)


def _user_with_email() -> type[Record]:
    class User(Record):  # the same record name, one field more, with a default
        name = String()
        age = Integer()
        score = Double(required=True)
        email = String(default=None, required_default=True)

    return User


def _user_with_text_age() -> type[Record]:
    class User(Record):  # age changed from int to string: neither reads the other
        name = String()
        age = String()
        score = Double(required=True)

    return User


UserWithEmail = _user_with_email()
UserWithTextAge = _user_with_text_age()
USERS = [User(name="ada", age=36, score=1.5), User(name="alan", age=41, score=-2.25)]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("schemas") / "standalone")


@pytest.fixture
def pc(node: StandaloneProcess) -> Iterator[pulsar.Client]:
    c = client(node)
    yield c
    c.close()


def schema_of(node: StandaloneProcess, topic: str, suffix: str = "schema") -> tuple[int, dict]:
    status, text = admin(node, "GET", f"/schemas/public/default/{topic}/{suffix}")
    return status, json.loads(text)


def client_version(version: int) -> str:
    """A schema version as the client's ``Message.schema_version()`` gives it: the 8 bytes of
    the wire (a big-endian long) as a string."""
    return version.to_bytes(8, "big").decode("latin-1")


def definition(schema: pulsar.schema.Schema) -> dict:
    return json.loads(schema.schema_info().schema())


def round_trip(pc: pulsar.Client, topic: str, schema: pulsar.schema.Schema) -> list[Record]:
    consumer = pc.subscribe(
        topic,
        "typed",
        schema=schema,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = pc.create_producer(topic, schema=schema)
    for user in USERS:
        producer.send(user)
    got = []
    for _ in USERS:
        msg = consumer.receive(timeout_millis=10_000)
        consumer.acknowledge(msg)
        assert msg.schema_version() == client_version(0)
        got.append(msg.value())
    producer.close()
    consumer.close()
    return got


@pytest.mark.parametrize(
    ("kind", "schema"), [("JSON", JsonSchema(User)), ("AVRO", AvroSchema(User))]
)
def test_typed_round_trip_and_admin_view(
    node: StandaloneProcess, pc: pulsar.Client, kind: str, schema: pulsar.schema.Schema
) -> None:
    topic = f"schema-{kind.lower()}"
    got = round_trip(pc, f"persistent://public/default/{topic}", schema)
    assert [(u.name, u.age, u.score) for u in got] == [
        ("ada", 36, 1.5),
        ("alan", 41, -2.25),
    ]
    assert all(type(u) is User for u in got)
    status, latest = schema_of(node, topic)
    assert status == 200, latest
    assert latest["version"] == 0
    assert latest["type"] == kind
    assert json.loads(latest["data"]) == definition(schema)
    assert latest["properties"] == {}
    assert isinstance(latest["timestamp"], int) and latest["timestamp"] > 0
    assert schema_of(node, topic, "schema/0") == (200, latest)
    assert schema_of(node, topic, "schemas") == (200, {"getSchemaResponses": [latest]})


def test_full_compatible_change_is_a_new_version(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "persistent://public/default/schema-evolve"
    first = pc.create_producer(topic, schema=AvroSchema(User))
    first.send(USERS[0])
    with_email = AvroSchema(UserWithEmail)
    second = pc.create_producer(topic, schema=with_email)  # FULL compatible: version 1
    second.send(UserWithEmail(name="grace", age=85, score=3.0, email="g@navy.mil"))
    again = pc.create_producer(topic, schema=AvroSchema(User))  # identical to version 0
    for p in (first, second, again):
        p.close()
    status, every = schema_of(node, "schema-evolve", "schemas")
    assert status == 200
    assert [(v["version"], json.loads(v["data"])) for v in every["getSchemaResponses"]] == [
        (0, definition(AvroSchema(User))),
        (1, definition(with_email)),
    ]
    # A reader of the latest version reads both messages, each resolved from its own version.
    reader = pc.create_reader(topic, pulsar.MessageId.earliest, schema=with_email)
    got = [reader.read_next(10_000) for _ in range(2)]
    reader.close()
    assert [m.schema_version() for m in got] == [client_version(0), client_version(1)]
    assert got[1].value().email == "g@navy.mil"


def test_incompatible_schema_is_refused_with_the_reason(
    node: StandaloneProcess, pc: pulsar.Client
) -> None:
    topic = "persistent://public/default/schema-refuse"
    pc.create_producer(topic, schema=JsonSchema(User)).close()
    text_age = JsonSchema(UserWithTextAge)
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer(topic, schema=text_age)
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.subscribe(topic, "wrong", schema=text_age)
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer(topic, schema=AvroSchema(User))  # another type
    # The reason, as the client gets it on the wire and as the admin API says it.
    with RawConnection(node) as raw:
        raw.connect()
        schema = pb.Schema(
            name="User",
            type=pb.Schema.Json,
            schema_data=text_age.schema_info().schema().encode(),
        )
        raw.command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1, schema=schema))
        error = raw.expect(Type.ERROR).body
        assert error.error == pb.IncompatibleSchema
        assert error.message == (
            f"topic {topic}: the JSON schema is not FULL compatible with version 0 (Pulsar's "
            "default strategy): the new schema cannot read old data: missing union branch at "
            "/, /fields/1/type/1: reader union lacking writer type: INT; the old schema cannot "
            "read new data: missing union branch at /, /fields/1/type/1: reader union lacking "
            "writer type: STRING"
        )
    status, text = admin(
        node,
        "POST",
        "/schemas/public/default/schema-refuse/schema",
        json.dumps({"type": "JSON", "schema": text_age.schema_info().schema(), "properties": {}}),
    )
    assert status == 409
    assert json.loads(text)["reason"] == error.message
    assert schema_of(node, "schema-refuse", "schemas")[1]["getSchemaResponses"][0]["version"] == 0


def test_namespace_strategy_decides_evolution(node: StandaloneProcess, pc: pulsar.Client) -> None:
    assert admin(node, "PUT", "/namespaces/public/evolving")[0] == 204
    path = "/namespaces/public/evolving/schemaCompatibilityStrategy"
    assert admin(node, "GET", path) == (200, '"UNDEFINED"')
    assert admin(node, "PUT", path, '"SOMETIMES"')[0] == 400
    topic = "persistent://public/evolving/strategy"

    def register(record: type[Record]) -> None:
        pc.create_producer(topic, schema=JsonSchema(record)).close()

    assert admin(node, "PUT", path, '"ALWAYS_INCOMPATIBLE"')[0] == 204
    assert admin(node, "GET", path) == (200, '"ALWAYS_INCOMPATIBLE"')
    register(User)  # the first version needs no check
    with pytest.raises(pulsar.IncompatibleSchema):
        register(UserWithEmail)
    assert admin(node, "PUT", path, '"BACKWARD"')[0] == 204
    register(UserWithEmail)  # the new schema reads old data: email has a default
    with pytest.raises(pulsar.IncompatibleSchema):
        register(UserWithTextAge)
    # Testing a schema stores nothing; finding a schema's version.
    base = "/schemas/public/evolving/strategy"

    def payload(record: type[Record]) -> str:
        info = JsonSchema(record).schema_info()
        return json.dumps({"type": "JSON", "schema": info.schema(), "properties": {}})

    status, text = admin(node, "POST", f"{base}/compatibility", payload(UserWithTextAge))
    assert status == 200
    assert json.loads(text) == {"isCompatibility": False, "schemaCompatibilityStrategy": "BACKWARD"}
    status, text = admin(node, "POST", f"{base}/compatibility", payload(UserWithEmail))
    assert json.loads(text) == {"isCompatibility": True, "schemaCompatibilityStrategy": "BACKWARD"}
    assert admin(node, "POST", f"{base}/version", payload(User)) == (200, '{"version": 0}')
    assert admin(node, "POST", f"{base}/version", payload(UserWithEmail)) == (200, '{"version": 1}')
    assert admin(node, "POST", f"{base}/version", payload(UserWithTextAge))[0] == 404
    assert admin(node, "PUT", path, '"ALWAYS_COMPATIBLE"')[0] == 204
    register(UserWithTextAge)
    status, text = admin(node, "GET", "/schemas/public/evolving/strategy/schemas")
    assert status == 200 and len(json.loads(text)["getSchemaResponses"]) == 3
    assert admin(node, "DELETE", path)[0] == 204
    assert admin(node, "GET", path) == (200, '"UNDEFINED"')


def test_topic_strategy_over_the_namespaces(node: StandaloneProcess, pc: pulsar.Client) -> None:
    """A topic's own schemaCompatibilityStrategy (PUT/GET/DELETE on the topic, as Pulsar's
    topic policies) wins over its namespace's; removed, the namespace's applies again."""
    assert admin(node, "PUT", "/namespaces/public/topical")[0] == 204
    ns_path = "/namespaces/public/topical/schemaCompatibilityStrategy"
    assert admin(node, "PUT", ns_path, '"ALWAYS_COMPATIBLE"')[0] == 204
    strict, loose = "persistent://public/topical/strict", "persistent://public/topical/loose"
    for topic in (strict, loose):
        pc.create_producer(topic, schema=JsonSchema(User)).close()
    path = "/persistent/public/topical/strict/schemaCompatibilityStrategy"
    assert admin(node, "GET", path) == (200, "null")
    assert admin(node, "GET", path + "?applied=true") == (200, '"ALWAYS_COMPATIBLE"')
    assert admin(node, "PUT", path, '"SOMETIMES"')[0] == 400
    assert admin(node, "POST", path, '"FULL"')[0] == 405  # Pulsar sets it with PUT
    assert admin(node, "PUT", "/persistent/public/topical/nosuch/schemaCompatibilityStrategy",
                 '"FULL"')[0] == 404  # fmt: skip
    assert admin(node, "PUT", path, '"ALWAYS_INCOMPATIBLE"')[0] == 204
    assert admin(node, "GET", path) == (200, '"ALWAYS_INCOMPATIBLE"')
    assert admin(node, "GET", path + "?applied=true") == (200, '"ALWAYS_INCOMPATIBLE"')
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer(strict, schema=JsonSchema(UserWithTextAge))
    pc.create_producer(loose, schema=JsonSchema(UserWithTextAge)).close()  # the namespace's
    status, text = admin(
        node,
        "POST",
        "/schemas/public/topical/strict/compatibility",
        json.dumps(
            {"type": "JSON", "schema": JsonSchema(UserWithEmail).schema_info().schema(),
             "properties": {}}
        ),
    )  # fmt: skip
    assert status == 200 and json.loads(text) == {
        "isCompatibility": False,
        "schemaCompatibilityStrategy": "ALWAYS_INCOMPATIBLE",
    }
    assert admin(node, "DELETE", path)[0] == 204
    assert admin(node, "GET", path) == (200, "null")
    pc.create_producer(strict, schema=JsonSchema(UserWithTextAge)).close()
    assert admin(node, "DELETE", ns_path)[0] == 204
    assert admin(node, "GET", path + "?applied=true") == (200, '"FULL"')

    enforced = "/namespaces/public/evolving/schemaValidationEnforced"
    assert admin(node, "GET", enforced) == (200, "false")
    assert admin(node, "POST", enforced, "true")[0] == 204
    assert admin(node, "GET", enforced) == (200, "true")


def test_get_schema_and_get_or_create_schema(node: StandaloneProcess, pc: pulsar.Client) -> None:
    topic = "persistent://public/default/schema-raw"
    pc.create_producer(topic, schema=AvroSchema(User)).close()
    data = AvroSchema(User).schema_info().schema().encode()
    with RawConnection(node) as raw:
        raw.connect()
        raw.command(pb.CommandGetSchema(request_id=1, topic=topic))
        latest = raw.expect(Type.GET_SCHEMA_RESPONSE).body
        assert latest.schema.type == pb.Schema.Avro
        assert latest.schema.schema_data == data
        assert latest.schema_version == (0).to_bytes(8, "big")
        raw.command(
            pb.CommandGetSchema(
                request_id=2, topic=f"{topic}-partition-3", schema_version=(0).to_bytes(8, "big")
            )
        )
        assert raw.expect(Type.GET_SCHEMA_RESPONSE).body.schema.schema_data == data
        raw.command(
            pb.CommandGetSchema(request_id=3, topic=topic, schema_version=(7).to_bytes(8, "big"))
        )
        missing = raw.expect(Type.GET_SCHEMA_RESPONSE).body
        assert (missing.request_id, missing.error_code) == (3, pb.TopicNotFound)
        assert missing.error_message == f"no schema: topic {topic} has no schema version 7"
        wanted = pb.Schema(name="User", type=pb.Schema.Avro, schema_data=data)
        raw.command(pb.CommandGetOrCreateSchema(request_id=4, topic=topic, schema=wanted))
        found = raw.expect(Type.GET_OR_CREATE_SCHEMA_RESPONSE).body
        assert (found.request_id, found.HasField("error_code")) == (4, False)
        assert found.schema_version == (0).to_bytes(8, "big")
        fresh = "persistent://public/default/schema-created"
        raw.command(pb.CommandGetOrCreateSchema(request_id=5, topic=fresh, schema=wanted))
        assert raw.expect(Type.GET_OR_CREATE_SCHEMA_RESPONSE).body.schema_version == bytes(8)
    assert schema_of(node, "schema-created")[1]["type"] == "AVRO"


def test_upload_and_delete(node: StandaloneProcess, pc: pulsar.Client) -> None:
    path = "/schemas/public/default/schema-admin/schema"
    assert admin(node, "GET", path) == (
        404,
        json.dumps(
            {
                "reason": "Schema not found: topic persistent://public/default/schema-admin has no schema"
            }
        ),
    )
    body = {"type": "JSON", "schema": JsonSchema(User).schema_info().schema(), "properties": {}}
    assert admin(node, "POST", path, json.dumps(body)) == (200, '{"version": 0}')
    assert admin(node, "POST", path, json.dumps(body)) == (200, '{"version": 0}')  # identical
    producer = pc.create_producer("schema-admin", schema=JsonSchema(User))
    producer.send(USERS[0])
    producer.close()
    assert admin(node, "DELETE", path) == (200, '{"version": 1}')
    assert admin(node, "GET", path)[0] == 404
    assert admin(node, "DELETE", path)[0] == 404
    # After a deletion any schema may start afresh, checked against nothing older.
    avro = {"type": "AVRO", "schema": AvroSchema(User).schema_info().schema(), "properties": {}}
    assert admin(node, "POST", path, json.dumps(avro)) == (200, '{"version": 2}')
    assert schema_of(node, "schema-admin")[1]["type"] == "AVRO"


def test_schemas_survive_a_restart(node: StandaloneProcess) -> None:
    before = schema_of(node, "schema-evolve", "schemas")
    node.stop()
    node.start()
    assert schema_of(node, "schema-evolve", "schemas") == before
    c = client(node)
    try:
        producer = c.create_producer(
            "persistent://public/default/schema-evolve", schema=AvroSchema(User)
        )
        producer.send(USERS[1])
        producer.close()
        with pytest.raises(pulsar.IncompatibleSchema):
            c.create_producer(
                "persistent://public/default/schema-evolve",
                schema=AvroSchema(UserWithTextAge),
            )
    finally:
        c.close()
