"""Admin REST of partitioned topics, on Pulsar's paths:

- ``PUT    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` body: the partition count
- ``POST   /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` body: a larger count
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` -> ``{"partitions": N}``
- ``DELETE /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions`` (``?force``): every
  partition's data, at the broker serving it, then the metadata (``delete_partitioned_topic``)
- ``POST   /admin/v2/{domain}/{tenant}/{namespace}/{topic}/createMissedPartitions``: each
  partition not stored yet is created where it is served
- ``GET    /admin/v2/{domain}/{tenant}/{namespace}/partitioned`` lists partitioned topics

Partitioned-topic metadata lives in the metadata store at
``/magnetar/admin/partitioned-topics/<tenant>/<namespace>/<domain>/<topic>`` as
``{"partitions": N}``, with ``"deleted": true`` while a delete is under way
(``policies.PartitionedTopicRecord``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aiohttp import ClientError, ClientResponse, ClientSession, ClientTimeout, web
from yarl import URL

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.topics import NAMESPACE_PATH
from magnetar.broker.cluster.lookup import lookup
from magnetar.broker.errors import TopicBusyError, TopicNotOwnedError
from magnetar.broker.model.keys import MANAGED_LEDGERS_PATH, decode_name
from magnetar.broker.model.topic_name import PARTITION_SUFFIX, TopicName
from magnetar.broker.namespace import policies
from magnetar.broker.namespace.policies import (
    PartitionCountError,
    PartitionedMetadataError,
    PartitionedTopicRecord,
    PolicyError,
)
from magnetar.broker.namespace.records import (
    delete_topic_policies,
    partitioned_key,
    partitioned_topics,
    read_partitioned,
)
from magnetar.common.metadata import NOT_EXISTS, BadVersionError

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker
    from magnetar.common.cluster.broker_info import BrokerInfo

log = logging.getLogger(__name__)


def add_partitioned_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    base = NAMESPACE_PATH

    @routes.put(base + "/{topic}/partitions")
    async def create_partitioned(request: web.Request) -> web.Response:
        name = requests.topic(request)
        if PARTITION_SUFFIX in name.local_name:
            raise AdminError(412, f"Partitioned Topic Name should not contain '{PARTITION_SUFFIX}'")
        partitions = _partition_count_body(await requests.json_body(request), _limit(broker))
        await create_partitioned_topic(broker, name, partitions)
        return web.Response(status=204)

    @routes.post(base + "/{topic}/partitions")
    async def update_partitioned(request: web.Request) -> web.Response:
        name = requests.topic(request)
        partitions = _partition_count_body(await requests.json_body(request), _limit(broker))
        await update_partitioned_topic(broker, name, partitions)
        return web.Response(status=204)

    @routes.get(base + "/{topic}/partitions")
    async def get_partitions(request: web.Request) -> web.Response:
        record = await read_partitioned(broker.configuration_store, requests.topic(request))
        if record is None:
            return web.json_response({"partitions": 0})
        answer: dict[str, Any] = {"partitions": record.partitions}
        if record.deleted:  # an interrupted delete: the next DELETE finishes it
            answer["deleted"] = True
        return web.json_response(answer)

    #: Partitioned topics being deleted by this broker: a second DELETE waits for the first.
    deleting: dict[str, asyncio.Event] = {}

    @routes.delete(base + "/{topic}/partitions")
    async def delete_partitioned(request: web.Request) -> web.Response:
        name = requests.topic(request)
        force = requests.flag(request, "force")
        await requests.require_namespace(broker, name.namespace_name)
        key = str(name)
        while key in deleting:
            await deleting[key].wait()
        done = deleting[key] = asyncio.Event()
        try:
            await delete_partitioned_topic(broker, name, force=force)
        finally:
            del deleting[key]
            done.set()
        return web.Response(status=204)

    @routes.post(base + "/{topic}/createMissedPartitions")
    async def create_missed_partitions(request: web.Request) -> web.Response:
        name = requests.topic(request)
        await requests.require_namespace(broker, name.namespace_name)
        assert broker.store is not None
        record = await read_partitioned(broker.configuration_store, name)
        if record is None or record.deleted:
            raise AdminError(404, f"Partitioned Topic not found: {name}")
        if name.persistent:
            await create_missed_partitions_of(broker, name, record.partitions)
        return web.Response(status=204)

    @routes.get(base + "/partitioned")
    async def list_partitioned(request: web.Request) -> web.Response:
        m = request.match_info
        await requests.require_namespace(broker, requests.namespace(request))
        return web.json_response(
            await partitioned_topics(
                broker.configuration_store, m["tenant"], m["namespace"], m["domain"]
            )
        )


def _limit(broker: AdminBroker) -> int:
    return broker.config.max_num_partitions_per_partitioned_topic


def _partition_count_body(value: Any, limit: int) -> int:
    try:
        return policies.check_partition_count(value, limit)
    except PartitionCountError as e:
        raise AdminError(406, str(e)) from None
    except PolicyError as e:
        raise AdminError(400, str(e)) from None


async def create_partitioned_topic(broker: AdminBroker, name: TopicName, partitions: int) -> None:
    """Store a partitioned topic's metadata, as Pulsar refuses it: 404 without the namespace,
    409 over an existing non-partitioned topic (its backlog would hide behind the partitions)
    or partitioned one. ``partitions`` is already bounded."""
    assert broker.store is not None
    await requests.require_namespace(broker, name.namespace_name)
    if await requests.stored_or_loaded(broker, name):
        raise AdminError(409, f"This topic already exists: {name} is a non-partitioned topic")
    try:
        await broker.configuration_store.put(
            partitioned_key(name), PartitionedTopicRecord(partitions).to_bytes(), NOT_EXISTS
        )
    except BadVersionError:
        existing = await read_partitioned(broker.configuration_store, name)
        if existing is not None and existing.deleted:
            raise AdminError(
                409,
                f"Partitioned topic already exists: {name} is being deleted (a delete was "
                "interrupted): DELETE it again to finish, then create it",
            ) from None
        raise AdminError(409, f"Partitioned topic already exists: {name}") from None
    log.info("partitioned topic %s created (%d partitions)", name, partitions)


async def create_missed_partitions_of(broker: AdminBroker, name: TopicName, count: int) -> None:
    """Pulsar's createMissedPartitions: every partition not stored yet is created where it is
    served (here, or by a PUT at its owner)."""
    async with ClientSession(
        timeout=ClientTimeout(total=PARTITION_DELETE_TIMEOUT_S),
        headers=broker.client_credentials.http_headers(),
    ) as http:
        for index in range(count):
            partition = name.partition(index)
            if await requests.stored_or_loaded(broker, partition):
                continue
            served_by = (await lookup(broker, partition, authoritative=True)).broker
            if served_by.broker_id == broker.info.broker_id:
                await broker.get_topic(partition)
                continue
            try:
                async with http.put(_topic_url(served_by, partition)) as response:
                    if response.status not in (204, 409):  # created, or there already
                        raise AdminError(
                            503,
                            f"partition {partition} not created at {served_by.broker_id} "
                            f"(HTTP {response.status}: {await _reason(response)})",
                        )
            except (ClientError, TimeoutError) as e:
                raise AdminError(
                    503, f"partition {partition}: {served_by.broker_id} did not answer ({e!r})"
                ) from None
        log.info("partitioned topic %s: missing partitions created", name)


async def update_partitioned_topic(broker: AdminBroker, name: TopicName, partitions: int) -> None:
    """Grow a partitioned topic (Pulsar never shrinks one: 422 otherwise), by CAS."""
    assert broker.store is not None
    while True:
        found = await broker.configuration_store.get(partitioned_key(name))
        if found is None:
            raise AdminError(404, f"Partitioned topic {name} does not exist")
        record = PartitionedTopicRecord.from_bytes(found.value, str(name))
        if record.deleted:
            raise AdminError(
                409, f"Partitioned topic {name} is being deleted: DELETE it again to finish"
            )
        current = record.partitions
        if partitions <= current:
            raise AdminError(
                422,
                "Number of new partitions must be greater than existing number of partitions "
                f"({current})",
            )
        try:
            await broker.configuration_store.put(
                partitioned_key(name),
                replace(record, partitions=partitions).to_bytes(),
                found.version,
            )
        except BadVersionError:
            continue  # changed meanwhile: check against the new count
        log.info("partitioned topic %s grown from %d to %d partitions", name, current, partitions)
        return


#: Longest one partition's delete, or the count of its clients, may take at its owner.
PARTITION_DELETE_TIMEOUT_S = 60.0
#: Times a partition that moved to another broker while being deleted is followed.
PARTITION_DELETE_ATTEMPTS = 3


class PartitionBusyError(Exception):
    """A partition still has producers or consumers (delete without force)."""


async def delete_partitioned_topic(broker: AdminBroker, name: TopicName, *, force: bool) -> None:
    """Delete a partitioned topic: every partition's data (managed ledger, ledgers, cursors),
    then its metadata, in Pulsar's order (``internalDeletePartitionedTopic``):

    1. Without ``force``, the partitions' producers and consumers are counted, each partition
       at the broker that serves it: any at all is 412 and nothing changes.
    2. The record is marked ``deleted`` (CAS). From then on no client gets a partition
       (``Broker.check_partition``), none is created, the topic cannot grow, and
       PARTITIONED_METADATA answers TopicNotFound: what is deleted stays deleted.
    3. Each partition goes through the plain topic delete (``Broker.delete_topic``; with
       ``force`` its clients are closed first) at the broker owning its bundle: this one if it
       owns it, or takes it because nobody does; else the plain DELETE is sent to the owner,
       which alone knows the partition's clients and may have it loaded, so its data is never
       deleted behind the owner's back. Partitions already gone are skipped.
    4. The record goes last, once every partition is gone, so there is never a partition
       without its parent.

    Interrupted anywhere (a crash, an owner unreachable, a client that connected between 1 and
    2), the record stays, marked: the topic is still listed as partitioned, refuses clients, and
    the next DELETE (``force`` or not) carries on from where this one stopped.
    """
    assert broker.store is not None
    key = partitioned_key(name)
    while True:
        found = await broker.configuration_store.get(key)
        if found is None:
            raise AdminError(404, f"Partitioned topic {name} does not exist")
        try:
            record = PartitionedTopicRecord.from_bytes(found.value, str(name))
        except PartitionedMetadataError as e:
            log.warning("%s; deleting the partitions stored for it", e)
            record = PartitionedTopicRecord(0)
        partitions = await _partitions_to_delete(broker, name, record.partitions)
        if record.deleted:
            log.info("partitioned topic %s: finishing an interrupted delete", name)
            break
        if not force:
            await _refuse_if_busy(broker, name, partitions)
        try:
            await broker.configuration_store.put(
                key, replace(record, deleted=True).to_bytes(), found.version
            )
        except BadVersionError:
            continue  # grown or marked meanwhile: look again
        log.info(
            "partitioned topic %s: marked deleted; deleting %d partitions", name, len(partitions)
        )
        break
    async with ClientSession(
        timeout=ClientTimeout(total=PARTITION_DELETE_TIMEOUT_S),
        headers=broker.client_credentials.http_headers(),
    ) as http:
        for partition in partitions:
            await _delete_partition(broker, http, name, partition, force)
        # A client that passed the partition check just before the mark may have stored its
        # partition after that partition was looked at: look once more before the record goes.
        for partition in await _partitions_to_delete(broker, name, 0):
            await _delete_partition(broker, http, name, partition, force)
    await delete_topic_policies(broker.store, name)
    await broker.configuration_store.delete(key)
    log.info("partitioned topic %s deleted (%d partitions)", name, len(partitions))


async def _partitions_to_delete(
    broker: AdminBroker, name: TopicName, count: int
) -> list[TopicName]:
    """Partitions 0..``count``-1 (a count beyond ``max_num_partitions_per_partitioned_topic``, a
    damaged record, is not walked), and every partition stored beyond them."""
    assert broker.store is not None
    indexes = set(range(count)) if 0 < count <= _limit(broker) else set()
    prefix = f"{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}{PARTITION_SUFFIX}"
    for segment in await broker.store.children(MANAGED_LEDGERS_PATH):
        stored = decode_name(segment)
        index = stored.removeprefix(prefix)
        if stored.startswith(prefix) and index.isdigit() and str(int(index)) == index:
            indexes.add(int(index))
    return [name.partition(i) for i in sorted(indexes)]


async def _owner_of(broker: AdminBroker, name: TopicName) -> BrokerInfo | None:
    """The broker serving ``name``'s bundle as the store says now (None: nobody)."""
    assert broker.ownership is not None
    return await broker.ownership.read_owner(name.namespace_name, await broker.bundle_of(name))


