"""One client connection speaking the Pulsar binary protocol.

Bytes go through the sans-I/O codec; the connection's state (``common/protocol/state.py``) says
whether a decoded command is legal now, and a table sends each legal command to a small handler.
Handlers that need storage (producer and consumer creation, seeks, lookups) run as tracked
tasks whose failures are logged and answered, so one slow topic never blocks the connection
and no request goes unanswered. A malformed frame ends this connection only, with one log line;
a bad checksum on a SEND is answered with SEND_ERROR and the connection carries on.

Writes are coalesced: everything written during one turn of the event loop leaves in one
``transport.write``. When the transport's buffer passes its high-water mark
(``pause_writing``), dispatchers stop sending to this connection's consumers until it drains.
Keep-alive follows Pulsar: PING after ``keep_alive_interval_seconds`` without a frame from the
peer, close after ``keep_alive_timeout_seconds`` more without one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from magnetar.broker.cluster.lookup import LookupKind, lookup
from magnetar.broker.errors import (
    NamespaceNotFoundError,
    TopicNotFoundError,
    TopicNotOwnedError,
    TopicUnloadingError,
)
from magnetar.broker.ledger.managed_ledger import (
    EntryTooLargeForLedgerError,
    ManagedLedgerFencedError,
)
from magnetar.broker.model.message_id import EARLIEST, LATEST, to_wire
from magnetar.broker.model.position import Position
from magnetar.broker.model.topic_name import InvalidTopicNameError, TopicName
from magnetar.broker.schema.registry import (
    IncompatibleSchemaError,
    SchemaData,
    SchemaNotFoundError,
    SchemaRegistry,
    decode_version,
    encode_version,
)
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.dispatchers.base import ConsumerBusyError
from magnetar.broker.topics.nonpersistent import NonPersistentSubscription, NonPersistentTopic
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.broker.topics.producers import ProducerBusyError, ProducerFencedError
from magnetar.broker.topics.subscription import Subscription, SubscriptionTypeError
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.state import ConnectionState, IllegalCommand, next_state

if TYPE_CHECKING:
    from magnetar.broker.broker import Broker

log = logging.getLogger(__name__)
Type = pb.BaseCommand.Type
SERVER_VERSION = "magnetar-0.1"
#: How long a reader's subscription waits for the reader to come back after a seek.
READER_RECONNECT_GRACE_S = 30.0
#: Frames handled per turn of the event loop before the connection lets other work run.
FRAMES_PER_SLICE = 32

AnyTopic = PersistentTopic | NonPersistentTopic
AnySubscription = Subscription | NonPersistentSubscription
#: Requests answered by their own response type (with a status), not by CommandError.
_OWN_RESPONSE = (pb.CommandLookupTopicResponse, pb.CommandPartitionedTopicMetadataResponse)
#: Schema requests: answered by their own response type with ``error_code``.
_SCHEMA_RESPONSE = (pb.CommandGetSchemaResponse, pb.CommandGetOrCreateSchemaResponse)
#: Wire schema types that mean "no schema to check": BYTES (``None``) and AUTO_CONSUME.
_NO_SCHEMA = (0, pb.Schema.AutoConsume)


class _Answered(Exception):
    """The request was refused and answered already; the handler stops."""


class ServerConnection(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.decoder = codec.FrameDecoder(broker.config.max_message_size + codec.FRAME_PADDING)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.state = ConnectionState.AWAITING_CONNECT
        self.protocol_version = 0
        self.producers: dict[int, tuple[AnyTopic, str]] = {}
        #: Producer ids this broker closed (fenced, unloaded): their late sends are ignored.
        self.closed_by_broker: set[int] = set()
        self.consumers: dict[int, tuple[AnySubscription, Consumer]] = {}
        #: False while the transport's buffer is above its high-water mark.
        self.writable = True
        self._out: list[bytes] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._heard = False  # a frame arrived since the last keep-alive check
        self._reading_paused = False
        self._ping_outstanding = False
        self._keepalive: asyncio.TimerHandle | None = None

    # -- transport ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport) or hasattr(transport, "write")
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)
        self._schedule_keepalive()

    def connection_lost(self, exc: Exception | None) -> None:
        self._apply_buffered_acks()
        self.state = ConnectionState.CLOSED
        self.broker.connections.discard(self)
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._out.clear()
        for subscription, consumer in self.consumers.values():
            self._drop_consumer(subscription, consumer)
        self.consumers.clear()
        for producer_id, (topic, _name) in self.producers.items():
            topic.producers.remove((id(self), producer_id))
        self.producers.clear()
        for task in self._tasks:
            task.cancel()

    def _apply_buffered_acks(self) -> None:
        """Acks the peer sent before the connection went away, still waiting here to be handled
        (frames are handled a slice per loop turn; a reset found while writing ends the
        connection at once): they are applied, as a broker applies everything it read before
        a channel closes. Nothing else is, and nothing is answered."""
        if self.state is not ConnectionState.CONNECTED:
            return
        while True:
            try:
                frame = self.decoder.next_frame()
            except codec.ProtocolError:
                return
            if frame is None:
                return
            if frame.type == pb.BaseCommand.ACK:
                try:
                    self._ack(frame.body, frame)  # type: ignore[arg-type]
                except Exception:
                    log.exception("connection %s: error applying an ack at close", self.peer)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for subscription, _consumer in list(self.consumers.values()):
            subscription.wake()

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def send(self, body: object) -> None:
        self.write(codec.encode_command(body))  # type: ignore[arg-type]

    def close(self) -> None:
        if self.transport is not None:
            self._flush()
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._heard = True
        self.decoder.receive_data(data)
        self._process_frames()

    def _process_frames(self) -> None:
        """Handle the frames received so far, a slice at a time: after FRAMES_PER_SLICE the
        rest waits for the next turn of the event loop (reading paused meanwhile), so journal
        completions and receipts go out while a burst is still being read."""
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        for _ in range(FRAMES_PER_SLICE):
            if self.state is ConnectionState.CLOSED:
                return
            try:
                frame = self.decoder.next_frame()
            except codec.ChecksumError as e:
                self._checksum_failed(e)
                continue
            except codec.ProtocolError as e:
                log.warning("connection %s: malformed frame, closing it: %s", self.peer, e)
                self.close()
                return
            if frame is None:
                return
            try:
                self.state = next_state(self.state, frame.type)
            except IllegalCommand as e:
                log.warning("connection %s: %s; closing", self.peer, e)
                self.close()
                return
            try:
                _HANDLERS.get(frame.type, ServerConnection._unsupported)(self, frame.body, frame)
            except Exception:
                log.exception("connection %s: error handling %s", self.peer, frame.name)
                self._answer_failure(frame.body, "internal error")
        if self.transport is not None and not self.transport.is_closing():
            self._reading_paused = True
            self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._process_frames)

    # -- tasks and replies ---------------------------------------------------------------------

    def _spawn(
        self,
        coro: Coroutine[Any, Any, None],
        request: object,
        reply: type | None = None,
    ) -> None:
        """Run a handler as a task; if it fails unexpectedly, log it and answer ``request``."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if task.cancelled() or task.exception() is None:
                return
            error = task.exception()
            log.error(
                "connection %s: handling %s failed",
                self.peer,
                type(request).__name__,
                exc_info=error,
            )
            self._answer_failure(request, f"internal error: {error}", reply)

        task.add_done_callback(done)

    def _answer_failure(self, request: object, message: str, reply: type | None = None) -> None:
        request_id = getattr(request, "request_id", None)
        if request_id is not None:
            self._error(request_id, pb.UnknownError, message, reply)
        elif isinstance(request, pb.CommandSend):
            self._send_error(request, pb.UnknownError, message)

    def _not_served(self, request_id: int, name: TopicName, error: TopicNotOwnedError) -> None:
        """PRODUCER or SUBSCRIBE for a topic this broker does not serve now (it moved, or is
        moving, to another broker): ServiceNotReady in Pulsar's words, so the client looks the
        topic up again. The message must not name an unload in progress: the official clients
        keep the connection for such a message.

        A connection left with no producer or consumer is then closed. The official C++ client
        (under the Python one) marks a consumer as connected before its SUBSCRIBE is answered
        and, when that SUBSCRIBE is refused, ignores its own retries because it believes it is
        connected, so creating the consumer waits out the whole operation timeout (30 s by
        default; seen with readers created while their topic moved). A closed connection makes
        it drop that state and look the topic up again at once."""
        self._error(
            request_id,
            pb.ServiceNotReady,
            f"Namespace bundle for topic ({name}) not served by this instance ({error}). "
            "Please redo the lookup.",
        )
        if not self.producers and not self.consumers:
            log.info(
                "connection %s: closed after refusing %s (not served here) so the client "
                "looks it up again",
                self.peer,
                name,
            )
            self.close()

    def _error(self, request_id: int, error: int, message: str, reply: type | None = None) -> None:
        if reply in _OWN_RESPONSE:
            assert reply is not None
            self.send(
                reply(request_id=request_id, response=reply.Failed, error=error, message=message)
            )
        elif reply in _SCHEMA_RESPONSE:
            self.send(reply(request_id=request_id, error_code=error, error_message=message))
        else:
            self.send(pb.CommandError(request_id=request_id, error=error, message=message))

    def _send_error(self, body: pb.CommandSend, error: int, message: str) -> None:
        self.send(
            pb.CommandSendError(
                producer_id=body.producer_id,
                sequence_id=body.sequence_id,
                error=error,
                message=message,
            )
        )

    def _checksum_failed(self, error: codec.ChecksumError) -> None:
        send = error.command.send if error.command.HasField("send") else None
        if send is None:
            log.warning(
                "connection %s: checksum error on a %s; closing",
                self.peer,
                codec.command_name(error.command.type),
            )
            self.close()
            return
        log.warning(
            "connection %s: producer %d sent a message with a bad checksum",
            self.peer,
            send.producer_id,
        )
        self._send_error(send, pb.ChecksumError, "message checksum does not match its content")

    def _topic_name(self, name: str, request_id: int, reply: type) -> TopicName | None:
        try:
            return TopicName.parse(name)
        except InvalidTopicNameError as e:
            self._error(request_id, pb.InvalidTopicName, str(e), reply)
            return None

    # -- keep-alive ----------------------------------------------------------------------------

    def _schedule_keepalive(self) -> None:
        config = self.broker.config
        interval = config.keep_alive_interval_seconds
        if interval > 0:
            delay = interval
            if self._ping_outstanding and config.keep_alive_timeout_seconds > 0:
                delay = config.keep_alive_timeout_seconds
            loop = asyncio.get_running_loop()
            self._keepalive = loop.call_later(delay, self._check_alive)

    def _check_alive(self) -> None:
        """Pulsar's rule: nothing heard for an interval -> PING; nothing for the timeout after
        it -> close."""
        if self.state is ConnectionState.CLOSED:
            return
        if self._heard:
            self._heard = False
            self._ping_outstanding = False
        elif self._ping_outstanding:
            log.warning("connection %s: no answer to PING; closing", self.peer)
            self.close()
            return
        elif self.state is ConnectionState.CONNECTED:
            self._ping_outstanding = True
            self.send(pb.CommandPing())
        else:
            log.warning("connection %s: no CONNECT in time; closing", self.peer)
            self.close()
            return
        self._schedule_keepalive()

    # -- handlers: connection ------------------------------------------------------------------

    def _connect(self, body: pb.CommandConnect, frame: codec.Frame) -> None:
        self.protocol_version = codec.negotiate_protocol_version(body.protocol_version)
        self.send(
            pb.CommandConnected(
                server_version=SERVER_VERSION,
                protocol_version=self.protocol_version,
                max_message_size=self.broker.config.max_message_size,
            )
        )

    def _ping(self, body: pb.CommandPing, frame: codec.Frame) -> None:
        self.send(pb.CommandPong())

    def _pong(self, body: pb.CommandPong, frame: codec.Frame) -> None:
        pass  # being heard is what counts

    def _unsupported(self, body: Any, frame: codec.Frame) -> None:
        request_id = getattr(body, "request_id", None)
        log.info("connection %s: %s is not served", self.peer, frame.name)
        if request_id is not None:
            self._error(
                request_id, pb.NotAllowedError, f"{frame.name} is not supported by this broker"
            )

    # -- handlers: lookup ----------------------------------------------------------------------

    def _partitioned_metadata(
        self, body: pb.CommandPartitionedTopicMetadata, frame: codec.Frame
    ) -> None:
        reply = pb.CommandPartitionedTopicMetadataResponse
        self._spawn(self._answer_partitioned_metadata(body), body, reply)

    async def _answer_partitioned_metadata(self, body: pb.CommandPartitionedTopicMetadata) -> None:
        reply = pb.CommandPartitionedTopicMetadataResponse
        name = self._topic_name(body.topic, body.request_id, reply)
        if name is None:
            return
        try:
            partitions = await self.broker.partitions_for_client(name)
        except (NamespaceNotFoundError, TopicNotFoundError) as e:
            self._error(body.request_id, pb.TopicNotFound, str(e), reply)
            return
        except Exception as e:  # the metadata store failed: an answer, not a client timeout
            log.warning("partitioned metadata of %s: %s", name, e)
            self._error(body.request_id, pb.MetadataError, f"partitioned metadata: {e}", reply)
            return
        self.send(reply(request_id=body.request_id, partitions=partitions, response=reply.Success))

    def _lookup(self, body: pb.CommandLookupTopic, frame: codec.Frame) -> None:
        self._spawn(self._answer_lookup(body), body, pb.CommandLookupTopicResponse)

    async def _answer_lookup(self, body: pb.CommandLookupTopic) -> None:
        reply = pb.CommandLookupTopicResponse
        name = self._topic_name(body.topic, body.request_id, reply)
        if name is None:
            return
        listener = body.advertised_listener_name
        if listener and listener not in self.broker.listener_names:
            self._error(
                body.request_id,
                pb.ServiceNotReady,
                f"the broker has no advertised listener named {listener!r}",
                reply,
            )
            return
        try:
            answer = await lookup(self.broker, name, body.authoritative)
        except NamespaceNotFoundError as e:
            self._error(body.request_id, pb.TopicNotFound, str(e), reply)
            return
        except Exception as e:  # no leader yet, the store failing: the client retries
            log.warning("lookup of %s: %s", name, e)
            self._error(body.request_id, pb.ServiceNotReady, f"lookup of {name}: {e}", reply)
            return
        self.send(
            reply(
                request_id=body.request_id,
                response=reply.Connect if answer.kind is LookupKind.CONNECT else reply.Redirect,
                brokerServiceUrl=answer.broker.service_url,
                authoritative=answer.authoritative,
            )
        )

    def _topics_of_namespace(
        self, body: pb.CommandGetTopicsOfNamespace, frame: codec.Frame
    ) -> None:
        self._spawn(self._answer_topics_of_namespace(body), body)

    async def _answer_topics_of_namespace(self, body: pb.CommandGetTopicsOfNamespace) -> None:
        mode = pb.CommandGetTopicsOfNamespace
        domains = {
            mode.PERSISTENT: ("persistent",),
            mode.NON_PERSISTENT: ("non-persistent",),
            mode.ALL: ("persistent", "non-persistent"),
        }[body.mode]
        if body.namespace.count("/") != 1:
            self._error(
                body.request_id,
                pb.MetadataError,
                f"namespace {body.namespace!r}: expected tenant/namespace",
            )
            return
        try:
            topics = await self.broker.list_topics(body.namespace, domains)
        except Exception as e:  # the metadata store failed: an answer, not a client timeout
            log.warning("topics of namespace %s: %s", body.namespace, e)
            self._error(body.request_id, pb.MetadataError, f"topics of {body.namespace}: {e}")
            return
        # Not filtered by topics_pattern here: the client applies its pattern itself.
        self.send(pb.CommandGetTopicsOfNamespaceResponse(request_id=body.request_id, topics=topics))

    def _get_schema(self, body: pb.CommandGetSchema, frame: codec.Frame) -> None:
        self._spawn(self._answer_get_schema(body), body, pb.CommandGetSchemaResponse)

    async def _answer_get_schema(self, body: pb.CommandGetSchema) -> None:
        reply = pb.CommandGetSchemaResponse
        name = self._topic_name(body.topic, body.request_id, reply)
        if name is None:
            return
        assert self.broker.store is not None
        try:
            version = (
                decode_version(body.schema_version) if body.HasField("schema_version") else None
            )
            found = await SchemaRegistry(self.broker.store).get(name, version)
        except SchemaNotFoundError as e:
            # Pulsar's answer for a topic without a schema: the client then reads bytes.
            self._error(body.request_id, pb.TopicNotFound, f"no schema: {e}", reply)
            return
        except Exception as e:  # the store failed, or a damaged record: an answer, not a timeout
            log.warning("topic %s: schema registry: %s", name, e)
            self._error(body.request_id, pb.MetadataError, f"schema of {name}: {e}", reply)
            return
        self.send(
            reply(
                request_id=body.request_id,
                schema=found.to_wire(name.partitioned_topic_name.local_name),
                schema_version=encode_version(found.version),
            )
        )

    def _get_or_create_schema(self, body: pb.CommandGetOrCreateSchema, frame: codec.Frame) -> None:
        reply = pb.CommandGetOrCreateSchemaResponse
        self._spawn(self._answer_get_or_create_schema(body), body, reply)

    async def _answer_get_or_create_schema(self, body: pb.CommandGetOrCreateSchema) -> None:
        reply = pb.CommandGetOrCreateSchemaResponse
        name = self._topic_name(body.topic, body.request_id, reply)
        if name is None:
            return
        assert self.broker.store is not None
        try:
            version = await SchemaRegistry(self.broker.store).put_if_absent(
                name, SchemaData.from_wire(body.schema)
            )
        except IncompatibleSchemaError as e:
            self._error(body.request_id, pb.IncompatibleSchema, str(e), reply)
            return
        except Exception as e:  # the store failed: an answer, not a client timeout
            log.warning("topic %s: schema registry: %s", name, e)
            self._error(body.request_id, pb.MetadataError, f"schema of {name}: {e}", reply)
            return
        self.send(reply(request_id=body.request_id, schema_version=encode_version(version)))

    async def _producer_schema_version(
        self, body: pb.CommandProducer, name: TopicName
    ) -> bytes | None:
        """The version of the producer's schema (stored if new and allowed); None without a
        schema. A refusal is answered here and raises _Answered."""
        if not body.HasField("schema") or body.schema.type in _NO_SCHEMA:
            return None
        assert self.broker.store is not None
        try:
            version = await SchemaRegistry(self.broker.store).put_if_absent(
                name, SchemaData.from_wire(body.schema)
            )
        except IncompatibleSchemaError as e:
            log.info("topic %s: producer schema refused: %s", name, e)
            self._error(body.request_id, pb.IncompatibleSchema, str(e))
            raise _Answered from None
        except Exception as e:  # the store failed: an answer the client retries on
            log.warning("topic %s: schema registry: %s", name, e)
            self._error(body.request_id, pb.ServiceNotReady, f"topic {name}: schema: {e}")
            raise _Answered from None
        return encode_version(version)

    # -- handlers: producers -------------------------------------------------------------------

    def _producer(self, body: pb.CommandProducer, frame: codec.Frame) -> None:
        self._spawn(self._create_producer(body), body)

    async def _create_producer(self, body: pb.CommandProducer) -> None:
        name = self._topic_name(body.topic, body.request_id, pb.CommandError)
        if name is None:
            return
        existing = self.producers.get(body.producer_id)
        if existing is not None:
            if existing[0].name == name:  # the client asked again: same answer
                try:
                    schema_version = await self._producer_schema_version(body, name)
                except _Answered:
                    return
                self._producer_success(body, existing[0], existing[1], None, schema_version)
            else:
                self._error(
                    body.request_id,
                    pb.ProducerBusy,
                    f"producer id {body.producer_id} is already in use on this connection",
                )
            return
        try:
            topic = await self.broker.get_topic(name, auto=True)
        except (NamespaceNotFoundError, TopicNotFoundError) as e:
            self._error(body.request_id, pb.TopicNotFound, str(e))
            return
        except TopicNotOwnedError as e:
            self._not_served(body.request_id, name, e)
            return
        except Exception as e:  # any storage failure: the client gets the reason, not a timeout
            log.warning("topic %s cannot be loaded: %s", name, e)
            self._error(body.request_id, pb.ServiceNotReady, f"topic {name} cannot be loaded: {e}")
            return
        try:
            schema_version = await self._producer_schema_version(body, name)
        except _Answered:
            return
        producer_name = body.producer_name or f"magnetar-{uuid.uuid4().hex[:12]}"
        mode = body.producer_access_mode
        if mode == pb.WaitForExclusive and len(topic.producers):
            # Pulsar's protocol: "pending" now, the real success when the topic is ours.
            self.send(
                pb.CommandProducerSuccess(
                    request_id=body.request_id, producer_name=producer_name, producer_ready=False
                )
            )
        epoch = body.topic_epoch if body.HasField("topic_epoch") else None
        try:
            epoch = await topic.producers.add(
                (id(self), body.producer_id),
                mode,
                lambda assigned_url: self._fence_producer(body.producer_id, assigned_url),
                epoch,
                name=producer_name,
            )
        except ProducerFencedError as e:
            self._error(body.request_id, pb.ProducerFenced, f"topic {name}: {e}")
            return
        except ProducerBusyError as e:
            self._error(body.request_id, pb.ProducerBusy, f"topic {name}: {e}")
            return
        if mode != pb.Shared:
            try:
                await topic.store_epoch(epoch)
            except Exception as e:  # the epoch must survive a move before the producer has it
                topic.producers.remove((id(self), body.producer_id))
                log.warning("topic %s: topic epoch not stored: %s", name, e)
                self._error(body.request_id, pb.ServiceNotReady, f"topic {name}: {e}")
                return
        if self.state is ConnectionState.CLOSED:
            topic.producers.remove((id(self), body.producer_id))
            return
        self.producers[body.producer_id] = (topic, producer_name)
        self.closed_by_broker.discard(body.producer_id)
        self._producer_success(body, topic, producer_name, epoch, schema_version)

    def _producer_success(
        self,
        body: pb.CommandProducer,
        topic: AnyTopic,
        producer_name: str,
        epoch: int | None,
        schema_version: bytes | None,
    ) -> None:
        success = pb.CommandProducerSuccess(
            request_id=body.request_id,
            producer_name=producer_name,
            last_sequence_id=(
                topic.deduplication.last_sequence_id(producer_name)
                if topic.deduplication is not None
                else -1
            ),
        )
        success.topic_epoch = topic.producers.topic_epoch if epoch is None else epoch
        if schema_version is not None:
            success.schema_version = schema_version
        self.send(success)

    def _fence_producer(self, producer_id: int, assigned_url: str | None) -> None:
        """Another producer took the topic with ExclusiveWithFencing, or the topic went away
        (to the broker at ``assigned_url``, when it was handed over)."""
        if self.producers.pop(producer_id, None) is not None:
            self.closed_by_broker.add(producer_id)
            close = pb.CommandCloseProducer(producer_id=producer_id, request_id=0)
            if assigned_url is not None and self.knows_assigned_broker:
                close.assignedBrokerServiceUrl = assigned_url
            self.send(close)

    def _close_producer(self, body: pb.CommandCloseProducer, frame: codec.Frame) -> None:
        found = self.producers.pop(body.producer_id, None)
        if found is not None:
            found[0].producers.remove((id(self), body.producer_id))
        self.send(pb.CommandSuccess(request_id=body.request_id))

    def _send_message(self, body: pb.CommandSend, frame: codec.Frame) -> None:
        found = self.producers.get(body.producer_id)
        if found is None:
            if body.producer_id in self.closed_by_broker:
                # Sent before the client read our CLOSE_PRODUCER: it sends them again where
                # it reconnects (Pulsar ignores these too, rather than close the connection).
                return
            self._send_error(
                body,
                pb.NotAllowedError,
                f"unknown producer id {body.producer_id} on this connection",
            )
            return
        topic, producer_name = found
        if not self.broker.may_serve():
            # Our bundles may belong to another broker already: store nothing more here.
            self._send_error(body, pb.ServiceNotReady, "the broker's metadata session expired")
            return
        highest = body.highest_sequence_id if body.HasField("highest_sequence_id") else None
        future = topic.publish(
            frame.headers_and_payload,
            producer_name,
            body.sequence_id,
            -1 if highest is None else highest,
            max(body.num_messages, 1),
        )
        producer_id, sequence_id = body.producer_id, body.sequence_id

        def receipt(done: asyncio.Future[Position | None]) -> None:
            if done.cancelled():
                return
            error = done.exception()
            if isinstance(error, TopicUnloadingError):
                return  # nothing stored: CLOSE_PRODUCER follows, and the client sends it again
            if error is not None:
                if isinstance(error, ManagedLedgerFencedError):
                    self.broker.topic_fenced(topic)
                log.warning("topic %s: send failed: %s", topic.name, error)
                self.broker.metrics.send_errors.labels(type(error).__name__).inc()
                self._send_error(
                    body,
                    pb.NotAllowedError
                    if isinstance(error, EntryTooLargeForLedgerError)
                    else pb.PersistenceError,
                    str(error),
                )
                return
            # A duplicate is acknowledged with Pulsar's (-1, -1): it was not stored again.
            position = done.result() or EARLIEST
            self.write(
                codec.encode_send_receipt(
                    producer_id, sequence_id, position.ledger_id, position.entry_id, highest
                )
            )

        future.add_done_callback(receipt)

    # -- handlers: consumers -------------------------------------------------------------------

    def _subscribe(self, body: pb.CommandSubscribe, frame: codec.Frame) -> None:
        self._spawn(self._create_consumer(body), body)

    async def _create_consumer(self, body: pb.CommandSubscribe) -> None:
        name = self._topic_name(body.topic, body.request_id, pb.CommandError)
        if name is None:
            return
        if not body.subscription:
            self._error(body.request_id, pb.NotAllowedError, "the subscription name is empty")
            return
        existing = self.consumers.get(body.consumer_id)
        if existing is not None:
            subscription = existing[0]
            if subscription.topic.name == name and subscription.name == body.subscription:
                self.send(pb.CommandSuccess(request_id=body.request_id))  # asked again
            else:
                self._error(
                    body.request_id,
                    pb.ConsumerBusy,
                    f"consumer id {body.consumer_id} is already in use on this connection",
                )
            return
        log.debug("connection %s: SUBSCRIBE %s", self.peer, body)
        try:
            topic = await self.broker.get_topic(name, auto=True)
            consumer = Consumer(
                body.consumer_id,
                body.consumer_name,
                self,
                priority=body.priority_level,
                partition=name.partition_index,
                key_shared_meta=body.keySharedMeta if body.HasField("keySharedMeta") else None,
            )
            if body.HasField("schema") and body.schema.type not in _NO_SCHEMA:
                assert self.broker.store is not None
                await SchemaRegistry(self.broker.store).check_consumer(
                    name, SchemaData.from_wire(body.schema), _idle(topic)
                )
            start = None
            if not body.durable:  # a reader: start at the given message (or earliest/latest)
                start = (
                    body.start_message_id if body.HasField("start_message_id") else to_wire(LATEST)
                )
            subscription = await topic.subscribe(
                consumer, body.subscription, body.subType, body.initialPosition, start
            )
        except ConsumerBusyError as e:
            self._error(body.request_id, pb.ConsumerBusy, str(e))
            return
        except SubscriptionTypeError as e:
            # Pulsar answers a type mismatch as a busy subscription (the client does not retry).
            self._error(body.request_id, pb.ConsumerBusy, str(e))
            return
        except NotImplementedError as e:
            self._error(body.request_id, pb.NotAllowedError, str(e))
            return
        except IncompatibleSchemaError as e:
            log.info("topic %s: consumer schema refused: %s", name, e)
            self._error(body.request_id, pb.IncompatibleSchema, str(e))
            return
        except (NamespaceNotFoundError, TopicNotFoundError) as e:
            self._error(body.request_id, pb.TopicNotFound, str(e))
            return
        except TopicNotOwnedError as e:
            self._not_served(body.request_id, name, e)
            return
        except Exception as e:  # any storage failure: the client gets the reason, not a timeout
            log.warning("topic %s cannot be loaded: %s", name, e)
            self._error(body.request_id, pb.ServiceNotReady, f"topic {name} cannot be loaded: {e}")
            return
        if self.state is ConnectionState.CLOSED:
            self._drop_consumer(subscription, consumer)
            return
        self.consumers[body.consumer_id] = (subscription, consumer)
        self.send(pb.CommandSuccess(request_id=body.request_id))

    def close_consumer(
        self, subscription: AnySubscription, consumer: Consumer, assigned_url: str | None = None
    ) -> None:
        """The broker ends this consumer (its topic is unloaded or sought): CLOSE_CONSUMER
        tells the client to reconnect (to the broker at ``assigned_url``, when the topic was
        handed over)."""
        if self.consumers.get(consumer.consumer_id) == (subscription, consumer):
            del self.consumers[consumer.consumer_id]
            subscription.remove_consumer(consumer)
            close = pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=0)
            if assigned_url is not None and self.knows_assigned_broker:
                close.assignedBrokerServiceUrl = assigned_url
            self.send(close)

    @property
    def knows_assigned_broker(self) -> bool:
        """Whether the client reads the new owner's URL in CLOSE_PRODUCER / CLOSE_CONSUMER
        (clients of protocol version 20 and later; older ones look the topic up again)."""
        return self.protocol_version >= pb.v20

    def _drop_consumer(self, subscription: AnySubscription, consumer: Consumer) -> None:
        subscription.remove_consumer(consumer)
        if not subscription.durable:
            self._spawn(subscription.topic.remove_subscription_if_unused(subscription), None)

    def _flow(self, body: pb.CommandFlow, frame: codec.Frame) -> None:
        found = self.consumers.get(body.consumer_id)
        if found is not None:
            found[0].flow(found[1], body.messagePermits)

    def _ack(self, body: pb.CommandAck, frame: codec.Frame) -> None:
        found = self.consumers.get(body.consumer_id)
        error: str | None = None
        if found is None:
            error = f"unknown consumer id {body.consumer_id}"
        else:
            try:
                found[0].ack(found[1], body.ack_type, list(body.message_id))
            except ValueError as e:  # an ack the subscription refuses (bad position, batch size)
                log.warning("connection %s: ack refused: %s", self.peer, e)
                error = str(e)
        if body.HasField("request_id"):
            response = pb.CommandAckResponse(
                consumer_id=body.consumer_id, request_id=body.request_id
            )
            if error is not None:
                response.error = pb.NotAllowedError
                response.message = error
            self.send(response)

    def _redeliver(
        self, body: pb.CommandRedeliverUnacknowledgedMessages, frame: codec.Frame
    ) -> None:
        found = self.consumers.get(body.consumer_id)
        if found is not None:
            found[0].redeliver(found[1], list(body.message_ids) or None)

    def _close_consumer(self, body: pb.CommandCloseConsumer, frame: codec.Frame) -> None:
        found = self.consumers.pop(body.consumer_id, None)
        if found is not None:
            self._drop_consumer(*found)
        self.send(pb.CommandSuccess(request_id=body.request_id))

    def _unsubscribe(self, body: pb.CommandUnsubscribe, frame: codec.Frame) -> None:
        self._spawn(self._remove_subscription(body), body)

    async def _remove_subscription(self, body: pb.CommandUnsubscribe) -> None:
        found = self.consumers.get(body.consumer_id)
        if found is None:
            self._error(body.request_id, pb.SubscriptionNotFound, "unknown consumer id")
            return
        subscription, consumer = found
        others = [c for c in subscription.consumers if c is not consumer]
        if others:
            # Pulsar: a subscription with other consumers stays, and so does this consumer.
            self._error(
                body.request_id,
                pb.ConsumerBusy,
                f"subscription {subscription} has {len(others)} other consumer(s)",
            )
            return
        self.consumers.pop(body.consumer_id, None)
        subscription.remove_consumer(consumer)
        await subscription.topic.unsubscribe(subscription.name)
        self.send(pb.CommandSuccess(request_id=body.request_id))

    def _seek(self, body: pb.CommandSeek, frame: codec.Frame) -> None:
        self._spawn(self._reset_subscription(body), body)

    async def _reset_subscription(self, body: pb.CommandSeek) -> None:
        found = self.consumers.get(body.consumer_id)
        if found is None:
            self._error(body.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = found[0]
        if not isinstance(subscription, Subscription):
            self._error(
                body.request_id,
                pb.NotAllowedError,
                f"{subscription.topic.name} is non-persistent: nothing to seek in",
            )
            return
        position = None
        if body.HasField("message_id"):
            position = subscription.topic.position_for(body.message_id)
        elif not body.HasField("message_publish_time"):
            self._error(
                body.request_id, pb.MetadataError, "SEEK needs a message id or a publish time"
            )
            return
        consumers = await subscription.seek(
            position, body.message_publish_time if position is None else None
        )
        # Like Pulsar: the subscription's consumers are disconnected before the seek succeeds;
        # they come back at the new position with nothing stale in their queues.
        for consumer in consumers:
            owner = consumer.connection
            owner.consumers.pop(consumer.consumer_id, None)
            owner.send(pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=0))
        self.send(pb.CommandSuccess(request_id=body.request_id))
        if not subscription.durable:
            # The reader comes back under the same subscription name and must find the cursor
            # where the seek put it (a seek by time has no message id to come back with).
            subscription.topic.remove_subscription_later(subscription, READER_RECONNECT_GRACE_S)

    def _get_last_message_id(self, body: pb.CommandGetLastMessageId, frame: codec.Frame) -> None:
        found = self.consumers.get(body.consumer_id)
        if found is None:
            self._error(body.request_id, pb.ConsumerNotFound, "unknown consumer id")
        elif not isinstance(found[0], Subscription):
            self._error(
                body.request_id,
                pb.NotAllowedError,
                "a non-persistent topic stores no messages: it has no last message id",
            )
        else:
            self._spawn(self._answer_last_message_id(body, found[0]), body)

    async def _answer_last_message_id(
        self, body: pb.CommandGetLastMessageId, subscription: Subscription
    ) -> None:
        try:
            last = await subscription.topic.last_message_id()
        except Exception as e:  # storage failed: an answer, not a client timeout
            log.warning("topic %s: last message id: %s", subscription.topic.name, e)
            self._error(body.request_id, pb.PersistenceError, f"last message id: {e}")
            return
        self.send(
            pb.CommandGetLastMessageIdResponse(
                request_id=body.request_id,
                last_message_id=last,
                consumer_mark_delete_position=to_wire(
                    subscription.cursor.mark_delete_position,
                    subscription.topic.name.partition_index,
                ),
            )
        )


