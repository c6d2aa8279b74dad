"""One client connection speaking the Pulsar binary protocol: the broker's side.

The transport (frames in, coalesced writes out, a slice of frames per loop turn, back-pressure,
keep-alive) is ``common/protocol/transport.py``; this class adds what the broker keeps per
connection (its producers and consumers), the reply plumbing, and the table that sends each
legal command to its handler, one module per command family:

* ``authentication``: CONNECT and AUTH_RESPONSE (who is on the connection);
* ``connect``: PING, PONG, and commands not served;
* ``lookup``: PARTITIONED_METADATA, LOOKUP, GET_TOPICS_OF_NAMESPACE;
* ``schema``: GET_SCHEMA, GET_OR_CREATE_SCHEMA;
* ``producer``: PRODUCER, SEND, CLOSE_PRODUCER;
* ``consumer``: SUBSCRIBE, FLOW, ACK, REDELIVER, CLOSE_CONSUMER, UNSUBSCRIBE, SEEK,
  GET_LAST_MESSAGE_ID.

Handlers that need storage (producer and consumer creation, seeks, lookups) run as tracked
tasks whose failures are logged and answered, so one slow topic never blocks the connection
and no request goes unanswered; a refusal is answered from one table (``protocol/errors.py``).
A bad checksum on a SEND is answered with SEND_ERROR and the connection carries on. When the
transport's buffer passes its high-water mark, dispatchers stop sending to this connection's
consumers until it drains.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from magnetar.broker.model.topic_name import InvalidTopicNameError, TopicName
from magnetar.broker.protocol import authentication, connect, consumer, lookup, producer, schema
from magnetar.broker.protocol.authentication import Identity
from magnetar.broker.protocol.errors import Refusal, refusal
from magnetar.broker.protocol.service import BrokerService
from magnetar.broker.topics.consumer import Consumer
from magnetar.broker.topics.nonpersistent import NonPersistentSubscription, NonPersistentTopic
from magnetar.broker.topics.persistent import PersistentTopic
from magnetar.broker.topics.subscription import Subscription
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.state import ConnectionState
from magnetar.common.protocol.transport import FrameConnection
from magnetar.common.tls import peer_certificate_der

log = logging.getLogger(__name__)
Type = pb.BaseCommand.Type
_SEND = Type.SEND  # asked of every frame: a plain int, not an attribute of the enum wrapper

AnyTopic = PersistentTopic | NonPersistentTopic
AnySubscription = Subscription | NonPersistentSubscription
#: Frames a client may send while its CONNECT is being authenticated (clients send none; a
#: bound, so a peer cannot make the broker hold an unbounded backlog meanwhile).
MAX_HELD_FRAMES = 1000
#: Requests answered by their own response type (with a status), not by CommandError.
_OWN_RESPONSE = (pb.CommandLookupTopicResponse, pb.CommandPartitionedTopicMetadataResponse)
#: Schema requests: answered by their own response type with ``error_code``.
_SCHEMA_RESPONSE = (pb.CommandGetSchemaResponse, pb.CommandGetOrCreateSchemaResponse)


class ServerConnection(FrameConnection):
    def __init__(self, broker: BrokerService) -> None:
        config = broker.config
        super().__init__(
            config.max_message_size + codec.FRAME_PADDING,
            config.keep_alive_interval_seconds,
            config.keep_alive_timeout_seconds,
        )
        self.broker = broker
        self.protocol_version = 0
        #: The client's own name and version, from CONNECT (``Pulsar-Java-v3.3.0``, ...).
        self.client_version = ""
        self.producers: dict[int, tuple[AnyTopic, str]] = {}
        #: Producer ids this broker closed (fenced, unloaded): their late sends are ignored.
        self.closed_by_broker: set[int] = set()
        self.consumers: dict[int, tuple[AnySubscription, Consumer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.identity = Identity()
        #: Frames that arrived while CONNECT's credentials were being checked (None: none held).
        self._held: list[codec.Frame] | None = None
        #: The SENDs of the slice being handled, by producer id, in their order: served
        #: together when the slice ends or another command comes (``frames_handled``).
        self._sends: dict[int, list[codec.Frame]] = {}

    # -- transport ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.broker.connections.add(self)
        self.broker.metrics.connection_counts.created += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._apply_buffered_acks()
        super().connection_lost(exc)

    def closed(self, exc: Exception | None) -> None:
        self.broker.connections.discard(self)
        self.broker.metrics.connection_counts.closed += 1
        for subscription, found in self.consumers.values():
            self.drop_consumer(subscription, found)
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
        for frame in self.buffered_frames():
            if frame.type == pb.BaseCommand.ACK:
                try:
                    consumer.ack(self, frame.body, frame)  # type: ignore[arg-type]
                except Exception:
                    log.exception("connection %s: error applying an ack at close", self.peer)

    def writing_resumed(self) -> None:
        for subscription, _consumer in list(self.consumers.values()):
            subscription.wake()

    def handle_frame(self, frame: codec.Frame) -> None:
        if self._held is not None and frame.type not in (Type.PING, Type.PONG):
            if len(self._held) >= MAX_HELD_FRAMES:
                log.warning(
                    "connection %s: %d frames sent before CONNECT was answered; closing",
                    self.peer,
                    len(self._held),
                )
                self.close()
                return
            self._held.append(frame)
            return
        if frame.type == _SEND:
            # Gathered by producer, served when the slice ends or another command comes
            # (``frames_handled``), if its topic takes runs; else served now, on its own.
            producer_id = frame.body.producer_id  # type: ignore[union-attr]
            sends = self._sends.get(producer_id)
            if sends is not None:
                sends.append(frame)
                return
            found = self.producers.get(producer_id)
            if found is not None and found[0].takes_runs():
                self._sends[producer_id] = [frame]
                return
        if self._sends:
            self.frames_handled()  # the SENDs before this command come first
        HANDLERS.get(frame.type, connect.unsupported)(self, frame.body, frame)

    def frames_handled(self) -> None:
        """Serve the SENDs gathered so far, each producer's as a run (``producer.send_run``)."""
        if not self._sends:
            return
        sends, self._sends = self._sends, {}
        for frames in sends.values():
            try:
                producer.send_run(self, frames)
            except Exception:
                log.exception("connection %s: error handling %d SENDs", self.peer, len(frames))
                for frame in frames:
                    self.frame_failed(frame)

    # -- authentication (protocol/authentication.py) -------------------------------------------

    def hold_frames(self) -> None:
        """Keep the frames that arrive from now on until :meth:`release_frames`."""
        self._held = []

    def release_frames(self) -> None:
        held, self._held = self._held or [], None
        for frame in held:
            if self.is_closed:
                break
            self.handle_frame(frame)
        self.frames_handled()

    @property
    def is_closed(self) -> bool:
        return self.state is ConnectionState.CLOSED

    def peer_certificate(self) -> bytes | None:
        """The DER of the certificate the client showed on a TLS connection, if any."""
        return peer_certificate_der(self.transport) if self.transport else None

    def frame_failed(self, frame: codec.Frame) -> None:
        self.answer_failure(frame.body, "internal error")

    def checksum_failed(self, error: codec.ChecksumError) -> None:
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
        self.send_error(send, pb.ChecksumError, "message checksum does not match its content")

    # -- tasks and replies ---------------------------------------------------------------------

    def spawn(
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
            self.answer_failure(request, f"internal error: {error}", reply)

        task.add_done_callback(done)

    def answer_failure(self, request: object, message: str, reply: type | None = None) -> None:
        request_id = getattr(request, "request_id", None)
        if request_id is not None:
            self.error(request_id, pb.UnknownError, message, reply)
        elif isinstance(request, pb.CommandSend):
            self.send_error(request, pb.UnknownError, message)

    def refuse(
        self,
        request_id: int,
        name: object,
        error: Exception,
        answered: Iterable[type[Exception]],
        fallback: Refusal | None = None,
        reply: type | None = None,
    ) -> None:
        """Answer a request that failed with ``error``, from the table in ``errors.py``: the
        row of the first type in ``answered`` that ``error`` is, else ``fallback`` (logged);
        ``name`` is the topic (or namespace) asked about."""
        answer = refusal(error, answered, fallback)
        if answer.log is not None:
            log.warning(answer.log, name, error)
        if answer.not_served:
            assert isinstance(name, TopicName)
            self.not_served(request_id, name, answer.text(name, error))
        else:
            self.error(request_id, answer.error, answer.text(name, error), reply)

    def not_served(self, request_id: int, name: TopicName, message: str) -> None:
        """PRODUCER or SUBSCRIBE for a topic this broker does not serve now (it moved, or is
        moving, to another broker): ServiceNotReady in Pulsar's words, so the client looks the
        topic up again.

        A connection left with no producer or consumer is then closed. The official C++ client
        (under the Python one) marks a consumer as connected before its SUBSCRIBE is answered
        and, when that SUBSCRIBE is refused, ignores its own retries because it believes it is
        connected, so creating the consumer waits out the whole operation timeout (30 s by
        default; seen with readers created while their topic moved). A closed connection makes
        it drop that state and look the topic up again at once."""
        self.error(request_id, pb.ServiceNotReady, message)
        if not self.producers and not self.consumers:
            log.info(
                "connection %s: closed after refusing %s (not served here) so the client "
                "looks it up again",
                self.peer,
                name,
            )
            self.close()

    def error(self, request_id: int, error: int, message: str, reply: type | None = None) -> None:
        if reply in _OWN_RESPONSE:
            assert reply is not None
            self.send(
                reply(request_id=request_id, response=reply.Failed, error=error, message=message)
            )
        elif reply in _SCHEMA_RESPONSE:
            self.send(reply(request_id=request_id, error_code=error, error_message=message))
        else:
            self.send(pb.CommandError(request_id=request_id, error=error, message=message))

    def send_error(self, body: pb.CommandSend, error: int, message: str) -> None:
        self.send(
            pb.CommandSendError(
                producer_id=body.producer_id,
                sequence_id=body.sequence_id,
                error=error,
                message=message,
            )
        )

    def topic_name(self, name: str, request_id: int, reply: type) -> TopicName | None:
        try:
            return TopicName.parse(name)
        except InvalidTopicNameError as e:
            self.error(request_id, pb.InvalidTopicName, str(e), reply)
            return None

    # -- consumers, as topics see them (topics/consumer.py's ConsumerChannel) -----------------

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

    def reconnect_consumer(self, consumer: Consumer) -> None:
        """``consumer`` was taken off its subscription by a seek: it is forgotten here and the
        client comes back at the new position with nothing stale in its queue."""
        self.consumers.pop(consumer.consumer_id, None)
        self.send(pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=0))

    @property
    def understands_end_of_topic(self) -> bool:
        """Whether the client handles REACHED_END_OF_TOPIC (Pulsar sends it from protocol
        version 9 on). The C++ client, and the Python and Node clients built on it
        (``Pulsar-CPP-v...``), has no handler for it: it takes the command for an invalid one
        and closes the connection, then reconnects and is told again. Those consumers are not
        sent it; they find the end as a receive that times out and, for a reader,
        ``has_message_available()`` turning false."""
        return self.protocol_version >= pb.v9 and not self.client_version.startswith("Pulsar-CPP")

    @property
    def knows_assigned_broker(self) -> bool:
        """Whether the client reads the new owner's URL in CLOSE_PRODUCER / CLOSE_CONSUMER
        (clients of protocol version 20 and later; older ones look the topic up again)."""
        return self.protocol_version >= pb.v20

    def drop_consumer(self, subscription: AnySubscription, consumer: Consumer) -> None:
        subscription.remove_consumer(consumer)
        if not subscription.durable:
            self.spawn(subscription.topic.remove_subscription_if_unused(subscription), None)


