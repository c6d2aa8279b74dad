"""How a refused request is answered: one table from exception type to Pulsar ``ServerError``
and message, used by every command handler.

A handler names the exception types it answers (in the order it tests them, a ladder) and the
answer for any other failure (its fallback, logged as a warning): ``refusal`` picks the row.
Each message is a template with ``{name}`` (the topic, or namespace, asked about) and
``{error}`` (the exception's text).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from magnetar.broker.errors import (
    NamespaceNotFoundError,
    NamespaceNotInClusterError,
    ProducerHeldByQuotaError,
    ProducerRefusedByQuotaError,
    TopicNotFoundError,
    TopicNotOwnedError,
    TopicTerminatedError,
)
from magnetar.broker.schema.registry import IncompatibleSchemaError, SchemaNotFoundError
from magnetar.broker.topics.compaction import ReadCompactedNotAllowedError
from magnetar.broker.topics.dispatchers.base import ConsumerBusyError
from magnetar.broker.topics.producers import ProducerBusyError, ProducerFencedError
from magnetar.broker.topics.subscription import SubscriptionTypeError
from magnetar.common.proto import pulsar_api_pb2 as pb


@dataclass(slots=True, frozen=True)
class Refusal:
    """The answer to a refused request."""

    error: int  # a pb.ServerError
    message: str  # template: {name} the topic or namespace, {error} the exception's text
    #: A warning logged with (name, error) before answering; None: nothing logged.
    log: str | None = None
    #: The topic is not served here: the connection's not-served path answers (and may close).
    not_served: bool = False

    def text(self, name: object, error: BaseException) -> str:
        return self.message.format(name=name, error=error)


#: The one table: how each refusal the handlers know is answered.
REFUSALS: dict[type[Exception], Refusal] = {
    NamespaceNotFoundError: Refusal(pb.TopicNotFound, "{error}"),
    # Pulsar answers a lookup in a cluster the namespace is not replicated to with MetadataError.
    NamespaceNotInClusterError: Refusal(pb.MetadataError, "{error}"),
    TopicNotFoundError: Refusal(pb.TopicNotFound, "{error}"),
    # Pulsar's words, so the client looks the topic up again; they must not name an unload in
    # progress (the official clients keep the connection for such a message).
    TopicNotOwnedError: Refusal(
        pb.ServiceNotReady,
        "Namespace bundle for topic ({name}) not served by this instance ({error}). "
        "Please redo the lookup.",
        not_served=True,
    ),
    ConsumerBusyError: Refusal(pb.ConsumerBusy, "{error}"),
    # Pulsar answers a type mismatch as a busy subscription (the client does not retry).
    SubscriptionTypeError: Refusal(pb.ConsumerBusy, "{error}"),
    NotImplementedError: Refusal(pb.NotAllowedError, "{error}"),
    ReadCompactedNotAllowedError: Refusal(pb.NotAllowedError, "{error}"),
    IncompatibleSchemaError: Refusal(pb.IncompatibleSchema, "{error}"),
    # Pulsar's answer for a topic without a schema: the client then reads bytes.
    SchemaNotFoundError: Refusal(pb.TopicNotFound, "no schema: {error}"),
    ProducerFencedError: Refusal(pb.ProducerFenced, "topic {name}: {error}"),
    ProducerBusyError: Refusal(pb.ProducerBusy, "topic {name}: {error}"),
    TopicTerminatedError: Refusal(pb.TopicTerminatedError, "{error}"),
    ProducerHeldByQuotaError: Refusal(pb.ProducerBlockedQuotaExceededError, "{error}"),
    ProducerRefusedByQuotaError: Refusal(pb.ProducerBlockedQuotaExceededException, "{error}"),
}

# -- which rows each request answers, in ladder order ---------------------------------------------

#: Loading a topic for a producer or a consumer.
TOPIC_LOADING: tuple[type[Exception], ...] = (
    NamespaceNotFoundError,
    TopicNotFoundError,
    TopicNotOwnedError,
)
#: Creating a consumer: its subscription's rules first, then loading its topic.
SUBSCRIBING: tuple[type[Exception], ...] = (
    ConsumerBusyError,
    SubscriptionTypeError,
    NotImplementedError,
    ReadCompactedNotAllowedError,
    IncompatibleSchemaError,
    *TOPIC_LOADING,
)
#: Adding a producer to a loaded topic (access modes, fencing).
PRODUCER_ACCESS: tuple[type[Exception], ...] = (ProducerFencedError, ProducerBusyError)
#: Whether the topic takes a new producer now (terminated, backlog over a producer quota).
PRODUCER_ADMISSION: tuple[type[Exception], ...] = (
    TopicTerminatedError,
    ProducerHeldByQuotaError,
    ProducerRefusedByQuotaError,
)
PARTITIONED_METADATA: tuple[type[Exception], ...] = (
    NamespaceNotFoundError,
    NamespaceNotInClusterError,
    TopicNotFoundError,
)
LOOKUP: tuple[type[Exception], ...] = (NamespaceNotFoundError, NamespaceNotInClusterError)
GET_SCHEMA: tuple[type[Exception], ...] = (SchemaNotFoundError,)
PUT_SCHEMA: tuple[type[Exception], ...] = (IncompatibleSchemaError,)

# -- fallbacks: any other failure (the store, the ledger): an answer, not a client timeout ---------

TOPIC_NOT_LOADED = Refusal(
    pb.ServiceNotReady,
    "topic {name} cannot be loaded: {error}",
    log="topic %s cannot be loaded: %s",
)
PARTITIONS_UNREADABLE = Refusal(
    pb.MetadataError, "partitioned metadata: {error}", log="partitioned metadata of %s: %s"
)
#: No leader yet, the store failing: the client retries.
LOOKUP_FAILED = Refusal(pb.ServiceNotReady, "lookup of {name}: {error}", log="lookup of %s: %s")
TOPICS_UNREADABLE = Refusal(
    pb.MetadataError, "topics of {name}: {error}", log="topics of namespace %s: %s"
)
SCHEMA_UNREADABLE = Refusal(
    pb.MetadataError, "schema of {name}: {error}", log="topic %s: schema registry: %s"
)
#: A producer's schema not stored: an answer the client retries on.
PRODUCER_SCHEMA_FAILED = Refusal(
    pb.ServiceNotReady, "topic {name}: schema: {error}", log="topic %s: schema registry: %s"
)
#: The topic epoch must survive a move before the producer has it.
EPOCH_NOT_STORED = Refusal(
    pb.ServiceNotReady, "topic {name}: {error}", log="topic %s: topic epoch not stored: %s"
)
LAST_MESSAGE_ID_UNREADABLE = Refusal(
    pb.PersistenceError, "last message id: {error}", log="topic %s: last message id: %s"
)


def refusal(
    error: Exception, answered: Iterable[type[Exception]], fallback: Refusal | None = None
) -> Refusal:
    """The answer to ``error``: the row of the first type in ``answered`` it is an instance of,
    else ``fallback``; with no fallback an unanswered ``error`` is raised again."""
    for kind in answered:
        if isinstance(error, kind):
            return REFUSALS[kind]
    if fallback is None:
        raise error
    return fallback
