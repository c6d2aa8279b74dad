"""The proxy with real processes: three brokers (authentication and authorization on) behind two
``magnetar proxy`` processes, the official client knowing only the proxies' URLs.

One cluster for the module. Producers go through one proxy and consumers through the other, so
every message crosses both. Covered: the four subscription modes draining a backlog with exact
counts, a partitioned topic, a reader loop and seek, a JSON schema, a bundle unload under
production (no application-visible error, nothing receipted lost), relay targets that are not
allowed registered brokers (refused, and the address named is never dialled), a client granted
one namespace refused elsewhere through the proxy, a proxy role without an original principal
refused by the brokers, and the relays to a frozen broker (SIGSTOP) closed once its
registration expires, so clients move to the next owner within the session TTL.
"""

from __future__ import annotations

import itertools
import json
import secrets
import select
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pulsar
import pytest
from pulsar.schema import Integer, JsonSchema, Record, String

from magnetar.common.cluster.broker_info import BROKERS_ROOT
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.certs import Pki, make_pki
from tests.support.cluster import (
    MagnetarCluster,
    PacedProducer,
    _run,
    assert_no_traceback,
)
from tests.support.etcd import free_port
from tests.support.proxy import ProxyProcess
from tests.support.raw_client import RawConnection, rss_mb

Type = pb.BaseCommand.Type

TENANT = "px"
NAMESPACE = f"{TENANT}/ns"
OTHER_NAMESPACE = f"{TENANT}/other"
SUPERUSER = "admin"
BROKER_ROLE = "broker"
PROXY_ROLE = "proxy"
ALICE = "alice"  # granted produce and consume on NAMESPACE only
SESSION_TTL = 10
HANDSHAKE_TIMEOUT = 3
#: Connections one IP may hold on the second proxy.
PER_IP_LIMIT = 64


@dataclass
class Deployment:
    cluster: MagnetarCluster
    proxies: list[ProxyProcess]
    secret: bytes
    #: Listening sockets at addresses a client may name but the proxy must never dial.
    decoy: socket.socket
    #: Brokers paused long enough to lose their metadata session.
    frozen: set[str]
    pki: Pki
    #: A third proxy: TLS for clients (on ``tls_port``) and to brokers, client credentials
    #: forwarded, one lookup at a time.
    tls_proxy: ProxyProcess
    tls_port: int
    #: The brokers' TLS ports, as registered.
    broker_tls_ports: set[int]

    def token(self, role: str) -> str:
        return jwt.encode({"sub": role}, self.secret, "HS256")

    def client(self, proxy: int = 0, role: str = SUPERUSER) -> pulsar.Client:
        return pulsar.Client(
            self.proxies[proxy].url,
            authentication=pulsar.AuthenticationToken(self.token(role)),
            operation_timeout_seconds=30,
        )

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """A superuser's admin call to a running broker (redirects followed); must succeed."""
        broker = self.cluster.running_brokers()[0]
        url = broker.http_url + path
        data = json.dumps(body).encode() if body is not None else None
        for _ in range(5):
            request = urllib.request.Request(url, method=method, data=data)
            request.add_header("Authorization", f"Bearer {self.token(SUPERUSER)}")
            if data is not None:
                request.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    raw = response.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as e:
                location = e.headers.get("Location")
                if e.code in (307, 308) and location:
                    url = urllib.parse.urljoin(url, location)
                    continue
                raise AssertionError(f"{method} {path}: {e.code} {e.read()!r}") from None
        raise AssertionError(f"{method} {path}: too many redirects")


