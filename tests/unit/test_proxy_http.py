"""The proxy HTTP half's pure parts: which redirects it follows (only to registered brokers,
path and query kept as encoded), how broker origins compare, and the proxy's TLS client
certificate read from Pulsar's parameters. The forwarding itself is tested against real brokers
in tests/integration/test_proxy_http.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from magnetar.common.auth.client import ClientCredentials
from magnetar.common.auth.service import AuthenticationService
from magnetar.common.auth.settings import SecuritySettings
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.proxy.http import Forwarder, ForwardError, client_certificate, origin
from magnetar.proxy.metrics import ProxyMetrics

B1 = BrokerInfo("b1:8080", "pulsar://b1:6650", "http://b1:8080", https_url="https://b1:8443")
B2 = BrokerInfo("b2:8080", "pulsar://b2:6650", "http://b2:8080")


@dataclass
class Settings:
    authentication_enabled: bool = False
    forward_authorization_credentials: bool = False
    tls_enabled_with_broker: bool = False
    tls_hostname_verification_enabled: bool = False
    broker_client_trust_certs_file_path: str = ""
    broker_proxy_read_timeout_ms: int = 1000


@dataclass
class Directory:
    known: list[BrokerInfo]

    def brokers(self) -> list[BrokerInfo]:
        return list(self.known)

    def pick(self) -> BrokerInfo:
        return self.known[0]


@dataclass
class Host:
    config: Settings = field(default_factory=Settings)
    directory: Directory = field(default_factory=lambda: Directory([B1, B2]))
    authentication: AuthenticationService = field(
        default_factory=lambda: AuthenticationService(SecuritySettings())
    )
    client_credentials: ClientCredentials = field(default_factory=lambda: ClientCredentials("", ""))
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)

    def ready(self) -> bool:
        return True


def test_origins_compare_with_explicit_ports() -> None:
    assert origin("http://B1/admin") == origin("http://b1:80/x") == "http://b1:80"
    assert origin("https://b1/admin") == "https://b1:443"
    assert origin("") == ""


def test_redirects_to_registered_brokers_keep_path_and_query() -> None:
    forwarder = Forwarder(Host())
    location = "http://b2:8080/admin/v2/persistent/t/n/a%2Fb/stats?authoritative=true"
    assert forwarder.registered_target(location, "http://b1:8080/x") == (
        B2,
        "/admin/v2/persistent/t/n/a%2Fb/stats?authoritative=true",
    )
    # A broker's HTTPS address names it as well.
    assert forwarder.registered_target("https://b1:8443/lookup/v2/x", "http://b2:8080/")[0] == B1
    # A relative Location stays on the broker that answered.
    assert forwarder.registered_target("/admin/v2/y?q=1", "http://b2:8080/admin/v2/x") == (
        B2,
        "/admin/v2/y?q=1",
    )


@pytest.mark.parametrize(
    "location",
    ["http://169.254.169.254/latest/meta-data", "http://b2:8081/admin", "https://b2:8080/admin"],
)
def test_redirects_elsewhere_are_refused(location: str) -> None:
    with pytest.raises(ForwardError) as refused:
        Forwarder(Host()).registered_target(location, "http://b1:8080/admin")
    assert refused.value.status == 502
    assert "not a registered broker" in refused.value.reason


def test_client_certificate_from_pulsar_parameters() -> None:
    plain = ClientCredentials("tls", "tlsCertFile:/c/proxy.pem,tlsKeyFile:/c/proxy.key")
    assert client_certificate(plain) == ("/c/proxy.pem", "/c/proxy.key")
    as_json = ClientCredentials("tls", '{"tlsCertFile": "/c/p.pem", "tlsKeyFile": "/c/p.key"}')
    assert client_certificate(as_json) == ("/c/p.pem", "/c/p.key")
    assert client_certificate(ClientCredentials("token", "token:abc")) == ("", "")
