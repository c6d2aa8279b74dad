"""Clusters registered in the configuration store (Pulsar's ClusterData), read by the admin
room and by replicators. A record lives at ``/magnetar/admin/clusters/<name>`` as Pulsar's JSON:
``{"serviceUrl", "serviceUrlTls", "brokerServiceUrl", "brokerServiceUrlTls"}``. The
configuration store is the one ``configuration_metadata_url`` names (by default the local
metadata store), shared by the clusters that replicate to each other."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from magnetar.common.metadata import MetadataStore

CLUSTERS_PATH = "/magnetar/admin/clusters"
FIELDS = ("serviceUrl", "serviceUrlTls", "brokerServiceUrl", "brokerServiceUrlTls")


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
