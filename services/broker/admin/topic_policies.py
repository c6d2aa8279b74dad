"""Topic-level policies, on Pulsar's paths (``{topic}`` is
``/admin/v2/{domain}/{tenant}/{namespace}/{topic}``): a topic sets for itself what its namespace
sets for all its topics, and Pulsar's resolution applies, topic over namespace over broker.

- ``GET|POST|DELETE {topic}/retention`` (``{"retentionTimeInMinutes", "retentionSizeInMB"}``)
- ``GET|POST|DELETE {topic}/messageTTL`` (``POST ...?messageTTL=N``, or N as the body)
- ``GET|POST|DELETE {topic}/deduplicationEnabled`` (true/false)
- ``GET|POST|DELETE {topic}/maxProducers``, ``.../maxConsumers``,
  ``.../maxConsumersPerSubscription``, ``.../maxUnackedMessagesOnConsumer``,
  ``.../maxUnackedMessagesOnSubscription`` (N)
- ``GET|POST|DELETE {topic}/inactiveTopicPolicies``
- ``GET|POST|DELETE {topic}/compactionThreshold`` (bytes)
- ``GET|POST|DELETE {topic}/dispatchRate``, ``.../subscriptionDispatchRate`` (DispatchRate)
- ``GET|POST|DELETE {topic}/publishRate`` (PublishRate)
- ``POST|DELETE {topic}/backlogQuota?backlogQuotaType=...``, ``GET {topic}/backlogQuotaMap``
- ``GET|PUT|DELETE {topic}/schemaCompatibilityStrategy`` (a strategy name, set with PUT as
  Pulsar's; ``GET ...?applied=true`` answers the one in force: the topic's, else the
  namespace's, else the broker's FULL)

GET answers the topic's own value (null: none, the namespace's applies). A partitioned topic's
policies apply to its partitions. They are kept in the metadata store
(``records.topic_policies_key``); the topic's owner answers (307 from another broker) and applies
them at once, other brokers at their next policy round.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.namespaces import RATES, check_schema_strategy
from magnetar.broker.admin.subscriptions import TOPIC_PATH
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace import policies
from magnetar.broker.namespace.policies import PolicyError, parse_document
from magnetar.broker.namespace.records import (
    read_partitioned,
    topic_policies_key,
)
from magnetar.broker.schema import compatibility as schema_compatibility
from magnetar.broker.schema.registry import SchemaRegistry
from magnetar.common.metadata import NOT_EXISTS, BadVersionError

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

Check = Callable[[Any], Any]

#: Path segment -> (field of the policy document, value check); the fields are the namespace's.
TOPIC_POLICIES: dict[str, tuple[str, Check]] = {
    "retention": ("retention_policies", policies.check_retention),
    "messageTTL": ("message_ttl_in_seconds", policies.check_ttl),
    "deduplicationEnabled": (
        "deduplicationEnabled",
        lambda v: policies.check_bool(v, "deduplicationEnabled"),
    ),
    "maxProducers": (
        "max_producers_per_topic",
        lambda v: policies.check_limit(v, "maxProducers"),
    ),
    "maxConsumers": (
        "max_consumers_per_topic",
        lambda v: policies.check_limit(v, "maxConsumers"),
    ),
    "maxConsumersPerSubscription": (
        "max_consumers_per_subscription",
        lambda v: policies.check_limit(v, "maxConsumersPerSubscription"),
    ),
    "maxUnackedMessagesOnConsumer": (
        "max_unacked_messages_per_consumer",
        lambda v: policies.check_limit(v, "maxUnackedMessagesOnConsumer"),
    ),
    "maxUnackedMessagesOnSubscription": (
        "max_unacked_messages_per_subscription",
        lambda v: policies.check_limit(v, "maxUnackedMessagesOnSubscription"),
    ),
    "inactiveTopicPolicies": ("inactive_topic_policies", policies.check_inactive_topics),
    "compactionThreshold": ("compaction_threshold", policies.check_compaction_threshold),
    "schemaCompatibilityStrategy": ("schema_compatibility_strategy", check_schema_strategy),
}
#: Set with PUT, as Pulsar's admin does (the others with POST).
SET_WITH_PUT = frozenset({"schemaCompatibilityStrategy"})


async def _existing(broker: AdminBroker, request: web.Request) -> TopicName:
    """The path's topic, which must exist: a partitioned topic, or a topic its owner serves
    (404 otherwise; 307 to the owner from another broker)."""
    name = requests.topic(request)
    await requests.require_namespace(broker, name.namespace_name)
    assert broker.store is not None
    record = await read_partitioned(broker.configuration_store, name)
    if record is None or record.deleted:
        await requests.existing_topic(broker, name)
    return name


async def _document(broker: AdminBroker, name: TopicName) -> dict[str, Any]:
    assert broker.store is not None
    found = await broker.store.get(topic_policies_key(name))
    return parse_document(found.value) if found is not None else {}


async def _update(broker: AdminBroker, name: TopicName, field: str, value: Any) -> None:
    """Set (None: remove) one field of the topic's policy document, by CAS."""
    assert broker.store is not None
    key = topic_policies_key(name)
    while True:
        found = await broker.store.get(key)
        document = parse_document(found.value) if found is not None else {}
        if value is None:
            document.pop(field, None)
        else:
            document[field] = value
        try:
            await broker.store.put(
                key, json.dumps(document).encode(), found.version if found else NOT_EXISTS
            )
        except BadVersionError:
            continue  # changed meanwhile: apply to the new version
        broker.policies_changed()
        return