def _security(key_file: Path) -> dict[str, object]:
    return {
        "authentication_enabled": True,
        "authentication_providers": "token",
        "token_secret_key": f"file://{key_file}",
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    base = tmp_path_factory.mktemp("proxy")
    secret = secrets.token_bytes(32)
    key_file = base / "secret.key"
    key_file.write_bytes(secret)
    broker_settings = {
        **_security(key_file),
        "authorization_enabled": True,
        "superuser_roles": f"{SUPERUSER},{BROKER_ROLE}",
        "proxy_roles": PROXY_ROLE,
        "broker_client_authentication_plugin": "token",
        "broker_client_authentication_parameters": "token:"
        + jwt.encode({"sub": BROKER_ROLE}, secret, "HS256"),
        "broker_session_ttl_seconds": SESSION_TTL,
        "authentication_refresh_check_seconds": 1,
    }
    pki = make_pki(base / "pki")
    broker_settings.update(
        broker_service_port_tls=0,  # each broker binds a free one and registers it
        tls_certificate_file_path=pki.server.certificate,
        tls_key_file_path=pki.server.key,
    )
    decoy = socket.socket()
    decoy.bind(("127.0.0.1", 0))
    decoy.listen(8)
    decoy.setblocking(False)
    cluster = MagnetarCluster(base / "cluster", brokers=3, broker_settings=broker_settings)
    proxies: list[ProxyProcess] = []
    frozen: set[str] = set()
    try:
        cluster.start()
        tls_ports = {
            int(document["info"]["serviceUrlTls"].rsplit(":", 1)[1])
            for document in cluster.registered().values()
        }
        ports = [b.port for b in cluster.brokers] + sorted(tls_ports) + [decoy.getsockname()[1]]
        common = {
            **_security(key_file),
            "broker_client_authentication_plugin": "token",
            "broker_client_authentication_parameters": "token:"
            + jwt.encode({"sub": PROXY_ROLE}, secret, "HS256"),
            "broker_proxy_allowed_target_ports": ",".join(map(str, ports)),
            "handshake_timeout_seconds": HANDSHAKE_TIMEOUT,
            "authentication_refresh_check_seconds": 1,
        }
        for n in range(2):
            proxies.append(
                ProxyProcess(
                    base / f"proxy-{n}",
                    cluster.url,
                    settings={
                        **common,
                        "max_concurrent_inbound_connections_per_ip": PER_IP_LIMIT if n else 0,
                    },
                )
            )
        tls_port = free_port()
        proxies.append(
            ProxyProcess(
                base / "proxy-tls",
                cluster.url,
                settings={
                    **common,
                    "service_port_tls": tls_port,
                    "tls_certificate_file_path": pki.server.certificate,
                    "tls_key_file_path": pki.server.key,
                    "tls_enabled_with_broker": True,
                    "broker_client_trust_certs_file_path": pki.ca.certificate,
                    "tls_hostname_verification_enabled": True,
                    "max_concurrent_lookup_requests": 1,
                    # Brokers then check the client's own token too (original_auth_data).
                    "forward_authorization_credentials": True,
                },
            )
        )
        for proxy in proxies:
            proxy.spawn()
        for proxy in proxies:
            proxy.wait_serving()
        deployment = Deployment(
            cluster, proxies[:2], secret, decoy, frozen, pki, proxies[2], tls_port, tls_ports
        )
        deployment.admin("PUT", f"/admin/v2/tenants/{TENANT}", {"allowedClusters": ["standalone"]})
        for namespace in (NAMESPACE, OTHER_NAMESPACE):
            deployment.admin(
                "PUT", f"/admin/v2/namespaces/{namespace}", {"bundles": {"numBundles": 4}}
            )
        # Brokers authorize both the proxy's role and the client's (Pulsar's rule): the proxy
        # may act on both namespaces, alice only on one.
        grants = [(NAMESPACE, ALICE), (NAMESPACE, PROXY_ROLE), (OTHER_NAMESPACE, PROXY_ROLE)]
        for namespace, role in grants:
            deployment.admin(
                "POST",
                f"/admin/v2/namespaces/{namespace}/permissions/{role}",
                ["produce", "consume"],
            )
        yield deployment
    finally:
        for proxy in proxies:
            proxy.stop()
        cluster.close()
        decoy.close()
        for proxy in proxies:
            print(f"===== {proxy.describe()} =====\n{proxy.log_tail(3000)}")
        print(cluster.logs())
    for broker in cluster.brokers:
        assert_no_traceback(broker)
        if broker.broker_id in frozen:
            continue  # it lost its session while stopped, and says so at ERROR
        errors = broker.log_lines(" ERROR ", " CRITICAL ")
        assert not errors, f"broker {broker.broker_id} logged errors:\n" + "\n".join(errors[:40])
    for proxy in proxies:
        bad = proxy.log_lines("Traceback", " ERROR ", " CRITICAL ")
        assert not bad, f"{proxy.describe()} logged errors:\n" + "\n".join(bad[:40])


def topic(name: str, namespace: str = NAMESPACE) -> str:
    return f"persistent://{namespace}/{name}"


def drain(consumers: list[pulsar.Consumer], expected: int, timeout: float = 30.0) -> list[str]:
    """Receive and acknowledge until ``expected`` messages came: each consumer is read until it
    has nothing for a moment, then the next (one may hold the whole backlog)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        for consumer in consumers:
            while len(got) < expected:
                try:
                    message = consumer.receive(100)
                except pulsar.Timeout:
                    break
                got.append(message.data().decode())
                consumer.acknowledge(message)
    return got


# -- what clients do through the proxies ------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "consumers"),
    [
        (pulsar.ConsumerType.Exclusive, 1),
        (pulsar.ConsumerType.Failover, 2),
        (pulsar.ConsumerType.Shared, 2),
        (pulsar.ConsumerType.KeyShared, 2),
    ],
    ids=["exclusive", "failover", "shared", "key_shared"],
)
def test_subscription_modes_drain_a_backlog(
    deployment: Deployment, mode: pulsar.ConsumerType, consumers: int
) -> None:
    name = topic(f"modes-{mode}")
    count = 300
    producing, consuming = deployment.client(0), deployment.client(1)
    try:
        subscribed = [
            consuming.subscribe(name, "sub", consumer_type=mode, consumer_name=f"c{n}")
            for n in range(consumers)
        ]
        producer = producing.create_producer(name, batching_enabled=True)
        sent = [f"m-{n}" for n in range(count)]
        for n, body in enumerate(sent):
            producer.send_async(body.encode(), None, partition_key=f"k{n % 7}")
        producer.flush()
        got = drain(subscribed, count)
        assert sorted(got) == sorted(sent)
        assert drain(subscribed, 1, timeout=1.0) == []
    finally:
        producing.close()
        consuming.close()


def test_partitioned_topic(deployment: Deployment) -> None:
    name = topic("parted")
    deployment.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/parted/partitions", 3)
    producing, consuming = deployment.client(0), deployment.client(1)
    try:
        consumer = consuming.subscribe(name, "sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = producing.create_producer(name, batching_enabled=False)
        sent = [f"p-{n}" for n in range(150)]
        for n, body in enumerate(sent):
            producer.send(body.encode(), partition_key=f"key-{n}")
        got = drain([consumer], len(sent))
        assert sorted(got) == sorted(sent)
        partitions = {m for m in consuming.get_topic_partitions(name)}
        assert partitions == {f"{name}-partition-{n}" for n in range(3)}
    finally:
        producing.close()
        consuming.close()


def test_reader_and_seek(deployment: Deployment) -> None:
    name = topic("reading")
    producing, reading = deployment.client(0), deployment.client(1)
    try:
        producer = producing.create_producer(name, batching_enabled=False)
        ids = [producer.send(f"r-{n}".encode()) for n in range(60)]
        reader = reading.create_reader(name, pulsar.MessageId.earliest)
        read = []
        while reader.has_message_available():
            read.append(reader.read_next(5000).data().decode())
        assert read == [f"r-{n}" for n in range(60)]
        reader.seek(ids[40])
        again = [reader.read_next(5000).data().decode() for _ in range(5)]
        assert again[0] in ("r-40", "r-41") and again[-1] in ("r-44", "r-45")
        consumer = reading.subscribe(name, "seeker")
        consumer.seek(ids[10])
        first = consumer.receive(10_000)
        assert first.data().decode() in ("r-10", "r-11")
    finally:
        producing.close()
        reading.close()


class Reading(Record):
    sensor = String()
    value = Integer()


def test_json_schema(deployment: Deployment) -> None:
    name = topic("schema")
    producing, consuming = deployment.client(0), deployment.client(1)
    try:
        schema = JsonSchema(Reading)
        consumer = consuming.subscribe(name, "sub", schema=schema)
        producer = producing.create_producer(name, schema=schema)
        for n in range(20):
            producer.send(Reading(sensor=f"s{n % 3}", value=n))
        values = []
        for _ in range(20):
            message = consumer.receive(10_000)
            values.append(message.value().value)
            consumer.acknowledge(message)
        assert values == list(range(20))
        versions = deployment.admin("GET", f"/admin/v2/schemas/{NAMESPACE}/schema/schema")
        assert "sensor" in json.dumps(versions)
    finally:
        producing.close()
        consuming.close()


def test_unload_under_production_loses_nothing(deployment: Deployment) -> None:
    name = topic("unloaded")
    producing, consuming = deployment.client(0), deployment.client(1)
    try:
        consumer = consuming.subscribe(name, "sub")
        paced = PacedProducer(producing, name, interval=0.002).start()
        try:
            paced.wait_for(100)
            owner_before = deployment.cluster.owner_of_topic(name)
            bundles = deployment.admin("GET", f"/admin/v2/namespaces/{NAMESPACE}/bundles")
            boundaries = bundles["boundaries"]
            for low, high in itertools.pairwise(boundaries):
                deployment.admin("PUT", f"/admin/v2/namespaces/{NAMESPACE}/{low}_{high}/unload")
            paced.wait_for(200, timeout=60)
        finally:
            paced.stop()
            paced.close()
        assert paced.errors == [] and paced.raised == []
        got = set(drain([consumer], len(paced.receipted), timeout=60))
        assert set(paced.receipted) <= got, sorted(set(paced.receipted) - got)[:10]
        assert owner_before is not None
    finally:
        producing.close()
        consuming.close()


def test_admin_calls_through_the_proxy_http_port(deployment: Deployment) -> None:
    """The HTTP half (``http.py``) served by the proxy process: an admin call with the client's
    token reaches a broker, which sees the client's role beside the proxy's."""
    proxy = deployment.proxies[0]
    producing = deployment.client(0)
    try:
        producing.create_producer(topic("listed")).close()
    finally:
        producing.close()
    request = urllib.request.Request(f"{proxy.http_url}/admin/v2/persistent/{NAMESPACE}")
    request.add_header("Authorization", f"Bearer {deployment.token(SUPERUSER)}")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert topic("listed") in json.loads(response.read())
    assert proxy.http_status("/ready") == 200


# -- relay targets -----------------------------------------------------------------------------


def _raw_connect(deployment: Deployment, proxy: ProxyProcess, target: str) -> RawConnection:
    raw = RawConnection(proxy)  # type: ignore[arg-type]
    raw.command(
        pb.CommandConnect(
            client_version="proxy-test",
            protocol_version=codec.SERVER_PROTOCOL_VERSION,
            auth_method_name="token",
            auth_data=deployment.token(SUPERUSER).encode(),
            proxy_to_broker_url=target,
        )
    )
    return raw


def _assert_refused_target(raw: RawConnection) -> None:
    with raw:
        frame = raw.expect(Type.ERROR)
        assert frame.body.error == pb.ServiceNotReady  # type: ignore[attr-defined]
        assert frame.body.message == "Target broker cannot be validated."  # type: ignore[attr-defined]
        assert raw.closed_by_peer()


def _dialled(listener: socket.socket) -> bool:
    readable, _, _ = select.select([listener], [], [], 0.5)
    if readable:
        listener.accept()[0].close()
    return bool(readable)


def _new_connections(proxy: ProxyProcess) -> float:
    for line in proxy.metrics().splitlines():
        if line.startswith("pulsar_proxy_new_connections_total "):
            return float(line.split()[1])
    return 0.0


def test_unregistered_address_is_refused_and_never_dialled(deployment: Deployment) -> None:
    port = deployment.decoy.getsockname()[1]  # an allowed port, but nobody registered it
    _assert_refused_target(_raw_connect(deployment, deployment.proxies[0], f"127.0.0.1:{port}"))
    assert not _dialled(deployment.decoy)


def test_disallowed_port_is_refused_and_never_dialled(deployment: Deployment) -> None:
    """Even a registered broker is not dialled on a port outside the allowed ones: a
    registration naming a listening socket is added for the test, then removed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    cluster = deployment.cluster
    key = f"{BROKERS_ROOT}/127.0.0.1:{free_port()}"
    real = next(iter(cluster.registered().values()))
    info = {**real["info"], "brokerId": key.rsplit("/", 1)[1]}
    info["serviceUrl"] = f"pulsar://127.0.0.1:{port}"
    document = json.dumps({"info": info, "report": real["report"]}).encode()

    async def put() -> None:
        from magnetar.common.metadata import open_store

        store = await open_store(cluster.url)
        try:
            await store.put(key, document)
        finally:
            await store.close()

    proxy = deployment.proxies[0]
    try:
        _run(put)
        cluster.wait_for(
            lambda: proxy.log_lines(f"(pulsar://127.0.0.1:{port})"),
            what="the proxy saw the registration",
        )
        _assert_refused_target(_raw_connect(deployment, proxy, f"127.0.0.1:{port}"))
        assert not _dialled(listener)
        assert proxy.log_lines(f"port {port} is not in broker_proxy_allowed_target_ports")
    finally:
        cluster.delete(key)
        listener.close()


def test_the_proxy_itself_is_refused(deployment: Deployment) -> None:
    proxy = deployment.proxies[0]
    before = _new_connections(proxy)
    _assert_refused_target(_raw_connect(deployment, proxy, f"127.0.0.1:{proxy.port}"))
    assert _new_connections(proxy) == before + 1  # ours only: it did not dial itself


def test_old_protocol_versions_are_refused(deployment: Deployment) -> None:
    with RawConnection(deployment.proxies[1]) as raw:  # type: ignore[arg-type]
        raw.command(pb.CommandConnect(client_version="old", protocol_version=9))
        frame = raw.expect(Type.ERROR)
        assert frame.body.error == pb.UnsupportedVersionError  # type: ignore[attr-defined]
        assert raw.closed_by_peer()


def _metric(proxy: ProxyProcess, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in proxy.metrics().splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def test_a_silent_connection_is_closed_after_the_handshake_timeout(
    deployment: Deployment,
) -> None:
    proxy = deployment.proxies[0]
    reason = 'reason="handshake_timeout"'
    before = _metric(proxy, "pulsar_proxy_rejected_connections_total", reason)
    started = time.monotonic()
    with RawConnection(proxy) as raw:  # type: ignore[arg-type]
        assert raw.closed_by_peer(timeout=HANDSHAKE_TIMEOUT + 5)
    assert time.monotonic() - started >= HANDSHAKE_TIMEOUT - 0.5
    assert _metric(proxy, "pulsar_proxy_rejected_connections_total", reason) == before + 1


def test_connections_beyond_the_per_ip_limit_are_closed(deployment: Deployment) -> None:
    proxy = deployment.proxies[1]
    per_ip_reason = 'reason="max_connections_per_ip"'
    silent_reason = 'reason="handshake_timeout"'
    silent_before = _metric(proxy, "pulsar_proxy_rejected_connections_total", silent_reason)
    sockets = [
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        for _ in range(PER_IP_LIMIT + 5)
    ]
    try:
        for sock in sockets:
            sock.setblocking(False)
        closed: set[int] = set()
        # Until the proxy closed the excess and counted each closing, the same in two looks in
        # a row (a loaded machine may take a while). The admitted sockets never send CONNECT,
        # so they are closed too once the handshake timeout passes: counted apart.
        last: tuple[int, float, float] | None = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for i, sock in enumerate(sockets):
                if i in closed:
                    continue
                try:
                    if sock.recv(1) == b"":
                        closed.add(i)
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    closed.add(i)
            per_ip = _metric(proxy, "pulsar_proxy_rejected_connections_total", per_ip_reason)
            silent = (
                _metric(proxy, "pulsar_proxy_rejected_connections_total", silent_reason)
                - silent_before
            )
            look = (len(closed), per_ip, silent)
            if per_ip >= 5 and len(closed) == per_ip + silent and look == last:
                break
            last = look
            time.sleep(0.2)
        assert last is not None
        closings, per_ip, silent = last
        assert 5 <= per_ip <= 5 + 8  # a few may be held by clients of earlier tests
        assert closings == per_ip + silent  # each closing counted, under its reason
    finally:
        for sock in sockets:
            sock.close()
    with RawConnection(proxy) as raw:  # type: ignore[arg-type]
        raw.command(_connect(deployment))
        raw.expect(Type.CONNECTED)


def _connect(
    deployment: Deployment, target: str = "", token: str | None = None
) -> pb.CommandConnect:
    return pb.CommandConnect(
        client_version="proxy-test",
        protocol_version=codec.SERVER_PROTOCOL_VERSION,
        auth_method_name="token",
        auth_data=(token or deployment.token(SUPERUSER)).encode(),
        proxy_to_broker_url=target or None,
    )


def test_other_commands_are_refused_in_lookup_mode(deployment: Deployment) -> None:
    with RawConnection(deployment.proxies[0]) as raw:  # type: ignore[arg-type]
        raw.command(_connect(deployment))
        raw.expect(Type.CONNECTED)
        raw.command(pb.CommandProducer(topic=topic("nope"), producer_id=1, request_id=7))
        frame = raw.expect(Type.ERROR)
        assert frame.body.request_id == 7  # type: ignore[attr-defined]
        assert frame.body.error == pb.NotAllowedError  # type: ignore[attr-defined]
        raw.command(pb.CommandPartitionedTopicMetadata(topic=topic("meta"), request_id=8))
        answer = raw.expect(Type.PARTITIONED_METADATA_RESPONSE).body
        assert answer.request_id == 8 and answer.partitions == 0  # type: ignore[attr-defined]


def test_lookups_beyond_the_limit_are_refused(deployment: Deployment) -> None:
    """Two lookups in one write to a proxy that serves one at a time: the second is refused
    while the first is with a broker, and the first is answered."""
    with RawConnection(deployment.tls_proxy) as raw:  # type: ignore[arg-type]
        raw.command(_connect(deployment))
        raw.expect(Type.CONNECTED)
        raw.send(
            codec.encode_command(pb.CommandLookupTopic(topic=topic("limited"), request_id=1))
            + codec.encode_command(pb.CommandLookupTopic(topic=topic("limited"), request_id=2))
        )
        answers = {}
        for _ in range(2):
            body = raw.expect(Type.LOOKUP_RESPONSE).body
            answers[body.request_id] = body  # type: ignore[attr-defined]
    refused = answers[2]
    assert refused.response == pb.CommandLookupTopicResponse.Failed
    assert refused.error == pb.ServiceNotReady
    assert refused.message == "Too many concurrent lookup requests"
    assert answers[1].response == pb.CommandLookupTopicResponse.Connect, answers[1]
    assert answers[1].proxy_through_service_url


def test_a_relay_whose_client_credentials_expire_is_closed(deployment: Deployment) -> None:
    broker = deployment.cluster.running_brokers()[0]
    expiring = jwt.encode(
        {"sub": SUPERUSER, "exp": int(time.time()) + 3}, deployment.secret, "HS256"
    )
    with RawConnection(deployment.proxies[1]) as raw:  # type: ignore[arg-type]
        raw.command(_connect(deployment, f"127.0.0.1:{broker.port}", expiring))
        raw.expect(Type.CONNECTED)
        raw.command(pb.CommandPing())
        raw.expect(Type.PONG)  # from the broker, through the relay
        assert raw.closed_by_peer(timeout=10)
    assert deployment.proxies[1].log_lines("credentials of 'admin' expired; closing")


def test_a_slow_consumer_leaves_its_backlog_on_the_broker(deployment: Deployment) -> None:
    """A consumer that never reads its socket, with permits for everything: the proxy stops
    reading from the broker once the client's buffers are full, so its memory stays put while
    tens of megabytes are published to the subscription."""
    name = topic("slow")
    proxy = deployment.proxies[1]
    with RawConnection(proxy) as lookup:  # type: ignore[arg-type]
        lookup.command(_connect(deployment))
        lookup.expect(Type.CONNECTED)
        for _ in range(10):
            lookup.command(pb.CommandLookupTopic(topic=name, request_id=1))
            found = lookup.expect(Type.LOOKUP_RESPONSE).body
            if found.response == pb.CommandLookupTopicResponse.Connect:  # type: ignore[attr-defined]
                break
            time.sleep(0.5)
        assert found.proxy_through_service_url and found.authoritative  # type: ignore[attr-defined]
        broker_url = found.brokerServiceUrl  # type: ignore[attr-defined]
    assert broker_url in {b.url for b in deployment.cluster.brokers}
    slow = RawConnection(proxy)  # type: ignore[arg-type]
    producing = deployment.client(0)
    try:
        slow.command(_connect(deployment, broker_url.removeprefix("pulsar://")))
        slow.expect(Type.CONNECTED)
        subscribe = pb.CommandSubscribe(
            topic=name,
            subscription="slow",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1,
            request_id=2,
            initialPosition=pb.CommandSubscribe.Earliest,
        )
        slow.command(subscribe)
        slow.expect(Type.SUCCESS)
        slow.command(pb.CommandFlow(consumer_id=1, messagePermits=1_000_000))
        to_client = 'direction="to_client"'
        relayed_before = _metric(proxy, "pulsar_proxy_binary_bytes_total", to_client)
        rss_before = rss_mb(proxy.pid or 0)
        producer = producing.create_producer(name, batching_enabled=False)
        payload = secrets.token_bytes(100 * 1024)
        count = 400  # 40 MiB
        for _ in range(count):
            producer.send_async(payload, None)
        producer.flush()
        time.sleep(2)
        rss_after = rss_mb(proxy.pid or 0)
        relayed = _metric(proxy, "pulsar_proxy_binary_bytes_total", to_client) - relayed_before
        published = count * len(payload) / 2**20
        print(
            f"slow consumer: {published:.0f} MiB published, {relayed / 2**20:.1f} MiB relayed "
            f"to it, proxy RSS {rss_before:.1f} -> {rss_after:.1f} MiB"
        )
        assert relayed / 2**20 < published / 2
        assert rss_after - rss_before < 16
    finally:
        producing.close()
        slow.close()


def test_tls_from_clients_to_the_proxy_and_from_the_proxy_to_brokers(
    deployment: Deployment,
) -> None:
    proxy = deployment.tls_proxy
    client = pulsar.Client(
        f"pulsar+ssl://127.0.0.1:{deployment.tls_port}",
        authentication=pulsar.AuthenticationToken(deployment.token(SUPERUSER)),
        tls_trust_certs_file_path=str(deployment.pki.ca.certificate),
        tls_validate_hostname=True,
        operation_timeout_seconds=30,
    )
    try:
        names = [topic(f"tls-{n}") for n in range(4)]  # spread over the brokers
        for name in names:
            consumer = client.subscribe(name, "sub")
            producer = client.create_producer(name)
            for n in range(10):
                producer.send(f"{name}-{n}".encode())
            got = drain([consumer], 10)
            assert got == [f"{name}-{n}" for n in range(10)]
    finally:
        client.close()
    relayed = proxy.log_lines("relaying to broker")
    assert relayed
    for line in relayed:
        port = int(line.split("relaying to broker ")[1].split()[0].rsplit(":", 1)[1])
        assert port in deployment.broker_tls_ports, line


def test_a_forwarded_token_is_refreshed_through_the_relay(deployment: Deployment) -> None:
    """The TLS proxy forwards client credentials: the broker checks the client's token, and
    when it expires challenges the client through the relay; a token supplier answers and
    nothing is lost."""
    made: list[str] = []

    def supplier() -> str:
        made.append(
            jwt.encode({"sub": ALICE, "exp": int(time.time()) + 3}, deployment.secret, "HS256")
        )
        return made[-1]

    client = pulsar.Client(
        f"pulsar+ssl://127.0.0.1:{deployment.tls_port}",
        authentication=pulsar.AuthenticationToken(supplier),
        tls_trust_certs_file_path=str(deployment.pki.ca.certificate),
        operation_timeout_seconds=30,
    )
    name = topic("forwarded-refresh")
    try:
        consumer = client.subscribe(name, "sub")
        producer = client.create_producer(name, batching_enabled=False)
        sent = 0
        deadline = time.monotonic() + 8  # beyond two lifetimes of a token
        while time.monotonic() < deadline:
            producer.send(f"r-{sent}".encode())
            sent += 1
            time.sleep(0.1)
        assert drain([consumer], sent) == [f"r-{n}" for n in range(sent)]
    finally:
        client.close()
    refreshed = [
        line
        for broker in deployment.cluster.running_brokers()
        for line in broker.log_lines(f"credentials of '{ALICE}' refreshed")
    ]
    assert refreshed, "no broker refreshed the forwarded credentials"


# -- identity ----------------------------------------------------------------------------------


def test_a_client_granted_one_namespace_is_refused_elsewhere(deployment: Deployment) -> None:
    alice = deployment.client(0, role=ALICE)
    try:
        producer = alice.create_producer(topic("alice"))
        producer.send(b"hello")
        consumer = alice.subscribe(
            topic("alice"), "s", initial_position=pulsar.InitialPosition.Earliest
        )
        assert consumer.receive(10_000).data() == b"hello"
        with pytest.raises(pulsar.AuthorizationError):
            alice.create_producer(topic("alice", OTHER_NAMESPACE))
        with pytest.raises(pulsar.AuthorizationError):
            alice.subscribe(topic("alice", OTHER_NAMESPACE), "s")
    finally:
        alice.close()


def test_bad_credentials_are_refused_by_the_proxy(deployment: Deployment) -> None:
    with RawConnection(deployment.proxies[0]) as raw:  # type: ignore[arg-type]
        raw.command(
            pb.CommandConnect(
                client_version="forger",
                protocol_version=codec.SERVER_PROTOCOL_VERSION,
                auth_method_name="token",
                auth_data=jwt.encode({"sub": SUPERUSER}, b"x" * 32, "HS256").encode(),
            )
        )
        frame = raw.expect(Type.ERROR)
        assert frame.body.error == pb.AuthenticationError  # type: ignore[attr-defined]
        assert raw.closed_by_peer()


def test_a_proxy_role_without_original_principal_is_refused_by_brokers(
    deployment: Deployment,
) -> None:
    broker = deployment.cluster.brokers[0]
    with RawConnection(broker) as raw:  # type: ignore[arg-type]
        raw.command(
            pb.CommandConnect(
                client_version="proxy-impostor",
                protocol_version=codec.SERVER_PROTOCOL_VERSION,
                auth_method_name="token",
                auth_data=deployment.token(PROXY_ROLE).encode(),
            )
        )
        frame = raw.expect(Type.ERROR)
        assert frame.body.error == pb.AuthenticationError  # type: ignore[attr-defined]
        assert frame.body.message == "Invalid roles."  # type: ignore[attr-defined]
        assert raw.closed_by_peer()


# -- a frozen broker (last: it changes the cluster) ---------------------------------------------


@pytest.mark.parametrize("failure", ["sigstop", "sigkill"])
def test_clients_move_on_when_the_owner_freezes_or_dies(
    deployment: Deployment, failure: str
) -> None:
    """SIGSTOP or kill -9 of the owner while a producer runs through the proxy: receipts start
    again within the session TTL plus a few seconds (the time is printed). A frozen broker keeps
    its sockets open; the proxy closes its relays when its registration expires."""
    name = topic(f"owner-{failure}")
    cluster = deployment.cluster
    producing = deployment.client(0)
    try:
        paced = PacedProducer(producing, name, interval=0.005).start()
        try:
            paced.wait_for(50)
            owner = cluster.broker(
                cluster.wait_for(lambda: cluster.owner_of_topic(name), what="an owner")
            )
            deployment.frozen.add(owner.broker_id)
            failed_at = time.monotonic()
            if failure == "sigstop":
                owner.pause()
            else:
                owner.kill()
            try:
                count = len(paced.receipted)
                paced.wait_until(count + 50, failed_at + SESSION_TTL + 20)
                recovered = min(t for t in paced.receipted.values() if t > failed_at + 1)
                recovered -= failed_at
                print(f"receipts again {recovered:.1f} s after {failure} of the owner (proxy)")
                assert recovered < SESSION_TTL + 15
            finally:
                if failure == "sigstop":
                    owner.resume()
        finally:
            paced.stop()
            paced.close()
        assert paced.raised == []
    finally:
        producing.close()
