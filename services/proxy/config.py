"""Proxy configuration (``magnetar proxy --help`` prints every setting with its default).

Names are Pulsar's ``proxy.conf`` ones in snake_case, except the two ports, which are named as
the broker's are (``port``: Pulsar's ``servicePort``; ``http_port``: its ``webServicePort``).
The security settings (TLS files, authentication providers, ``broker_client_authentication_*``)
are the broker's, shared through :class:`SecuritySettings`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from magnetar.common.auth.settings import SecuritySettings, names
from magnetar.common.config import ConfigError, setting


@dataclass(slots=True)
class ProxyConfig(SecuritySettings):
    # -- shared security settings whose meaning differs on a proxy --------------------------------
    broker_service_port_tls: int = setting(
        -1, "a broker setting, refused here: the proxy's TLS port is service_port_tls"
    )
    web_service_port_tls: int = setting(
        -1, "HTTPS port of the proxy's HTTP API (-1: off; Pulsar's is 8443)"
    )
    authorization_enabled: bool = setting(
        False,
        "not checked by the proxy: brokers authorize the proxy's role and the client's "
        "(original_principal); needs authentication_enabled when set",
    )
    broker_client_authentication_plugin: str = setting(
        "",
        "authentication the proxy uses towards brokers: token, basic, tls (or Pulsar's client "
        "class names), empty for none; its role must be in the brokers' proxy_roles",
    )
    broker_client_authentication_parameters: str = setting(
        "",
        "its parameters as Pulsar writes them: token:<jwt> or file:///path (token), "
        "user:password or JSON (basic), tlsCertFile:...,tlsKeyFile:... (tls)",
    )
    broker_client_trust_certs_file_path: str = setting(
        "", "PEM CAs the proxy trusts for brokers' certificates (with tls_enabled_with_broker)"
    )
    # -- the proxy's own --------------------------------------------------------------------------
    metadata_url: str = setting(
        "etcd://127.0.0.1:2379",
        "metadata store URL (etcd://h:p[,h:p] or local:///path/meta.db): where brokers "
        "register; the proxy knows brokers only from there",
    )
    bind_address: str = setting("0.0.0.0", "address the proxy's servers listen on")
    advertised_address: str = setting(
        "127.0.0.1", "host name or IP clients reach this proxy by (logs, HTTP answers)"
    )
    port: int = setting(6650, "Pulsar binary protocol port (Pulsar's servicePort)")
    http_port: int = setting(
        8080,
        "HTTP port: /admin/v2 and /lookup/v2 forwarded to brokers, probes, /metrics "
        "(Pulsar's webServicePort)",
    )
    service_port_tls: int = setting(
        -1,
        "Pulsar protocol port over TLS, pulsar+ssl:// (-1: off; Pulsar's servicePortTls, "
        "usually 6651); uses the tls_* certificate files",
    )
    broker_service_url: str = setting(
        "",
        "static pulsar:// URL lookups are first sent to instead of a registered broker "
        "(Pulsar's brokerServiceURL; relayed connections are still checked against the "
        "registered brokers)",
    )
    max_message_size: int = setting(
        5 * 1024 * 1024, "largest message announced to clients answered by the proxy itself"
    )
    max_concurrent_lookup_requests: int = setting(
        50_000,
        "lookups (LOOKUP, PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA) in "
        "flight at once; beyond, ServiceNotReady 'Too many concurrent lookup requests'",
    )
    max_concurrent_inbound_connections: int = setting(
        10_000, "client connections open at once; further ones are closed at once (0: no limit)"
    )
    max_concurrent_inbound_connections_per_ip: int = setting(
        0, "client connections open at once from one IP address (0: no limit)"
    )
    broker_proxy_allowed_target_ports: str = setting(
        "6650,6651",
        "comma-separated broker ports a client may ask to be relayed to (*: any); a target "
        "must also be a registered broker",
    )
    broker_proxy_allowed_host_names: str = setting(
        "*",
        "comma-separated host name patterns (* and ? wildcards) a relay target may have",
    )
    broker_proxy_allowed_ip_addresses: str = setting(
        "*",
        "comma-separated IP addresses or CIDR ranges a relay target must resolve to (*: any)",
    )
    forward_authorization_credentials: bool = setting(
        False,
        "send the client's own credentials to brokers (original_auth_data) beside its role, "
        "for brokers with authenticate_original_auth_data",
    )
    tls_enabled_with_broker: bool = setting(
        False,
        "reach brokers on their TLS ports (service_url_tls), trusting "
        "broker_client_trust_certs_file_path",
    )
    tls_hostname_verification_enabled: bool = setting(
        False, "check that a broker's TLS certificate names the host dialled"
    )
    handshake_timeout_seconds: float = setting(
        10.0,
        "a client connection that has not completed CONNECT (authentication and, for a "
        "relayed one, the broker's answer) this long after it opened is closed",
    )
    broker_proxy_connect_timeout_ms: int = setting(
        10_000, "time to open a TCP (and TLS) connection to a broker and get its CONNECTED"
    )
    broker_proxy_read_timeout_ms: int = setting(
        75_000,
        "a relayed connection on which the broker sent nothing this long is closed (brokers "
        "PING every keep-alive interval, so silence means the broker is gone); 0: never",
    )
    lookup_timeout_seconds: float = setting(
        30.0, "time a broker has to answer one lookup the proxy makes for a client"
    )
    keep_alive_interval_seconds: float = setting(
        30.0,
        "PING a client in lookup mode silent this long, close it after as long again without "
        "an answer (0: never); relayed connections carry the broker's PINGs instead",
    )

    def allowed_ports(self) -> frozenset[int] | None:
        """Ports a relay may target; None: any."""
        listed = names(self.broker_proxy_allowed_target_ports)
        if "*" in listed:
            return None
        return frozenset(int(p) for p in listed)

    def allowed_host_patterns(self) -> tuple[str, ...]:
        return tuple(names(self.broker_proxy_allowed_host_names))

    def allowed_networks(
        self,
    ) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None:
        """Networks a relay target's address must be in; None: any."""
        listed = names(self.broker_proxy_allowed_ip_addresses)
        if "*" in listed:
            return None
        return tuple(ipaddress.ip_network(item, strict=False) for item in listed)

    def validate(self) -> None:
        for name in ("port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {getattr(self, name)}")
        self.validate_etcd_tls(self.metadata_url)
        if not -1 <= self.service_port_tls <= 65535:
            raise ConfigError(
                f"service_port_tls must be -1 (off) or a TCP port, got {self.service_port_tls}"
            )
        if self.service_port_tls >= 0 and not (
            self.tls_certificate_file_path and self.tls_key_file_path
        ):
            raise ConfigError(
                "service_port_tls is set: tls_certificate_file_path and tls_key_file_path are "
                "needed"
            )
        if self.broker_service_port_tls >= 0:
            raise ConfigError(
                "broker_service_port_tls is a broker setting; the proxy's TLS port is "
                "service_port_tls"
            )
        if not self.metadata_url:
            raise ConfigError("metadata_url is needed: the proxy finds brokers there")
        if self.broker_service_url and not self.broker_service_url.startswith(
            ("pulsar://", "pulsar+ssl://")
        ):
            raise ConfigError(
                f"broker_service_url must be a pulsar:// or pulsar+ssl:// URL, got "
                f"{self.broker_service_url!r}"
            )
        for name in (
            "max_concurrent_inbound_connections",
            "max_concurrent_inbound_connections_per_ip",
            "broker_proxy_read_timeout_ms",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more")
        for name in (
            "max_concurrent_lookup_requests",
            "max_message_size",
            "handshake_timeout_seconds",
            "broker_proxy_connect_timeout_ms",
            "lookup_timeout_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.keep_alive_interval_seconds < 0:
            raise ConfigError("keep_alive_interval_seconds must be 0 or more")
        try:
            ports = self.allowed_ports()
        except ValueError:
            raise ConfigError(
                "broker_proxy_allowed_target_ports: comma-separated port numbers or *, got "
                f"{self.broker_proxy_allowed_target_ports!r}"
            ) from None
        if ports is not None and not all(0 < p <= 65535 for p in ports):
            raise ConfigError("broker_proxy_allowed_target_ports: ports must be 1-65535")
        if not self.allowed_host_patterns():
            raise ConfigError(
                "broker_proxy_allowed_host_names is empty: no broker could be reached (* for any)"
            )
        try:
            networks = self.allowed_networks()
        except ValueError as e:
            raise ConfigError(f"broker_proxy_allowed_ip_addresses: {e}") from None
        if networks is not None and not networks:
            raise ConfigError(
                "broker_proxy_allowed_ip_addresses is empty: no broker could be reached (* for any)"
            )
        if self.broker_client_trust_certs_file_path and not self.tls_enabled_with_broker:
            raise ConfigError(
                "broker_client_trust_certs_file_path is set but tls_enabled_with_broker is off"
            )
        if self.forward_authorization_credentials and not self.authentication_enabled:
            raise ConfigError(
                "forward_authorization_credentials needs authentication_enabled (the proxy "
                "forwards only credentials it checked)"
            )
        self.validate_security()