def _clients_in(stats: dict[str, Any]) -> int:
    """Producers and consumers in a topic's stats (Pulsar's TopicStats)."""
    return len(stats.get("publishers", ())) + sum(
        len(s.get("consumers", ())) for s in stats.get("subscriptions", {}).values()
    )


async def _refuse_if_busy(
    broker: AdminBroker, name: TopicName, partitions: list[TopicName]
) -> None:
    """412 if any partition has a producer or consumer, counted where the partition is served
    (a partition loaded nowhere has none)."""
    busy: dict[str, int] = {}
    async with ClientSession(
        timeout=ClientTimeout(total=PARTITION_DELETE_TIMEOUT_S),
        headers=broker.client_credentials.http_headers(),
    ) as http:
        for partition in partitions:
            topic = broker.topics.get(str(partition))
            if topic is not None:
                clients = _clients_in(topic.stats())
            else:
                owner = await _owner_of(broker, partition)
                if owner is None or owner.broker_id == broker.info.broker_id:
                    continue  # served nowhere, or here and not loaded
                clients = await _remote_clients(http, owner, partition)
            if clients:
                busy[partition.local_name] = clients
    if busy:
        raise AdminError(
            412,
            f"Partitioned topic {name} has {sum(busy.values())} producer(s)/consumer(s) "
            f"connected (on {', '.join(sorted(busy))}); use force=true",
        )


