"""Geo-replication to clusters that require authentication (issue 25): two clusters with token
authentication and authorization on, sharing a configuration etcd; each broker's replicators
authenticate to the other cluster with the broker's client credentials
(``broker_client_authentication_plugin`` / ``_parameters``, a token of a superuser role).
Replicators reach the remote over TLS (``brokerServiceUrlTls``, trusting
``broker_client_trust_certs_file_path``). Cluster registration is for superusers."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jwt
import pulsar
import pytest

from tests.support.certs import make_pki
from tests.support.cluster import BrokerProcess, MagnetarCluster
from tests.support.etcd import EtcdServer, free_port
from tests.support.standalone import QUIET

CLUSTERS = ("secure-a", "secure-b")
NAMESPACE = "geo-auth/rep"


class Secured:
    def __init__(self, secret: bytes, clusters: dict[str, MagnetarCluster]) -> None:
        self.secret = secret
        self.clusters = clusters

    def token(self, role: str) -> str:
        return jwt.encode({"sub": role}, self.secret, algorithm="HS256")

    def broker(self, name: str) -> BrokerProcess:
        return self.clusters[name].brokers[0]

    def admin(self, name: str, *words: str) -> str:
        broker = self.broker(name)
        done = subprocess.run(
            [sys.executable, "-m", "magnetar.cli", "admin", "--admin-url",
             f"http://127.0.0.1:{broker.http_port}", "--token", self.token("admin"), *words],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, f"magnetar admin {' '.join(words)}: {done.stderr}"
        return done.stdout

    def client(self, name: str) -> pulsar.Client:
        return pulsar.Client(
            self.broker(name).url,
            authentication=pulsar.AuthenticationToken(self.token("admin")),
            operation_timeout_seconds=30,
            logger=QUIET,
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base: Path = tmp_path_factory.mktemp("geo-auth")
    secret = secrets.token_bytes(32)
    key_file = base / "secret.key"
    key_file.write_bytes(secret)
    replicator_token = jwt.encode({"sub": "replicator"}, secret, algorithm="HS256")
    pki = make_pki(base / "pki")
    tls_ports = {name: free_port() for name in CLUSTERS}
    config = EtcdServer(name="configuration").start()
    clusters: dict[str, MagnetarCluster] = {}
    try:
        for name in CLUSTERS:
            clusters[name] = MagnetarCluster(
                base / name,
                bookies=2,
                brokers=1,
                broker_settings={
                    "cluster_name": name,
                    "configuration_metadata_url": config.url,
                    "policy_check_interval_seconds": 1,
                    "authentication_enabled": True,
                    "authorization_enabled": True,
                    "authentication_providers": "token",
                    "token_secret_key": f"file://{key_file}",
                    "superuser_roles": "admin,replicator",
                    "broker_client_authentication_plugin": "token",
                    "broker_client_authentication_parameters": f"token:{replicator_token}",
                    "broker_service_port_tls": tls_ports[name],
                    "tls_certificate_file_path": str(pki.server.certificate),
                    "tls_key_file_path": str(pki.server.key),
                    "tls_trust_certs_file_path": str(pki.ca.certificate),
                    "broker_client_trust_certs_file_path": str(pki.ca.certificate),
                },
            ).start()
        node = Secured(secret, clusters)
        for name in CLUSTERS:
            broker = node.broker(name)
            node.admin(
                CLUSTERS[0], "clusters", "create", name,
                "--url", f"http://127.0.0.1:{broker.http_port}", "--broker-url", broker.url,
                "--broker-url-secure", f"pulsar+ssl://localhost:{tls_ports[name]}",
            )  # fmt: skip
        # Tenants and namespaces live in the shared configuration store: made once.
        first, second = CLUSTERS[0], CLUSTERS[1]
        node.admin(first, "tenants", "create", "geo-auth", "--allowed-clusters", ",".join(CLUSTERS))
        node.admin(first, "namespaces", "create", NAMESPACE)
        node.admin(
            second, "namespaces", "set-clusters", NAMESPACE, "--clusters", ",".join(CLUSTERS)
        )
        yield node
    finally:
        for cluster in clusters.values():
            cluster.close()
        config.close()


def test_replicates_to_an_authenticating_cluster(secured: Secured) -> None:
    topic = f"persistent://{NAMESPACE}/t"
    a, b = secured.client("secure-a"), secured.client("secure-b")
    try:
        consumer = b.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
        producer = a.create_producer(topic)
        for i in range(50):
            producer.send_async(f"m-{i}".encode(), None)
        producer.flush()
        got: list[str] = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            got.append(message.data().decode())
            consumer.acknowledge(message)
    finally:
        a.close()
        b.close()
    assert got == [f"m-{i}" for i in range(50)]
    stats = json.loads(secured.admin("secure-a", "--json", "topics", "stats", topic))
    replication = stats["replication"]["secure-b"]
    assert replication["outboundConnection"].startswith("pulsar+ssl://localhost:"), replication


def test_cluster_writes_are_for_superusers(secured: Secured) -> None:
    broker = secured.broker("secure-a")

    def call(method: str, path: str, role: str, body: object = None) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{broker.http_port}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {secured.token(role)}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status
        except urllib.error.HTTPError as e:
            return e.code

    data = {"serviceUrl": "http://elsewhere:8080", "brokerServiceUrl": "pulsar://elsewhere:6650"}
    assert call("PUT", "/admin/v2/clusters/elsewhere", "app", data) in (401, 403)
    assert call("GET", "/admin/v2/clusters", "app") == 200
    assert call("PUT", "/admin/v2/clusters/elsewhere", "admin", data) == 204
    assert call("DELETE", "/admin/v2/clusters/elsewhere", "app") in (401, 403)
    assert call("DELETE", "/admin/v2/clusters/elsewhere", "admin") == 204
