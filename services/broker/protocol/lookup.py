"""PARTITIONED_METADATA, LOOKUP and GET_TOPICS_OF_NAMESPACE: where a client finds its topics."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from magnetar.broker.cluster.lookup import LookupKind, lookup
from magnetar.broker.errors import NamespaceNotInClusterError
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.protocol import errors
from magnetar.broker.protocol.authorization import may_list, may_look_up
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

if TYPE_CHECKING:
    from magnetar.broker.protocol.connection import ServerConnection

log = logging.getLogger(__name__)


def partitioned_metadata(
    conn: ServerConnection, body: pb.CommandPartitionedTopicMetadata, frame: codec.Frame
) -> None:
    reply = pb.CommandPartitionedTopicMetadataResponse
    conn.spawn(_answer_partitioned_metadata(conn, body), body, reply)


async def _answer_partitioned_metadata(
    conn: ServerConnection, body: pb.CommandPartitionedTopicMetadata
) -> None:
    reply = pb.CommandPartitionedTopicMetadataResponse
    name = conn.topic_name(body.topic, body.request_id, reply)
    if name is None or not await may_look_up(
        conn, body.request_id, name, reply, "Get Partition Metadata"
    ):
        return
    try:
        await served_in_this_cluster(conn, name)
        partitions = await conn.broker.partitions_for_client(name)
    except Exception as e:
        conn.refuse(
            body.request_id,
            name,
            e,
            errors.PARTITIONED_METADATA,
            errors.PARTITIONS_UNREADABLE,
            reply,
        )
        return
    conn.send(reply(request_id=body.request_id, partitions=partitions, response=reply.Success))


async def served_in_this_cluster(conn: ServerConnection, name: TopicName) -> None:
    """Raise NamespaceNotInClusterError when the topic's namespace is replicated to clusters
    that leave this one out: Pulsar answers its lookups there with an error naming them."""
    try:
        policies = await conn.broker.namespace_policies(name.namespace_name)
    except Exception as e:
        # No such namespace (answered as before, where the topic is used), or the
        # configuration store out of reach: clients of topics loaded here are still served.
        log.debug("lookup of %s: replication list not read (%s)", name, e)
        return
    missing = policies.missing_cluster(conn.broker.config.cluster_name, name.namespace_name)
    if missing is not None:
        raise NamespaceNotInClusterError(missing)


def lookup_topic(conn: ServerConnection, body: pb.CommandLookupTopic, frame: codec.Frame) -> None:
    conn.spawn(_answer_lookup(conn, body), body, pb.CommandLookupTopicResponse)


async def _answer_lookup(conn: ServerConnection, body: pb.CommandLookupTopic) -> None:
    reply = pb.CommandLookupTopicResponse
    name = conn.topic_name(body.topic, body.request_id, reply)
    if name is None or not await may_look_up(conn, body.request_id, name, reply, "Lookup"):
        return
    listener = body.advertised_listener_name
    if listener and listener not in conn.broker.listener_names:
        conn.error(
            body.request_id,
            pb.ServiceNotReady,
            f"the broker has no advertised listener named {listener!r}",
            reply,
        )
        return
    counts = conn.broker.metrics.lookup_counts
    try:
        with counts.measure():
            await served_in_this_cluster(conn, name)
            answer = await lookup(conn.broker, name, body.authoritative)
    except Exception as e:
        conn.refuse(body.request_id, name, e, errors.LOOKUP, errors.LOOKUP_FAILED, reply)
        return
    counts.answered(redirect=answer.kind is not LookupKind.CONNECT)
    conn.send(
        reply(
            request_id=body.request_id,
            response=reply.Connect if answer.kind is LookupKind.CONNECT else reply.Redirect,
            brokerServiceUrl=answer.broker.service_url,
            brokerServiceUrlTls=answer.broker.service_url_tls or None,
            authoritative=answer.authoritative,
        )
    )


def topics_of_namespace(
    conn: ServerConnection, body: pb.CommandGetTopicsOfNamespace, frame: codec.Frame
) -> None:
    conn.spawn(_answer_topics_of_namespace(conn, body), body)


async def _answer_topics_of_namespace(
    conn: ServerConnection, body: pb.CommandGetTopicsOfNamespace
) -> None:
    mode = pb.CommandGetTopicsOfNamespace
    domains = {
        mode.PERSISTENT: ("persistent",),
        mode.NON_PERSISTENT: ("non-persistent",),
        mode.ALL: ("persistent", "non-persistent"),
    }[body.mode]
    if body.namespace.count("/") != 1:
        conn.error(
            body.request_id,
            pb.MetadataError,
            f"namespace {body.namespace!r}: expected tenant/namespace",
        )
        return
    if not await may_list(conn, body.request_id, body.namespace):
        return
    try:
        topics = await conn.broker.list_topics(body.namespace, domains)
    except Exception as e:
        conn.refuse(body.request_id, body.namespace, e, (), errors.TOPICS_UNREADABLE)
        return
    # Not filtered by topics_pattern here: the client applies its pattern itself.
    conn.send(pb.CommandGetTopicsOfNamespaceResponse(request_id=body.request_id, topics=topics))
