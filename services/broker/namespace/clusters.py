"""Clusters registered in the configuration store (Pulsar's ClusterData), read by the admin
room and by replicators. A record lives at ``/magnetar/admin/clusters/<name>`` as Pulsar's JSON:
``{"serviceUrl", "serviceUrlTls", "brokerServiceUrl", "brokerServiceUrlTls"}``. The
configuration store is the one ``configuration_metadata_url`` names (by default the local
metadata store), shared by the clusters that replicate to each other."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from magnetar.common.metadata import MetadataStore

CLUSTERS_PATH = "/magnetar/admin/clusters"
FIELDS = ("serviceUrl", "serviceUrlTls", "brokerServiceUrl", "brokerServiceUrlTls")
#: Each URL's scheme and Pulsar's refusal of another (ClusterData's property check).
URL_SCHEMES = {
    "serviceUrl": ("http", "Illegal service url, example: http://pulsar.example.com:8080"),
    "serviceUrlTls": (
        "https",
        "Illegal service tls url, example: https://pulsar.example.com:8443",
    ),
    "brokerServiceUrl": (
        "pulsar",
        "Illegal broker service url, example: pulsar://pulsar.example.com:6650",
    ),
    "brokerServiceUrlTls": (
        "pulsar+ssl",
        "Illegal broker service tls url, example: pulsar+ssl://pulsar.example.com:6651",
    ),
}


class ClusterDataError(ValueError):
    """A ClusterData body that cannot be stored."""


@dataclass(frozen=True, slots=True)
class ClusterData:
    service_url: str = ""
    service_url_tls: str = ""
    broker_service_url: str = ""
    broker_service_url_tls: str = ""

    @classmethod
    def from_json(cls, value: Any) -> ClusterData:
        if not isinstance(value, dict):
            raise ClusterDataError(
                'expected {"serviceUrl": ..., "brokerServiceUrl": ..., "serviceUrlTls": ..., '
                '"brokerServiceUrlTls": ...}'
            )
        found = []
        for field in FIELDS:
            text = value.get(field) or ""
            if not isinstance(text, str):
                raise ClusterDataError(f"{field} must be a string, got {text!r}")
            found.append(text)
        data = cls(*found)
        if not data.broker_service_url and not data.broker_service_url_tls:
            if not data.service_url and not data.service_url_tls:
                raise ClusterDataError("a cluster needs at least a serviceUrl or brokerServiceUrl")
        return data

    def check_urls(self) -> None:
        """Each URL given has its scheme (what Pulsar checks of a cluster it registers)."""
        for field, url in self.to_json().items():
            scheme, refusal = URL_SCHEMES[field]
            if any(c.isspace() for c in url) or urlsplit(url).scheme != scheme:
                raise ClusterDataError(f"{refusal}; got {url!r}")

    def to_json(self) -> dict[str, str]:
        values = (
            self.service_url,
            self.service_url_tls,
            self.broker_service_url,
            self.broker_service_url_tls,
        )
        return {field: value for field, value in zip(FIELDS, values, strict=True) if value}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> ClusterData:
        return cls.from_json(json.loads(raw))


def cluster_key(name: str) -> str:
    return f"{CLUSTERS_PATH}/{name}"


async def read_cluster(store: MetadataStore, name: str) -> ClusterData | None:
    found = await store.get(cluster_key(name))
    return None if found is None else ClusterData.from_bytes(found.value)


async def cluster_names(store: MetadataStore) -> list[str]:
    return sorted(await store.children(CLUSTERS_PATH))
