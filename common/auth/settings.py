"""Security settings under Pulsar's ``broker.conf`` names (snake_case), shared by the broker, the
standalone and the proxy: TLS to etcd, TLS ports and files, authentication providers and their
keys, authorization, proxy roles, and how a broker authenticates to other brokers."""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.common.config import ConfigError, setting
from magnetar.common.metadata.etcd_settings import EtcdTlsSettings

#: Provider names accepted in ``authentication_providers``, with Pulsar's class names for them.
PROVIDER_NAMES = {
    "token": "token",
    "org.apache.pulsar.broker.authentication.AuthenticationProviderToken": "token",
    "tls": "tls",
    "org.apache.pulsar.broker.authentication.AuthenticationProviderTls": "tls",
    "basic": "basic",
    "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic": "basic",
}


def names(value: str) -> list[str]:
    """A comma-separated list setting (Pulsar's way), without blanks."""
    return [part.strip() for part in value.split(",") if part.strip()]


@dataclass(slots=True)
class SecuritySettings(EtcdTlsSettings):
    # -- TLS -------------------------------------------------------------------------------------
    broker_service_port_tls: int = setting(
        -1, "Pulsar protocol port over TLS, pulsar+ssl:// (-1: off; Pulsar's is 6651)"
    )
    web_service_port_tls: int = setting(
        -1, "HTTPS port of the admin API (-1: off; Pulsar's is 8443)"
    )
    tls_certificate_file_path: str = setting("", "PEM file of the server's certificate (chain)")
    tls_key_file_path: str = setting("", "PEM file of the server certificate's private key")
    tls_trust_certs_file_path: str = setting(
        "", "PEM file of the CAs trusted for client certificates (mutual TLS, the tls provider)"
    )
    tls_require_trusted_client_cert_on_connect: bool = setting(
        False, "refuse TLS clients that do not show a certificate signed by a trusted CA"
    )
    tls_cert_refresh_check_duration_sec: float = setting(
        60.0,
        "how often the certificate, key and CA files are checked for changes; new connections "
        "use the new files (0: at every new connection)",
    )
    # -- authentication --------------------------------------------------------------------------
    authentication_enabled: bool = setting(
        False, "require clients to authenticate (binary protocol and HTTP)"
    )
    authentication_providers: str = setting(
        "",
        "comma-separated providers: token, tls, basic (Pulsar's AuthenticationProvider class "
        "names are read as well)",
    )
    authentication_refresh_check_seconds: float = setting(
        60.0,
        "how often a connection's credentials are checked for expiry; expired ones are "
        "challenged (AUTH_CHALLENGE) or the connection is closed",
    )
    anonymous_user_role: str = setting(
        "", "role given to clients that present no credentials (empty: they are refused)"
    )
    token_secret_key: str = setting(
        "", "HS256 key of the token provider: file:///path, data:;base64,..., a path or base64"
    )
    token_public_key: str = setting(
        "", "public key (DER or PEM) of the token provider, read as token_secret_key is"
    )
    token_public_alg: str = setting("RS256", "signature algorithm of token_public_key")
    token_auth_claim: str = setting("sub", "token claim holding the role")
    token_audience_claim: str = setting(
        "", "token claim that must hold token_audience (empty: audience not checked)"
    )
    token_audience: str = setting("", "the audience this service accepts in token_audience_claim")
    basic_auth_conf: str = setting(
        "",
        "htpasswd file of the basic provider ($apr1$, crypt and bcrypt hashes): a path, "
        "file:// or data: URL, or base64 of the file",
    )
    # -- authorization ---------------------------------------------------------------------------
    authorization_enabled: bool = setting(
        False, "check every command and admin call against the roles' permissions"
    )
    superuser_roles: str = setting("", "comma-separated roles allowed everything")
    authorization_allow_wildcards_matching: bool = setting(
        False, "a granted role with * at its start or end matches roles ending or starting so"
    )
    proxy_roles: str = setting(
        "",
        "comma-separated roles of proxies: such a connection must name the client it relays "
        "(original_principal), and both are authorized",
    )
    authenticate_original_auth_data: bool = setting(
        True, "authenticate the client credentials a proxy forwards, not only the proxy's"
    )
    # -- how this broker authenticates to other brokers ------------------------------------------
    broker_client_authentication_plugin: str = setting(
        "",
        "authentication a broker uses towards other brokers: token, basic, tls (or Pulsar's "
        "client class names), empty for none",
    )
    broker_client_authentication_parameters: str = setting(
        "",
        "its parameters as Pulsar writes them: token:<jwt> or file:///path (token), "
        "user:password or JSON (basic), tlsCertFile:...,tlsKeyFile:... (tls)",
    )
    broker_client_trust_certs_file_path: str = setting(
        "", "PEM CAs a broker trusts when it calls another broker over TLS"
    )

    def provider_names(self) -> list[str]:
        found = []
        for name in names(self.authentication_providers):
            if name not in PROVIDER_NAMES:
                raise ConfigError(
                    f"authentication_providers: unknown provider {name!r} (known: token, tls, "
                    "basic, or Pulsar's AuthenticationProvider{Token,Tls,Basic} class names)"
                )
            found.append(PROVIDER_NAMES[name])
        return found

    def validate_security(self) -> None:
        for name in ("broker_service_port_tls", "web_service_port_tls"):
            if not -1 <= getattr(self, name) <= 65535:
                raise ConfigError(
                    f"{name} must be -1 (off) or a TCP port, got {getattr(self, name)}"
                )
        tls_ports = self.broker_service_port_tls >= 0 or self.web_service_port_tls >= 0
        if tls_ports and not (self.tls_certificate_file_path and self.tls_key_file_path):
            raise ConfigError(
                "a TLS port is set: tls_certificate_file_path and tls_key_file_path are needed"
            )
        if self.tls_require_trusted_client_cert_on_connect and not self.tls_trust_certs_file_path:
            raise ConfigError(
                "tls_require_trusted_client_cert_on_connect needs tls_trust_certs_file_path"
            )
        if self.tls_cert_refresh_check_duration_sec < 0:
            raise ConfigError("tls_cert_refresh_check_duration_sec must be 0 or more")
        if self.authentication_refresh_check_seconds <= 0:
            raise ConfigError("authentication_refresh_check_seconds must be positive")
        providers = self.provider_names()
        if self.authentication_enabled and not providers and not self.anonymous_user_role:
            raise ConfigError(
                "authentication_enabled needs authentication_providers (or anonymous_user_role)"
            )
        if self.token_audience_claim and not self.token_audience:
            raise ConfigError("token_audience_claim is set but token_audience is not")
        if "token" in providers and not (self.token_secret_key or self.token_public_key):
            raise ConfigError("the token provider needs token_secret_key or token_public_key")
        if "basic" in providers and not self.basic_auth_conf:
            raise ConfigError("the basic provider needs basic_auth_conf")
        if "tls" in providers and not self.tls_trust_certs_file_path:
            raise ConfigError("the tls provider needs tls_trust_certs_file_path")
        if self.authorization_enabled and not self.authentication_enabled:
            raise ConfigError("authorization_enabled needs authentication_enabled")
