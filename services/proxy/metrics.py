"""Prometheus metrics of one proxy, in a registry of its own (tests run several proxies in one
process).

Pulsar's proxy families keep Pulsar's names and meaning: ``pulsar_proxy_active_connections``
(gauge), ``pulsar_proxy_new_connections``, ``pulsar_proxy_rejected_connections`` and
``pulsar_proxy_binary_bytes`` (counters; prometheus_client exposes them with ``_total``, as
Pulsar's client library does since 0.10). Labels are added where Pulsar has one unlabelled
total: summing over ``reason`` or ``direction`` gives Pulsar's figure. Pulsar counts lookups
in four separate families (``pulsar_proxy_lookup_requests``,
``pulsar_proxy_partitions_metadata_requests``, ``pulsar_proxy_get_topics_of_namespace_requests``,
``pulsar_proxy_get_schema_requests``); here they are one ``magnetar_proxy_lookup_requests``
family labelled ``kind``, so the Pulsar names are not reused for a different shape. Families
Pulsar has no equivalent for are ``magnetar_proxy_*``.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from magnetar.common.metrics import service_registry

#: ``binary_bytes`` ``direction`` label values.
TO_BROKER = "to_broker"
TO_CLIENT = "to_client"

#: ``lookups`` / ``lookup_errors`` ``kind`` label values, one per command the proxy answers
#: itself in lookup mode.
LOOKUP = "lookup"
PARTITIONED_METADATA = "partitioned_metadata"
TOPICS_OF_NAMESPACE = "topics_of_namespace"
GET_SCHEMA = "get_schema"
LOOKUP_KINDS = (LOOKUP, PARTITIONED_METADATA, TOPICS_OF_NAMESPACE, GET_SCHEMA)


class ProxyMetrics:
    """Everything ``/metrics`` of a proxy shows, including the process's own ``process_*``."""

    def __init__(self) -> None:
        self.registry = r = service_registry()
        self.active_connections = Gauge(
            "pulsar_proxy_active_connections",
            "Number of connections currently active in the proxy",
            registry=r,
        )
        self.new_connections = Counter(
            "pulsar_proxy_new_connections",
            "Counter of connections being opened in the proxy",
            registry=r,
        )
        self.rejected_connections = Counter(
            "pulsar_proxy_rejected_connections",
            "Connections rejected (limits, handshake timeout, refused target, authentication)",
            ["reason"],
            registry=r,
        )
        self.binary_bytes = Counter(
            "pulsar_proxy_binary_bytes",
            "Bytes relayed between clients and brokers",
            ["direction"],
            registry=r,
        )
        self.lookups = Counter(
            "magnetar_proxy_lookup_requests",
            "Lookup-mode requests answered by the proxy, by command",
            ["kind"],
            registry=r,
        )
        self.lookup_errors = Counter(
            "magnetar_proxy_lookup_errors",
            "Lookup-mode requests answered with an error (including throttled ones), by command",
            ["kind"],
            registry=r,
        )
        self.relayed_connections = Gauge(
            "magnetar_proxy_relayed_connections",
            "Client connections currently relayed to each broker",
            ["broker"],
            registry=r,
        )
        self.http_requests = Counter(
            "magnetar_proxy_http_requests",
            "HTTP requests forwarded to brokers, by the status code returned to the client",
            ["code"],
            registry=r,
        )