def add_topic_policy_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    for segment, (field, check) in TOPIC_POLICIES.items():

        async def get_policy(request: web.Request, field: str = field) -> web.Response:
            name = await _existing(broker, request)
            own = (await _document(broker, name)).get(field)
            if field == "schema_compatibility_strategy" and requests.flag(request, "applied"):
                assert broker.store is not None
                registry = SchemaRegistry(broker.store, broker.configuration_store)
                applied = await registry.strategy(name)  # UNDEFINED: neither set one
                return web.json_response(
                    schema_compatibility.DEFAULT_STRATEGY if applied == "UNDEFINED" else applied
                )
            return web.json_response(own)

        async def set_policy(
            request: web.Request, field: str = field, check: Check = check, segment: str = segment
        ) -> web.Response:
            name = await _existing(broker, request)
            value = None
            if request.method in ("POST", "PUT"):
                if segment == "messageTTL" and "messageTTL" in request.query:
                    try:
                        body: Any = int(request.query["messageTTL"])
                    except ValueError:
                        raise AdminError(412, "messageTTL must be a number of seconds") from None
                else:
                    body = await requests.json_body(request)
                try:
                    value = check(body)
                except PolicyError as e:
                    raise AdminError(400, f"{segment}: {e}") from None
            await _update(broker, name, field, value)
            return web.Response(status=204)

        routes.get(f"{TOPIC_PATH}/{segment}")(get_policy)
        if segment in SET_WITH_PUT:
            routes.put(f"{TOPIC_PATH}/{segment}")(set_policy)
        else:
            routes.post(f"{TOPIC_PATH}/{segment}")(set_policy)
        routes.delete(f"{TOPIC_PATH}/{segment}")(set_policy)

    for segment, (field, check) in RATES.items():

        async def get_rate(request: web.Request, field: str = field) -> web.Response:
            name = await _existing(broker, request)
            found = (await _document(broker, name)).get(field) or {}
            return web.json_response(next(iter(found.values()), None))

        async def set_rate(
            request: web.Request,
            field: str = field,
            segment: str = segment,
            check: Callable[[Any], dict[str, Any]] = check,
        ) -> web.Response:
            name = await _existing(broker, request)
            value = None
            if request.method == "POST":
                try:
                    rate = check(await requests.json_body(request))
                except PolicyError as e:
                    raise AdminError(400, f"{segment}: {e}") from None
                value = {broker.config.cluster_name: rate}
            await _update(broker, name, field, value)
            return web.Response(status=204)

        routes.get(f"{TOPIC_PATH}/{segment}")(get_rate)
        routes.post(f"{TOPIC_PATH}/{segment}")(set_rate)
        routes.delete(f"{TOPIC_PATH}/{segment}")(set_rate)

    @routes.get(TOPIC_PATH + "/backlogQuotaMap")
    async def backlog_quota_map(request: web.Request) -> web.Response:
        name = await _existing(broker, request)
        return web.json_response((await _document(broker, name)).get("backlog_quota_map") or {})

    @routes.post(TOPIC_PATH + "/backlogQuota")
    @routes.delete(TOPIC_PATH + "/backlogQuota")
    async def backlog_quota(request: web.Request) -> web.Response:
        name = await _existing(broker, request)
        kind = request.query.get("backlogQuotaType", "destination_storage")
        if kind not in policies.QUOTA_TYPES:
            raise AdminError(
                412, f"backlogQuotaType must be one of {', '.join(policies.QUOTA_TYPES)}"
            )
        quotas = dict((await _document(broker, name)).get("backlog_quota_map") or {})
        if request.method == "POST":
            try:
                quotas[kind] = policies.check_backlog_quota(await requests.json_body(request))
            except PolicyError as e:
                raise AdminError(400, f"backlogQuota: {e}") from None
        else:
            quotas.pop(kind, None)
        await _update(broker, name, "backlog_quota_map", quotas or None)
        return web.Response(status=204)
