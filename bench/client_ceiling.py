"""How many of a 2,000-message ``send_async`` burst the official client gets in when receipts cost
the broker nothing: the ceiling for the plain-flow backlog check on this machine.

The plain-flow check (and a new user) sends 2,000 messages with ``send_async`` in a tight Python
loop, with the client's defaults: a queue of 1,000 unacknowledged sends and
``block_if_queue_full`` off, so a send that finds the queue full is dropped
(ProducerQueueIsFull). How many get in depends on the broker, but also on how fast the client
itself turns receipts into free queue slots while the loop runs.

This starts a stand-in broker in its own process that answers the handshake, lookups and
producers, and acknowledges every SEND the moment it reads it (nothing stored, a few
microseconds each), then runs the loop exactly as the check does (no callback, a partition key)
against it, batched and not, and prints how many messages reached it. Whatever is missing was
refused by the client with no broker work in the way.

    python bench/client_ceiling.py [--rounds 5] [--messages 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from magnetar.common.proto import pulsar_api_pb2 as pb  # noqa: E402
from magnetar.common.protocol import codec  # noqa: E402
from tests.support.etcd import free_port  # noqa: E402

Type = pb.BaseCommand.Type


class InstantReceipts(asyncio.Protocol):
    """One client connection: every request answered at once, every SEND acknowledged as read;
    on CLOSE_PRODUCER the number of messages that producer sent is printed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.decoder = codec.FrameDecoder(1 << 26)
        self.messages = 0
        self.entry_id = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        out: list[bytes] = []
        while (frame := self.decoder.next_frame()) is not None:
            out.extend(self.answer(frame))
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def answer(self, frame: codec.Frame) -> list[bytes]:
        body = frame.body
        if frame.type == Type.SEND:
            self.entry_id += 1
            self.messages += max(body.num_messages, 1)
            return [codec.encode_send_receipt(body.producer_id, body.sequence_id, 1, self.entry_id)]
        if frame.type == Type.CONNECT:
            reply: object = pb.CommandConnected(
                server_version="instant-receipts", protocol_version=21, max_message_size=5 << 20
            )
        elif frame.type == Type.PARTITIONED_METADATA:
            reply = pb.CommandPartitionedTopicMetadataResponse(
                request_id=body.request_id,
                partitions=0,
                response=pb.CommandPartitionedTopicMetadataResponse.Success,
            )
        elif frame.type == Type.LOOKUP:
            reply = pb.CommandLookupTopicResponse(
                request_id=body.request_id,
                brokerServiceUrl=f"pulsar://127.0.0.1:{self.port}",
                response=pb.CommandLookupTopicResponse.Connect,
                authoritative=True,
            )
        elif frame.type == Type.PRODUCER:
            reply = pb.CommandProducerSuccess(
                request_id=body.request_id, producer_name="ceiling", last_sequence_id=-1
            )
        elif frame.type == Type.CLOSE_PRODUCER:
            print(self.messages, flush=True)
            self.messages = 0
            reply = pb.CommandSuccess(request_id=body.request_id)
        elif frame.type == Type.PING:
            reply = pb.CommandPong()
        else:
            return []
        return [codec.encode_command(reply)]  # type: ignore[arg-type]


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: InstantReceipts(port), "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


def burst(client: pulsar.Client, topic: str, batched: bool, messages: int) -> float:
    """The plain-flow check's producer loop; returns its duration in seconds."""
    producer = client.create_producer(topic, batching_enabled=batched)
    started = time.perf_counter()
    for i in range(messages):
        producer.send_async(f"m{i}".encode(), None, partition_key=f"k{i % 16}")
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the stand-in broker
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return 0
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the stand-in broker did not start")
        client = pulsar.Client(
            f"pulsar://127.0.0.1:{port}", logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        print(
            f"{args.messages:,} send_async calls per round (client defaults: queue 1,000, "
            "no blocking), every receipt instant:"
        )
        for batched in (False, True):
            got = []
            for n in range(args.rounds):
                elapsed = burst(client, f"ceiling-{int(batched)}-{n}", batched, args.messages)
                got.append(int(server.stdout.readline()))
                print(
                    f"  batching={batched!s:5}  round {n + 1}: {got[-1]:5,} reached the "
                    f"broker (loop {1000 * elapsed:5.0f} ms)"
                )
            print(
                f"  batching={batched!s:5}  all rounds: {min(got):,}-{max(got):,} of "
                f"{args.messages:,}; every round complete: {all(g == args.messages for g in got)}"
            )
        client.close()
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
