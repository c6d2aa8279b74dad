"""Authentication against a real standalone with the official client's own plugins (issue 18).

Two standalones per module:

* ``open_node`` is configured as the official Python client's test suite configures its broker
  (``standalone-ssl.conf``): TLS ports, the tls, token and basic providers named by Pulsar's class
  names, an anonymous role, the superusers ``localhost,superUser,admin``;
* ``strict_node`` has the token provider only and no anonymous role, and requires a trusted
  client certificate on its TLS port.

Every refusal must be the error the client expects, leave the broker healthy, and never put
the credentials in the broker's log.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jwt
import pulsar
import pytest
from prometheus_client.parser import text_string_to_metric_families

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.certs import Pki, make_pki, reissue_server, tls_flags
from tests.support.etcd import free_port
from tests.support.polling import wait_until
from tests.support.raw_client import RawConnection, assert_log_clean
from tests.support.standalone import QUIET, StandaloneProcess

SUPERUSERS = "localhost,superUser,admin"
PROVIDERS = ",".join(
    f"org.apache.pulsar.broker.authentication.AuthenticationProvider{kind}"
    for kind in ("Tls", "Token", "Basic")
)


@dataclass
class Secured:
    node: StandaloneProcess
    pki: Pki
    secret: bytes
    tls_port: int
    https_port: int
    htpasswd: Path

    def token(self, role: str, expires_in: float | None = None, key: bytes | None = None) -> str:
        claims: dict[str, object] = {"sub": role}
        if expires_in is not None:
            claims["exp"] = int(time.time() + expires_in)
        return jwt.encode(claims, key or self.secret, algorithm="HS256")

    @property
    def tls_url(self) -> str:
        return f"pulsar+ssl://localhost:{self.tls_port}"

    @property
    def https(self) -> str:
        return f"https://localhost:{self.https_port}"


def _apr1(password: str) -> str:
    """An Apache MD5 hash made by openssl, not by the code under test."""
    done = subprocess.run(
        ["openssl", "passwd", "-apr1", password], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _start(base: Path, name: str, extra: list[str]) -> Secured:
    pki = make_pki(base / f"{name}-pki", client_role="admin")
    secret = secrets.token_bytes(32)
    key_file = base / f"{name}-secret.key"
    key_file.write_bytes(secret)
    htpasswd = base / f"{name}.htpasswd"
    htpasswd.write_text(f"admin:{_apr1('123456')}\n")
    tls_port, https_port = free_port(), free_port()
    node = StandaloneProcess(
        base / name,
        extra=[
            *tls_flags(pki, tls_port, https_port),
            "--tls-cert-refresh-check-duration-sec", "0",
            "--authentication-enabled",
            "--token-secret-key", f"file://{key_file}",
            "--basic-auth-conf", str(htpasswd),
            "--superuser-roles", SUPERUSERS,
            "--authentication-refresh-check-seconds", "1",
            *extra,
        ],
    )  # fmt: skip
    return Secured(node.start(), pki, secret, tls_port, https_port, htpasswd)


OPEN_SETTINGS = [
    "--authentication-providers", PROVIDERS,
    "--anonymous-user-role", "anonymous",
    "--proxy-roles", "proxy",
]  # fmt: skip


@pytest.fixture(scope="module")
def open_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    secured = _start(
        tmp_path_factory.mktemp("auth"),
        "open",
        OPEN_SETTINGS,
    )
    yield from _checked(secured)


@pytest.fixture(scope="module")
def strict_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    secured = _start(
        tmp_path_factory.mktemp("auth"),
        "strict",
        ["--authentication-providers", "token", "--tls-require-trusted-client-cert-on-connect"],
    )
    yield from _checked(secured)


def _checked(secured: Secured) -> Iterator[Secured]:
    try:
        yield secured
    finally:
        secured.node.stop()
    assert_log_clean(secured.node)
    log = secured.node.log_path.read_text(errors="replace")
    assert base64.b64encode(secured.secret).decode() not in log
    assert "123456" not in log


def _client(url: str, **kwargs: object) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=10, logger=QUIET, **kwargs)  # type: ignore[arg-type]


def _round_trip(c: pulsar.Client, topic: str, count: int = 50) -> None:
    """Produce a backlog of ``count`` messages, then drain it: exactly those, in order."""
    consumer = c.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send(f"m-{i}".encode())
    got = [consumer.receive(timeout_millis=10_000) for _ in range(count)]
    for message in got:
        consumer.acknowledge(message)
    assert sorted(m.data() for m in got) == sorted(f"m-{i}".encode() for i in range(count))
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)


def _refused(url: str, authentication: pulsar.Authentication | None, **kwargs: object) -> str:
    """Connecting with ``authentication`` fails; the exception's type name is returned.

    The official client closes a connection answered by anything but CONNECTED and tries
    again until its operation timeout (as it does against Pulsar), so a refused CONNECT is a
    ``Timeout`` to it; what the broker answered is checked with :func:`_raw_connect`."""
    kwargs.setdefault("operation_timeout_seconds", 1)
    c = pulsar.Client(url, authentication=authentication, logger=QUIET, **kwargs)  # type: ignore[arg-type]
    try:
        with pytest.raises(Exception) as refused:
            c.create_producer(f"auth-refused-{time.monotonic_ns()}")
        return type(refused.value).__name__
    finally:
        c.close()


def _raw_connect(node: StandaloneProcess, method: str, data: bytes, **proxied: str) -> codec.Frame:
    """CONNECT with ``method`` and ``data`` (and ``original_*`` fields, as a proxy sends them)
    on a raw connection: the broker's first answer."""
    with RawConnection(node) as raw:
        raw.command(
            pb.CommandConnect(
                client_version="auth-test",
                protocol_version=codec.SERVER_PROTOCOL_VERSION,
                auth_method_name=method,
                auth_data=data,
                **proxied,
            )
        )
        frame = raw.next_frame()
        if frame.type == pb.BaseCommand.ERROR:
            assert raw.closed_by_peer(), "a refused CONNECT closes the connection"
        return frame


