"""Admin REST of tenants, namespaces and their policies, on Pulsar's paths:

- ``GET    /admin/v2/tenants`` lists the tenants
- ``PUT|POST|GET|DELETE /admin/v2/tenants/{tenant}`` creates, updates, reads, deletes one: its
  record is Pulsar's TenantInfo, ``{"adminRoles": [...], "allowedClusters": [...]}``; the tenant
  routes are for superusers (Pulsar's, when authentication and authorization are on)
- ``GET    /admin/v2/namespaces/{tenant}`` lists its namespaces
- ``PUT    /admin/v2/namespaces/{tenant}/{namespace}`` (body: ``{"bundles": {"numBundles": n}}``)
- ``GET    /admin/v2/namespaces/{tenant}/{namespace}`` the namespace's policies: Pulsar's whole
  Policies document, unset fields at Pulsar's defaults
- ``GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/{policy}`` one policy, for
  ``retention``, ``messageTTL``, ``deduplication``, ``autoTopicCreation``,
  ``maxProducersPerTopic``, ``maxConsumersPerTopic``, ``maxConsumersPerSubscription``,
  ``maxUnackedMessagesPerConsumer``, ``maxUnackedMessagesPerSubscription``,
  ``inactiveTopicPolicies``, ``compactionThreshold`` (bytes; PUT too, as Pulsar) (see
  ``policies``)
- ``GET|POST|DELETE .../dispatchRate`` and ``.../subscriptionDispatchRate``: Pulsar's
  DispatchRate for each topic, and each subscription, of the namespace
- ``GET|POST|DELETE .../publishRate``: Pulsar's PublishRate for each topic of the namespace,
  ``{"publishThrottlingRateInMsg": N, "publishThrottlingRateInByte": N}`` a second
- ``GET|POST|DELETE .../subscriptionExpirationTime``: minutes a subscription with no consumer may
  stay idle before it is deleted (0: never; unset: the broker's setting)
- ``GET|PUT|DELETE .../properties``: the namespace's properties (PUT adds or changes some,
  DELETE clears them)
- ``POST|DELETE .../backlogQuota?backlogQuotaType=destination_storage|message_age`` (body:
  ``{"limitSize", "limitTime", "policy"}``), ``GET .../backlogQuotaMap``
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from magnetar.broker.admin import requests
from magnetar.broker.admin.errors import AdminError
from magnetar.broker.admin.permissions import require_superuser
from magnetar.broker.cluster import bundles as bundle_math
from magnetar.broker.cluster.bundles import load_or_create
from magnetar.broker.config import TopicSettings
from magnetar.broker.namespace import policies
from magnetar.broker.namespace.authorization import TenantInfo
from magnetar.broker.namespace.clusters import read_cluster
from magnetar.broker.namespace.policies import PartitionCountError, PolicyError, parse_document
from magnetar.broker.namespace.records import NAMESPACES_PATH, TENANTS_PATH
from magnetar.broker.schema import compatibility as schema_compatibility
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, NoSuchKeyError

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker

#: Admin path segment -> (field in the namespace's policy document, value check).
POLICY_FIELDS: dict[str, tuple[str, Callable[[Any, TopicSettings], Any]]] = {
    "retention": ("retention_policies", lambda v, _: policies.check_retention(v)),
    "messageTTL": ("message_ttl_in_seconds", lambda v, _: policies.check_ttl(v)),
    "deduplication": (
        "deduplicationEnabled",
        lambda v, _: policies.check_bool(v, "deduplication"),
    ),
    **{
        name: (field, lambda v, _, name=name: policies.check_limit(v, name))
        for name, field in (
            ("maxProducersPerTopic", "max_producers_per_topic"),
            ("maxConsumersPerTopic", "max_consumers_per_topic"),
            ("maxConsumersPerSubscription", "max_consumers_per_subscription"),
            ("maxUnackedMessagesPerConsumer", "max_unacked_messages_per_consumer"),
            ("maxUnackedMessagesPerSubscription", "max_unacked_messages_per_subscription"),
        )
    },
    "inactiveTopicPolicies": (
        "inactive_topic_policies",
        lambda v, _: policies.check_inactive_topics(v),
    ),
    "compactionThreshold": (
        "compaction_threshold",
        lambda v, _: policies.check_compaction_threshold(v),
    ),
    "schemaCompatibilityStrategy": (
        "schema_compatibility_strategy",
        lambda v, _: check_schema_strategy(v),
    ),
    "schemaValidationEnforced": (
        "schema_validation_enforced",
        lambda v, _: policies.check_bool(v, "schemaValidationEnforced"),
    ),
    "subscriptionExpirationTime": (
        "subscription_expiration_time_minutes",
        lambda v, _: policies.check_expiration_minutes(v),
    ),
    "autoTopicCreation": (
        "autoTopicCreationOverride",
        lambda v, limits: policies.check_auto_topic_creation(
            v, limits.max_num_partitions_per_partitioned_topic
        ),
    ),
}


#: The policies Pulsar sets with PUT (as a route's path segment).
PUT_POLICIES = "{policy:schemaCompatibilityStrategy|compactionThreshold}"

#: What GET answers for a policy that was never set, where Pulsar answers something else
#: than null.
POLICY_UNSET: dict[str, Any] = {
    "schema_compatibility_strategy": "UNDEFINED",
    "schema_validation_enforced": False,
}


#: The policy field holding ``{cluster: PublishRate}`` (a namespace's, or a topic's own).
PUBLISH_RATE = "publishMaxMessageRate"

#: Admin path segment -> the policy field holding ``{cluster: DispatchRate}``.
DISPATCH_RATES = {
    "dispatchRate": "topicDispatchRate",
    "subscriptionDispatchRate": "subscriptionDispatchRate",
}

#: Admin path segment -> (the policy field holding ``{cluster: rate}``, the rate's check):
#: the dispatch rates and the publish rate, read and set alike at both levels.
RATES: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    **{segment: (field, policies.check_dispatch_rate) for segment, field in DISPATCH_RATES.items()},
    "publishRate": (PUBLISH_RATE, policies.check_publish_rate),
}


def add_namespace_routes(routes: web.RouteTableDef, broker: AdminBroker) -> None:
    @routes.get("/admin/v2/tenants")
    async def list_tenants(request: web.Request) -> web.Response:
        assert broker.store is not None
        await require_superuser(request, broker)
        return web.json_response(await broker.configuration_store.children(TENANTS_PATH))

    @routes.put("/admin/v2/tenants/{tenant}")
    async def create_tenant(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant = requests.tenant(request)
        await require_superuser(request, broker)
        record = await _tenant_body(request)
        try:
            await broker.configuration_store.put(f"{TENANTS_PATH}/{tenant}", record, NOT_EXISTS)
        except BadVersionError:
            raise AdminError(409, "Tenant already exists") from None
        _tenant_changed(broker, tenant)
        return web.Response(status=204)

    @routes.get("/admin/v2/tenants/{tenant}")
    async def get_tenant(request: web.Request) -> web.Response:
        assert broker.store is not None
        await require_superuser(request, broker)
        found = await broker.configuration_store.get(f"{TENANTS_PATH}/{requests.tenant(request)}")
        if found is None:
            raise AdminError(404, "Tenant does not exist")
        return web.json_response(TenantInfo.from_bytes(found.value).to_json())

    @routes.post("/admin/v2/tenants/{tenant}")
    async def update_tenant(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant = requests.tenant(request)
        await require_superuser(request, broker)
        record = await _tenant_body(request)
        key = f"{TENANTS_PATH}/{tenant}"
        found = await broker.configuration_store.get(key)
        if found is None:
            raise AdminError(404, "Tenant does not exist")
        try:
            await broker.configuration_store.put(key, record, found.version)
        except BadVersionError:  # deleted or rewritten meanwhile: the caller decides again
            raise AdminError(409, "Concurrent modification") from None
        _tenant_changed(broker, tenant)
        return web.Response(status=204)

    @routes.delete("/admin/v2/tenants/{tenant}")
    async def delete_tenant(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant = requests.tenant(request)
        await require_superuser(request, broker)
        key = f"{TENANTS_PATH}/{tenant}"
        found = await broker.configuration_store.get(key)
        if found is None:
            raise AdminError(404, "Tenant does not exist")
        if await broker.configuration_store.children(f"{NAMESPACES_PATH}/{tenant}"):
            raise AdminError(409, "The tenant still has active namespaces")
        try:
            await broker.configuration_store.delete(key, found.version)
        except (BadVersionError, NoSuchKeyError):
            raise AdminError(409, "Concurrent modification") from None
        _tenant_changed(broker, tenant)
        return web.Response(status=204)

    @routes.get("/admin/v2/namespaces/{tenant}")
    async def list_namespaces(request: web.Request) -> web.Response:
        assert broker.store is not None
        tenant = requests.tenant(request)
        if await broker.configuration_store.get(f"{TENANTS_PATH}/{tenant}") is None:
            raise AdminError(404, f"Tenant does not exist: {tenant}")
        names = await broker.configuration_store.children(f"{NAMESPACES_PATH}/{tenant}")
        return web.json_response([f"{tenant}/{n}" for n in names])

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}")
    async def create_namespace(request: web.Request) -> web.Response:
        assert broker.store is not None
        namespace = requests.namespace(request)
        tenant = request.match_info["tenant"]
        if await broker.configuration_store.get(f"{TENANTS_PATH}/{tenant}") is None:
            raise AdminError(404, f"Tenant does not exist: {tenant}")
        body = await requests.json_body(request) if request.can_read_body else None
        if body is not None and not isinstance(body, dict):
            raise AdminError(400, f"the namespace's policies must be a JSON object, got {body!r}")
        count = _bundle_count(body)
        # Pulsar's policies body: {"bundles": {"numBundles": n}}, kept in the shared record so
        # every cluster's first bundles of the namespace are that many.
        record: dict[str, Any] = {} if count is None else {"bundles": {"numBundles": count}}
        # and {"replication_clusters": [...]} (pulsar-admin namespaces create --clusters),
        # checked as the replication route checks it.
        if isinstance(body, dict) and body.get("replication_clusters") is not None:
            record["replication_clusters"] = await checked_replication_clusters(
                broker, tenant, body["replication_clusters"]
            )
        try:
            await broker.configuration_store.put(
                f"{NAMESPACES_PATH}/{namespace}", json.dumps(record).encode(), NOT_EXISTS
            )
        except BadVersionError:
            raise AdminError(409, "Namespace already exists") from None
        if count is not None:
            await load_or_create(broker.store, namespace, count)
        return web.Response(status=204)

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}")
    async def get_policies(request: web.Request) -> web.Response:
        document = policies.full_document(await _policy_document(broker, request))
        # Pulsar's BundlesData, as .../bundles answers it.
        ranges = await broker.namespace_bundles(requests.namespace(request))
        return web.json_response({**document, "bundles": json.loads(bundle_math.encode(ranges))})

    for segment, (field, check) in RATES.items():

        async def get_rate(request: web.Request, field: str = field) -> web.Response:
            found = (await _policy_document(broker, request)).get(field) or {}
            return web.json_response(next(iter(found.values()), None))

        async def set_rate(
            request: web.Request,
            field: str = field,
            segment: str = segment,
            check: Callable[[Any], dict[str, Any]] = check,
        ) -> web.Response:
            namespace = requests.namespace(request)
            await _policy_document(broker, request)  # 404 for a missing namespace
            value = None
            if request.method == "POST":
                try:
                    rate = check(await requests.json_body(request))
                except PolicyError as e:
                    raise AdminError(400, f"{segment}: {e}") from None
                value = {broker.config.cluster_name: rate}
            await _update_policies(broker, f"{NAMESPACES_PATH}/{namespace}", field, value)
            broker.policies_changed()
            return web.Response(status=204)

        routes.get(f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{segment}")(get_rate)
        routes.post(f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{segment}")(set_rate)
        routes.delete(f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{segment}")(set_rate)

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/properties")
    async def get_properties(request: web.Request) -> web.Response:
        return web.json_response((await _policy_document(broker, request)).get("properties") or {})

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}/properties")
    @routes.delete("/admin/v2/namespaces/{tenant}/{namespace}/properties")
    async def set_properties(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        merged = None
        if request.method == "PUT":
            body = await requests.json_body(request)
            if not isinstance(body, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in body.items()
            ):
                raise AdminError(412, 'expected the properties as {"key": "value", ...}')
            merged = {**((await _policy_document(broker, request)).get("properties") or {}), **body}
        await _update_policies(broker, f"{NAMESPACES_PATH}/{namespace}", "properties", merged)
        return web.Response(status=204)

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/backlogQuotaMap")
    async def backlog_quota_map(request: web.Request) -> web.Response:
        document = await _policy_document(broker, request)
        return web.json_response(document.get("backlog_quota_map") or {})

    @routes.post("/admin/v2/namespaces/{tenant}/{namespace}/backlogQuota")
    @routes.delete("/admin/v2/namespaces/{tenant}/{namespace}/backlogQuota")
    async def backlog_quota(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        kind = request.query.get("backlogQuotaType", "destination_storage")
        if kind not in policies.QUOTA_TYPES:
            raise AdminError(
                412, f"backlogQuotaType must be one of {', '.join(policies.QUOTA_TYPES)}"
            )
        key = f"{NAMESPACES_PATH}/{namespace}"
        found = await _policy_document(broker, request)
        quotas = dict(found.get("backlog_quota_map") or {})
        if request.method == "POST":
            try:
                quotas[kind] = policies.check_backlog_quota(await requests.json_body(request))
            except PolicyError as e:
                raise AdminError(400, f"backlogQuota: {e}") from None
        else:
            quotas.pop(kind, None)
        await _update_policies(broker, key, "backlog_quota_map", quotas or None)
        broker.policies_changed()
        return web.Response(status=204)

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/{policy}")
    async def get_policy(request: web.Request) -> web.Response:
        key, _check = _policy_field(request)
        document = await _policy_document(broker, request)
        return web.json_response(document.get(key, POLICY_UNSET.get(key)))

    # Pulsar sets the strategy and the compaction threshold with PUT (the others with POST).
    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}/" + PUT_POLICIES)
    @routes.post("/admin/v2/namespaces/{tenant}/{namespace}/{policy}")
    @routes.delete("/admin/v2/namespaces/{tenant}/{namespace}/{policy}")
    async def set_policy(request: web.Request) -> web.Response:
        namespace = requests.namespace(request)
        key, check = _policy_field(request)
        value = None
        if request.method in ("POST", "PUT"):
            body = await requests.json_body(request)
            try:
                value = check(body, broker.config)
            except PartitionCountError as e:
                raise AdminError(406, str(e)) from None
            except PolicyError as e:
                raise AdminError(400, f"{request.match_info['policy']}: {e}") from None
        await _update_policies(broker, f"{NAMESPACES_PATH}/{namespace}", key, value)
        broker.policies_changed()
        return web.Response(status=204)


async def _tenant_body(request: web.Request) -> bytes:
    """The stored record of a tenant PUT or POST: its TenantInfo body, ``{}`` when empty."""
    if not request.can_read_body or not (await request.text()).strip():
        return b"{}"
    body = await requests.json_body(request)
    if not isinstance(body, dict):
        raise AdminError(412, 'expected {"adminRoles": [...], "allowedClusters": [...]}')
    record: dict[str, list[str]] = {}
    for field in ("adminRoles", "allowedClusters"):
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise AdminError(412, f"{field} must be a list of names, got {value!r}")
        record[field] = list(dict.fromkeys(value))
    return json.dumps(record).encode()


def _tenant_changed(broker: AdminBroker, tenant: str) -> None:
    """This broker's authorization sees the tenant's new admins at once."""
    authorization = getattr(broker, "authorization", None)  # absent in admin-only test brokers
    if authorization is not None:
        authorization.invalidate(tenant=tenant)


async def checked_replication_clusters(
    broker: AdminBroker, tenant: str, clusters: Any
) -> list[str]:
    """``clusters`` as a namespace's replication list, checked as Pulsar does: a non-empty list
    of names, each allowed by the tenant (403) and registered or the local cluster (412)."""
    if not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters):
        raise AdminError(412, 'expected a list of cluster names: ["a", "b"]')
    if not clusters:  # Pulsar's rule and words
        raise AdminError(412, "ClusterIds should not be null or empty")
    found = await broker.configuration_store.get(f"{TENANTS_PATH}/{tenant}")
    if found is None:
        raise AdminError(404, f"Tenant does not exist: {tenant}")
    allowed = json.loads(found.value or b"{}").get("allowedClusters") or []
    local = broker.config.cluster_name
    for cluster in clusters:
        if cluster not in allowed:
            raise AdminError(
                403, f"Cluster {cluster} is not in the list of allowed clusters of {tenant}"
            )
        if cluster != local and await read_cluster(broker.configuration_store, cluster) is None:
            raise AdminError(412, f"Cluster {cluster} is not registered")
    return list(dict.fromkeys(clusters))


def _bundle_count(body: Any) -> int | None:
    """``bundles.numBundles`` of a namespace-creation body, if one was sent (1..1024)."""
    bundles = body.get("bundles") if isinstance(body, dict) else None
    if bundles is None:
        return None
    count = bundles.get("numBundles") if isinstance(bundles, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1024:
        raise AdminError(412, f"bundles.numBundles must be between 1 and 1024, got {count!r}")
    return count


def check_schema_strategy(value: Any) -> str:
    """A schemaCompatibilityStrategy name (a namespace's or a topic's), PolicyError if none."""
    try:
        return schema_compatibility.check_strategy(value)
    except ValueError as e:
        raise PolicyError(str(e)) from None


def _policy_field(request: web.Request) -> tuple[str, Callable[[Any, TopicSettings], Any]]:
    field = POLICY_FIELDS.get(request.match_info["policy"])
    if field is None:
        raise AdminError(404, f"unknown namespace policy {request.match_info['policy']!r}")
    return field


async def _policy_document(broker: AdminBroker, request: web.Request) -> dict[str, Any]:
    return parse_document(await requests.require_namespace(broker, requests.namespace(request)))


async def _update_policies(broker: AdminBroker, key: str, field: str, value: Any) -> None:
    """Set (or remove, for None) one field of a namespace's policy document, by CAS."""
    assert broker.store is not None
    while True:
        found = await broker.configuration_store.get(key)
        if found is None:
            raise AdminError(
                404, f"Namespace does not exist: {key.removeprefix(NAMESPACES_PATH + '/')}"
            )
        document = parse_document(found.value)
        if value is None:
            document.pop(field, None)
        else:
            document[field] = value
        try:
            await broker.configuration_store.put(key, json.dumps(document).encode(), found.version)
            return
        except BadVersionError:
            continue  # changed meanwhile: apply to the new version
