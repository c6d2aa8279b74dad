"""The admin REST app on the broker's HTTP port, on Pulsar's ``/admin/v2/...`` paths (a first
subset), built from one route adder per resource group:

- ``brokers``: the broker's version, configuration, topic stats and load report; the bookies
- ``cluster``: clusters, brokers, the leader, bundles, unloading and splitting, the HTTP lookup
- ``schemas``: the schema registry
- ``status``: ``/health`` and ``/metrics``
- ``namespaces``: tenants, namespaces and their policies
- ``replication``: a namespace's replication clusters
- ``namespace_topics``: a namespace's topics, deleting it, its (or a bundle's) backlog cleared
  and subscriptions removed
- ``topics``: non-partitioned topics, their stats and subscriptions
- ``subscriptions``: creating, skipping, expiring and resetting a subscription
- ``messages``: peeking and examining messages, by position, id and time
- ``topic_housekeeping``: a topic's bundle, properties and trimming
- ``termination``: terminating a topic, or each partition of a partitioned one
- ``compaction``: starting a topic's compaction and its status
- ``topic_policies``: a topic's own policies, over its namespace's
- ``partitioned``: partitioned topics (their delete goes to each partition's owner)
- ``partitioned_stats``: their stats, each partition's from its owner, added up

Every request is authenticated first (``authentication.authentication``, a middleware: the
caller's role is on the request before its route runs), then authorized for what it asks
(``authorization.authorization``, the table of who may call what). Errors are Pulsar's, answered in one
place (``errors.errors``, the middleware): handlers raise ``AdminError``. What the routes need
of the broker is ``service.AdminBroker``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from magnetar.broker.admin.authentication import authentication
from magnetar.broker.admin.authorization import authorization
from magnetar.broker.admin.brokers import add_broker_routes
from magnetar.broker.admin.cluster import add_cluster_routes
from magnetar.broker.admin.compaction import add_compaction_routes
from magnetar.broker.admin.errors import errors
from magnetar.broker.admin.messages import add_message_routes
from magnetar.broker.admin.namespace_topics import add_namespace_topic_routes
from magnetar.broker.admin.namespaces import add_namespace_routes
from magnetar.broker.admin.partitioned import add_partitioned_routes
from magnetar.broker.admin.partitioned_stats import add_partitioned_stats_routes
from magnetar.broker.admin.permissions import add_permission_routes
from magnetar.broker.admin.replication import add_replication_routes
from magnetar.broker.admin.schemas import add_schema_routes
from magnetar.broker.admin.status import add_health_routes, add_metrics_routes
from magnetar.broker.admin.subscriptions import add_subscription_routes
from magnetar.broker.admin.termination import add_termination_routes
from magnetar.broker.admin.topic_housekeeping import add_topic_housekeeping_routes
from magnetar.broker.admin.topic_policies import add_topic_policy_routes
from magnetar.broker.admin.topics import add_topic_routes

if TYPE_CHECKING:
    from magnetar.broker.admin.service import AdminBroker


def build_app(broker: AdminBroker) -> web.Application:
    routes = web.RouteTableDef()
    # In this order: the router tries routes as added, and the cluster's paths are more
    # specific than the namespace policies' (``.../{namespace}/bundles`` before ``{policy}``).
    for add in (
        add_permission_routes,  # before the namespace policies' ``.../{policy}``
        add_broker_routes,  # before the cluster's ``/brokers/{cluster}``
        add_cluster_routes,
        add_schema_routes,
        add_health_routes,
        add_namespace_topic_routes,  # before the namespace policies' ``.../{policy}``
        add_replication_routes,  # before the namespace policies' ``.../{policy}``
        add_namespace_routes,
        add_topic_routes,
        add_subscription_routes,
        add_message_routes,
        add_topic_housekeeping_routes,
        add_termination_routes,
        add_compaction_routes,
        add_topic_policy_routes,
        add_partitioned_routes,
        add_partitioned_stats_routes,
        add_metrics_routes,
    ):
        add(routes, broker)
    app = web.Application(middlewares=[errors, authentication(broker), authorization(broker)])
    app.add_routes(routes)
    return app
