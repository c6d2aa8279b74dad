"""One client connection speaking the Pulsar binary protocol.

Bytes go through the sans-I/O codec; each decoded command goes to a handler. Handlers that
need storage (producer and consumer creation, sends) run as tasks, so one slow topic never
blocks the connection's other work. A malformed frame ends this connection only, with one log
line; a bad checksum on a SEND is answered with SEND_ERROR and the connection carries on.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING

from magnetar.broker.consumer import Consumer
from magnetar.broker.dispatchers.base import ConsumerBusyError
from magnetar.broker.managed_ledger import Position
from magnetar.broker.nonpersistent import (
    NonPersistentSubscription,
    NonPersistentTopic,
)
from magnetar.broker.producers import ProducerBusyError
from magnetar.broker.subscription import Subscription, SubscriptionTypeError
from magnetar.broker.topic import (
    LATEST_LEDGER_ID,
    NamespaceNotFoundError,
    PersistentTopic,
    TopicNotFoundError,
)
from magnetar.broker.topic_name import InvalidTopicNameError, TopicName
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

if TYPE_CHECKING:
    from magnetar.broker.broker import Broker

log = logging.getLogger(__name__)
Type = pb.BaseCommand.Type
SERVER_VERSION = "magnetar-0.1"


class ServerConnection(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.decoder = codec.FrameDecoder(broker.config.max_message_size + codec.FRAME_PADDING)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.connected = False
        self.producers: dict[int, tuple[PersistentTopic | NonPersistentTopic, str]] = {}
        self.consumers: dict[int, tuple[Subscription | NonPersistentSubscription, Consumer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- transport ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.connections.discard(self)
        for subscription, consumer in self.consumers.values():
            self._drop_consumer(subscription, consumer)
        self.consumers.clear()
        for producer_id, (topic, _name) in self.producers.items():
            topic.producers.remove((id(self), producer_id))
        self.producers.clear()
        for task in self._tasks:
            task.cancel()

    def _drop_consumer(
        self, subscription: Subscription | NonPersistentSubscription, consumer: Consumer
    ) -> None:
        subscription.remove_consumer(consumer)
        if not subscription.durable:
            asyncio.get_running_loop().create_task(
                subscription.topic.remove_subscription_if_unused(subscription)
            )

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send(self, body: object) -> None:
        self.write(codec.encode_command(body))  # type: ignore[arg-type]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        while True:
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
                self._handle(frame)
            except Exception:
                log.exception("connection %s: error handling %s", self.peer, frame.name)
                self.close()
                return

    def _spawn(self, coro: object) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        self.send(
            pb.CommandSendError(
                producer_id=send.producer_id,
                sequence_id=send.sequence_id,
                error=pb.ChecksumError,
                message="message checksum does not match its content",
            )
        )

    # -- dispatch -----------------------------------------------------------------------------

    def _handle(self, frame: codec.Frame) -> None:
        body = frame.body
        kind = frame.type
        if not self.connected and kind != Type.CONNECT:
            log.warning("connection %s: %s before CONNECT; closing", self.peer, frame.name)
            self.close()
            return
        match kind:
            case Type.CONNECT:
                self._connect(body)
            case Type.PING:
                self.send(pb.CommandPong())
            case Type.PONG:
                pass
            case Type.PARTITIONED_METADATA:
                self._spawn(self._partitioned_metadata(body))
            case Type.LOOKUP:
                self._lookup(body)
            case Type.PRODUCER:
                self._spawn(self._producer(body))
            case Type.SEND:
                self._send_message(body, frame)
            case Type.CLOSE_PRODUCER:
                found_producer = self.producers.pop(body.producer_id, None)
                if found_producer is not None:
                    found_producer[0].producers.remove((id(self), body.producer_id))
                self.send(pb.CommandSuccess(request_id=body.request_id))
            case Type.SUBSCRIBE:
                self._spawn(self._subscribe(body))
            case Type.FLOW:
                found = self.consumers.get(body.consumer_id)
                if found is not None:
                    found[0].flow(found[1], body.messagePermits)
            case Type.ACK:
                found = self.consumers.get(body.consumer_id)
                if found is not None:
                    found[0].ack(found[1], body.ack_type, list(body.message_id))
                    if body.HasField("request_id"):
                        self.send(
                            pb.CommandAckResponse(
                                consumer_id=body.consumer_id, request_id=body.request_id
                            )
                        )
            case Type.REDELIVER_UNACKNOWLEDGED_MESSAGES:
                found = self.consumers.get(body.consumer_id)
                if found is not None:
                    found[0].redeliver(found[1], list(body.message_ids) or None)
            case Type.CLOSE_CONSUMER:
                found = self.consumers.pop(body.consumer_id, None)
                if found is not None:
                    self._drop_consumer(*found)
                self.send(pb.CommandSuccess(request_id=body.request_id))
            case Type.UNSUBSCRIBE:
                self._spawn(self._unsubscribe(body))
            case Type.SEEK:
                self._spawn(self._seek(body))
            case Type.GET_TOPICS_OF_NAMESPACE:
                self._spawn(self._topics_of_namespace(body))
            case Type.GET_LAST_MESSAGE_ID:
                found = self.consumers.get(body.consumer_id)
                if found is None:
                    self._error(body.request_id, pb.ConsumerNotFound, "unknown consumer id")
                elif not found[0].topic.name.persistent:
                    self._error(
                        body.request_id,
                        pb.NotAllowedError,
                        "a non-persistent topic stores no messages: it has no last message id",
                    )
                else:
                    subscription = found[0]
                    mark_delete = subscription.cursor.mark_delete_position
                    self.send(
                        pb.CommandGetLastMessageIdResponse(
                            request_id=body.request_id,
                            last_message_id=subscription.topic.last_message_id(),
                            consumer_mark_delete_position=pb.MessageIdData(
                                ledgerId=mark_delete.ledger_id, entryId=mark_delete.entry_id
                            ),
                        )
                    )
            case _:
                request_id = getattr(body, "request_id", None)
                log.info("connection %s: %s is not served yet", self.peer, frame.name)
                if request_id is not None:
                    self.send(
                        pb.CommandError(
                            request_id=request_id,
                            error=pb.NotAllowedError,
                            message=f"{frame.name} is not supported by this broker yet",
                        )
                    )

    # -- handlers -----------------------------------------------------------------------------

    def _connect(self, body: pb.CommandConnect) -> None:
        self.connected = True
        self.send(
            pb.CommandConnected(
                server_version=SERVER_VERSION,
                protocol_version=codec.negotiate_protocol_version(body.protocol_version),
                max_message_size=self.broker.config.max_message_size,
            )
        )

    def _topic_name(self, name: str, request_id: int, reply: type) -> TopicName | None:
        try:
            topic = TopicName.parse(name)
        except InvalidTopicNameError as e:
            self._error(request_id, pb.InvalidTopicName, str(e), reply)
            return None
        return topic

    def _error(self, request_id: int, error: int, message: str, reply: type | None = None) -> None:
        if reply in (pb.CommandLookupTopicResponse, pb.CommandPartitionedTopicMetadataResponse):
            # These requests are answered by their own response type, with a Failed status.
            self.send(
                reply(request_id=request_id, response=reply.Failed, error=error, message=message)  # type: ignore[misc,union-attr]
            )
        else:
            self.send(pb.CommandError(request_id=request_id, error=error, message=message))

    async def _partitioned_metadata(self, body: pb.CommandPartitionedTopicMetadata) -> None:
        name = self._topic_name(
            body.topic, body.request_id, pb.CommandPartitionedTopicMetadataResponse
        )
        if name is None:
            return
        try:
            partitions = await self.broker.partitions_for_client(name)
        except (NamespaceNotFoundError, TopicNotFoundError) as e:
            self._error(
                body.request_id,
                pb.TopicNotFound,
                str(e),
                pb.CommandPartitionedTopicMetadataResponse,
            )
            return
        except Exception as e:  # the metadata store failed: an answer, not a client timeout
            log.warning("partitioned metadata of %s: %s", name, e)
            self._error(
                body.request_id,
                pb.MetadataError,
                f"partitioned metadata of {name}: {e}",
                pb.CommandPartitionedTopicMetadataResponse,
            )
            return
        self.send(
            pb.CommandPartitionedTopicMetadataResponse(
                request_id=body.request_id,
                partitions=partitions,
                response=pb.CommandPartitionedTopicMetadataResponse.Success,
            )
        )

    def _lookup(self, body: pb.CommandLookupTopic) -> None:
        if self._topic_name(body.topic, body.request_id, pb.CommandLookupTopicResponse) is None:
            return
        self.send(
            pb.CommandLookupTopicResponse(
                request_id=body.request_id,
                response=pb.CommandLookupTopicResponse.Connect,
                brokerServiceUrl=self.broker.service_url,
                authoritative=True,
            )
        )

    async def _producer(self, body: pb.CommandProducer) -> None:
        name = self._topic_name(body.topic, body.request_id, pb.CommandError)
        if name is None:
            return
        try:
            topic = await self.broker.get_topic(name, auto=True)
        except (NamespaceNotFoundError, TopicNotFoundError) as e:
            self._error(body.request_id, pb.TopicNotFound, str(e))
            return
        except Exception as e:  # any storage failure: the client gets the reason, not a timeout
            log.warning("topic %s cannot be loaded: %s", name, e)
            self._error(body.request_id, pb.ServiceNotReady, f"topic {name} cannot be loaded: {e}")
            return
        producer_name = body.producer_name or f"magnetar-{uuid.uuid4().hex[:12]}"
        key = (id(self), body.producer_id)
        mode = body.producer_access_mode
        if mode == pb.WaitForExclusive and len(topic.producers):
            # Pulsar's protocol: "pending" now, the real success when the topic is ours.
            self.send(
                pb.CommandProducerSuccess(
                    request_id=body.request_id, producer_name=producer_name, producer_ready=False
                )
            )
        try:
            epoch = await topic.producers.add(
                key, mode, lambda: self._fence_producer(body.producer_id)
            )
        except ProducerBusyError as e:
            self._error(body.request_id, pb.ProducerBusy, f"topic {name}: {e}")
            return
        self.producers[body.producer_id] = (topic, producer_name)
        self.send(
            pb.CommandProducerSuccess(
                request_id=body.request_id,
                producer_name=producer_name,
                last_sequence_id=(
                    topic.deduplication.last_sequence_id(producer_name)
                    if topic.deduplication is not None
                    else -1
                ),
                topic_epoch=epoch,
            )
        )

    def _fence_producer(self, producer_id: int) -> None:
        """Another producer took the topic with ExclusiveWithFencing."""
        if self.producers.pop(producer_id, None) is not None:
            self.send(pb.CommandCloseProducer(producer_id=producer_id, request_id=0))

    def _send_message(self, body: pb.CommandSend, frame: codec.Frame) -> None:
        found = self.producers.get(body.producer_id)
        if found is None:
            self.send(
                pb.CommandSendError(
                    producer_id=body.producer_id,
                    sequence_id=body.sequence_id,
                    error=pb.NotConnected,
                    message="unknown producer id",
                )
            )
            return
        topic, producer_name = found
        future = topic.publish(
            frame.headers_and_payload,
            producer_name,
            body.sequence_id,
            body.highest_sequence_id if body.HasField("highest_sequence_id") else -1,
        )
        producer_id, sequence_id = body.producer_id, body.sequence_id
        highest = body.highest_sequence_id if body.HasField("highest_sequence_id") else None

        def receipt(done: asyncio.Future[Position]) -> None:
            if done.cancelled():
                return
            error = done.exception()
            if error is not None:
                log.warning("topic %s: send failed: %s", topic.name, error)
                self.send(
                    pb.CommandSendError(
                        producer_id=producer_id,
                        sequence_id=sequence_id,
                        error=pb.PersistenceError,
                        message=str(error),
                    )
                )
                return
            position = done.result()
            if position is None:  # a duplicate: acknowledged, not stored again
                position = Position(2**64 - 1, 2**64 - 1)  # Pulsar's (-1, -1) on the wire
            message = pb.CommandSendReceipt(
                producer_id=producer_id,
                sequence_id=sequence_id,
                message_id=pb.MessageIdData(ledgerId=position.ledger_id, entryId=position.entry_id),
            )
            if highest is not None:
                message.highest_sequence_id = highest
            self.send(message)

        future.add_done_callback(receipt)

    async def _subscribe(self, body: pb.CommandSubscribe) -> None:
        name = self._topic_name(body.topic, body.request_id, pb.CommandError)
        if name is None:
            return
        log.debug("connection %s: SUBSCRIBE %s", self.peer, body)
        try:
            topic = await self.broker.get_topic(name, auto=True)
            consumer = Consumer(
                body.consumer_id,
                body.consumer_name,
                self,
                priority=body.priority_level,
                key_shared_meta=body.keySharedMeta if body.HasField("keySharedMeta") else None,
            )
            start = None
            if not body.durable:  # a reader: start at the given message (or earliest/latest)
                start = (
                    body.start_message_id
                    if body.HasField("start_message_id")
                    else pb.MessageIdData(ledgerId=LATEST_LEDGER_ID, entryId=LATEST_LEDGER_ID)
                )
            subscription = await topic.subscribe(
                consumer, body.subscription, body.subType, body.initialPosition, start
            )
        except ConsumerBusyError as e:
            self._error(body.request_id, pb.ConsumerBusy, str(e))
            return
        except SubscriptionTypeError as e:
            self._error(body.request_id, pb.SubscriptionNotFound, str(e))
            return
        except NotImplementedError as e:
            self._error(body.request_id, pb.NotAllowedError, str(e))
            return
        except (NamespaceNotFoundError, TopicNotFoundError) as e:
            self._error(body.request_id, pb.TopicNotFound, str(e))
            return
        except Exception as e:  # any storage failure: the client gets the reason, not a timeout
            log.warning("topic %s cannot be loaded: %s", name, e)
            self._error(body.request_id, pb.ServiceNotReady, f"topic {name} cannot be loaded: {e}")
            return
        self.consumers[body.consumer_id] = (subscription, consumer)
        self.send(pb.CommandSuccess(request_id=body.request_id))

    async def _topics_of_namespace(self, body: pb.CommandGetTopicsOfNamespace) -> None:
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

    async def _seek(self, body: pb.CommandSeek) -> None:
        found = self.consumers.get(body.consumer_id)
        if found is None:
            self._error(body.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = found[0]
        if not subscription.topic.name.persistent:
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
        self.send(pb.CommandSuccess(request_id=body.request_id))
        # Like Pulsar: the subscription's consumers are disconnected and come back at the new position.
        for consumer in consumers:
            owner = consumer.connection
            owner.consumers.pop(consumer.consumer_id, None)
            owner.send(pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=0))
        if not subscription.durable:
            await subscription.topic.remove_subscription_if_unused(subscription)

    async def _unsubscribe(self, body: pb.CommandUnsubscribe) -> None:
        found = self.consumers.pop(body.consumer_id, None)
        if found is None:
            self._error(body.request_id, pb.SubscriptionNotFound, "unknown consumer id")
            return
        subscription, consumer = found
        subscription.remove_consumer(consumer)
        if subscription.dispatcher.consumers:
            self._error(
                body.request_id, pb.UnsupportedVersionError, "subscription still has consumers"
            )
            return
        await subscription.topic.unsubscribe(subscription.name)
        self.send(pb.CommandSuccess(request_id=body.request_id))
