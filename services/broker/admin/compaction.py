"""Admin REST of topic compaction, on Pulsar's paths (``{topic}`` is
``/admin/v2/persistent/{tenant}/{namespace}/{topic}``):

- ``PUT {topic}/compaction``: start compacting it (204; 409 while a run is under way). For a
  partitioned topic, every partition (each where it is served), as Pulsar does.
- ``GET {topic}/compaction``: the last run's status, Pulsar's LongRunningProcessStatus:
  ``{"status": "NOT_RUN|RUNNING|SUCCESS|ERROR", "lastError": ""}`` (of a topic, or of a
  partition; a partitioned topic has none, as in Pulsar: 404)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.subscriptions import TOPIC_PATH, persistent_topic
from magnetar.broker.cluster.lookup import lookup
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.records import read_partitioned
from magnetar.broker.topics.compaction import CompactionInProgressError
from magnetar.broker.topics.persistent import PersistentTopic

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: How long a partition's owner is waited on.
PARTITION_TIMEOUT_S = 30.0


def add_compaction_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.put(TOPIC_PATH + "/compaction")
    async def compact(request: web.Request) -> web.Response:
        name = requests.topic(request)
        if not name.persistent:
            raise AdminError(405, f"Topic {name} is non-persistent: it stores no messages")
        assert broker.store is not None
        record = await read_partitioned(broker.configuration_store, name)
        if record is not None and not record.deleted and name.partition_index < 0:
            await requests.require_namespace(broker, name.namespace_name)
            async with ClientSession(
                timeout=ClientTimeout(total=PARTITION_TIMEOUT_S),
                headers=broker.client_credentials.http_headers(),
            ) as http:
                for index in range(record.partitions):
                    await _compact_partition(broker, http, name.partition(index))
            return web.Response(status=204)
        _start(await persistent_topic(broker, request))
        return web.Response(status=204)

    @routes.get(TOPIC_PATH + "/compaction")
    async def compaction_status(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        return web.json_response(topic.compaction.status_document())


def _start(topic: PersistentTopic) -> None:
    try:
        topic.compaction.start()
    except CompactionInProgressError as e:
        raise AdminError(409, str(e)) from None


async def _compact_partition(
    broker: AdminBroker, http: ClientSession, partition: TopicName
) -> None:
    """Start compacting one partition where it is served (a partition never stored has
    nothing to compact)."""
    local = broker.topics.get(str(partition))
    if local is None:
        if not await broker.topic_exists(partition):
            return
        served_by = (await lookup(broker, partition, authoritative=True)).broker
        if served_by.broker_id != broker.info.broker_id:
            await _remote(http, served_by.http_url, partition)
            return
        local = await requests.existing_topic(broker, partition)
    if isinstance(local, PersistentTopic):
        _start(local)


async def _remote(http: ClientSession, base: str, partition: TopicName) -> None:
    url = requests.topic_admin_url(base, partition) / "compaction"
    try:
        async with http.put(url) as response:
            if response.status == 409:
                raise AdminError(409, f"Compaction already in progress for {partition}")
            if response.status != 204:
                raise AdminError(503, f"partition {partition}: HTTP {response.status} from {base}")
    except (ClientError, TimeoutError) as e:
        raise AdminError(503, f"partition {partition}: {base} did not answer ({e!r})") from None
