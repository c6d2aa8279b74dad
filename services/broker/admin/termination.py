"""Admin REST of topic termination, on Pulsar's paths (``{topic}`` is
``/admin/v2/{domain}/{tenant}/{namespace}/{topic}``):

- ``POST {topic}/terminate``: the topic takes no more messages, ever; answers the last
  message's id, ``{"ledgerId": l, "entryId": e, "partitionIndex": p}``. 405 for a partitioned
  topic and for a non-persistent one (it stores nothing to end), 404 for a missing topic.
- ``POST {topic}/terminate/partitions``: each partition of a partitioned topic terminated where
  it is served; answers ``{"0": MessageId, "1": ...}`` (Pulsar's map of partition index to
  message id). 405 for a non-partitioned or non-persistent topic.

Producers are then refused (TopicTerminatedError); consumers are told when they have read and
acknowledged everything (REACHED_END_OF_TOPIC). The state is kept with the topic's managed
ledger: a restart or a move keeps it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.subscriptions import TOPIC_PATH, persistent_topic
from magnetar.broker.cluster.lookup import lookup
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.records import read_partitioned
from magnetar.broker.topics.persistent import PersistentTopic

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: How long one partition's owner is waited on.
PARTITION_TIMEOUT_S = 30.0


def message_id_json(ledger_id: int, entry_id: int, partition: int) -> dict[str, int]:
    """Pulsar's MessageIdImpl as its admin API writes it."""
    return {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": partition}


async def _terminate_local(topic: PersistentTopic) -> dict[str, int]:
    last = await topic.terminate()
    return message_id_json(last.ledger_id, last.entry_id, topic.name.partition_index)


async def _terminate_remote(http: ClientSession, base: str, partition: TopicName) -> Any:
    url = requests.topic_admin_url(base, partition) / "terminate"
    try:
        async with http.post(url) as response:
            if response.status != 200:
                raise AdminError(503, f"partition {partition}: HTTP {response.status} from {base}")
            return await response.json()
    except (ClientError, TimeoutError) as e:
        raise AdminError(503, f"partition {partition}: {base} did not answer ({e!r})") from None


def add_termination_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.post(TOPIC_PATH + "/terminate")
    async def terminate(request: web.Request) -> web.Response:
        name = requests.topic(request)
        await requests.require_namespace(broker, name.namespace_name)
        assert broker.store is not None
        record = await read_partitioned(broker.configuration_store, name)
        if record is not None and not record.deleted and name.partition_index < 0:
            raise AdminError(405, "Termination of a partitioned topic is not allowed")
        if not name.persistent:
            raise AdminError(405, "Termination of a non-persistent topic is not allowed")
        topic = await persistent_topic(broker, request)
        return web.json_response(await _terminate_local(topic))

    @routes.post(TOPIC_PATH + "/terminate/partitions")
    async def terminate_partitions(request: web.Request) -> web.Response:
        name = requests.topic(request)
        await requests.require_namespace(broker, name.namespace_name)
        if not name.persistent:
            raise AdminError(405, "Termination of a non-persistent topic is not allowed")
        assert broker.store is not None
        record = await read_partitioned(broker.configuration_store, name)
        if name.partition_index >= 0 or record is None or record.deleted:
            raise AdminError(
                405, f"Termination of a non-partitioned topic is not allowed here: {name}"
            )
        answer: dict[str, Any] = {}
        async with ClientSession(
            timeout=ClientTimeout(total=PARTITION_TIMEOUT_S),
            headers=broker.client_credentials.http_headers(),
        ) as http:
            for index in range(record.partitions):
                partition = name.partition(index)
                local = broker.topics.get(str(partition))
                if local is None:
                    served_by = (await lookup(broker, partition, authoritative=True)).broker
                    if served_by.broker_id != broker.info.broker_id:
                        answer[str(index)] = await _terminate_remote(
                            http, served_by.http_url, partition
                        )
                        continue
                    local = await broker.get_topic(partition)
                assert isinstance(local, PersistentTopic)
                answer[str(index)] = await _terminate_local(local)
        return web.json_response(answer)
