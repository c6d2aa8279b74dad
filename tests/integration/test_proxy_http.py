"""The proxy's HTTP half (issue 19) against real brokers: ``build_http_app`` served on a real
port, called over real HTTP, forwarding to real ``magnetar standalone`` / ``magnetar broker``
processes.

The host is a small dataclass implementing ``ProxyHttpHost`` (the composition root is another
module's); its directory hands out the real brokers' ``BrokerInfo``. Covered:

- probes and ``/metrics`` open, ``/ready`` following the host;
- GET/PUT/POST/DELETE forwarded with bodies, query strings and status codes (a tenant, a
  namespace, a policy set, read back and removed, a 404, a broker's 412 naming the query);
- bodies over the bound answered 413 by the proxy; no broker, an unreachable broker (and the
  fallback to another), a paused broker (SIGSTOP: 504 after ``broker_proxy_read_timeout_ms``);
- with authentication and authorization on: the proxy's 401 for missing and forged tokens; the
  broker authorizing the client's role, not the proxy's superuser role (a tenant admin allowed,
  an ungranted role refused, a forged ``X-Original-Principal`` dropped); a proxy credential
  outside ``proxy_roles`` refused by the broker; ``forward_authorization_credentials``; HTTPS
  to the broker (``tls_enabled_with_broker``, the test CA trusted);
- on a two-broker cluster: a broker's 307 to the owner followed by the proxy, so the client
  sees only the answer.

Not covered with real processes: the ten-hop limit and a redirect to an unregistered address
(no real broker answers so); both raise the proxy's own 502.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
from aiohttp import web

from magnetar.common.auth.client import ClientCredentials
from magnetar.common.auth.service import AuthenticationService
from magnetar.common.auth.settings import SecuritySettings
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.proxy.http import MAX_REQUEST_BODY_BYTES, ProxyHttpHost, build_http_app
from magnetar.proxy.metrics import ProxyMetrics
from tests.support.certs import Pki, make_pki
from tests.support.cluster import MagnetarCluster
from tests.support.etcd import free_port
from tests.support.standalone import StandaloneProcess

# -- the host ---------------------------------------------------------------------------------


@dataclass
class HttpSettings:
    """The ``ProxyConfig`` fields the HTTP half reads."""

    authentication_enabled: bool = False
    forward_authorization_credentials: bool = False
    tls_enabled_with_broker: bool = False
    tls_hostname_verification_enabled: bool = True
    broker_client_trust_certs_file_path: str = ""
    broker_proxy_read_timeout_ms: int = 15_000


@dataclass
class Directory:
    """Brokers in a fixed order; ``pick`` is the first."""

    known: list[BrokerInfo]

    def brokers(self) -> list[BrokerInfo]:
        return list(self.known)

    def pick(self) -> BrokerInfo:
        if not self.known:
            raise LookupError("no broker registered")
        return self.known[0]


@dataclass
class Host:
    config: HttpSettings
    directory: Directory
    authentication: AuthenticationService = field(
        default_factory=lambda: AuthenticationService(SecuritySettings())
    )
    client_credentials: ClientCredentials = field(default_factory=lambda: ClientCredentials("", ""))
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    is_ready: bool = True

    def ready(self) -> bool:
        return self.is_ready


def _typed(host: Host) -> ProxyHttpHost:
    return host  # mypy checks Host against the protocol here


def standalone_info(node: StandaloneProcess, https_port: int = 0) -> BrokerInfo:
    return BrokerInfo(
        f"127.0.0.1:{node.http_port}",
        node.url,
        f"http://127.0.0.1:{node.http_port}",
        https_url=f"https://localhost:{https_port}" if https_port else "",
    )


def dead_broker() -> BrokerInfo:
    port = free_port()  # nothing listens there
    return BrokerInfo(f"127.0.0.1:{port}", "pulsar://127.0.0.1:1", f"http://127.0.0.1:{port}")


# -- the proxy's HTTP server, on a loop of its own ---------------------------------------------


class ProxyHttpServer:
    """``build_http_app(host)`` served on a free loopback port from a thread of its own."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> ProxyHttpServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(build_http_app(_typed(self.host)))
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
    ) -> Answer:
        return call(self.port, method, path, body, headers, token)

    def metrics(self) -> str:
        return self.call("GET", "/metrics").text


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    token: str | None = None,
) -> Answer:
    """One request, redirects not followed: what the client sees is what the proxy answered."""
    sent = dict(headers or {})
    data: bytes | None = None
    if isinstance(body, bytes):
        data = body
    elif body is not None:
        data = json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        return Answer(response.status, response.headers, response.read())
    finally:
        connection.close()