def _idle(topic: AnyTopic) -> bool:
    """Pulsar's idle topic (a consumer's schema may become its first): no producer, no
    consumer, nothing stored."""
    stored = topic.ml.total_size if isinstance(topic, PersistentTopic) else 0
    consumers = any(s.consumers for s in topic.subscriptions.values())
    return stored == 0 and not len(topic.producers) and not consumers


Handler = Callable[[ServerConnection, Any, codec.Frame], None]

#: Which handler serves which command. Commands legal in the state table but missing here get
#: a NotAllowedError answer (``_unsupported``).
_HANDLERS: dict[int, Handler] = {
    Type.CONNECT: ServerConnection._connect,
    Type.PING: ServerConnection._ping,
    Type.PONG: ServerConnection._pong,
    Type.PARTITIONED_METADATA: ServerConnection._partitioned_metadata,
    Type.LOOKUP: ServerConnection._lookup,
    Type.GET_TOPICS_OF_NAMESPACE: ServerConnection._topics_of_namespace,
    Type.GET_SCHEMA: ServerConnection._get_schema,
    Type.GET_OR_CREATE_SCHEMA: ServerConnection._get_or_create_schema,
    Type.PRODUCER: ServerConnection._producer,
    Type.SEND: ServerConnection._send_message,
    Type.CLOSE_PRODUCER: ServerConnection._close_producer,
    Type.SUBSCRIBE: ServerConnection._subscribe,
    Type.FLOW: ServerConnection._flow,
    Type.ACK: ServerConnection._ack,
    Type.REDELIVER_UNACKNOWLEDGED_MESSAGES: ServerConnection._redeliver,
    Type.CLOSE_CONSUMER: ServerConnection._close_consumer,
    Type.UNSUBSCRIBE: ServerConnection._unsubscribe,
    Type.SEEK: ServerConnection._seek,
    Type.GET_LAST_MESSAGE_ID: ServerConnection._get_last_message_id,
}
