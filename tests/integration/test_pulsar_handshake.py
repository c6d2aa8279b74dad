"""The official `pulsar-client` against a scripted in-test broker built on Magnetar's codec.

The broker here is deliberately tiny: it answers each command the client sends with a fixed
reply. What it proves is wire compatibility in both directions: every frame the real (C++ based)
client sends decodes with `FrameDecoder`, and the frames we encode (CONNECTED, lookup answers,
PRODUCER_SUCCESS, SEND_RECEIPT, ERROR, MESSAGE with and without CRC32C, with broker entry
metadata, batched) are understood by the client.

`pulsar-client` comes from the project's dev extra (`pip install -e '.[dev]'`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import pulsar
import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

TOPIC = "persistent://public/default/handshake"
BATCH_TOPIC = "persistent://public/default/handshake-batched"
DENIED_TOPIC = "persistent://public/default/denied"
DENIED_MESSAGE = "magnetar test broker: producing here is not allowed"
PRODUCER_NAME = "magnetar-test-producer"
RECEIPT_LEDGER = 7

Type = pb.BaseCommand.Type


@dataclass
class ScriptedBroker:
    """Answers client commands with canned replies and records every decoded frame."""

    port: int = 0
    frames: list[codec.Frame] = field(default_factory=list)
    sent_connected: list[pb.CommandConnected] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    connections: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        decoder = codec.FrameDecoder()
        try:
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    self.frames.append(frame)
                    for reply in self.replies(frame):
                        writer.write(reply)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:  # recorded so the test fails with the real cause
            self.errors.append(exc)
        finally:
            writer.close()

    def replies(self, frame: codec.Frame) -> list[bytes]:
        body = frame.body
        match frame.type:
            case Type.CONNECT:
                connected = pb.CommandConnected(
                    server_version="magnetar-test",
                    protocol_version=codec.negotiate_protocol_version(body.protocol_version),
                    max_message_size=codec.DEFAULT_MAX_MESSAGE_SIZE,
                )
                self.sent_connected.append(connected)
                return [codec.encode_command(connected)]
            case Type.PARTITIONED_METADATA:
                return [
                    codec.encode_command(
                        pb.CommandPartitionedTopicMetadataResponse(
                            request_id=body.request_id,
                            partitions=0,
                            response=pb.CommandPartitionedTopicMetadataResponse.Success,
                        )
                    )
                ]
            case Type.LOOKUP:
                return [
                    codec.encode_command(
                        pb.CommandLookupTopicResponse(
                            request_id=body.request_id,
                            response=pb.CommandLookupTopicResponse.Connect,
                            brokerServiceUrl=f"pulsar://127.0.0.1:{self.port}",
                            authoritative=True,
                        )
                    )
                ]
            case Type.PRODUCER if body.topic == DENIED_TOPIC:
                return [
                    codec.encode_command(
                        pb.CommandError(
                            request_id=body.request_id,
                            error=pb.AuthorizationError,
                            message=DENIED_MESSAGE,
                        )
                    )
                ]
            case Type.PRODUCER:
                return [
                    codec.encode_command(
                        pb.CommandProducerSuccess(
                            request_id=body.request_id, producer_name=PRODUCER_NAME
                        )
                    )
                ]
            case Type.SEND:
                receipt = pb.CommandSendReceipt(
                    producer_id=body.producer_id,
                    sequence_id=body.sequence_id,
                    message_id=pb.MessageIdData(
                        ledgerId=RECEIPT_LEDGER, entryId=100 + body.sequence_id
                    ),
                )
                return [codec.encode_command(receipt)]
            case Type.SUBSCRIBE:
                return [codec.encode_command(pb.CommandSuccess(request_id=body.request_id))]
            case Type.FLOW:
                return deliveries(body.consumer_id)
            case Type.CLOSE_PRODUCER | Type.CLOSE_CONSUMER:
                return [codec.encode_command(pb.CommandSuccess(request_id=body.request_id))]
            case Type.PING:
                return [codec.encode_command(pb.CommandPong())]
        return []

    async def wait_for_disconnects(self) -> None:
        if self.connections:
            await asyncio.wait_for(asyncio.gather(*self.connections), timeout=15)


def deliveries(consumer_id: int) -> list[bytes]:
    """MESSAGE frames in every layout the broker will use, plus one with a corrupted payload."""
    metadata = pb.MessageMetadata(
        producer_name="stored-producer", sequence_id=1, publish_time=int(time.time() * 1000)
    )

    def message(entry: int) -> pb.CommandMessage:
        return pb.CommandMessage(
            consumer_id=consumer_id, message_id=pb.MessageIdData(ledgerId=9, entryId=entry)
        )

    corrupted = bytearray(codec.encode_payload_command(message(1), metadata, b"corrupted"))
    corrupted[-1] ^= 0xFF  # sizes intact, CRC32C now wrong
    batch_metadata = pb.MessageMetadata()
    batch_metadata.CopyFrom(metadata)
    batch_metadata.num_messages_in_batch = 2
    batch = codec.build_batch(
        (pb.SingleMessageMetadata(properties=[pb.KeyValue(key="i", value=str(i))]), b"item-%d" % i)
        for i in range(2)
    )
    return [
        bytes(corrupted),
        codec.encode_payload_command(message(2), metadata, b"with-crc"),
        codec.encode_payload_command(message(3), metadata, b"without-crc", checksum=False),
        codec.encode_payload_command(
            message(4),
            metadata,
            b"with-entry-metadata",
            broker_entry_metadata=pb.BrokerEntryMetadata(broker_timestamp=1, index=41),
        ),
        codec.encode_payload_command(message(5), batch_metadata, batch),
    ]


def run_client(url: str) -> dict[str, object]:
    """Drive the official client (blocking API); runs in a worker thread."""
    results: dict[str, object] = {}
    client = pulsar.Client(
        url,
        operation_timeout_seconds=5,
        connection_timeout_ms=5000,
        logger=logging.getLogger("pulsar-client"),
    )
    try:
        producer = client.create_producer(TOPIC, batching_enabled=False)
        results["producer_name"] = producer.producer_name()
        message_id = producer.send(b"hello magnetar", properties={"k": "v"})
        results["send_id"] = (message_id.ledger_id(), message_id.entry_id())

        try:
            client.create_producer(DENIED_TOPIC)
        except pulsar.PulsarException as exc:
            results["denied"] = exc
        else:
            results["denied"] = None

        consumer = client.subscribe(TOPIC, "handshake-sub")
        received = []
        for _ in range(5):
            msg = consumer.receive(timeout_millis=5000)
            mid = msg.message_id()
            received.append((msg.data(), mid.entry_id(), mid.batch_index(), dict(msg.properties())))
            consumer.acknowledge(msg)
        results["received"] = received

        batched = client.create_producer(
            BATCH_TOPIC, batching_enabled=True, batching_max_publish_delay_ms=50
        )
        outcomes: list[object] = []
        for i in range(3):
            batched.send_async(b"batched-%d" % i, lambda res, _mid: outcomes.append(res))
        batched.flush()
        results["batch_outcomes"] = outcomes
    finally:
        client.close()
    return results


async def test_official_client_round_trip(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pulsar-client")
    broker = ScriptedBroker()
    server = await asyncio.start_server(broker.handle, "127.0.0.1", 0)
    broker.port = server.sockets[0].getsockname()[1]
    try:
        results = await asyncio.wait_for(
            asyncio.to_thread(run_client, f"pulsar://127.0.0.1:{broker.port}"), timeout=45
        )
        await broker.wait_for_disconnects()
    finally:
        server.close()
        await server.wait_closed()

    assert broker.errors == []
    by_type: dict[int, list[codec.Frame]] = {}
    for frame in broker.frames:
        by_type.setdefault(frame.type, []).append(frame)

    # Handshake: the client's CONNECT decodes and we answered at min(client, ours).
    connect = by_type[Type.CONNECT][0].command.connect
    assert connect.client_version.startswith("Pulsar-")
    assert connect.protocol_version >= 14
    assert broker.sent_connected[0].protocol_version == min(
        connect.protocol_version, codec.SERVER_PROTOCOL_VERSION
    )

    # Lookup: the client accepted our partition metadata and lookup answers.
    assert by_type[Type.PARTITIONED_METADATA][0].command.partitionMetadata.topic == TOPIC
    assert by_type[Type.LOOKUP][0].command.lookupTopic.topic == TOPIC
    assert results["producer_name"] == PRODUCER_NAME

    # SEND: metadata and payload decode, the client's CRC32C verifies, our receipt is used.
    sends = by_type[Type.SEND]
    plain = sends[0]
    assert plain.checksum is codec.ChecksumState.VALID
    assert plain.payload == b"hello magnetar"
    assert plain.metadata is not None
    assert plain.metadata.producer_name == PRODUCER_NAME
    assert [(kv.key, kv.value) for kv in plain.metadata.properties] == [("k", "v")]
    assert results["send_id"] == (RECEIPT_LEDGER, 100 + plain.command.send.sequence_id)

    # ERROR: the client surfaced our error code instead of timing out.
    assert isinstance(results["denied"], pulsar.AuthorizationError)
    assert any(DENIED_MESSAGE in record.getMessage() for record in caplog.records)

    # MESSAGE: the corrupted one was dropped (and reported), the other layouts were delivered.
    assert results["received"] == [
        (b"with-crc", 2, -1, {}),
        (b"without-crc", 3, -1, {}),
        (b"with-entry-metadata", 4, -1, {}),
        (b"item-0", 5, 0, {"i": "0"}),
        (b"item-1", 5, 1, {"i": "1"}),
    ]
    rejected = [
        frame.command.ack
        for frame in by_type[Type.ACK]
        if frame.command.ack.HasField("validation_error")
    ]
    assert [(ack.validation_error, ack.message_id[0].entryId) for ack in rejected] == [
        (pb.CommandAck.ChecksumMismatch, 1)
    ]

    # Batched SEND: one frame whose payload splits into the three messages.
    batch_frame = sends[-1]
    assert batch_frame.metadata is not None
    assert codec.is_batch(batch_frame.metadata)
    items = codec.split_batch(batch_frame.payload, batch_frame.metadata.num_messages_in_batch)
    assert [data for _, data in items] == [b"batched-0", b"batched-1", b"batched-2"]
    assert batch_frame.command.send.num_messages == 3
    assert results["batch_outcomes"] == [pulsar.Result.Ok] * 3
