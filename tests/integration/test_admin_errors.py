"""Admin REST errors as Pulsar gives them (status and ``{"reason": ...}``), and the bound on
partitions, against a real ``magnetar standalone`` and the official client."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.namespace.records import PARTITIONED_PATH
from magnetar.common.metadata import open_store
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.standalone import StandaloneProcess, client

LIMIT = 8  # max_num_partitions_per_partitioned_topic of these tests' standalone


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    data = tmp_path_factory.mktemp("admin-errors") / "standalone"
    process = StandaloneProcess(
        data, extra=["--max-num-partitions-per-partitioned-topic", str(LIMIT)]
    ).start()
    try:
        yield process
    finally:
        process.stop()
        print(process.log_tail())


def admin(
    node: StandaloneProcess, method: str, path: str, body: bytes | str | None = None
) -> tuple[int, object]:
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(node.admin_url + path, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def refused(
    node: StandaloneProcess, method: str, path: str, body: bytes | str | None = None
) -> tuple[int, str]:
    """Status and reason of an error answer (which must be Pulsar's JSON shape)."""
    status, answer = admin(node, method, path, body)
    assert status >= 400 and isinstance(answer, dict) and set(answer) == {"reason"}, answer
    return status, answer["reason"]


def partitioned_metadata(
    node: StandaloneProcess, topic: str
) -> pb.CommandPartitionedTopicMetadataResponse:
    """One PARTITIONED_METADATA in raw frames: the broker's answer, whatever it is (the official
    client retries a MetadataError until its timeout, hiding whether the broker answered)."""
    decoder = codec.FrameDecoder(1024 * 1024)
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(
            codec.encode_command(
                pb.CommandConnect(
                    client_version="admin-errors-test",
                    protocol_version=codec.SERVER_PROTOCOL_VERSION,
                )
            )
        )
        sock.sendall(
            codec.encode_command(pb.CommandPartitionedTopicMetadata(topic=topic, request_id=1))
        )
        while True:
            data = sock.recv(65536)
            assert data, "the broker closed the connection instead of answering"
            for frame in decoder.feed(data):
                if frame.type == pb.BaseCommand.PARTITIONED_METADATA_RESPONSE:
                    return frame.body  # type: ignore[return-value]


def healthy(node: StandaloneProcess) -> None:
    """The broker still answers admin calls and a round trip with the official client."""
    assert admin(node, "GET", "/tenants")[0] == 200
    c = client(node)
    try:
        consumer = c.subscribe(
            "health-check", "s", initial_position=pulsar.InitialPosition.Earliest
        )
        c.create_producer("health-check").send(b"alive")
        assert consumer.receive(timeout_millis=10_000).data() == b"alive"
    finally:
        c.close()


def test_unparseable_bodies_are_400(node: StandaloneProcess) -> None:
    deep = "[" * 200_000 + "]" * 200_000  # the JSON parser's recursion gives out long before
    for method, path in (
        ("POST", "/namespaces/public/default/messageTTL"),
        ("POST", "/namespaces/public/default/retention"),
        ("PUT", "/persistent/public/default/deep/partitions"),
    ):
        status, reason = refused(node, method, path, deep)
        assert status == 400 and "nested too deeply" in reason
        assert refused(node, method, path, b"\xff\xfe")[0] == 400  # not UTF-8
        assert refused(node, method, path, "{")[0] == 400
    assert refused(node, "PUT", "/persistent/public/default/deep/partitions", "true")[0] == 400
    assert refused(node, "PUT", "/persistent/public/default/deep/partitions", "2.5")[0] == 400
    assert admin(node, "GET", "/persistent/public/default/deep/partitions") == (
        200,
        {"partitions": 0},
    )
    healthy(node)


def test_topics_of_a_missing_namespace_are_404(node: StandaloneProcess) -> None:
    for method, path, body in (
        ("PUT", "/persistent/public/nowhere/t", None),
        ("DELETE", "/persistent/public/nowhere/t", None),
        ("PUT", "/persistent/public/nowhere/t/partitions", "2"),
        ("DELETE", "/persistent/public/nowhere/t/partitions", None),
        ("GET", "/persistent/public/nowhere", None),
        ("GET", "/non-persistent/public/nowhere", None),
        ("GET", "/persistent/public/nowhere/partitioned", None),
        ("GET", "/namespaces/public/nowhere", None),
        ("POST", "/namespaces/public/nowhere/messageTTL", "10"),
    ):
        status, reason = refused(node, method, path, body)
        assert status == 404 and reason.startswith("Namespace does not exist"), (path, reason)
    assert "public/nowhere" not in json.dumps(admin(node, "GET", "/namespaces/public")[1])
    healthy(node)


@pytest.mark.parametrize("name", ["..", ".", "...", "a%20b", "x$y", "%C3%A9", "a%2Fb", "%2E%2E"])
def test_invalid_tenant_and_namespace_names_are_412(node: StandaloneProcess, name: str) -> None:
    status, reason = refused(node, "PUT", f"/tenants/{name}")
    assert status == 412 and reason.startswith("Tenant name is not valid")
    assert refused(node, "GET", f"/namespaces/{name}")[0] == 412
    for path in (f"/namespaces/public/{name}", f"/namespaces/{name}/ns"):
        status, reason = refused(node, "PUT", path)
        assert status == 412 and reason.startswith("Namespace name is not valid"), path
    assert refused(node, "GET", f"/persistent/public/{name}")[0] == 412
    assert refused(node, "PUT", f"/persistent/public/{name}/t")[0] == 412
    assert set(admin(node, "GET", "/tenants")[1]) <= {"public", "t-1.=:_x"}  # type: ignore[arg-type]
    assert admin(node, "GET", "/namespaces/public")[1] == ["public/default"]
    # Names Pulsar accepts still work.
    assert admin(node, "PUT", "/tenants/t-1.=:_x")[0] in (204, 409)
    assert admin(node, "PUT", "/namespaces/t-1.=:_x/ns.a")[0] in (204, 409)


def test_delete_of_a_topic_that_never_existed_is_404_and_creates_nothing(
    node: StandaloneProcess,
) -> None:
    for domain in ("persistent", "non-persistent"):
        status, reason = refused(node, "DELETE", f"/{domain}/public/default/never-made")
        assert status == 404 and "not found" in reason
        assert refused(node, "GET", f"/{domain}/public/default/never-made/stats")[0] == 404
        listed = admin(node, "GET", f"/{domain}/public/default")[1]
        assert f"{domain}://public/default/never-made" not in listed  # type: ignore[operator]
    assert refused(node, "DELETE", "/persistent/public/default/never-made/partitions")[0] == 404


def test_partitioned_and_non_partitioned_topics_do_not_overlap(node: StandaloneProcess) -> None:
    c = client(node)
    try:
        producer = c.create_producer("backlogged", batching_enabled=False)
        for i in range(3):
            producer.send(f"b{i}".encode())
        producer.close()
        status, reason = refused(
            node, "PUT", "/persistent/public/default/backlogged/partitions", "4"
        )
        assert status == 409 and reason.startswith("This topic already exists")
        assert admin(node, "GET", "/persistent/public/default/backlogged/partitions")[1] == {
            "partitions": 0
        }
        # The backlog is still there, not hidden behind partitions.
        consumer = c.subscribe("backlogged", "s", initial_position=pulsar.InitialPosition.Earliest)
        assert [consumer.receive(timeout_millis=10_000).data() for _ in range(3)] == [
            b"b0",
            b"b1",
            b"b2",
        ]
        assert refused(node, "PUT", "/persistent/public/default/backlogged")[0] == 409

        assert admin(node, "PUT", "/persistent/public/default/split/partitions", "2")[0] == 204
        status, reason = refused(node, "PUT", "/persistent/public/default/split")
        assert status == 409 and reason.startswith("This topic already exists")
        status, reason = refused(node, "PUT", "/persistent/public/default/split/partitions", "2")
        assert status == 409 and reason.startswith("Partitioned topic already exists")
        status, reason = refused(
            node, "PUT", "/persistent/public/default/a-partition-1/partitions", "2"
        )
        assert status == 412 and "-partition-" in reason
    finally:
        c.close()


def test_partition_count_is_bounded(node: StandaloneProcess) -> None:
    path = "/persistent/public/default/bounded/partitions"
    for count in (LIMIT + 1, 10**9, 10**13, 10**40):
        status, reason = refused(node, "PUT", path, str(count))
        assert (status, reason) == (
            406,
            f"Number of partitions should be less than or equal to {LIMIT}",
        )
    for count in (0, -1):
        status, reason = refused(node, "PUT", path, str(count))
        assert (status, reason) == (406, "Number of partitions should be more than 0")
    assert admin(node, "PUT", path, "3")[0] == 204
    assert refused(node, "POST", path, str(LIMIT + 1))[0] == 406
    assert refused(node, "POST", path, "2")[0] == 422  # Pulsar never shrinks a partitioned topic
    assert refused(node, "POST", "/persistent/public/default/unknown/partitions", "2")[0] == 404
    assert admin(node, "POST", path, str(LIMIT))[0] == 204
    assert admin(node, "GET", path) == (200, {"partitions": LIMIT})
    c = client(node)
    try:
        producer = c.create_producer("bounded", batching_enabled=False)
        partitions = {producer.send(f"m{i}".encode()).partition() for i in range(2 * LIMIT)}
        assert partitions == set(range(LIMIT))
    finally:
        c.close()
    policy = {
        "allowAutoTopicCreation": True,
        "topicType": "partitioned",
        "defaultNumPartitions": LIMIT + 1,
    }
    status, reason = refused(
        node, "POST", "/namespaces/public/default/autoTopicCreation", json.dumps(policy)
    )
    assert status == 406 and str(LIMIT) in reason


def test_unknown_paths_and_methods_answer_in_pulsars_shape(node: StandaloneProcess) -> None:
    assert refused(node, "GET", "/no/such/path")[0] == 404
    assert refused(node, "PATCH", "/tenants")[0] == 405


def test_stats_of_a_stored_topic_that_is_not_loaded(tmp_path: Path) -> None:
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
        c = client(node)
        try:
            c.subscribe("kept", "reader-sub")
            producer = c.create_producer("kept", batching_enabled=False)
            for i in range(4):
                producer.send(f"k{i}".encode())
        finally:
            c.close()
        node.stop()
        node.start()  # nothing is loaded now
        status, stats = admin(node, "GET", "/persistent/public/default/kept/stats")
        assert status == 200 and stats["entries"] == 4  # type: ignore[index]
        assert stats["storageSize"] > 0  # type: ignore[index]
        assert admin(node, "GET", "/persistent/public/default/kept/subscriptions")[0] == 200
        status, internal = admin(node, "GET", "/persistent/public/default/kept/internalStats")
        assert status == 200 and internal["numberOfEntries"] == 4  # type: ignore[index]
        for what in ("stats", "internalStats", "subscriptions"):
            assert refused(node, "GET", f"/persistent/public/default/absent/{what}")[0] == 404
        listed = admin(node, "GET", "/persistent/public/default")[1]
        assert "persistent://public/default/absent" not in listed  # type: ignore[operator]
    finally:
        node.stop()
        print(node.log_tail())


def test_stored_partition_counts_out_of_bounds_are_answered(tmp_path: Path) -> None:
    """Records a create would refuse (damaged, or written under a larger bound) still get an
    answer on every path: PARTITIONED_METADATA an error, listings stay bounded, admin reads 500
    with a reason for an unreadable record."""
    data = tmp_path / "standalone"
    node = StandaloneProcess(data, extra=["--max-num-partitions-per-partitioned-topic", "4"])
    node.start().stop()

    async def damage() -> None:
        store = await open_store(f"local://{(data / 'meta.db').resolve()}")
        try:
            base = f"{PARTITIONED_PATH}/public/default/persistent"
            for topic, value in (
                ("huge", b'{"partitions": 10000000000000}'),
                ("over", b'{"partitions": 5}'),
                ("negative", b'{"partitions": -3}'),
                ("garbage", b"not json" + b"[" * 100_000),
            ):
                await store.put(f"{base}/{topic}", value)
        finally:
            await store.close()

    asyncio.run(damage())
    node.start()
    try:
        for topic in ("huge", "over", "negative", "garbage"):
            answer = partitioned_metadata(node, f"persistent://public/default/{topic}")
            assert answer.response == answer.Failed, topic
            assert answer.error == pb.MetadataError, topic
        assert (
            "max_num_partitions_per_partitioned_topic"
            in partitioned_metadata(node, "persistent://public/default/over").message
        )
        status, listed = admin(node, "GET", "/persistent/public/default")
        assert status == 200 and listed == []
        assert admin(node, "GET", "/persistent/public/default/partitioned")[0] == 200
        status, reason = refused(node, "GET", "/persistent/public/default/garbage/partitions")
        assert status == 500 and "garbage" in reason
        assert (
            node.log_tail(200_000).count(
                "admin GET /admin/v2/persistent/public/default/garbage/partitions failed"
            )
            == 1
        )
        healthy(node)
    finally:
        node.stop()
        print(node.log_tail())


def test_policy_bodies_of_the_wrong_shape_or_range_are_400(node: StandaloneProcess) -> None:
    """Bodies Pulsar could not read into its policy types (a non-object where an object is
    expected, a number beyond Java's int or long) are refused with 400 and nothing is stored."""
    over_int, over_long = str(2**31), str(2**63)
    topic = "/persistent/public/default/shapes"
    assert admin(node, "PUT", topic)[0] == 204
    cases: list[tuple[str, str, str]] = [
        ("PUT", "/namespaces/public/shapes-string", '"x"'),
        ("PUT", "/namespaces/public/shapes-list", "[1]"),
        ("PUT", "/namespaces/public/shapes-number", "-5"),
        ("PUT", "/namespaces/public/shapes-bool", "true"),
        ("PUT", "/namespaces/public/default/compactionThreshold", over_long),
        ("POST", f"{topic}/compactionThreshold", over_long),
        ("POST", "/namespaces/public/default/subscriptionExpirationTime", over_int),
        ("POST", "/namespaces/public/default/messageTTL", over_int),
    ]
    for base in ("/namespaces/public/default", topic):
        for segment in ("dispatchRate", "subscriptionDispatchRate"):
            cases += [
                ("POST", f"{base}/{segment}", f'{{"ratePeriodInSecond": {over_int}}}'),
                ("POST", f"{base}/{segment}", f'{{"dispatchThrottlingRateInMsg": {over_int}}}'),
                ("POST", f"{base}/{segment}", f'{{"dispatchThrottlingRateInByte": {over_long}}}'),
            ]
        cases += [
            ("POST", f"{base}/publishRate", f'{{"publishThrottlingRateInMsg": {over_int}}}'),
            ("POST", f"{base}/publishRate", f'{{"publishThrottlingRateInByte": {over_long}}}'),
            ("POST", f"{base}/backlogQuota", f'{{"limitSize": {over_long}}}'),
            (
                "POST",
                f"{base}/backlogQuota?backlogQuotaType=message_age",
                f'{{"limitTime": {over_int}, "policy": "producer_exception"}}',
            ),
        ]
    for method, path, body in cases:
        assert refused(node, method, path, body)[0] == 400, (method, path, body)
    assert "shapes" not in json.dumps(admin(node, "GET", "/namespaces/public")[1])
    for segment in ("compactionThreshold", "publishRate", "dispatchRate", "backlogQuotaMap"):
        assert admin(node, "GET", f"/namespaces/public/default/{segment}")[1] in (None, {}), segment
    assert admin(node, "GET", f"{topic}/compactionThreshold")[1] is None
    # the largest values are taken
    assert admin(node, "POST", f"{topic}/compactionThreshold", str(2**63 - 1))[0] == 204
    assert admin(node, "GET", f"{topic}/compactionThreshold")[1] == 2**63 - 1
    assert admin(node, "DELETE", f"{topic}/compactionThreshold")[0] == 204
    # Pulsar's deprecated "limit" is the size limit (what clients before 2.9.1 send)
    quota = '{"limit": 1048576, "policy": "producer_exception"}'
    assert admin(node, "POST", f"{topic}/backlogQuota", quota)[0] == 204
    assert admin(node, "GET", f"{topic}/backlogQuotaMap")[1] == {
        "destination_storage": {
            "limitSize": 1048576,
            "limitTime": -1,
            "policy": "producer_exception",
        }
    }
    assert admin(node, "DELETE", f"{topic}/backlogQuota")[0] == 204
    assert refused(node, "POST", f"{topic}/backlogQuota", '{"limit": "big"}')[0] == 400
    assert "Traceback" not in node.log_tail(200_000)
    healthy(node)


def test_cluster_urls_of_the_wrong_scheme_are_400(node: StandaloneProcess) -> None:
    """A cluster's URLs are checked as Pulsar checks them (each its scheme), when created and
    when updated; nothing is stored from a refused body."""
    for field, url in (
        ("serviceUrl", "not a url"),
        ("serviceUrl", "pulsar://h:6650"),
        ("serviceUrl", "h:8080"),
        ("serviceUrlTls", "http://h:8443"),
        ("brokerServiceUrl", "http://h:8080"),
        ("brokerServiceUrl", "localhost"),
        ("brokerServiceUrlTls", "pulsar://h:6651"),
    ):
        body = json.dumps({field: url})
        status, reason = refused(node, "PUT", "/clusters/schemes", body)
        assert status == 400 and reason.startswith("Invalid ClusterData: Illegal"), (url, reason)
        assert refused(node, "POST", "/clusters/standalone", body)[0] == 400, url
    assert refused(node, "GET", "/clusters/schemes")[0] == 404
    body = {
        "serviceUrl": "http://h:8080",
        "serviceUrlTls": "https://h:8443",
        "brokerServiceUrl": "pulsar://h1:6650,h2:6650",
        "brokerServiceUrlTls": "pulsar+ssl://h:6651",
    }
    assert admin(node, "PUT", "/clusters/schemes", json.dumps(body))[0] == 204
    assert admin(node, "GET", "/clusters/schemes") == (200, body)
    assert admin(node, "DELETE", "/clusters/schemes")[0] == 204
    standalone = admin(node, "GET", "/clusters/standalone")[1]
    assert isinstance(standalone, dict) and standalone["brokerServiceUrl"].startswith("pulsar://")


def test_requests_the_http_parser_refuses_are_4xx_without_a_traceback(
    node: StandaloneProcess,
) -> None:
    """A request line or header over aiohttp's 8190 bytes is refused before any route; the
    broker logs one warning, not an ERROR with a traceback."""
    long_name = "a" * 9000
    for method, path, headers in (
        ("POST", f"/persistent/public/default/{long_name}/terminate", {}),
        ("PUT", f"/persistent/public/default/{long_name}/compaction", {}),
        ("GET", "/clusters", {"X-Long": long_name}),
    ):
        request = urllib.request.Request(node.admin_url + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as e:
            status = e.code
        assert 400 <= status < 500, (path[:60], status)
    log = node.log_tail(200_000)
    assert "Traceback" not in log and " ERROR " not in log
    assert log.count("Got more than 8190 bytes") >= 3
    healthy(node)
