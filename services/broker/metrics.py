"""Prometheus metrics of one broker, in a registry of its own (a standalone process holds a
bookie's registry too)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # Set when scraped, from the loaded topics' own counters (nothing extra per message).
        self.entries_in = Gauge(
            "magnetar_broker_in_entries",
            "Entries (producer batches) stored by the loaded topics since they were loaded",
            registry=r,
        )
        self.bytes_in = Gauge(
            "magnetar_broker_in_bytes",
            "Bytes stored by the loaded topics since they were loaded",
            registry=r,
        )
        self.send_errors = Counter(
            "magnetar_broker_send_errors", "Sends answered with SEND_ERROR", ["error"], registry=r
        )
        self.dispatch_failures = Counter(
            "magnetar_broker_dispatch_failures",
            "Dispatch rounds that failed and were retried",
            registry=r,
        )
        self.unreadable_entries = Counter(
            "magnetar_broker_unreadable_entries",
            "Reads of entries with no intact copy on any bookie",
            registry=r,
        )
        self.skipped_entries = Counter(
            "magnetar_broker_skipped_unreadable_entries",
            "Unreadable entries skipped (auto_skip_non_recoverable_data)",
            registry=r,
        )
        self.topics = Gauge("magnetar_broker_topics", "Topics loaded", registry=r)
        self.connections = Gauge(
            "magnetar_broker_connections", "Client connections open", registry=r
        )