def _topic_url(owner: BrokerInfo, name: TopicName) -> URL:
    return requests.topic_admin_url(owner.http_url, name)


async def _remote_clients(http: ClientSession, owner: BrokerInfo, name: TopicName) -> int:
    """Clients of ``name`` at ``owner`` (its stats; redirects to a newer owner followed)."""
    try:
        async with http.get(_topic_url(owner, name) / "stats") as response:
            if response.status == 404:
                return 0
            if response.status != 200:
                raise AdminError(
                    503,
                    f"partition {name}: its clients cannot be counted at {owner.broker_id} "
                    f"(HTTP {response.status}: {await _reason(response)}); nothing was deleted",
                )
            return _clients_in(await response.json())
    except (ClientError, TimeoutError) as e:
        raise AdminError(
            503,
            f"partition {name}: its owner {owner.broker_id} did not answer ({e!r}); "
            "nothing was deleted",
        ) from None


async def _reason(response: ClientResponse) -> str:
    text = await response.text()
    try:
        return str(json.loads(text)["reason"])
    except (ValueError, KeyError, TypeError):
        return text[:200]


async def _delete_partition(
    broker: AdminBroker, http: ClientSession, parent: TopicName, name: TopicName, force: bool
) -> None:
    """Delete one partition where it is served (see ``delete_partitioned_topic``); a partition
    that is gone already is fine."""
    try:
        for _ in range(PARTITION_DELETE_ATTEMPTS):
            if name.persistent and not await requests.stored_or_loaded(broker, name):
                return
            if not name.persistent and str(name) not in broker.topics:
                if await _owner_of(broker, name) is None:
                    return  # served nowhere: a non-persistent partition exists only where served
            # authoritative: an unowned bundle is taken here rather than placed by the leader.
            served_by = (await lookup(broker, name, authoritative=True)).broker
            if served_by.broker_id != broker.info.broker_id:
                await _forward_delete(http, served_by, name, force)
                return
            try:
                if await requests.stored_or_loaded(broker, name):
                    await broker.delete_topic(name, force=force)
                return
            except TopicNotOwnedError:
                continue  # moved meanwhile: follow it
        raise AdminError(
            503,
            f"partition {name} kept moving between brokers while being deleted; partitioned "
            f"topic {parent} stays marked deleted: DELETE it again to finish",
        )
    except (TopicBusyError, PartitionBusyError) as e:
        raise AdminError(
            412,
            f"{e}: it connected while partitioned topic {parent} was being deleted; the topic "
            "stays marked deleted and refuses new clients: DELETE it again to finish (force=true "
            "closes the clients)",
        ) from None


async def _forward_delete(
    http: ClientSession, owner: BrokerInfo, name: TopicName, force: bool
) -> None:
    """The plain topic DELETE at ``owner`` (redirects to a newer owner followed)."""
    url = _topic_url(owner, name).with_query(force="true" if force else "false")
    try:
        async with http.delete(url) as response:
            if response.status in (204, 404):  # deleted, or gone already
                return
            reason = await _reason(response)
            if response.status == 412:
                raise PartitionBusyError(reason)
            raise AdminError(
                503,
                f"partition {name} was not deleted at {owner.broker_id} (HTTP {response.status}: "
                f"{reason}); partitioned topic {name.partitioned_topic_name} stays marked "
                "deleted: DELETE it again to finish",
            )
    except (ClientError, TimeoutError) as e:
        raise AdminError(
            503,
            f"partition {name}: its owner {owner.broker_id} did not answer ({e!r}); partitioned "
            f"topic {name.partitioned_topic_name} stays marked deleted: DELETE it again to finish",
        ) from None
