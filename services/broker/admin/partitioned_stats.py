"""Stats of a partitioned topic, on Pulsar's paths and in its shapes:

- ``GET {topic}/partitioned-stats`` (``?perPartition=false``: empty ``partitions``):
  Pulsar's PartitionedTopicStats, the partitions' TopicStats added up (rates, counters, sizes;
  publishers listed together; subscriptions merged by name, their consumers listed together),
  ``metadata: {"partitions": N}`` and ``partitions: {name: TopicStats}``
- ``GET {topic}/partitioned-internalStats``: ``{"metadata": {...}, "partitions": {name:
  PersistentTopicInternalStats}}``

Each partition's stats come from the broker serving it (asked over HTTP when that is another
one); a partition not stored anywhere yet has none and is left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.subscriptions import TOPIC_PATH
from magnetar.broker.cluster.lookup import lookup
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import PartitionedMetadataError
from magnetar.broker.namespace.records import read_partitioned
from magnetar.broker.topics.persistent import PersistentTopic

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: How long one partition's owner is waited on.
PARTITION_STATS_TIMEOUT_S = 30.0
#: Summed when partitions' stats are added up (Pulsar's TopicStatsImpl.add).
TOPIC_SUMS = (
    "msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "bytesInCounter",
    "msgInCounter", "bytesOutCounter", "msgOutCounter", "storageSize", "backlogSize",
    "offloadedStorageSize", "waitingPublishers", "publishRateLimitedTimes",
)  # fmt: skip
SUBSCRIPTION_SUMS = (
    "msgRateOut", "msgThroughputOut", "bytesOutCounter", "msgOutCounter", "msgRateRedeliver",
    "chunkedMessageRate", "msgBacklog", "backlogSize", "msgBacklogNoDelayed", "msgDelayed",
    "unackedMessages", "msgRateExpired", "totalMsgExpired",
)  # fmt: skip
#: Summed per remote cluster (Pulsar's ReplicatorStatsImpl.add); ``connected`` holds when it
#: holds for every partition, ``replicationDelayInSeconds`` is the largest.
REPLICATION_SUMS = (
    "msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "msgRateExpired",
    "replicationBacklog", "msgOutCounter", "bytesOutCounter",
)  # fmt: skip


def add_up(partitions: list[dict[str, Any]]) -> dict[str, Any]:
    """The partitions' TopicStats as one (PartitionedTopicStats without its two extra fields)."""
    total: dict[str, Any] = {key: 0 for key in TOPIC_SUMS}
    total.update(publishers=[], subscriptions={}, replication={}, averageMsgSize=0.0)
    total["deduplicationStatus"] = "Disabled"
    for stats in partitions:
        total["deduplicationStatus"] = stats.get("deduplicationStatus", "Disabled")
        for key in TOPIC_SUMS:
            total[key] += stats.get(key, 0)
        total["publishers"].extend(stats.get("publishers", []))
        for name, sub in stats.get("subscriptions", {}).items():
            merged = total["subscriptions"].get(name)
            if merged is None:
                total["subscriptions"][name] = {**sub, "consumers": list(sub.get("consumers", []))}
                continue
            for key in SUBSCRIPTION_SUMS:
                if key in sub:
                    merged[key] = merged.get(key, 0) + sub[key]
            merged["consumers"].extend(sub.get("consumers", []))
        for remote, replication in stats.get("replication", {}).items():
            merged = total["replication"].get(remote)
            if merged is None:
                total["replication"][remote] = dict(replication)
                continue
            for key in REPLICATION_SUMS:
                if key in replication:
                    merged[key] = merged.get(key, 0) + replication[key]
            merged["connected"] = bool(merged.get("connected")) and bool(
                replication.get("connected")
            )
            merged["replicationDelayInSeconds"] = max(
                merged.get("replicationDelayInSeconds", 0),
                replication.get("replicationDelayInSeconds", 0),
            )
    if total["msgInCounter"]:
        total["averageMsgSize"] = total["bytesInCounter"] / total["msgInCounter"]
    return total


async def _record_count(broker: AdminBroker, name: TopicName) -> int:
    assert broker.store is not None
    try:
        record = await read_partitioned(broker.configuration_store, name)
    except PartitionedMetadataError as e:
        raise AdminError(500, str(e)) from None
    if record is None or record.deleted:
        raise AdminError(404, f"Partitioned Topic not found: {name} is not a partitioned topic")
    return record.partitions


async def _each_partition(
    broker: AdminBroker, name: TopicName, what: str
) -> tuple[int, dict[str, dict[str, Any]]]:
    """``what`` (``stats`` or ``internalStats``) of each partition, where it is served."""
    if name.partition_index >= 0:
        raise AdminError(412, f"{name} is a partition, not a partitioned topic")
    count = await _record_count(broker, name)
    found: dict[str, dict[str, Any]] = {}
    async with ClientSession(
        timeout=ClientTimeout(total=PARTITION_STATS_TIMEOUT_S),
        headers=broker.client_credentials.http_headers(),
    ) as http:
        for index in range(count):
            partition = name.partition(index)
            local = broker.topics.get(str(partition))
            if local is None and await broker.topic_exists(partition):
                served_by = (await lookup(broker, partition, authoritative=True)).broker
                if served_by.broker_id != broker.info.broker_id:
                    remote = await _remote(http, served_by.http_url, partition, what)
                    if remote is not None:
                        found[str(partition)] = remote
                    continue
                local = await requests.existing_topic(broker, partition)
            if local is None:
                continue  # never stored: nothing to show
            if what == "stats":
                found[str(partition)] = local.stats()
            elif isinstance(local, PersistentTopic):
                found[str(partition)] = local.internal_stats()
    return count, found


async def _remote(
    http: ClientSession, base: str, partition: TopicName, what: str
) -> dict[str, Any] | None:
    url = requests.topic_admin_url(base, partition) / what
    try:
        async with http.get(url) as response:
            if response.status == 404:
                return None
            if response.status != 200:
                raise AdminError(503, f"partition {partition}: HTTP {response.status} from {base}")
            document: dict[str, Any] = await response.json()
            return document
    except (ClientError, TimeoutError) as e:
        raise AdminError(503, f"partition {partition}: {base} did not answer ({e!r})") from None


def add_partitioned_stats_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get(TOPIC_PATH + "/partitioned-stats")
    async def partitioned_stats(request: web.Request) -> web.Response:
        name = requests.topic(request)
        count, partitions = await _each_partition(broker, name, "stats")
        document = {**add_up(list(partitions.values())), "metadata": {"partitions": count}}
        per_partition = request.query.get("perPartition", "true").lower() != "false"
        document["partitions"] = partitions if per_partition else {}
        return web.json_response(document)

    @routes.get(TOPIC_PATH + "/partitioned-internalStats")
    async def partitioned_internal_stats(request: web.Request) -> web.Response:
        name = requests.topic(request)
        if not name.persistent:
            raise AdminError(405, f"Topic {name} is non-persistent: it has no storage")
        count, partitions = await _each_partition(broker, name, "internalStats")
        return web.json_response({"metadata": {"partitions": count}, "partitions": partitions})