def metric_value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- an open standalone -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def open_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    node = StandaloneProcess(tmp_path_factory.mktemp("proxy-http") / "open").start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def proxy(open_node: StandaloneProcess) -> Iterator[ProxyHttpServer]:
    host = Host(HttpSettings(), Directory([standalone_info(open_node)]))
    with ProxyHttpServer(host) as server:
        yield server


def test_probes_and_metrics_are_open(proxy: ProxyHttpServer) -> None:
    for path in ("/status.html", "/health"):
        answer = proxy.call("GET", path)
        assert (answer.status, answer.text) == (200, "OK")
    proxy.host.is_ready = False
    answer = proxy.call("GET", "/ready")
    assert answer.status == 503, answer.text
    proxy.host.is_ready = True
    assert proxy.call("GET", "/ready").status == 200

    proxy.host.metrics.binary_bytes.labels("to_broker").inc(42)
    proxy.host.metrics.relayed_connections.labels("127.0.0.1:8080").set(3)
    answer = proxy.call("GET", "/metrics")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain")
    text = answer.text
    assert 'pulsar_proxy_binary_bytes_total{direction="to_broker"} 42.0' in text
    assert 'magnetar_proxy_relayed_connections{broker="127.0.0.1:8080"} 3.0' in text
    for family in (
        "pulsar_proxy_active_connections",
        "pulsar_proxy_new_connections_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert f"\n{family} " in text, family
    # Probes are not forwarded calls.
    assert "magnetar_proxy_http_requests_total{" not in text


def test_admin_calls_are_forwarded_with_bodies_and_statuses(proxy: ProxyHttpServer) -> None:
    tenant, ns = f"t{secrets.token_hex(3)}", "ns"
    assert proxy.call("PUT", f"/admin/v2/tenants/{tenant}", {"adminRoles": ["alice"]}).status == 204
    answer = proxy.call("GET", f"/admin/v2/tenants/{tenant}")
    assert answer.status == 200 and answer.json()["adminRoles"] == ["alice"], answer.text
    assert answer.headers["Content-Type"].startswith("application/json")
    body = {"bundles": {"numBundles": 4}}
    assert proxy.call("PUT", f"/admin/v2/namespaces/{tenant}/{ns}", body).status == 204
    assert proxy.call("PUT", f"/admin/v2/namespaces/{tenant}/{ns}").status == 409

    retention = {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
    path = f"/admin/v2/namespaces/{tenant}/{ns}/retention"
    assert proxy.call("POST", path, retention).status == 204
    answer = proxy.call("GET", path)
    assert (answer.status, answer.json()) == (200, retention)
    # The broker's own validation answers come back as they are.
    answer = proxy.call("POST", path, b"{not json", {"Content-Type": "application/json"})
    assert answer.status == 400 and "not valid JSON" in answer.json()["reason"], answer.text
    assert proxy.call("DELETE", path).status == 204
    assert proxy.call("GET", path).json() is None

    # The query string arrives as the client encoded it.
    bundles = proxy.call("GET", f"/admin/v2/namespaces/{tenant}/{ns}/bundles").json()
    first = f"{bundles['boundaries'][0]}_{bundles['boundaries'][1]}"
    answer = proxy.call(
        "PUT", f"/admin/v2/namespaces/{tenant}/{ns}/{first}/split?splitAlgorithmName=no%20such"
    )
    assert answer.status == 412, answer.text
    assert answer.json()["reason"] == "Unsupported split algorithm: no such"

    answer = proxy.call("GET", f"/admin/v2/namespaces/{tenant}/missing")
    assert answer.status == 404 and "reason" in answer.json(), answer.text
    # A method the broker does not serve there: its 405 and Allow header come back as they are.
    answer = proxy.call("POST", "/admin/v2/tenants")
    assert answer.status == 405 and "GET" in answer.headers["Allow"], answer.text
    assert proxy.call("PUT", f"/admin/v2/tenants/{tenant}-gone", {}).status == 204
    assert proxy.call("DELETE", f"/admin/v2/tenants/{tenant}-gone").status == 204
    assert proxy.call("GET", f"/admin/v2/tenants/{tenant}-gone").status == 404

    topic = f"persistent://{tenant}/other/t"
    assert proxy.call("PUT", f"/admin/v2/namespaces/{tenant}/other").status == 204
    answer = proxy.call("GET", "/lookup/v2/topic/" + topic.replace("://", "/"))
    assert answer.status == 200, answer.text
    assert answer.json()["brokerUrl"].endswith(proxy.host.directory.pick().service_url[-6:])

    text = proxy.metrics()
    counted = {"200": 5, "204": 7, "400": 1, "404": 2, "405": 1, "409": 1, "412": 1}
    for code, count in counted.items():
        sample = f'magnetar_proxy_http_requests_total{{code="{code}"}}'
        assert metric_value(text, sample) == count, (code, text)


def test_oversized_bodies_are_refused_by_the_proxy(proxy: ProxyHttpServer) -> None:
    answer = proxy.call(
        "POST",
        "/admin/v2/namespaces/public/default/retention",
        b"x" * (MAX_REQUEST_BODY_BYTES + 1),
        {"Content-Type": "application/json"},
    )
    assert answer.status == 413, answer.text
    assert "larger than" in answer.json()["reason"]
    assert 'magnetar_proxy_http_requests_total{code="413"} 1.0' in proxy.metrics()


def test_no_broker_and_unreachable_brokers(open_node: StandaloneProcess) -> None:
    alive = standalone_info(open_node)
    with ProxyHttpServer(Host(HttpSettings(), Directory([]))) as proxy:
        answer = proxy.call("GET", "/admin/v2/clusters")
        assert answer.status == 503 and "No broker" in answer.json()["reason"], answer.text
    dead = dead_broker()
    with ProxyHttpServer(Host(HttpSettings(), Directory([dead]))) as proxy:
        answer = proxy.call("GET", "/admin/v2/clusters")
        assert answer.status == 503, answer.text
        assert answer.json()["reason"].startswith(f"Broker {dead.broker_id} unreachable")
    # Nothing was sent to the dead one, so the next registered broker takes the request.
    with ProxyHttpServer(Host(HttpSettings(), Directory([dead, alive]))) as proxy:
        answer = proxy.call("GET", "/admin/v2/clusters")
        assert answer.status == 200, answer.text


def test_a_paused_broker_times_out(open_node: StandaloneProcess) -> None:
    settings = HttpSettings(broker_proxy_read_timeout_ms=700)
    with ProxyHttpServer(Host(settings, Directory([standalone_info(open_node)]))) as proxy:
        assert proxy.call("GET", "/admin/v2/clusters").status == 200  # a pooled connection
        open_node.pause()
        try:
            answer = proxy.call("GET", "/admin/v2/clusters")
        finally:
            open_node.resume()
        assert answer.status == 504, answer.text
        assert "did not answer within 700 ms" in answer.json()["reason"]
        assert proxy.call("GET", "/admin/v2/clusters").status == 200


# -- authentication and authorization ---------------------------------------------------------


@dataclass
class Secured:
    node: StandaloneProcess
    secret: bytes
    pki: Pki
    https_port: int

    def token(self, role: str, key: bytes | None = None) -> str:
        return jwt.encode({"sub": role}, key or self.secret, algorithm="HS256")

    def host(self, proxy_role: str = "proxy", **settings: Any) -> Host:
        security = SecuritySettings(
            authentication_enabled=True,
            authentication_providers="token",
            token_secret_key="data:;base64," + base64.b64encode(self.secret).decode(),
        )
        return Host(
            HttpSettings(authentication_enabled=True, **settings),
            Directory([standalone_info(self.node, self.https_port)]),
            authentication=AuthenticationService(security),
            client_credentials=ClientCredentials("token", "token:" + self.token(proxy_role)),
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("proxy-http-auth")
    secret = secrets.token_bytes(32)
    key_file = base / "secret.key"
    key_file.write_bytes(secret)
    pki = make_pki(base / "pki")
    https_port = free_port()
    node = StandaloneProcess(
        base / "secured",
        extra=[
            "--authentication-enabled",
            "--authentication-providers", "token",
            "--token-secret-key", f"file://{key_file}",
            "--authorization-enabled",
            "--proxy-roles", "proxy",
            "--superuser-roles", "proxy,admin",
            "--web-service-port-tls", str(https_port),
            "--tls-certificate-file-path", str(pki.server.certificate),
            "--tls-key-file-path", str(pki.server.key),
        ],
    ).start()  # fmt: skip
    try:
        found = Secured(node, secret, pki, https_port)
        admin = found.token("admin")
        port = node.http_port
        answer = call(port, "PUT", "/admin/v2/tenants/acme", {"adminRoles": ["alice"]}, token=admin)
        assert answer.status == 204, answer.text
        assert call(port, "PUT", "/admin/v2/namespaces/acme/ns", token=admin).status == 204
        yield found
    finally:
        node.stop()


def test_clients_are_authenticated_by_the_proxy(secured: Secured) -> None:
    with ProxyHttpServer(secured.host()) as proxy:
        answer = proxy.call("GET", "/admin/v2/namespaces/acme/ns")
        assert answer.status == 401, answer.text
        assert answer.json()["reason"].startswith("Authentication required")
        forged = secured.token("admin", key=secrets.token_bytes(32))
        answer = proxy.call("GET", "/admin/v2/namespaces/acme/ns", token=forged)
        assert answer.status == 401, answer.text
        answer = proxy.call("GET", "/admin/v2/namespaces/acme/ns", headers={"Authorization": "X y"})
        assert answer.status == 401, answer.text
        # Probes stay open.
        assert proxy.call("GET", "/health").status == 200
        assert proxy.call("GET", "/metrics").status == 200
        assert 'magnetar_proxy_http_requests_total{code="401"} 3.0' in proxy.metrics()


def test_the_broker_authorizes_the_clients_role(secured: Secured) -> None:
    """The proxy's role is a superuser; what a client may do is still its own role's."""
    path = "/admin/v2/namespaces/acme/ns"
    with ProxyHttpServer(secured.host()) as proxy:
        answer = proxy.call("GET", path, token=secured.token("alice"))
        assert answer.status == 200, answer.text  # acme's admin
        answer = proxy.call("GET", path, token=secured.token("mallory"))
        assert answer.status == 403, answer.text  # granted nothing
        # A principal header of the client's own is not passed on as the proxy's word.
        answer = proxy.call(
            "GET", path, token=secured.token("mallory"), headers={"X-Original-Principal": "admin"}
        )
        assert answer.status == 403, answer.text
        answer = proxy.call("PUT", "/admin/v2/tenants/evil", {}, token=secured.token("alice"))
        assert answer.status == 403, answer.text  # tenants are for superusers
    # The same refusal straight at the broker, as the proxy sends it.
    answer = call(
        secured.node.http_port,
        "GET",
        path,
        token=secured.token("proxy"),
        headers={"X-Original-Principal": "mallory"},
    )
    assert answer.status == 403, answer.text


def test_only_a_proxy_role_may_name_the_client(secured: Secured) -> None:
    with ProxyHttpServer(secured.host(proxy_role="not-a-proxy")) as proxy:
        answer = proxy.call("GET", "/admin/v2/namespaces/acme/ns", token=secured.token("alice"))
        assert answer.status == 401, answer.text
        assert "Invalid roles" in answer.json()["reason"]


def test_forwarded_client_credentials(secured: Secured) -> None:
    with ProxyHttpServer(secured.host(forward_authorization_credentials=True)) as proxy:
        path = "/admin/v2/namespaces/acme/ns"
        assert proxy.call("GET", path, token=secured.token("alice")).status == 200
        assert proxy.call("GET", path, token=secured.token("mallory")).status == 403


def test_https_to_the_broker(secured: Secured) -> None:
    host = secured.host(
        tls_enabled_with_broker=True,
        broker_client_trust_certs_file_path=str(secured.pki.ca.certificate),
    )
    with ProxyHttpServer(host) as proxy:
        answer = proxy.call("GET", "/admin/v2/namespaces/acme/ns", token=secured.token("alice"))
        assert answer.status == 200, answer.text
    untrusted = secured.host(tls_enabled_with_broker=True)  # the system CAs only
    with ProxyHttpServer(untrusted) as proxy:
        answer = proxy.call("GET", "/admin/v2/namespaces/acme/ns", token=secured.token("alice"))
        assert answer.status == 503, answer.text
        assert "certificate" in answer.json()["reason"].lower(), answer.text


# -- redirects between brokers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    with MagnetarCluster(tmp_path_factory.mktemp("proxy-http-cluster"), bookies=2, brokers=2) as c:
        yield c


def _info(cluster: MagnetarCluster, broker_id: str) -> BrokerInfo:
    return BrokerInfo.from_dict(cluster.registered()[broker_id]["info"])


def test_redirects_are_followed_by_the_proxy(cluster: MagnetarCluster) -> None:
    cluster.create_namespace("redir", "ns")
    topic = "persistent://redir/ns/t"
    cluster.http_lookup(topic)  # places the bundle
    owner = cluster.wait_for(lambda: cluster.owner_of_topic(topic), what="the topic's owner")
    other = next(b for b in cluster.brokers if b.broker_id != owner)
    path = "/admin/v2/persistent/redir/ns/t/unload"

    direct = call(other.http_port, "PUT", path)
    assert direct.status == 307, direct.text
    assert direct.headers["Location"].startswith(_info(cluster, owner).http_url)

    directory = Directory([_info(cluster, other.broker_id), _info(cluster, owner)])
    with ProxyHttpServer(Host(HttpSettings(), directory)) as proxy:
        answer = proxy.call("PUT", path)
        assert answer.status == 204, answer.text
        assert "Location" not in answer.headers
        text = proxy.metrics()
        assert 'magnetar_proxy_http_requests_total{code="204"} 1.0' in text
        assert 'code="307"' not in text
