"""Reading an admin request: its JSON body, its tenant, namespace and topic (validated as Pulsar
does: 412 for a bad name), its flags; and the existence checks the topic routes share."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web
from yarl import URL

from magnetar.broker.admin.errors import AdminError
from magnetar.broker.model.keys import managed_ledger_key
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.records import NAMESPACES_PATH, valid_name

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker
    from magnetar.broker.topics.service import Topic


async def json_body(request: web.Request) -> Any:
    """The request body as JSON; anything unparseable (bad UTF-8, bad JSON, nesting deep
    enough to exhaust the parser's recursion) is the client's error: 400."""
    try:
        return json.loads(await request.text())
    except RecursionError:
        raise AdminError(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise AdminError(400, f"request body is not valid JSON: {e}") from None


def flag(request: web.Request, name: str) -> bool:
    """A ``?name=true`` query flag (absent: false)."""
    return request.query.get(name, "false").lower() == "true"


def tenant(request: web.Request) -> str:
    name = request.match_info["tenant"]
    if not valid_name(name):
        raise AdminError(412, f"Tenant name is not valid: {name!r}")
    return name


def namespace(request: web.Request) -> str:
    """``tenant/namespace`` from the path; Pulsar answers 412 for an invalid part of either."""
    tenant, namespace = request.match_info["tenant"], request.match_info["namespace"]
    if not valid_name(tenant) or not valid_name(namespace):
        raise AdminError(412, f"Namespace name is not valid: {tenant}/{namespace}")
    return f"{tenant}/{namespace}"


def topic(request: web.Request, domain: str | None = None) -> TopicName:
    """The topic named by the path (``domain`` when the path has none, as the schema routes'),
    its namespace validated first."""
    m = request.match_info
    ns = namespace(request)
    return TopicName.parse(f"{domain or m['domain']}://{ns}/{m['topic']}")


async def require_namespace(broker: AdminBroker, namespace: str) -> bytes:
    """404 for a missing namespace; its stored policy record (for ``parse_document``)."""
    assert broker.store is not None
    found = await broker.configuration_store.get(f"{NAMESPACES_PATH}/{namespace}")
    if found is None:
        raise AdminError(404, f"Namespace does not exist: {namespace}")
    return found.value


async def stored_or_loaded(broker: AdminBroker, name: TopicName) -> bool:
    """A non-partitioned topic that exists as such: loaded here, or (persistent) stored."""
    assert broker.store is not None
    if str(name) in broker.topics:
        return True
    if not name.persistent:
        return False
    return await broker.store.get(managed_ledger_key(name.managed_ledger_name)) is not None


async def existing_topic(broker: AdminBroker, name: TopicName) -> Topic:
    """The topic, loaded if it is stored but not loaded yet; 404 if it does not exist (nothing
    is created). A partition of an existing partitioned topic exists, as in Pulsar."""
    found = broker.topics.get(str(name))
    if found is not None:
        return found
    if not name.persistent or not await broker.topic_exists(name):
        raise AdminError(404, f"Topic {name} not found")
    return await broker.get_topic(name)


def topic_admin_url(base: str, name: TopicName) -> URL:
    """``{base}/admin/v2/{domain}/{tenant}/{namespace}/{topic}``: the topic's admin path on the
    broker at ``base`` (where a partition is served)."""
    return URL(base).joinpath(
        "admin", "v2", name.domain, name.tenant, name.namespace, name.local_name
    )
