"""The official Python client's TLS and basic-auth tests (apache/pulsar-client-python
``tests/pulsar_test.py``), reproduced against one standalone configured as their
``tests/test-conf/standalone-ssl.conf`` configures Pulsar.

Their broker: a Pulsar protocol port and a TLS one, an HTTP port and an HTTPS one, advertised as
``localhost``; a broker certificate for ``localhost`` and a client certificate ``CN=admin``, both
signed by one CA; the tls, token and basic providers named by Pulsar's class names; an anonymous
role ``anonymous``; authorization on, superusers ``localhost,superUser,admin``; an htpasswd with
``admin`` / ``123456``; auto-created topics non-partitioned; messages up to 1024000 bytes.

Their setup (``build-support/start-test-service-inside-container.sh``), done here as a superuser
over the admin REST API: the secret key and the ``token-principal`` token made by the ``tokens``
command (``.test-token.txt``), ``public`` with the admin role ``anonymous`` and ``produce,consume``
granted to it on ``public/default``, ``private`` without admins, ``private/auth`` with
``produce,consume`` granted to ``token-principal``.

The tests keep their names and assert what theirs assert, with every client closed (theirs leave
a few open) and operation timeouts of 10 s (theirs use the client's 30 s default).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pulsar
import pytest

from tests.support.certs import Pki, make_pki, tls_flags
from tests.support.etcd import free_port
from tests.support.raw_client import assert_log_clean
from tests.support.standalone import QUIET, StandaloneProcess

TM = 10_000  # theirs: "Do not wait forever in tests"
PROVIDERS = ",".join(
    f"org.apache.pulsar.broker.authentication.AuthenticationProvider{kind}"
    for kind in ("Tls", "Token", "Basic")
)
SUPERUSER_BASIC = "Basic " + base64.b64encode(b"admin:123456").decode()
TLS_PLUGIN_CLASS = "org.apache.pulsar.client.impl.auth.AuthenticationTls"


@dataclass
class SslStandalone:
    """The standalone of ``standalone-ssl.conf`` and the files their tests read."""

    node: StandaloneProcess
    pki: Pki
    tls_port: int
    https_port: int
    token_file: Path  # their .test-token.txt

    @property
    def service_url(self) -> str:  # their serviceUrl
        return f"pulsar://localhost:{self.node.port}"

    @property
    def admin_url(self) -> str:  # their adminUrl, also a service URL (HTTP lookup)
        return f"http://localhost:{self.node.http_port}"

    @property
    def service_url_tls(self) -> str:  # their serviceUrlTls
        return f"pulsar+ssl://localhost:{self.tls_port}"

    def token(self) -> str:
        return self.token_file.read_text().strip()

    def log(self) -> str:
        return self.node.log_path.read_text(errors="replace")


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{args[:4]} failed: {done.stderr}"
    return done.stdout


def _tokens(*args: str) -> str:
    return _run(sys.executable, "-m", "magnetar", "tokens", *args)


def _http(
    url: str, method: str, body: object = None, authorization: str | None = None
) -> tuple[int, str]:
    """One REST call; (status, body text), error statuses included. ``body`` is sent as JSON."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _setup(suite: SslStandalone) -> None:
    """Their permissions script, as the superuser ``admin`` (Basic, from the htpasswd)."""
    admin = f"{suite.admin_url}/admin/v2"

    def call(method: str, path: str, body: object = None) -> str:
        status, text = _http(admin + path, method, body, SUPERUSER_BASIC)
        assert 200 <= status < 300, f"{method} {path}: {status} {text}"
        return text

    clusters = json.loads(call("GET", "/clusters"))
    assert clusters, "the standalone names its cluster"
    call("POST", "/tenants/public", {"adminRoles": ["anonymous"], "allowedClusters": clusters})
    call("POST", "/namespaces/public/default/permissions/anonymous", ["produce", "consume"])
    call("PUT", "/tenants/private", {"adminRoles": [], "allowedClusters": clusters})
    call("PUT", "/namespaces/private/auth", {"replication_clusters": clusters})
    call("POST", "/namespaces/private/auth/permissions/token-principal", ["produce", "consume"])


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SslStandalone]:
    base = tmp_path_factory.mktemp("official-auth")
    pki = make_pki(base / "test-conf", client_role="admin")
    secret_key = base / "data" / "tokens" / "secret.key"
    secret_key.parent.mkdir(parents=True)
    _tokens("create-secret-key", "--output", str(secret_key))
    token_file = base / ".test-token.txt"
    token_file.write_text(
        _tokens("create", "--subject", "token-principal", "--secret-key", f"file://{secret_key}")
    )
    htpasswd = base / "test-conf" / ".htpasswd"
    htpasswd.write_text(f"admin:{_run('openssl', 'passwd', '-apr1', '123456').strip()}\n")
    tls_port, https_port = free_port(), free_port()
    node = StandaloneProcess(
        base / "standalone",
        extra=[
            *tls_flags(pki, tls_port, https_port),
            "--anonymous-user-role", "anonymous",
            "--authentication-enabled",
            "--authentication-providers", PROVIDERS,
            "--authorization-enabled",
            "--token-secret-key", f"file://{secret_key}",
            "--superuser-roles", "localhost,superUser,admin",
            "--basic-auth-conf", str(htpasswd),
            "--allow-auto-topic-creation",
            "--allow-auto-topic-creation-type", "non-partitioned",
            "--default-num-partitions", "1",
            "--max-message-size", "1024000",
        ],
    )  # fmt: skip
    ssl_standalone = SslStandalone(node, pki, tls_port, https_port, token_file)
    try:
        node.start()
        _setup(ssl_standalone)
        yield ssl_standalone
    finally:
        node.stop()
        print(node.log_tail())
    assert_log_clean(node)
    log = ssl_standalone.log()
    assert ssl_standalone.token() not in log
    assert "123456" not in log
    assert base64.b64encode(secret_key.read_bytes()).decode() not in log


