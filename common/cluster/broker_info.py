"""How to reach a broker, as lookups, the registry and redirects tell it, and where brokers
register (``BROKERS_ROOT``/<broker id>: ``{"info": <BrokerInfo>, "report": <load report>}``,
written by the brokers' registry, read by it and by proxies)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

BROKERS_ROOT = "/magnetar/brokers"


@dataclass(slots=True, frozen=True)
class BrokerInfo:
    """How to reach a broker, as lookups and the registry tell it."""

    broker_id: str  # "host:http_port", as Pulsar names brokers (lookup data, admin paths)
    service_url: str  # pulsar://host:port
    http_url: str  # http://host:http_port
    service_url_tls: str = ""  # pulsar+ssl://host:port_tls, when the broker has a TLS port
    https_url: str = ""  # https://host:web_port_tls, when the broker has one

    def to_dict(self) -> dict[str, str]:
        document = {
            "brokerId": self.broker_id,
            "serviceUrl": self.service_url,
            "httpUrl": self.http_url,
        }
        if self.service_url_tls:
            document["serviceUrlTls"] = self.service_url_tls
        if self.https_url:
            document["httpsUrl"] = self.https_url
        return document

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    @classmethod
    def from_dict(cls, data: Any) -> BrokerInfo:
        try:
            return cls(
                str(data["brokerId"]),
                str(data["serviceUrl"]),
                str(data["httpUrl"]),
                str(data.get("serviceUrlTls", "")),
                str(data.get("httpsUrl", "")),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a broker info document: {data!r}") from e

    @classmethod
    def from_json(cls, data: bytes | str) -> BrokerInfo:
        try:
            document = json.loads(data)
        except ValueError as e:
            raise ValueError(f"not a broker info document: {data!r}") from e
        return cls.from_dict(document)


def registration_document(value: bytes) -> dict[str, Any]:
    """A broker's registration record as JSON (``ValueError`` if it is not one)."""
    try:
        document = json.loads(value)
    except ValueError as e:
        raise ValueError(f"not a broker registration: {value!r} ({e})") from e
    if not isinstance(document, dict) or "info" not in document:
        raise ValueError(f"not a broker registration: {value!r}")
    return document


def registered_broker(value: bytes) -> BrokerInfo:
    """How to reach the broker a registration record names."""
    return BrokerInfo.from_dict(registration_document(value)["info"])
