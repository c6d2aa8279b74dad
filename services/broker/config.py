"""Broker configuration (``magnetar broker --help`` prints every setting with its default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from magnetar.common.auth.settings import SecuritySettings
from magnetar.common.config import ConfigError, setting

if TYPE_CHECKING:
    from magnetar.common.ledger.bookie_client import BookieTls

AUTO_CREATION_TYPES = ("non-partitioned", "partitioned")


@dataclass(slots=True)
class TopicSettings(SecuritySettings):
    """Limits, the defaults of namespace policies and the security settings; shared by
    ``broker`` and ``standalone``."""

    max_message_size: int = setting(
        5 * 1024 * 1024, "largest message (payload and metadata) accepted"
    )
    deduplication_enabled: bool = setting(
        False,
        "default of the namespace policy: drop messages resent with an already stored "
        "producer name + sequence id",
    )
    allow_auto_topic_creation: bool = setting(
        True, "default of the namespace policy: create a topic when a client first uses it"
    )
    allow_auto_topic_creation_type: str = setting(
        "non-partitioned", "what auto-creation creates: non-partitioned or partitioned"
    )
    default_num_partitions: int = setting(1, "partitions of an auto-created partitioned topic")
    max_num_partitions_per_partitioned_topic: int = setting(
        1000,
        "most partitions a partitioned topic may have (admin create/update, auto-creation); a "
        "stored count above it is refused to clients. At least 1: there is no unbounded value",
    )
    default_retention_time_minutes: int = setting(
        0, "keep fully acknowledged messages this long (-1: forever) unless a namespace says else"
    )
    default_retention_size_mb: int = setting(
        0, "keep at most this much of fully acknowledged messages per topic (-1: no limit)"
    )
    ttl_duration_default_seconds: int = setting(
        0,
        "unacknowledged messages older than this are acknowledged for their subscriptions (0: never)",
    )
    max_entries_per_ledger: int = setting(
        50_000, "a topic starts a new ledger after this many entries"
    )
    auto_skip_non_recoverable_data: bool = setting(
        False,
        "acknowledge an entry no bookie can give back intact instead of waiting at it "
        "(delivery goes on without it; counted in magnetar_broker_skipped_unreadable_entries)",
    )
    managed_ledger_max_unacked_ranges_to_persist_in_metadata_store: int = setting(
        1000,
        "a subscription with more acknowledgement holes (ranges) than this stores its state in "
        "a cursor ledger on the bookies, and its metadata-store record only names that ledger",
    )
    keep_alive_interval_seconds: float = setting(
        30.0,
        "send PING to a client silent this long (0: never)",
    )
    keep_alive_timeout_seconds: float = setting(
        0.0,
        "close a connection that sent nothing this long after a PING (0: as long as "
        "keep_alive_interval_seconds, Pulsar's rule)",
    )
    max_unacked_messages_per_consumer: int = setting(
        50_000,
        "shared/key_shared: stop sending to a consumer with this many unacknowledged messages "
        "(0: no bound)",
    )
    max_unacked_messages_per_subscription: int = setting(
        200_000,
        "shared/key_shared: stop reading for a subscription with this many unacknowledged "
        "messages (0: no bound)",
    )
    policy_check_interval_seconds: float = setting(
        60.0, "how often retention and TTL are applied to loaded topics"
    )
    broker_service_compaction_monitor_interval_in_seconds: float = setting(
        60.0, "how often each loaded topic's compaction backlog is checked against its threshold"
    )
    broker_service_compaction_threshold_in_bytes: int = setting(
        0,
        "compact a topic once its compaction backlog passes this many bytes, unless its "
        "namespace or itself sets compactionThreshold (0: never automatically)",
    )
    max_publish_rate_per_topic_in_messages: int = setting(
        0,
        "default of the publish rate policy: messages a second each topic takes; a producer "
        "connection over it is not read until the next second (0: no limit)",
    )
    max_publish_rate_per_topic_in_bytes: int = setting(
        0,
        "default of the publish rate policy: bytes a second each topic takes (0: no limit)",
    )
    subscription_expiration_time_minutes: float = setting(
        0.0,
        "default of the namespace policy: delete a subscription with no consumer and no "
        "activity for this long (0: never; fractions of a minute are accepted, for tests)",
    )
    subscription_expiry_check_interval_in_minutes: float = setting(
        5.0,
        "how often subscriptions are checked for expiration (fractions of a minute are "
        "accepted, for tests)",
    )
    cluster_name: str = setting(
        "standalone",
        "name of the cluster the brokers form (Pulsar's clusterName; admin /admin/v2/clusters "
        "and /admin/v2/brokers/{cluster} use it)",
    )
    default_number_of_namespace_bundles: int = setting(
        4,
        "default of the namespace policy: bundles a namespace's hash range is split into when "
        "it is first used",
    )
    expose_topic_level_metrics_in_prometheus: bool = setting(
        True,
        "Pulsar's exposeTopicLevelMetricsInPrometheus: topic and subscription families per topic "
        "on /metrics; off: the topic families summed per namespace, no subscription families",
    )

    def validate_topic_settings(self) -> None:
        if self.max_message_size < 1024:
            raise ConfigError(
                f"max_message_size must be at least 1024, got {self.max_message_size}"
            )
        if self.allow_auto_topic_creation_type not in AUTO_CREATION_TYPES:
            raise ConfigError(
                "allow_auto_topic_creation_type must be non-partitioned or partitioned, got "
                f"{self.allow_auto_topic_creation_type!r}"
            )
        if self.default_num_partitions < 1:
            raise ConfigError("default_num_partitions must be at least 1")
        if self.max_num_partitions_per_partitioned_topic < 1:
            raise ConfigError(
                "max_num_partitions_per_partitioned_topic must be at least 1 (there is no "
                "unbounded value: a partitioned topic's partitions are listed and held in memory)"
            )
        if self.default_num_partitions > self.max_num_partitions_per_partitioned_topic:
            raise ConfigError(
                "default_num_partitions must not exceed max_num_partitions_per_partitioned_topic"
            )
        for name in ("default_retention_time_minutes", "default_retention_size_mb"):
            if getattr(self, name) < -1:
                raise ConfigError(f"{name} must be -1 (no limit) or more")
        if self.ttl_duration_default_seconds < 0:
            raise ConfigError("ttl_duration_default_seconds must be 0 (off) or more")
        if self.max_entries_per_ledger < 1:
            raise ConfigError("max_entries_per_ledger must be at least 1")
        if self.managed_ledger_max_unacked_ranges_to_persist_in_metadata_store < 0:
            raise ConfigError(
                "managed_ledger_max_unacked_ranges_to_persist_in_metadata_store must be 0 or more"
            )
        for name in ("max_unacked_messages_per_consumer", "max_unacked_messages_per_subscription"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 (no bound) or positive")
        if self.keep_alive_interval_seconds < 0:
            raise ConfigError("keep_alive_interval_seconds must be 0 (off) or positive")
        if self.keep_alive_timeout_seconds < 0:
            raise ConfigError("keep_alive_timeout_seconds must be 0 or positive")
        if self.policy_check_interval_seconds <= 0:
            raise ConfigError("policy_check_interval_seconds must be positive")
        if self.broker_service_compaction_monitor_interval_in_seconds <= 0:
            raise ConfigError(
                "broker_service_compaction_monitor_interval_in_seconds must be positive"
            )
        if self.broker_service_compaction_threshold_in_bytes < 0:
            raise ConfigError("broker_service_compaction_threshold_in_bytes must be >= 0")
        for name in (
            "max_publish_rate_per_topic_in_messages",
            "max_publish_rate_per_topic_in_bytes",
            "subscription_expiration_time_minutes",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 (off) or positive")
        if self.subscription_expiry_check_interval_in_minutes <= 0:
            raise ConfigError("subscription_expiry_check_interval_in_minutes must be positive")
        if not self.cluster_name or "/" in self.cluster_name:
            raise ConfigError(
                f"cluster_name must be non-empty and contain no '/', got {self.cluster_name!r}"
            )
        if not 1 <= self.default_number_of_namespace_bundles <= 1024:
            raise ConfigError("default_number_of_namespace_bundles must be between 1 and 1024")
        self.validate_security()


@dataclass(slots=True)
class BrokerConfig(TopicSettings):
    metadata_url: str = setting(
        "etcd://127.0.0.1:2379", "metadata store URL (etcd://h:p[,h:p] or local:///path/meta.db)"
    )
    configuration_metadata_url: str = setting(
        "",
        "configuration store URL shared by the clusters that replicate to each other (Pulsar's "
        "configurationMetadataStoreUrl): clusters, tenants, namespaces and partitioned-topic "
        "metadata live there (empty or equal to metadata_url: the local metadata store; such "
        "records found in the local store are moved there at start)",
    )
    replicator_batch_size: int = setting(
        100, "entries a geo-replicator reads and sends before waiting for their receipts"
    )
    enable_replicated_subscriptions: bool = setting(
        True,
        "honour consumers' replicate_subscription_state: their subscriptions' positions follow "
        "across the clusters of a replicated namespace (Pulsar's enableReplicatedSubscriptions)",
    )
    replicated_subscriptions_snapshot_frequency_millis: int = setting(
        1000,
        "how often the owner of a topic with a replicated subscription starts a snapshot of the "
        "clusters' positions; a consumer failing over to another cluster gets again at most "
        "about this much of what it acknowledged",
    )
    replicated_subscriptions_snapshot_timeout_seconds: int = setting(
        30, "a snapshot whose remote clusters have not all answered by then is dropped"
    )
    replicated_subscriptions_snapshot_max_cached_per_subscription: int = setting(
        10, "snapshots each replicated subscription keeps until its position reaches them"
    )
    bind_address: str = setting("0.0.0.0", "address the Pulsar protocol and HTTP servers listen on")
    advertised_address: str = setting("127.0.0.1", "host name or IP clients are told to connect to")
    port: int = setting(6650, "Pulsar binary protocol port")
    http_port: int = setting(8080, "HTTP port: admin REST (/admin/v2/...) and health")
    ensemble_size: int = setting(2, "bookies per topic ledger (E)")
    write_quorum: int = setting(2, "copies of each entry (Qw)")
    ack_quorum: int = setting(2, "copies that must be stored before a send is acknowledged (Qa)")
    dispatch_batch: int = setting(100, "entries read from storage per dispatch round at most")
    broker_session_ttl_seconds: int = setting(
        10,
        "TTL in seconds of the broker's metadata session (etcd lease): a broker silent this "
        "long loses its registration and every bundle it owned, and stops serving them",
    )
    broker_shutdown_timeout_ms: int = setting(
        60000,
        "on SIGTERM, how long the broker may spend handing its bundles to the other brokers "
        "before it closes anyway (Pulsar's brokerShutdownTimeoutMs); keep it below the pod's "
        "terminationGracePeriodSeconds",
    )
    load_balancer_enabled: bool = setting(
        True,
        "run the load manager on the elected leader broker: place unowned bundles on the "
        "least-loaded broker, shed bundles from overloaded brokers and split hot bundles",
    )
    load_balancer_report_update_interval_seconds: float = setting(
        10.0, "how often, in seconds, each broker refreshes its load report in the registry"
    )
    load_balancer_shedding_interval_seconds: float = setting(
        60.0,
        "how often, in seconds, the leader looks for overloaded brokers and hot bundles "
        "(Pulsar's loadBalancerSheddingIntervalMinutes, in seconds)",
    )
    load_balancer_broker_threshold_shedder_percentage: float = setting(
        10.0,
        "a broker whose load exceeds the cluster's average by more than this percentage of "
        "the average sheds its hottest bundles (Pulsar's threshold shedder)",
    )
    load_balancer_broker_overloaded_threshold_percentage: float = setting(
        85.0,
        "a broker whose highest resource usage (CPU, memory, bandwidth in or out, in percent "
        "of what it may use) is above this is overloaded: new bundles go elsewhere while "
        "another broker is not",
    )
    load_balancer_override_broker_nic_speed_gbps: float = setting(
        0.0,
        "the NIC speed bandwidth usage is measured against, in Gbit/s (0: the fastest "
        "physical interface /sys/class/net reports; no bandwidth usage when none does)",
    )
    load_balancer_shedding_grace_period_seconds: float = setting(
        1800.0,
        "a bundle moved by shedding is not moved again for this many seconds, against "
        "flapping (Pulsar's loadBalancerSheddingGracePeriodMinutes, in seconds)",
    )
    load_balancer_auto_bundle_split_enabled: bool = setting(
        True, "the leader splits a bundle whose topic count or message rate passes the limits"
    )
    load_balancer_namespace_bundle_max_topics: int = setting(
        1000, "split a bundle holding more topics than this (0: no topic limit)"
    )
    load_balancer_namespace_bundle_max_msg_rate: float = setting(
        30000.0, "split a bundle whose messages in + out per second exceed this (0: no limit)"
    )
    # -- TLS to bookies (Pulsar's bookkeeperTLS* names; off by default) --
    bookkeeper_tls_enabled: bool = setting(
        False,
        "reach bookies over TLS (their tls_certificate_path is set); Magnetar's switch: Pulsar "
        "has none apart from bookkeeper_tls_client_authentication, which turns TLS on as well",
    )
    bookkeeper_tls_client_authentication: bool = setting(
        False,
        "reach bookies over TLS and show them bookkeeper_tls_certificate_file_path, for bookies "
        "with tls_client_authentication (Pulsar's bookkeeperTLSClientAuthentication)",
    )
    bookkeeper_tls_trust_certs_file_path: str = setting(
        "",
        "PEM CA certificates bookie certificates must chain to (empty: gRPC's public roots); a "
        "bookie's certificate must name the host of its advertised address, which is always "
        "checked (Pulsar's bookkeeperTLSTrustCertsFilePath)",
    )
    bookkeeper_tls_certificate_file_path: str = setting(
        "",
        "PEM client certificate shown to bookies under bookkeeper_tls_client_authentication "
        "(Pulsar's bookkeeperTLSCertificateFilePath)",
    )
    bookkeeper_tls_key_file_path: str = setting(
        "",
        "PEM unencrypted private key of bookkeeper_tls_certificate_file_path "
        "(Pulsar's bookkeeperTLSKeyFilePath, PEM only)",
    )

    def bookkeeper_tls(self) -> BookieTls | None:
        """TLS of the ledger client to bookies, or None when off."""
        if not (self.bookkeeper_tls_enabled or self.bookkeeper_tls_client_authentication):
            return None
        from magnetar.common.ledger.bookie_client import BookieTls

        show = self.bookkeeper_tls_client_authentication
        return BookieTls(
            trust_certs_file=self.bookkeeper_tls_trust_certs_file_path,
            certificate_file=self.bookkeeper_tls_certificate_file_path if show else "",
            key_file=self.bookkeeper_tls_key_file_path if show else "",
        )

    def _validate_internal_tls(self) -> None:
        bookie_tls = self.bookkeeper_tls_enabled or self.bookkeeper_tls_client_authentication
        if self.bookkeeper_tls_trust_certs_file_path and not bookie_tls:
            raise ConfigError(
                "bookkeeper_tls_trust_certs_file_path is set but TLS to bookies is off: set "
                "bookkeeper_tls_enabled"
            )
        client_files = (
            self.bookkeeper_tls_certificate_file_path,
            self.bookkeeper_tls_key_file_path,
        )
        if self.bookkeeper_tls_client_authentication and not all(client_files):
            raise ConfigError(
                "bookkeeper_tls_client_authentication needs bookkeeper_tls_certificate_file_path "
                "and bookkeeper_tls_key_file_path"
            )
        if any(client_files) and not self.bookkeeper_tls_client_authentication:
            raise ConfigError(
                "bookkeeper_tls_certificate_file_path/bookkeeper_tls_key_file_path are shown to "
                "bookies only under bookkeeper_tls_client_authentication: turn it on"
            )
        self.validate_etcd_tls(self.metadata_url)

    def validate(self) -> None:
        for name in ("port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {getattr(self, name)}")
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ConfigError("need ensemble_size >= write_quorum >= ack_quorum >= 1")
        if self.broker_shutdown_timeout_ms < 0:
            raise ConfigError("broker_shutdown_timeout_ms must be 0 or more")
        if self.replicated_subscriptions_snapshot_frequency_millis <= 0:
            raise ConfigError("replicated_subscriptions_snapshot_frequency_millis must be positive")
        if self.replicated_subscriptions_snapshot_timeout_seconds <= 0:
            raise ConfigError("replicated_subscriptions_snapshot_timeout_seconds must be positive")
        if self.replicated_subscriptions_snapshot_max_cached_per_subscription < 3:
            raise ConfigError(
                "replicated_subscriptions_snapshot_max_cached_per_subscription must be at least 3"
            )
        if self.broker_session_ttl_seconds < 2:
            raise ConfigError(
                "broker_session_ttl_seconds must be at least 2 (etcd cannot keep a shorter lease)"
            )
        for name in (
            "load_balancer_report_update_interval_seconds",
            "load_balancer_shedding_interval_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        for name in (
            "load_balancer_broker_threshold_shedder_percentage",
            "load_balancer_broker_overloaded_threshold_percentage",
            "load_balancer_override_broker_nic_speed_gbps",
            "load_balancer_shedding_grace_period_seconds",
            "load_balancer_namespace_bundle_max_topics",
            "load_balancer_namespace_bundle_max_msg_rate",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more")
        self._validate_internal_tls()
        self.validate_topic_settings()