def _client(url: str, **kwargs: object) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=10, logger=QUIET, **kwargs)  # type: ignore[arg-type]


def _tls_client(suite: SslStandalone, authentication: pulsar.Authentication) -> pulsar.Client:
    return _client(
        suite.service_url_tls,
        tls_trust_certs_file_path=str(suite.pki.ca.certificate),
        tls_allow_insecure_connection=False,
        authentication=authentication,
    )


def _hello(client: pulsar.Client, topic: str, *, expect_nothing_more: bool) -> None:
    """Their body: Shared ``my-sub``, send b"hello", receive it (and nothing after it)."""
    consumer = client.subscribe(topic, "my-sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    producer.send(b"hello")
    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"hello"
    if expect_nothing_more:
        with pytest.raises(pulsar.Timeout):
            consumer.receive(100)


def _log_from(suite: SslStandalone) -> Callable[[], str]:
    """The log written from now on."""
    offset = len(suite.log())
    return lambda: suite.log()[offset:]


def _tls_params(suite: SslStandalone) -> str:
    pki = suite.pki
    return f"tlsCertFile:{pki.client.certificate},tlsKeyFile:{pki.client.key}"


# -- TLS -------------------------------------------------------------------------------------------


def test_tls_auth(suite: SslStandalone) -> None:
    pki = suite.pki
    since = _log_from(suite)
    client = _tls_client(
        suite, pulsar.AuthenticationTLS(str(pki.client.certificate), str(pki.client.key))
    )
    try:
        _hello(client, f"my-python-topic-tls-auth-{time.time()}", expect_nothing_more=True)
    finally:
        client.close()
    assert "authenticated as 'admin' (tls)" in since()


def test_tls_auth2(suite: SslStandalone) -> None:
    since = _log_from(suite)
    client = _tls_client(suite, pulsar.Authentication(TLS_PLUGIN_CLASS, _tls_params(suite)))
    try:
        _hello(client, f"my-python-topic-tls-auth-2-{time.time()}", expect_nothing_more=True)
    finally:
        client.close()
    assert "authenticated as 'admin' (tls)" in since()


def test_tls_auth3(suite: SslStandalone) -> None:
    since = _log_from(suite)
    client = _tls_client(suite, pulsar.Authentication("tls", _tls_params(suite)))
    try:
        _hello(client, f"my-python-topic-tls-auth-3-{time.time()}", expect_nothing_more=True)
    finally:
        client.close()
    assert "authenticated as 'admin' (tls)" in since()


def test_auth_junk_params(suite: SslStandalone) -> None:
    """Theirs asserts ConnectError. The refusal is the client's own: a plugin it cannot load
    leaves it without an Authentication, and it gives up before any byte reaches the broker.
    Which error it raises then depends on the client's version: ConnectError in the versions
    theirs was written for, AuthenticationError in pulsar-client 3.x (the C++ core's
    ClientConnection throws ResultAuthenticationError for a missing Authentication), so both
    are accepted, and the broker must not have seen a CONNECT."""
    since = _log_from(suite)
    client = _tls_client(suite, pulsar.Authentication("someoldjunk.so", "blah"))
    try:
        with pytest.raises((pulsar.ConnectError, pulsar.AuthenticationError)):
            client.subscribe(
                "my-python-topic-auth-junk-params",
                "my-sub",
                consumer_type=pulsar.ConsumerType.Shared,
            )
    finally:
        client.close()
    assert "authenticated as" not in since()


# -- token -----------------------------------------------------------------------------------------


def test_token_auth(suite: SslStandalone) -> None:
    # Theirs: "Use adminUrl to test both HTTP request and binary protocol".
    since = _log_from(suite)
    client = _client(suite.admin_url, authentication=pulsar.AuthenticationToken(suite.token()))
    try:
        _hello(
            client,
            "persistent://private/auth/my-python-topic-token-auth",
            expect_nothing_more=False,
        )
    finally:
        client.close()
    assert "authenticated as 'token-principal' (token)" in since()


def test_token_auth_supplier(suite: SslStandalone) -> None:
    def read_token() -> str:
        return suite.token_file.read_text().strip()

    client = _client(suite.service_url, authentication=pulsar.AuthenticationToken(read_token))
    try:
        _hello(
            client,
            "persistent://private/auth/my-python-topic-token-auth",
            expect_nothing_more=False,
        )
    finally:
        client.close()


# -- basic -----------------------------------------------------------------------------------------


def _test_basic_auth(suite: SslStandalone, id: int, auth: pulsar.AuthenticationBasic) -> None:
    client = _client(suite.admin_url, authentication=auth)
    try:
        _hello(
            client,
            f"persistent://private/auth/my-python-topic-basic-auth-{id}",
            expect_nothing_more=False,
        )
    finally:
        client.close()


def test_basic_auth(suite: SslStandalone) -> None:
    username, password = "admin", "123456"
    _test_basic_auth(suite, 0, pulsar.AuthenticationBasic(username, password))
    _test_basic_auth(
        suite,
        1,
        pulsar.AuthenticationBasic(
            auth_params_string=f'{{"username": "{username}","password": "{password}"}}'
        ),
    )


def test_basic_auth_method(suite: SslStandalone) -> None:
    username, password = "admin", "123456"
    _test_basic_auth(suite, 2, pulsar.AuthenticationBasic(username, password, "basic"))
    since = _log_from(suite)
    with pytest.raises(pulsar.AuthorizationError):
        _test_basic_auth(suite, 3, pulsar.AuthenticationBasic(username, password, "unknown"))
    # Why it is refused: Pulsar gives a method no provider serves the anonymous role, and
    # anonymous has no grant on private/auth.
    assert "authenticated as 'anonymous' (unknown)" in since()
    _test_basic_auth(
        suite,
        4,
        pulsar.AuthenticationBasic(
            auth_params_string=(
                f'{{"username": "{username}","password": "{password}", "method": "basic"}}'
            )
        ),
    )
    with pytest.raises(pulsar.AuthorizationError):
        _test_basic_auth(
            suite,
            5,
            pulsar.AuthenticationBasic(
                auth_params_string=(
                    f'{{"username": "{username}","password": "{password}", "method": "unknown"}}'
                )
            ),
        )


def test_invalid_basic_auth(suite: SslStandalone) -> None:
    username, password = "invalid", "123456"
    topic = "persistent://private/auth/my-python-topic-invalid-basic-auth"
    for auth in (
        pulsar.AuthenticationBasic(username, password),
        pulsar.AuthenticationBasic(
            auth_params_string=f'{{"username": "{username}","password": "{password}"}}'
        ),
    ):
        client = _client(suite.admin_url, authentication=auth)
        try:
            with pytest.raises(pulsar.ConnectError):
                client.subscribe(topic, "my-sub", consumer_type=pulsar.ConsumerType.Shared)
        finally:
            client.close()
    with pytest.raises(RuntimeError):
        pulsar.AuthenticationBasic(auth_params_string="invalid auth params")


def test_invalid_basic_auth_is_a_401_on_the_lookup(suite: SslStandalone) -> None:
    """What their ConnectError rests on: the HTTP lookup of an unknown user answers 401."""
    url = f"{suite.admin_url}/lookup/v2/topic/persistent/private/auth/my-python-topic-lookup"
    invalid = "Basic " + base64.b64encode(b"invalid:123456").decode()
    assert _http(url, "GET", authorization=invalid)[0] == 401
    status, text = _http(url, "GET", authorization=SUPERUSER_BASIC)
    assert status == 200, text
    assert json.loads(text)["brokerUrlTls"] == suite.service_url_tls


# -- what the rest of their suite relies on: anonymous is public's admin ---------------------------


def test_anonymous_admin_on_public_default(suite: SslStandalone) -> None:
    """Their other tests call the admin API without credentials (deduplication on and off,
    partitioned topics made with PUT) and use public/default anonymously."""
    admin = f"{suite.admin_url}/admin/v2"
    for value in (True, False):
        status, text = _http(admin + "/namespaces/public/default/deduplication", "POST", value)
        assert status == 204, text
    topic = "test_get_topics_partitions"
    status, text = _http(admin + f"/persistent/public/default/{topic}/partitions", "PUT", 3)
    assert status in (204, 409), text  # theirs ignores 409, for idempotency
    client = _client(suite.service_url)
    try:
        assert client.get_topic_partitions(f"persistent://public/default/{topic}") == [
            f"persistent://public/default/{topic}-partition-{i}" for i in range(3)
        ]
    finally:
        client.close()
    # Anonymous administers public only: private has no admins.
    status, _ = _http(admin + "/namespaces/private/auth/deduplication", "POST", True)
    assert status in (401, 403)


def test_anonymous_has_no_grant_on_private_auth(suite: SslStandalone) -> None:
    """The other side of their setup: only token-principal (and the superusers) may use
    private/auth, so the anonymous role is refused there."""
    client = _client(suite.service_url)
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(
                "persistent://private/auth/my-python-topic-anonymous",
                "my-sub",
                consumer_type=pulsar.ConsumerType.Shared,
            )
    finally:
        client.close()


@pytest.mark.parametrize("lookup", ["binary", "http"])
def test_v2_topics(suite: SslStandalone, lookup: str) -> None:
    """Their test_v2_topics and test_v2_topics_http: anonymous on public/default."""
    url = suite.service_url if lookup == "binary" else suite.admin_url
    client = _client(url)
    try:
        topic = f"my-v2-topic-producer-consumer-{lookup}"
        consumer = client.subscribe(topic, "my-sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        msg = consumer.receive(TM)
        assert msg.data() == b"hello"
        consumer.acknowledge(msg)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(100)
    finally:
        client.close()