def _assert_refused_on_the_wire(
    node: StandaloneProcess, method: str, data: bytes, **proxied: str
) -> str:
    """The broker refuses this CONNECT as Pulsar does; its message is returned."""
    frame = _raw_connect(node, method, data, **proxied)
    assert frame.type == pb.BaseCommand.ERROR, frame.name
    assert frame.body.error == pb.AuthenticationError  # type: ignore[attr-defined]
    assert frame.body.request_id == 2**64 - 1  # type: ignore[attr-defined]  # Pulsar's -1
    return frame.body.message  # type: ignore[attr-defined,no-any-return]


def _log_since(node: StandaloneProcess, offset: int) -> str:
    return node.log_path.read_text(errors="replace")[offset:]


def _log_size(node: StandaloneProcess) -> int:
    return len(node.log_path.read_text(errors="replace"))


# -- token -------------------------------------------------------------------------------------


def test_token_connects_and_round_trips(open_node: Secured) -> None:
    c = _client(
        open_node.node.url, authentication=pulsar.AuthenticationToken(open_node.token("alice"))
    )
    try:
        _round_trip(c, "token-round-trip")
    finally:
        c.close()
    assert "authenticated as 'alice' (token)" in open_node.node.log_tail(20_000)


@pytest.mark.parametrize(
    "case", ["wrong key", "expired", "truncated", "random", "one megabyte", "not a jwt"]
)
def test_bad_tokens_are_refused_and_never_logged(strict_node: Secured, case: str) -> None:
    good = strict_node.token("bob")
    token = {
        "wrong key": strict_node.token("bob", key=secrets.token_bytes(32)),
        "expired": strict_node.token("bob", expires_in=-10),
        "truncated": good[: len(good) // 2],
        "random": base64.urlsafe_b64encode(secrets.token_bytes(200)).decode(),
        "one megabyte": "a" * (1024 * 1024),
        "not a jwt": "header.payload",
    }[case]
    offset = _log_size(strict_node.node)
    _assert_refused_on_the_wire(strict_node.node, "token", token.encode())
    assert _refused(strict_node.node.url, pulsar.AuthenticationToken(token)) == "Timeout"
    log = _log_since(strict_node.node, offset)  # refusals are logged a few per 10 s at most
    if len(token) > 8:
        assert token[:40] not in log
    # The broker is healthy: the right token still works.
    c = _client(strict_node.node.url, authentication=pulsar.AuthenticationToken(good))
    try:
        _round_trip(c, f"after-{case.replace(' ', '-')}", count=5)
    finally:
        c.close()


def test_no_credentials_without_an_anonymous_role_are_refused(strict_node: Secured) -> None:
    _assert_refused_on_the_wire(strict_node.node, "", b"")
    _assert_refused_on_the_wire(strict_node.node, "basic", b"admin:123456")  # not configured
    assert _refused(strict_node.node.url, None) == "Timeout"


def test_refusals_are_logged_a_few_at_a_time(strict_node: Secured) -> None:
    """30 refusals in a row: at most 5 log lines per 10 s (the interval's arithmetic is
    tests/unit/test_token_auth.py's)."""
    offset = _log_size(strict_node.node)
    for _ in range(30):
        _assert_refused_on_the_wire(strict_node.node, "token", b"not-a-token")
    log = _log_since(strict_node.node, offset)
    assert log.count("CONNECT from 127.0.0.1:") <= 5, log  # earlier tests may have used them


def test_no_credentials_with_an_anonymous_role_connect(open_node: Secured) -> None:
    c = _client(open_node.node.url)
    try:
        _round_trip(c, "anonymous-round-trip", count=5)
    finally:
        c.close()


def test_a_token_supplier_refreshes_an_expiring_token_and_nothing_is_lost(
    open_node: Secured,
) -> None:
    made: list[str] = []

    def supplier() -> str:
        made.append(open_node.token("carol", expires_in=3))
        return made[-1]

    offset = _log_size(open_node.node)
    c = _client(open_node.node.url, authentication=pulsar.AuthenticationToken(supplier))
    try:
        consumer = c.subscribe("refresh-topic", "sub")
        producer = c.create_producer("refresh-topic", batching_enabled=False)
        sent = 0
        deadline = time.monotonic() + 9  # three lifetimes of a token
        while time.monotonic() < deadline:
            producer.send(f"r-{sent}".encode())
            sent += 1
            time.sleep(0.1)
        got = []
        for _ in range(sent):
            message = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(message)
            got.append(message.data())
        assert got == [f"r-{i}".encode() for i in range(sent)]
    finally:
        c.close()
    log = _log_since(open_node.node, offset)
    assert "credentials of 'carol' refreshed" in log
    assert "challenge unanswered" not in log


def test_a_fixed_token_that_expires_closes_the_connection(open_node: Secured) -> None:
    token = open_node.token("dave", expires_in=2)
    offset = _log_size(open_node.node)
    c = _client(open_node.node.url, authentication=pulsar.AuthenticationToken(token))
    try:
        producer = c.create_producer(
            "expiring-topic", batching_enabled=False, send_timeout_millis=3000
        )
        producer.send(b"before expiry")
        wait_until(
            lambda: (
                "refreshed credentials" in _log_since(open_node.node, offset)
                or "cannot refresh" in _log_since(open_node.node, offset)
            ),
            "the broker acts on the expired token",
            timeout=15,
        )
        with pytest.raises(Exception):  # noqa: B017 - the client's reconnect is refused too
            producer.send(b"after expiry")
    finally:
        c.close()
    assert "token expired" in _log_since(open_node.node, offset)


# -- proxies ---------------------------------------------------------------------------------


def test_a_proxy_role_names_the_client_it_relays(open_node: Secured) -> None:
    proxy = open_node.token("proxy").encode()
    alice = open_node.token("alice")
    offset = _log_size(open_node.node)
    frame = _raw_connect(open_node.node, "token", proxy, original_principal="alice")
    assert frame.type == pb.BaseCommand.CONNECTED, frame.name
    # The client's own credentials, forwarded: they are checked and name the client.
    frame = _raw_connect(
        open_node.node,
        "token",
        proxy,
        original_principal="alice",
        original_auth_method="token",
        original_auth_data=alice,
    )
    assert frame.type == pb.BaseCommand.CONNECTED, frame.name
    assert "authenticated as 'proxy' for 'alice' (token)" in _log_since(open_node.node, offset)
    invalid = "Invalid roles."
    refusals = [
        # A proxy must name its client, and the client may not be a proxy.
        _assert_refused_on_the_wire(open_node.node, "token", proxy),
        _assert_refused_on_the_wire(open_node.node, "token", proxy, original_principal="proxy"),
        # Forwarded credentials of another role than the one named.
        _assert_refused_on_the_wire(
            open_node.node,
            "token",
            proxy,
            original_principal="mallory",
            original_auth_method="token",
            original_auth_data=alice,
        ),
        # A client that is no proxy may not speak for another.
        _assert_refused_on_the_wire(
            open_node.node, "token", alice.encode(), original_principal="bob"
        ),
    ]
    assert refusals == [invalid] * 4
    forged = open_node.token("alice", key=secrets.token_bytes(32))
    assert "token not valid" in _assert_refused_on_the_wire(
        open_node.node,
        "token",
        proxy,
        original_principal="alice",
        original_auth_method="token",
        original_auth_data=forged,
    )


def test_a_proxy_names_the_client_over_http(open_node: Secured) -> None:
    http = f"http://127.0.0.1:{open_node.node.http_port}/admin/v2/tenants"
    proxy = f"Bearer {open_node.token('proxy')}"
    alice = f"Bearer {open_node.token('alice')}"
    assert _get(http, {"Authorization": proxy, "X-Original-Principal": "alice"}) == 200
    assert _get(http, {"Authorization": alice, "X-Original-Principal": "bob"}) == 401
    assert _get(http, {"Authorization": proxy, "X-Original-Principal": "proxy"}) == 401


# -- basic ---------------------------------------------------------------------------------------


def test_basic_connects_in_both_parameter_forms(open_node: Secured) -> None:
    for authentication in (
        pulsar.AuthenticationBasic("admin", "123456"),
        pulsar.AuthenticationBasic(auth_params_string='{"username": "admin","password": "123456"}'),
    ):
        c = _client(open_node.node.url, authentication=authentication)
        try:
            _round_trip(c, f"basic-{time.monotonic_ns()}", count=5)
        finally:
            c.close()


def test_basic_wrong_password_and_unknown_user_are_refused(open_node: Secured) -> None:
    for user, password in (("admin", "wrong"), ("invalid", "123456")):
        _assert_refused_on_the_wire(open_node.node, "basic", f"{user}:{password}".encode())
        refused = _refused(open_node.node.url, pulsar.AuthenticationBasic(user, password))
        assert refused == "Timeout"


def test_an_unknown_method_gets_the_anonymous_role(open_node: Secured) -> None:
    """Pulsar gives a method no provider serves the anonymous role (the official client's
    test_basic_auth_method relies on it: with authorization on, the next step is refused)."""
    offset = _log_size(open_node.node)
    c = _client(
        open_node.node.url,
        authentication=pulsar.AuthenticationBasic("admin", "123456", "unknown"),
    )
    try:
        c.create_producer("unknown-method-topic").close()
    finally:
        c.close()
    assert "authenticated as 'anonymous' (unknown)" in _log_since(open_node.node, offset)


# -- TLS -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["class", "plugin name", "class name"])
def test_tls_client_certificate_is_the_role(open_node: Secured, form: str) -> None:
    pki = open_node.pki
    params = f"tlsCertFile:{pki.client.certificate},tlsKeyFile:{pki.client.key}"
    authentication = {
        "class": pulsar.AuthenticationTLS(str(pki.client.certificate), str(pki.client.key)),
        "plugin name": pulsar.Authentication("tls", params),
        "class name": pulsar.Authentication(
            "org.apache.pulsar.client.impl.auth.AuthenticationTls", params
        ),
    }[form]
    offset = _log_size(open_node.node)
    c = _client(
        open_node.tls_url,
        authentication=authentication,
        tls_trust_certs_file_path=str(pki.ca.certificate),
        tls_allow_insecure_connection=False,
        tls_validate_hostname=True,
    )
    try:
        _round_trip(c, f"tls-{form.replace(' ', '-')}", count=10)
    finally:
        c.close()
    assert "authenticated as 'admin' (tls)" in _log_since(open_node.node, offset)


def test_tls_server_not_trusted_by_the_client_is_refused(open_node: Secured) -> None:
    refused = _refused(
        open_node.tls_url,
        pulsar.AuthenticationToken(open_node.token("erin")),
        tls_trust_certs_file_path=str(open_node.pki.untrusted_ca.certificate),
        tls_allow_insecure_connection=False,
    )
    assert refused in ("ConnectError", "Timeout")


def test_mutual_tls_required(strict_node: Secured) -> None:
    pki = strict_node.pki
    token = pulsar.AuthenticationToken(strict_node.token("frank"))
    common = {
        "tls_trust_certs_file_path": str(pki.ca.certificate),
        "tls_allow_insecure_connection": False,
    }
    # No client certificate, or one the broker does not trust, or an expired one: refused at
    # the handshake.
    assert _refused(strict_node.tls_url, token, **common) in ("ConnectError", "Timeout")
    for certificate in (pki.untrusted_client, pki.expired_client):
        assert _refused(
            strict_node.tls_url,
            token,
            tls_certificate_file_path=str(certificate.certificate),
            tls_private_key_file_path=str(certificate.key),
            **common,
        ) in ("ConnectError", "Timeout")
    c = _client(
        strict_node.tls_url,
        authentication=token,
        tls_certificate_file_path=str(pki.client.certificate),
        tls_private_key_file_path=str(pki.client.key),
        **common,
    )
    try:
        _round_trip(c, "mutual-tls", count=5)
    finally:
        c.close()


def _served_serial(port: int, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


def test_a_certificate_swapped_on_disk_is_served_to_new_connections(open_node: Secured) -> None:
    pki = open_node.pki
    before = _served_serial(open_node.tls_port, pki.ca.certificate)
    assert before == pki.server.serial()
    new_serial = reissue_server(pki)
    assert new_serial != before
    wait_until(
        lambda: _served_serial(open_node.tls_port, pki.ca.certificate) == new_serial,
        "new connections get the new certificate",
        timeout=10,
    )
    assert _served_serial(open_node.https_port, pki.ca.certificate) == new_serial
    c = _client(
        open_node.tls_url,
        authentication=pulsar.AuthenticationToken(open_node.token("gina")),
        tls_trust_certs_file_path=str(pki.ca.certificate),
    )
    try:
        _round_trip(c, "after-swap", count=5)
    finally:
        c.close()


# -- HTTP ------------------------------------------------------------------------------------------


def _get(url: str, headers: dict[str, str] | None = None, ca: Path | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_http_credentials(strict_node: Secured, open_node: Secured) -> None:
    tenants = "/admin/v2/tenants"
    http = f"http://127.0.0.1:{strict_node.node.http_port}"
    assert _get(http + tenants) == 401
    assert _get(http + tenants, {"Authorization": "Bearer garbage"}) == 401
    bearer = {"Authorization": f"Bearer {strict_node.token('admin')}"}
    assert _get(http + tenants, bearer) == 200
    assert _get(http + "/metrics") == 200  # scrapers carry no credentials
    assert _get(http + "/admin/v2/brokers/ready") == 200  # nor do Kubernetes probes
    basic = "Basic " + base64.b64encode(b"admin:123456").decode()
    open_http = f"http://127.0.0.1:{open_node.node.http_port}"
    assert _get(open_http + tenants, {"Authorization": basic}) == 200
    wrong = "Basic " + base64.b64encode(b"admin:654321").decode()
    assert _get(open_http + tenants, {"Authorization": wrong}) == 401
    assert _get(open_http + tenants) == 200  # anonymous role
    # HTTPS with the server verified by the client.
    assert _get(open_node.https + tenants, ca=open_node.pki.ca.certificate) == 200


def test_magnetar_admin_credentials_and_tls_flags(strict_node: Secured, open_node: Secured) -> None:
    """``magnetar admin``'s --token, --basic, --tls-trust-cert-path, --tls-cert-file /
    --tls-key-file and --tls-allow-insecure, over HTTP and HTTPS; a refusal is one line with
    the HTTP status and exit 1."""

    def admin(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "magnetar.cli", "admin", "--admin-url", url, *flags,
             "tenants", "list"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    strict = f"http://127.0.0.1:{strict_node.node.http_port}"
    refused = admin(strict)
    assert refused.returncode == 1 and refused.stderr.startswith("magnetar admin: HTTP 401")
    assert len(refused.stderr.strip().splitlines()) == 1
    assert admin(strict, "--token", strict_node.token("admin")).returncode == 0
    assert admin(strict, "--token", strict_node.token("admin", key=b"k" * 32)).returncode == 1
    open_http = f"http://127.0.0.1:{open_node.node.http_port}"
    assert admin(open_http, "--basic", "admin:123456").returncode == 0
    assert admin(open_http, "--basic", "admin:654321").returncode == 1
    ca = str(open_node.pki.ca.certificate)
    client = open_node.pki.client
    assert admin(open_node.https, "--tls-trust-cert-path", ca).returncode == 0
    assert admin(
        open_node.https, "--tls-trust-cert-path", ca,
        "--tls-cert-file", str(client.certificate), "--tls-key-file", str(client.key),
    ).returncode == 0  # fmt: skip
    unverified = admin(open_node.https)  # the test CA is not in the system's trust store
    assert unverified.returncode == 1 and "certificate" in unverified.stderr.lower()
    assert admin(open_node.https, "--tls-allow-insecure").returncode == 0


def test_http_lookup_names_the_tls_url(open_node: Secured) -> None:
    url = (
        f"http://127.0.0.1:{open_node.node.http_port}/lookup/v2/topic/persistent/public/default/"
        "lookup-tls"
    )
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["brokerUrlTls"] == f"pulsar+ssl://localhost:{open_node.tls_port}"
    assert answer["httpUrlTls"] == f"https://localhost:{open_node.https_port}"


def test_the_official_clients_token_test_over_http_lookup(open_node: Secured) -> None:
    """As the official client's test_token_auth: the service URL is the HTTP one."""
    c = _client(
        f"http://localhost:{open_node.node.http_port}",
        authentication=pulsar.AuthenticationToken(open_node.token("token-principal")),
    )
    try:
        _round_trip(c, "http-lookup-token", count=5)
    finally:
        c.close()


assert os.sep == "/"  # the file:// URLs above are POSIX paths


def test_authentication_counts_are_in_the_metrics(strict_node: Secured) -> None:
    _assert_refused_on_the_wire(strict_node.node, "token", b"not-a-token")
    c = _client(
        strict_node.node.url, authentication=pulsar.AuthenticationToken(strict_node.token("ivy"))
    )
    try:
        c.create_producer("counted").close()
    finally:
        c.close()
    url = f"http://127.0.0.1:{strict_node.node.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    counts = {
        (s.name, s.labels.get("auth_method")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("pulsar_authentication_")
    }
    assert counts[("pulsar_authentication_success_total", "token")] >= 1
    assert counts[("pulsar_authentication_failures_total", "token")] >= 1
    assert "not-a-token" not in text
