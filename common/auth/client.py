"""How a broker (or proxy) authenticates when it is the client: Pulsar's
``brokerClientAuthenticationPlugin`` / ``brokerClientAuthenticationParameters`` turned into the
``Authorization`` header of its HTTP calls and the method and data of its binary CONNECT.

Parameters as Pulsar writes them: ``token:<jwt>`` or ``file:///path`` for a token (the file is
read at each use, so a rotated token is picked up); ``user:password`` or
``{"userId": ..., "password": ...}`` for basic. TLS client authentication is a certificate on
the connection, not a header (``tlsCertFile:...,tlsKeyFile:...``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from magnetar.common.config import ConfigError

#: Pulsar's client plugin class names and ours.
PLUGINS = {
    "": "",
    "token": "token",
    "org.apache.pulsar.client.impl.auth.AuthenticationToken": "token",
    "basic": "basic",
    "org.apache.pulsar.client.impl.auth.AuthenticationBasic": "basic",
    "tls": "tls",
    "org.apache.pulsar.client.impl.auth.AuthenticationTls": "tls",
}


@dataclass(frozen=True, slots=True)
class ClientCredentials:
    method: str
    parameters: str

    @classmethod
    def parse(cls, plugin: str, parameters: str) -> ClientCredentials:
        method = PLUGINS.get(plugin.strip())
        if method is None:
            raise ConfigError(
                f"broker_client_authentication_plugin: unknown plugin {plugin!r} (token, basic, "
                "tls or Pulsar's AuthenticationToken/Basic/Tls class names)"
            )
        credentials = cls(method, parameters.strip())
        credentials.auth_data()  # a start-up error when unusable, not at the first call
        return credentials

    def auth_data(self) -> bytes:
        """What CONNECT carries as ``auth_data`` (empty for none and for TLS)."""
        if self.method == "token":
            value = self.parameters
            if value.startswith("token:"):
                return value[len("token:") :].strip().encode()
            if value.startswith("file:"):
                path = Path(urlparse(value).path)
                try:
                    return path.read_text().strip().encode()
                except OSError as e:
                    raise ConfigError(
                        f"broker_client_authentication_parameters: cannot read {path}: {e.strerror}"
                    ) from None
            if not value:
                raise ConfigError("broker_client_authentication_parameters: no token given")
            return value.encode()
        if self.method == "basic":
            value = self.parameters
            if value.startswith("{"):
                try:
                    found = json.loads(value)
                    return f"{found['userId']}:{found['password']}".encode()
                except (ValueError, KeyError, TypeError):
                    raise ConfigError(
                        "broker_client_authentication_parameters: basic needs "
                        '{"userId": ..., "password": ...} or user:password'
                    ) from None
            if ":" not in value:
                raise ConfigError(
                    "broker_client_authentication_parameters: basic needs user:password"
                )
            return value.encode()
        return b""

    def http_headers(self) -> dict[str, str]:
        if self.method == "token":
            return {"Authorization": f"Bearer {self.auth_data().decode()}"}
        if self.method == "basic":
            return {"Authorization": "Basic " + base64.b64encode(self.auth_data()).decode()}
        return {}
