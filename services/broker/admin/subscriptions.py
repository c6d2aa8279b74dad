"""Admin REST of a persistent topic's subscriptions, the operations an operator reaches for
when something is stuck, on Pulsar's paths (``{topic}`` is
``/admin/v2/persistent/{tenant}/{namespace}/{topic}``):

- ``PUT    {topic}/subscription/{sub}`` creates it with no consumer (body: optional message id,
  ``{"ledgerId": l, "entryId": e}``; default the latest message); 409 if it exists
- ``POST   {topic}/subscription/{sub}/skip/{n}`` skips ``n`` entries; ``.../skip_all`` all
- ``POST   {topic}/subscription/{sub}/expireMessages/{seconds}`` acknowledges what is older;
  ``{topic}/all_subscription/expireMessages/{seconds}`` for every subscription
- ``POST   {topic}/subscription/{sub}/resetcursor/{timestamp}`` to the first message published
  at or after ``timestamp`` (ms); ``POST .../resetcursor`` with a message id body to that
  message (``"isExcluded": true``: after it). Consumers are told to reconnect and receive from
  there.

All answer 204; 404 for a missing topic or subscription; 405 on a non-persistent topic (it stores
nothing to move over). A topic another broker owns is redirected there (307), as every topic call.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.topics import NAMESPACE_PATH
from magnetar.broker.model.position import Position
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.broker.topics.subscription import Subscription, SubscriptionExistsError
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

TOPIC_PATH = NAMESPACE_PATH + "/{topic}"
SUBSCRIPTION_PATH = TOPIC_PATH + "/subscription/{subscription}"


async def persistent_topic(broker: AdminBroker, request: web.Request) -> PersistentTopic:
    """The request's topic, which must exist and be persistent (405 otherwise, as Pulsar
    answers for what a non-persistent topic does not support)."""
    topic = await requests.existing_topic(broker, requests.topic(request))
    if not isinstance(topic, PersistentTopic):
        raise AdminError(405, f"Topic {topic.name} is non-persistent: it stores no messages")
    return topic


def subscription_of(topic: PersistentTopic, request: web.Request) -> Subscription:
    name = request.match_info["subscription"]
    found = topic.subscriptions.get(name)
    if found is None or not found.durable:
        raise AdminError(404, "Subscription not found")
    return found


def positive(request: web.Request, field: str) -> int:
    text = request.match_info[field]
    try:
        value = int(text)
    except ValueError:
        raise AdminError(412, f"{field} must be a number, got {text!r}") from None
    if value < 0:
        raise AdminError(412, f"{field} must not be negative, got {value}")
    return value


def message_id_body(body: Any) -> tuple[pb.MessageIdData, bool]:
    """Pulsar's MessageIdImpl / ResetCursorData JSON: ``ledgerId``, ``entryId`` (and
    ``partitionIndex``, ``batchIndex``, ``isExcluded``)."""
    if not isinstance(body, dict):
        raise AdminError(412, 'expected a message id: {"ledgerId": l, "entryId": e}')
    ledger, entry = body.get("ledgerId"), body.get("entryId")
    if not isinstance(ledger, int) or not isinstance(entry, int):
        raise AdminError(412, f"ledgerId and entryId must be numbers, got {body!r}")
    message_id = pb.MessageIdData(ledgerId=ledger & (2**64 - 1), entryId=entry & (2**64 - 1))
    return message_id, bool(body.get("isExcluded", False))


def add_subscription_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.put(SUBSCRIPTION_PATH)
    async def create_subscription(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        start = None
        if request.can_read_body and (await request.text()).strip():
            start, _excluded = message_id_body(await requests.json_body(request))
        try:
            await topic.create_subscription(request.match_info["subscription"], start)
        except SubscriptionExistsError as e:
            raise AdminError(409, str(e)) from None
        return web.Response(status=204)

    @routes.post(SUBSCRIPTION_PATH + "/skip/{numMessages}")
    async def skip(request: web.Request) -> web.Response:
        count = positive(request, "numMessages")
        subscription_of(await persistent_topic(broker, request), request).skip(count)
        return web.Response(status=204)

    @routes.post(SUBSCRIPTION_PATH + "/skip_all")
    async def skip_all(request: web.Request) -> web.Response:
        subscription_of(await persistent_topic(broker, request), request).clear_backlog()
        return web.Response(status=204)

    @routes.post(SUBSCRIPTION_PATH + "/expireMessages/{expireTimeInSeconds}")
    async def expire(request: web.Request) -> web.Response:
        seconds = positive(request, "expireTimeInSeconds")
        subscription = subscription_of(await persistent_topic(broker, request), request)
        await subscription.expire_before(int(time.time() * 1000) - seconds * 1000)
        return web.Response(status=204)

    @routes.post(TOPIC_PATH + "/all_subscription/expireMessages/{expireTimeInSeconds}")
    async def expire_all(request: web.Request) -> web.Response:
        seconds = positive(request, "expireTimeInSeconds")
        topic = await persistent_topic(broker, request)
        cutoff = int(time.time() * 1000) - seconds * 1000
        for subscription in list(topic.subscriptions.values()):
            if subscription.durable:
                await subscription.expire_before(cutoff)
        return web.Response(status=204)

    @routes.post(SUBSCRIPTION_PATH + "/replicatedSubscriptionStatus")
    async def set_replicated(request: web.Request) -> web.Response:
        enabled = await requests.json_body(request)
        if not isinstance(enabled, bool):
            raise AdminError(400, f"the body must be true or false, got {enabled!r}")
        if enabled and not broker.config.enable_replicated_subscriptions:
            raise AdminError(
                405,
                "Cannot enable replicated subscriptions: enable_replicated_subscriptions is off",
            )
        topic = await persistent_topic(broker, request)
        await topic.set_replicated(subscription_of(topic, request), enabled)
        return web.Response(status=204)

    @routes.get(SUBSCRIPTION_PATH + "/replicatedSubscriptionStatus")
    async def get_replicated(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        return web.json_response({str(topic.name): subscription_of(topic, request).replicated})

    @routes.post(SUBSCRIPTION_PATH + "/resetcursor/{timestamp}")
    async def reset_by_time(request: web.Request) -> web.Response:
        timestamp = positive(request, "timestamp")
        subscription = subscription_of(await persistent_topic(broker, request), request)
        await subscription.reset_cursor(None, timestamp)
        return web.Response(status=204)

    @routes.post(SUBSCRIPTION_PATH + "/resetcursor")
    async def reset_by_id(request: web.Request) -> web.Response:
        topic = await persistent_topic(broker, request)
        subscription = subscription_of(topic, request)
        message_id, excluded = message_id_body(await requests.json_body(request))
        position: Position = topic.position_for(message_id)
        if excluded:
            position = topic.ml.next_position(position)
        await subscription.reset_cursor(position, None)
        return web.Response(status=204)
