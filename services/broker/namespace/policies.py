"""Namespace policies: what a namespace sets for its topics, over the broker's defaults.

A namespace's policies are the JSON document at its key in the metadata store
(``/magnetar/admin/namespaces/<tenant>/<namespace>``), with Pulsar's field names, each optional
(absent means "the broker's default"):

- ``retention_policies``: ``{"retentionTimeInMinutes": T, "retentionSizeInMB": S}``
- ``message_ttl_in_seconds``: N
- ``deduplicationEnabled``: true/false
- ``autoTopicCreationOverride``: ``{"allowAutoTopicCreation": b, "topicType": "partitioned" |
  "non-partitioned", "defaultNumPartitions": N}``
- ``max_producers_per_topic``, ``max_consumers_per_topic``, ``max_consumers_per_subscription``:
  N (0 or absent: no limit), ``max_unacked_messages_per_consumer``,
  ``max_unacked_messages_per_subscription``: N (absent: the broker's setting; 0: no bound)
- ``topicDispatchRate``, ``subscriptionDispatchRate``: ``{cluster: {"dispatchThrottlingRateInMsg",
  "dispatchThrottlingRateInByte", "ratePeriodInSecond"}}``
- ``publishMaxMessageRate``: ``{cluster: {"publishThrottlingRateInMsg",
  "publishThrottlingRateInByte"}}`` (Pulsar's PublishRate; a topic's own is kept in the same
  field of its document)
- ``subscription_expiration_time_minutes``: N (0: subscriptions never expire)
- ``backlog_quota_map``: ``{"destination_storage"|"message_age": {"limitSize": bytes,
  "limitTime": seconds, "policy": ...}}``; ``inactive_topic_policies``:
  ``{"inactiveTopicDeleteMode", "maxInactiveDurationSeconds", "deleteWhileInactive"}``
- ``auth_policies``: the namespace's grants, ``{"namespace_auth": {role: [action]},
  "destination_auth": {topic: {role: [action]}}, "subscription_auth_roles": {sub: [role]}}``
  (read and written by ``authorization``; ``effective`` leaves it alone, and every writer of
  one policy rewrites the document with the others, grants included, as it found them)

A partitioned topic's record (``PartitionedTopicRecord``) lives here too: it is read by the admin
API, the lookup side (PARTITIONED_METADATA) and topic loading alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from magnetar.broker.config import AUTO_CREATION_TYPES, TopicSettings


class PolicyError(ValueError):
    """A policy value is invalid (the admin API answers 400 with this text)."""


class PartitionCountError(PolicyError):
    """A partition count outside ``1 .. max_num_partitions_per_partitioned_topic`` (the admin API
    answers 406 Not Acceptable with this text, as Pulsar does)."""


class PartitionedMetadataError(ValueError):
    """A stored partitioned-topic record that is not ``{"partitions": N}`` with an integer N."""


@dataclass(frozen=True, slots=True)
class PartitionedTopicRecord:
    """A partitioned topic as stored: ``{"partitions": N}``, and ``"deleted": true`` from the
    moment a delete starts (Pulsar's ``PartitionedTopicMetadata.deleted``). A topic marked so is
    only ever deleted further: its partitions take no new producer or consumer, none is created,
    it cannot grow, and the next DELETE finishes an interrupted one."""

    partitions: int
    deleted: bool = False

    def to_bytes(self) -> bytes:
        document: dict[str, Any] = {"partitions": self.partitions}
        if self.deleted:
            document["deleted"] = True
        return json.dumps(document).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, topic: str) -> PartitionedTopicRecord:
        """Raises PartitionedMetadataError (naming ``topic``) for anything else."""
        try:
            document = json.loads(raw)
            partitions = document["partitions"]
            deleted = document.get("deleted", False)
        except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as e:
            raise PartitionedMetadataError(
                f"partitioned topic {topic}: unreadable metadata: {e}"
            ) from None
        if not isinstance(partitions, int) or isinstance(partitions, bool):
            raise PartitionedMetadataError(
                f"partitioned topic {topic}: partition count {partitions!r} is not an integer"
            )
        if not isinstance(deleted, bool):
            raise PartitionedMetadataError(
                f"partitioned topic {topic}: deleted marker {deleted!r} is not true or false"
            )
        return cls(partitions, deleted)


def check_partition_count(partitions: Any, limit: int) -> int:
    """Pulsar's bounds on a partitioned topic's size (``maxNumPartitionsPerPartitionedTopic``),
    with its messages; ``limit`` is at least 1 (the config refuses anything else)."""
    if not isinstance(partitions, int) or isinstance(partitions, bool):
        raise PolicyError(f"the partition count must be an integer, got {partitions!r}")
    if partitions <= 0:
        raise PartitionCountError("Number of partitions should be more than 0")
    if partitions > limit:
        raise PartitionCountError(f"Number of partitions should be less than or equal to {limit}")
    return partitions


@dataclass(frozen=True, slots=True)
class Retention:
    time_minutes: int  # -1: forever
    size_mb: int  # -1: no limit


@dataclass(frozen=True, slots=True)
class AutoTopicCreation:
    allow: bool
    topic_type: str
    default_partitions: int


@dataclass(frozen=True, slots=True)
class Policies:
    """The policies in force for a namespace's topics (namespace values over broker defaults)."""

    retention: Retention
    message_ttl_seconds: int  # 0: messages do not expire
    deduplication: bool
    auto_topic_creation: AutoTopicCreation
    limits: TopicLimits = field(default_factory=lambda: TopicLimits())
    backlog_quota: BacklogQuota | None = None
    inactive_topics: InactiveTopics | None = None
    #: (messages, bytes, period in seconds, relative to the publish rate) a topic, and each
    #: subscription, may dispatch.
    dispatch_rate: tuple[int, int, int, bool] | None = None
    subscription_dispatch_rate: tuple[int, int, int, bool] | None = None
    #: Pulsar's ``replication_clusters``: the clusters the namespace's topics live in.
    replication_clusters: tuple[str, ...] = ()
    #: Pulsar's ``compaction_threshold``: compact once the compaction backlog passes these
    #: bytes (0: never automatically).
    compaction_threshold: int = 0
    #: (messages, bytes) each topic takes a second (0: no limit); None: no publish rate.
    publish_rate: tuple[int, int] | None = None
    #: Minutes a subscription with no consumer may stay idle before it is deleted (0: never).
    subscription_expiration_minutes: float = 0.0

    def missing_cluster(self, local: str, namespace: str) -> str | None:
        """Why ``namespace``'s topics are not served in cluster ``local`` (Pulsar's words), or
        None: a namespace with a replication list not naming ``local`` lives elsewhere."""
        clusters = self.replication_clusters
        if not clusters or local in clusters:
            return None
        return (
            "Namespace missing local cluster name in clusters list: "
            f"local_cluster={local} ns={namespace} clusters=[{', '.join(clusters)}]"
        )


#: Pulsar's RetentionPolicy names of a backlog quota.
QUOTA_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")
#: The quota policies that act on producers (not on subscriptions).
PRODUCER_QUOTA_POLICIES = ("producer_request_hold", "producer_exception")
#: Pulsar's BacklogQuotaType names (the quota map's keys).
QUOTA_TYPES = ("destination_storage", "message_age")
INACTIVE_MODES = ("delete_when_no_subscriptions", "delete_when_subscriptions_caught_up")


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    """What a subscription may leave unacknowledged (Pulsar's BacklogQuota): ``limit_size``
    bytes (destination_storage) and messages ``limit_time`` seconds old (message_age); -1: no
    limit. ``consumer_backlog_eviction``: the slowest subscriptions lose their oldest messages;
    ``producer_request_hold`` and ``producer_exception``: producers are refused (and those
    attached disconnected) while the backlog is over it."""

    limit_size: int = -1
    limit_time: int = -1
    policy: str = "producer_request_hold"


@dataclass(frozen=True, slots=True)
class InactiveTopics:
    """Pulsar's InactiveTopicPolicies: a topic with no producer and no consumer for
    ``max_inactive_seconds`` (and no subscription, or every subscription caught up, by
    ``mode``) is deleted when ``delete_while_inactive``."""

    mode: str
    max_inactive_seconds: int
    delete_while_inactive: bool


#: The largest values of Java's int and long, the types of Pulsar's policy fields: a larger
#: number cannot be a Pulsar policy (Pulsar refuses it as a malformed body).
JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1


def _java_number(number: Any, lowest: int, highest: int) -> bool:
    """Whether ``number`` is an integer (not a boolean) within ``lowest..highest``."""
    return isinstance(number, int) and not isinstance(number, bool) and lowest <= number <= highest


def check_dispatch_rate(value: Any) -> dict[str, Any]:
    """Pulsar's DispatchRate: ``dispatchThrottlingRateInMsg``, ``dispatchThrottlingRateInByte``
    (-1: no limit), ``ratePeriodInSecond`` (1 or more), ``relativeToPublishRate`` (true: the
    limits are over the topic's publish rate)."""
    if not isinstance(value, dict):
        raise PolicyError(
            'expected {"dispatchThrottlingRateInMsg": N, "dispatchThrottlingRateInByte": N, '
            '"ratePeriodInSecond": S}'
        )
    result: dict[str, Any] = {}
    for key, default, lowest, highest in (
        ("dispatchThrottlingRateInMsg", -1, -1, JAVA_INT_MAX),
        ("dispatchThrottlingRateInByte", -1, -1, JAVA_LONG_MAX),
        ("ratePeriodInSecond", 1, 1, JAVA_INT_MAX),
    ):
        number = value.get(key, default)
        if not _java_number(number, lowest, highest):
            raise PolicyError(f"{key} must be a number from {lowest} to {highest}; got {number!r}")
        result[key] = number
    relative = value.get("relativeToPublishRate", False)
    if not isinstance(relative, bool):
        raise PolicyError(f"relativeToPublishRate must be true or false; got {relative!r}")
    result["relativeToPublishRate"] = relative
    return result


def _cluster_rate(document: dict[str, Any], field: str) -> dict[str, Any] | None:
    """The rate of the (single) cluster in a ``{cluster: rate}`` policy field, if it is one."""
    by_cluster = document.get(field)
    if not isinstance(by_cluster, dict) or not by_cluster:
        return None
    rate = next(iter(by_cluster.values()))
    return rate if isinstance(rate, dict) else None


def _dispatch_rate(document: dict[str, Any], field: str) -> tuple[int, int, int, bool] | None:
    """The rate of the (single) cluster in a ``{cluster: DispatchRate}`` policy field."""
    rate = _cluster_rate(document, field)
    if rate is None:
        return None
    found = (
        int(rate.get("dispatchThrottlingRateInMsg", -1)),
        int(rate.get("dispatchThrottlingRateInByte", -1)),
        max(int(rate.get("ratePeriodInSecond", 1)), 1),
        rate.get("relativeToPublishRate") is True,
    )
    return None if found[0] <= 0 and found[1] <= 0 else found


def check_publish_rate(value: Any) -> dict[str, int]:
    """Pulsar's PublishRate: ``publishThrottlingRateInMsg``, ``publishThrottlingRateInByte``
    per second (-1 or 0: no limit)."""
    if not isinstance(value, dict):
        raise PolicyError(
            'expected {"publishThrottlingRateInMsg": N, "publishThrottlingRateInByte": N}'
        )
    result = {}
    for key, highest in (
        ("publishThrottlingRateInMsg", JAVA_INT_MAX),
        ("publishThrottlingRateInByte", JAVA_LONG_MAX),
    ):
        number = value.get(key, -1)
        if not _java_number(number, -1, highest):
            raise PolicyError(
                f"{key} must be a number from -1 (no limit) to {highest}; got {number!r}"
            )
        result[key] = number
    return result


def check_expiration_minutes(value: Any) -> int:
    if not _java_number(value, 0, JAVA_INT_MAX):
        raise PolicyError(
            f"subscriptionExpirationTime must be a number of minutes from 0 (never) to "
            f"{JAVA_INT_MAX}, got {value!r}"
        )
    return value


def _publish_rate(document: dict[str, Any], defaults: TopicSettings) -> tuple[int, int] | None:
    """The rate of the (single) cluster in ``publishMaxMessageRate``, else the broker's."""
    rate = _cluster_rate(document, "publishMaxMessageRate")
    if rate is not None:
        found = (
            max(int(rate.get("publishThrottlingRateInMsg", -1)), 0),
            max(int(rate.get("publishThrottlingRateInByte", -1)), 0),
        )
        return found if any(found) else None
    found = (
        defaults.max_publish_rate_per_topic_in_messages,
        defaults.max_publish_rate_per_topic_in_bytes,
    )
    return found if any(found) else None


def check_backlog_quota(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PolicyError('expected {"limitSize": bytes, "limitTime": seconds, "policy": ...}')
    result: dict[str, Any] = {}
    for key, highest in (("limitSize", JAVA_LONG_MAX), ("limitTime", JAVA_INT_MAX)):
        number = value.get(key, -1)
        if key == "limitSize" and value.get(key) is None:
            # Pulsar's deprecated name of limitSize, still what older clients send
            number = value.get("limit", -1)
        if not _java_number(number, -1, highest):
            raise PolicyError(
                f"{key} must be a number from -1 (no limit) to {highest}; got {number!r}"
            )
        result[key] = number
    policy = value.get("policy", "producer_request_hold")
    if policy not in QUOTA_POLICIES:
        raise PolicyError(f"policy must be one of {', '.join(QUOTA_POLICIES)}; got {policy!r}")
    result["policy"] = policy
    return result


def check_inactive_topics(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PolicyError(
            'expected {"inactiveTopicDeleteMode": ..., "maxInactiveDurationSeconds": N, '
            '"deleteWhileInactive": true|false}'
        )
    mode = value.get("inactiveTopicDeleteMode", "delete_when_no_subscriptions")
    if mode not in INACTIVE_MODES:
        raise PolicyError(f"inactiveTopicDeleteMode must be one of {', '.join(INACTIVE_MODES)}")
    seconds = value.get("maxInactiveDurationSeconds", 60)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 1:
        raise PolicyError(f"maxInactiveDurationSeconds must be 1 or more, got {seconds!r}")
    delete = value.get("deleteWhileInactive", False)
    if not isinstance(delete, bool):
        raise PolicyError(f"deleteWhileInactive must be true or false, got {delete!r}")
    return {
        "inactiveTopicDeleteMode": mode,
        "maxInactiveDurationSeconds": seconds,
        "deleteWhileInactive": delete,
    }


def _backlog_quota(document: dict[str, Any]) -> BacklogQuota | None:
    quotas = document.get("backlog_quota_map") or {}
    size = quotas.get("destination_storage") or {}
    age = quotas.get("message_age") or {}
    if not size and not age:
        return None
    return BacklogQuota(
        int(size.get("limitSize", -1)),
        int(age.get("limitTime", size.get("limitTime", -1))),
        str(size.get("policy") or age.get("policy") or "producer_request_hold"),
    )


def _inactive_topics(document: dict[str, Any]) -> InactiveTopics | None:
    found = document.get("inactive_topic_policies")
    if not isinstance(found, dict):
        return None
    return InactiveTopics(
        str(found.get("inactiveTopicDeleteMode", "delete_when_no_subscriptions")),
        int(found.get("maxInactiveDurationSeconds", 60)),
        bool(found.get("deleteWhileInactive", False)),
    )


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """How many clients a topic takes and how much a consumer may hold (Pulsar's
    maxProducersPerTopic, maxConsumersPerTopic, maxConsumersPerSubscription: 0 is no limit;
    maxUnackedMessagesPerConsumer/-Subscription: None is the broker's setting, 0 no bound)."""

    max_producers_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    max_unacked_per_consumer: int | None = None
    max_unacked_per_subscription: int | None = None


#: Policy document field -> TopicLimits field.
LIMIT_FIELDS = {
    "max_producers_per_topic": "max_producers_per_topic",
    "max_consumers_per_topic": "max_consumers_per_topic",
    "max_consumers_per_subscription": "max_consumers_per_subscription",
    "max_unacked_messages_per_consumer": "max_unacked_per_consumer",
    "max_unacked_messages_per_subscription": "max_unacked_per_subscription",
}


def check_limit(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PolicyError(f"{what} must be a number >= 0 (0: no limit), got {value!r}")
    return value


def full_document(stored: dict[str, Any]) -> dict[str, Any]:
    """A namespace's policies as Pulsar's GET answers them: every field of its Policies, unset
    ones at Pulsar's defaults (null: the broker's setting), then what the namespace set."""
    return {
        "auth_policies": {
            "namespace_auth": {},
            "destination_auth": {},
            "subscription_auth_roles": {},
        },
        "replication_clusters": [],
        "backlog_quota_map": {},
        "clusterDispatchRate": {},
        "topicDispatchRate": {},
        "subscriptionDispatchRate": {},
        "replicatorDispatchRate": {},
        "clusterSubscribeRate": {},
        "publishMaxMessageRate": {},
        "latency_stats_sample_rate": {},
        "persistence": None,
        "deduplicationEnabled": None,
        "autoTopicCreationOverride": None,
        "autoSubscriptionCreationOverride": None,
        "message_ttl_in_seconds": None,
        "subscription_expiration_time_minutes": 0,
        "retention_policies": None,
        "deleted": False,
        "encryption_required": False,
        "delayed_delivery_policies": None,
        "inactive_topic_policies": None,
        "subscription_auth_mode": "None",
        "max_producers_per_topic": None,
        "max_consumers_per_topic": None,
        "max_consumers_per_subscription": None,
        "max_unacked_messages_per_consumer": None,
        "max_unacked_messages_per_subscription": None,
        "max_subscriptions_per_topic": None,
        "compaction_threshold": None,
        "offload_threshold": -1,
        "schema_compatibility_strategy": "UNDEFINED",
        "schema_validation_enforced": False,
        "is_allow_auto_update_schema": None,
        "offload_deletion_lag_ms": None,
        "max_topics_per_namespace": None,
        "schema_auto_update_compatibility_strategy": "Full",
        "offload_policies": None,
        "deduplicationSnapshotIntervalSeconds": None,
        "subscription_types_enabled": [],
        "properties": {},
        "resource_group_name": None,
        **stored,
    }


def parse_document(raw: bytes | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise PolicyError(f"namespace policies are not JSON: {e}") from None
    if not isinstance(document, dict):
        raise PolicyError("namespace policies must be a JSON object")
    return document


def effective(document: dict[str, Any], defaults: TopicSettings) -> Policies:
    retention = document.get("retention_policies") or {}
    auto = document.get("autoTopicCreationOverride") or {}
    ttl = document.get("message_ttl_in_seconds")
    dedup = document.get("deduplicationEnabled")
    return Policies(
        retention=Retention(
            int(retention.get("retentionTimeInMinutes", defaults.default_retention_time_minutes)),
            int(retention.get("retentionSizeInMB", defaults.default_retention_size_mb)),
        ),
        message_ttl_seconds=int(ttl if ttl is not None else defaults.ttl_duration_default_seconds),
        deduplication=bool(dedup if dedup is not None else defaults.deduplication_enabled),
        auto_topic_creation=AutoTopicCreation(
            bool(auto.get("allowAutoTopicCreation", defaults.allow_auto_topic_creation)),
            str(auto.get("topicType", defaults.allow_auto_topic_creation_type)),
            int(auto.get("defaultNumPartitions", defaults.default_num_partitions)),
        ),
        limits=TopicLimits(
            **{
                name: int(document[key])
                for key, name in LIMIT_FIELDS.items()
                if isinstance(document.get(key), int)
            }
        ),
        backlog_quota=_backlog_quota(document),
        inactive_topics=_inactive_topics(document),
        dispatch_rate=_dispatch_rate(document, "topicDispatchRate"),
        subscription_dispatch_rate=_dispatch_rate(document, "subscriptionDispatchRate"),
        replication_clusters=tuple(
            c for c in document.get("replication_clusters") or () if isinstance(c, str)
        ),
        compaction_threshold=_compaction_threshold(document, defaults),
        publish_rate=_publish_rate(document, defaults),
        subscription_expiration_minutes=float(
            document["subscription_expiration_time_minutes"]
            if isinstance(document.get("subscription_expiration_time_minutes"), int)
            else defaults.subscription_expiration_time_minutes
        ),
    )


def _compaction_threshold(document: dict[str, Any], defaults: TopicSettings) -> int:
    found = document.get("compaction_threshold")
    if isinstance(found, int) and not isinstance(found, bool) and found >= 0:
        return found
    return defaults.broker_service_compaction_threshold_in_bytes


def check_compaction_threshold(value: Any) -> int:
    if not _java_number(value, 0, JAVA_LONG_MAX):
        raise PolicyError(
            f"compactionThreshold must be a number of bytes from 0 to {JAVA_LONG_MAX}, got {value!r}"
        )
    return value


def check_retention(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise PolicyError('expected {"retentionTimeInMinutes": T, "retentionSizeInMB": S}')
    result = {}
    for key in ("retentionTimeInMinutes", "retentionSizeInMB"):
        number = value.get(key, 0)
        if not isinstance(number, int) or isinstance(number, bool) or number < -1:
            raise PolicyError(f"{key} must be an integer, -1 (no limit) or more; got {number!r}")
        result[key] = number
    return result


def check_ttl(value: Any) -> int:
    if not _java_number(value, 0, JAVA_INT_MAX):
        raise PolicyError(f"the message TTL must be a number of seconds >= 0, got {value!r}")
    return value


def check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{what} must be true or false, got {value!r}")
    return value


def check_auto_topic_creation(value: Any, max_partitions: int) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("allowAutoTopicCreation"), bool):
        raise PolicyError('expected {"allowAutoTopicCreation": true|false, "topicType": ...}')
    result: dict[str, Any] = {"allowAutoTopicCreation": value["allowAutoTopicCreation"]}
    topic_type = value.get("topicType", "non-partitioned")
    if topic_type not in AUTO_CREATION_TYPES:
        raise PolicyError(f"topicType must be non-partitioned or partitioned, got {topic_type!r}")
    result["topicType"] = topic_type
    if topic_type == "partitioned":
        partitions = value.get("defaultNumPartitions")
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise PolicyError("a partitioned auto-creation needs defaultNumPartitions >= 1")
        result["defaultNumPartitions"] = check_partition_count(partitions, max_partitions)
    return result
