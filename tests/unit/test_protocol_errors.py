"""The table from exception to Pulsar ServerError (services/broker/protocol/errors.py), and how
a connection answers from it, without sockets."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import (
    NamespaceNotFoundError,
    ProducerHeldByQuotaError,
    ProducerRefusedByQuotaError,
    TopicNotFoundError,
    TopicNotOwnedError,
    TopicTerminatedError,
)
from magnetar.broker.metrics import BrokerMetrics
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.protocol import errors
from magnetar.broker.protocol.connection import ServerConnection
from magnetar.broker.schema.registry import IncompatibleSchemaError, SchemaNotFoundError
from magnetar.broker.topics.dispatchers.base import ConsumerBusyError
from magnetar.broker.topics.producers import ProducerBusyError, ProducerFencedError
from magnetar.broker.topics.subscription import SubscriptionTypeError
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

NAME = TopicName.parse("persistent://public/default/t")
LADDERS = [
    errors.TOPIC_LOADING,
    errors.SUBSCRIBING,
    errors.PRODUCER_ACCESS,
    errors.PRODUCER_ADMISSION,
    errors.PARTITIONED_METADATA,
    errors.LOOKUP,
    errors.GET_SCHEMA,
    errors.PUT_SCHEMA,
]


def answer(error: Exception, ladder: Any, fallback: Any = errors.TOPIC_NOT_LOADED) -> tuple:
    found = errors.refusal(error, ladder, fallback)
    return found.error, found.text(NAME, error)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (TopicNotFoundError("no such topic"), (pb.TopicNotFound, "no such topic")),
        (NamespaceNotFoundError("no such namespace"), (pb.TopicNotFound, "no such namespace")),
        (
            TopicNotOwnedError("served by b2"),
            (
                pb.ServiceNotReady,
                f"Namespace bundle for topic ({NAME}) not served by this instance "
                "(served by b2). Please redo the lookup.",
            ),
        ),
        (OSError("disk"), (pb.ServiceNotReady, f"topic {NAME} cannot be loaded: disk")),
        # Not answered when loading a topic for a producer: the storage fallback, as before.
        (ConsumerBusyError("busy"), (pb.ServiceNotReady, f"topic {NAME} cannot be loaded: busy")),
    ],
)
def test_loading_a_topic_for_a_producer(error: Exception, expected: tuple) -> None:
    assert answer(error, errors.TOPIC_LOADING) == expected


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConsumerBusyError("exclusive"), (pb.ConsumerBusy, "exclusive")),
        (SubscriptionTypeError("is shared"), (pb.ConsumerBusy, "is shared")),
        (NotImplementedError("no such mode"), (pb.NotAllowedError, "no such mode")),
        (IncompatibleSchemaError("avro vs json"), (pb.IncompatibleSchema, "avro vs json")),
        (TopicNotFoundError("gone"), (pb.TopicNotFound, "gone")),
        (NamespaceNotFoundError("gone"), (pb.TopicNotFound, "gone")),
        (RuntimeError("bk down"), (pb.ServiceNotReady, f"topic {NAME} cannot be loaded: bk down")),
    ],
)
def test_subscribing(error: Exception, expected: tuple) -> None:
    assert answer(error, errors.SUBSCRIBING) == expected
    assert errors.refusal(TopicNotOwnedError("x"), errors.SUBSCRIBING).not_served


def test_not_implemented_is_a_runtime_error_but_answered_as_not_allowed() -> None:
    # The ladder tests types in order; a RuntimeError that is not NotImplementedError falls back.
    assert answer(NotImplementedError("x"), errors.SUBSCRIBING)[0] == pb.NotAllowedError
    assert answer(RuntimeError("x"), errors.SUBSCRIBING)[0] == pb.ServiceNotReady


def test_producer_access() -> None:
    assert answer(ProducerFencedError("epoch 3 < 4"), errors.PRODUCER_ACCESS, None) == (
        pb.ProducerFenced,
        f"topic {NAME}: epoch 3 < 4",
    )
    assert answer(ProducerBusyError("exclusive"), errors.PRODUCER_ACCESS, None) == (
        pb.ProducerBusy,
        f"topic {NAME}: exclusive",
    )


def test_a_terminated_topic_or_a_backlog_over_its_quota_refuses_producers() -> None:
    assert answer(TopicTerminatedError("gone"), errors.PRODUCER_ADMISSION, None) == (
        pb.TopicTerminatedError,
        "gone",
    )
    assert answer(ProducerHeldByQuotaError("over"), errors.PRODUCER_ADMISSION, None) == (
        pb.ProducerBlockedQuotaExceededError,
        "over",
    )
    assert answer(ProducerRefusedByQuotaError("over"), errors.PRODUCER_ADMISSION, None) == (
        pb.ProducerBlockedQuotaExceededException,
        "over",
    )


def test_without_a_fallback_an_unanswered_error_is_raised_again() -> None:
    error = ValueError("unexpected")
    with pytest.raises(ValueError, match="unexpected"):
        errors.refusal(error, errors.PRODUCER_ACCESS)


def test_the_other_requests_and_their_fallbacks() -> None:
    e = OSError("etcd down")
    assert answer(e, errors.PARTITIONED_METADATA, errors.PARTITIONS_UNREADABLE) == (
        pb.MetadataError,
        "partitioned metadata: etcd down",
    )
    assert answer(TopicNotFoundError("t"), errors.PARTITIONED_METADATA, None)[0] == pb.TopicNotFound
    assert answer(NamespaceNotFoundError("ns"), errors.LOOKUP, None) == (pb.TopicNotFound, "ns")
    # A lookup answers only NamespaceNotFoundError from the table; the rest is retried.
    assert answer(TopicNotOwnedError("x"), errors.LOOKUP, errors.LOOKUP_FAILED) == (
        pb.ServiceNotReady,
        f"lookup of {NAME}: x",
    )
    assert answer(SchemaNotFoundError("none"), errors.GET_SCHEMA, None) == (
        pb.TopicNotFound,
        "no schema: none",
    )
    assert answer(e, errors.GET_SCHEMA, errors.SCHEMA_UNREADABLE) == (
        pb.MetadataError,
        f"schema of {NAME}: etcd down",
    )
    assert answer(IncompatibleSchemaError("no"), errors.PUT_SCHEMA, None) == (
        pb.IncompatibleSchema,
        "no",
    )
    assert answer(e, errors.PUT_SCHEMA, errors.PRODUCER_SCHEMA_FAILED) == (
        pb.ServiceNotReady,
        f"topic {NAME}: schema: etcd down",
    )
    assert answer(e, (), errors.EPOCH_NOT_STORED) == (
        pb.ServiceNotReady,
        f"topic {NAME}: etcd down",
    )
    assert answer(e, (), errors.LAST_MESSAGE_ID_UNREADABLE) == (
        pb.PersistenceError,
        "last message id: etcd down",
    )
    assert (
        errors.TOPICS_UNREADABLE.text("public/default", e) == "topics of public/default: etcd down"
    )


def test_every_row_of_the_table_is_answered_by_some_request() -> None:
    assert set(errors.REFUSALS) == {kind for ladder in LADDERS for kind in ladder}


# -- a connection answering from the table -----------------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def commands(self) -> list[pb.BaseCommand]:
        decoder = codec.FrameDecoder(1 << 20)
        decoder.receive_data(b"".join(self.writes))
        found = []
        while (frame := decoder.next_frame()) is not None:
            found.append(frame.command)
        return found


@dataclass
class FakeBroker:
    config: BrokerConfig = field(
        default_factory=lambda: BrokerConfig(keep_alive_interval_seconds=0)
    )
    connections: set[Any] = field(default_factory=set)
    metrics: BrokerMetrics = field(default_factory=BrokerMetrics)


def open_connection() -> tuple[ServerConnection, FakeTransport]:
    conn = ServerConnection(FakeBroker())  # type: ignore[arg-type]
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_a_topic_not_served_is_answered_and_an_idle_connection_closed() -> None:
    conn, transport = open_connection()
    conn.refuse(
        7, NAME, TopicNotOwnedError("moving"), errors.TOPIC_LOADING, errors.TOPIC_NOT_LOADED
    )
    (command,) = transport.commands()
    assert command.error.request_id == 7
    assert command.error.error == pb.ServiceNotReady
    assert command.error.message.startswith(f"Namespace bundle for topic ({NAME}) not served")
    assert transport.closing


async def test_a_storage_failure_is_logged_and_answered(caplog: pytest.LogCaptureFixture) -> None:
    conn, transport = open_connection()
    with caplog.at_level(logging.WARNING):
        conn.refuse(3, NAME, OSError("bookie gone"), errors.SUBSCRIBING, errors.TOPIC_NOT_LOADED)
    await asyncio.sleep(0)
    (command,) = transport.commands()
    assert (command.error.error, command.error.message) == (
        pb.ServiceNotReady,
        f"topic {NAME} cannot be loaded: bookie gone",
    )
    assert f"topic {NAME} cannot be loaded: bookie gone" in caplog.text
    assert not transport.closing


async def test_a_request_with_its_own_response_type_is_answered_in_it() -> None:
    conn, transport = open_connection()
    reply = pb.CommandLookupTopicResponse
    conn.refuse(5, NAME, OSError("x"), errors.LOOKUP, errors.LOOKUP_FAILED, reply)
    await asyncio.sleep(0)
    (command,) = transport.commands()
    assert command.lookupTopicResponse.response == reply.Failed
    assert command.lookupTopicResponse.error == pb.ServiceNotReady
    assert command.lookupTopicResponse.message == f"lookup of {NAME}: x"