Handler = Callable[[ServerConnection, Any, codec.Frame], None]

#: Which handler serves which command. Commands legal in the state table but missing here get
#: a NotAllowedError answer (``connect.unsupported``).
HANDLERS: dict[int, Handler] = {
    Type.CONNECT: authentication.connect,
    Type.AUTH_RESPONSE: authentication.auth_response,
    Type.PING: connect.ping,
    Type.PONG: connect.pong,
    Type.PARTITIONED_METADATA: lookup.partitioned_metadata,
    Type.LOOKUP: lookup.lookup_topic,
    Type.GET_TOPICS_OF_NAMESPACE: lookup.topics_of_namespace,
    Type.GET_SCHEMA: schema.get_schema,
    Type.GET_OR_CREATE_SCHEMA: schema.get_or_create_schema,
    Type.PRODUCER: producer.producer,
    Type.SEND: producer.send_message,  # a SEND gathered into a run goes to producer.send_run
    Type.CLOSE_PRODUCER: producer.close_producer,
    Type.SUBSCRIBE: consumer.subscribe,
    Type.FLOW: consumer.flow,
    Type.ACK: consumer.ack,
    Type.REDELIVER_UNACKNOWLEDGED_MESSAGES: consumer.redeliver,
    Type.CLOSE_CONSUMER: consumer.close_consumer,
    Type.UNSUBSCRIBE: consumer.unsubscribe,
    Type.SEEK: consumer.seek,
    Type.GET_LAST_MESSAGE_ID: consumer.get_last_message_id,
}
