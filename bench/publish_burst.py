"""How fast a standalone acknowledges a burst of non-batched sends, from the broker's side.

The plain-flow check sends 2,000 messages with ``send_async`` as fast as a Python loop can
(about 50,000 a second) through the official client, whose queue holds 1,000 unacknowledged
sends and refuses the rest (ProducerQueueIsFull). Whether all 2,000 get in depends on how soon
the broker acknowledges the first ones and how fast it goes on.

Starts one ``magnetar standalone`` with its default settings (journal fsync on) on free ports,
then, per round, a new topic and:

- ``raw``: one producer on a raw connection sends 2,000 pre-encoded SEND frames paced at
  ``--rate`` messages a second (no client library in the way) and timestamps each receipt:
  first receipt, receipts within 40 ms, the 1,000th and the last;
- ``client``: the official client sends ``--messages`` non-batched messages with
  ``block_if_queue_full``; the standalone's CPU (user + system, from /proc) per message.

    python bench/publish_burst.py [--rounds 3] [--rate 50000] [--messages 20000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from magnetar.common.proto import pulsar_api_pb2 as pb  # noqa: E402
from magnetar.common.protocol import codec  # noqa: E402
from tests.support.etcd import free_port  # noqa: E402

BURST = 2000
Type = pb.BaseCommand.Type


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


class Raw:
    """A blocking Pulsar connection for pre-encoded frames."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = codec.FrameDecoder(1 << 26)

    def command(self, body: object) -> None:
        self.sock.sendall(codec.encode_command(body))  # type: ignore[arg-type]

    def expect(self, kind: int) -> codec.Frame:
        while True:
            frame = self.decoder.next_frame()
            if frame is None:
                self.decoder.receive_data(self.sock.recv(1 << 20))
            elif frame.type == Type.PING:
                self.command(pb.CommandPong())
            else:
                assert frame.type == kind, f"expected {codec.command_name(kind)}, got {frame}"
                return frame


def raw_round(port: int, rate: float) -> dict[str, float]:
    conn = Raw(port)
    conn.command(pb.CommandConnect(client_version="publish-burst", protocol_version=21))
    conn.expect(Type.CONNECTED)
    topic = f"persistent://public/default/burst-{time.time_ns()}"
    conn.command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
    conn.expect(Type.PRODUCER_SUCCESS)
    frames = []
    for i in range(BURST):
        payload = f"m{i}".encode()
        metadata = pb.MessageMetadata(
            producer_name="burst",
            sequence_id=i,
            publish_time=int(time.time() * 1000),
            partition_key=f"k{i % 16}",
            uncompressed_size=len(payload),
        )
        send = pb.CommandSend(producer_id=1, sequence_id=i, num_messages=1)
        frames.append(codec.encode_payload_command(send, metadata, payload))
    receipts: list[float] = []

    def read() -> None:
        while len(receipts) < BURST:
            conn.expect(Type.SEND_RECEIPT)
            receipts.append(time.perf_counter())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.perf_counter()
    for i in range(0, BURST, 20):
        while time.perf_counter() < started + i / rate:
            pass
        conn.sock.sendall(b"".join(frames[i : i + 20]))
    reader.join(60)
    conn.sock.close()
    ms = [1000 * (t - started) for t in receipts]
    return {
        "first": ms[0],
        "by40": sum(1 for t in ms if t <= 40),
        "thousandth": ms[999],
        "last": ms[-1],
    }


def client_round(url: str, pid: int, messages: int) -> tuple[float, float]:
    """(messages a second, standalone CPU microseconds per message)."""
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            f"cpu-{time.time_ns()}", batching_enabled=False, block_if_queue_full=True
        )
        producer.send(b"warm")
        cpu_before, started = cpu_seconds(pid), time.perf_counter()
        for i in range(messages):
            producer.send_async(f"m{i}".encode(), None, partition_key=f"k{i % 16}")
        producer.flush()
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu_before
        producer.close()
        return messages / elapsed, 1e6 * cpu / messages
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=50_000, help="raw sends a second")
    parser.add_argument("--messages", type=int, default=20_000, help="client round's sends")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="publish-burst-"))
    port = free_port()
    command = [
        shutil.which("magnetar") or "magnetar", "standalone", "--data-dir", str(work / "data"),
        "--broker-port", str(port), "--http-port", str(free_port()),
        "--bookie-port", str(free_port()), "--bookie-http-port", str(free_port()),
    ]  # fmt: skip
    with open(work / "standalone.log", "w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the standalone did not open its port") from None
                time.sleep(0.2)
        print(f"raw burst of {BURST} non-batched sends at {args.rate:,.0f}/s, new topic each:")
        for n in range(args.rounds):
            r = raw_round(port, args.rate)
            print(
                f"  round {n + 1}: first receipt {r['first']:6.1f} ms, receipts by 40 ms "
                f"{r['by40']:5.0f}, 1000th {r['thousandth']:6.1f} ms, all {r['last']:6.1f} ms"
            )
        print(f"official client, {args.messages:,} non-batched sends, block_if_queue_full:")
        rates, costs = [], []
        for n in range(args.rounds):
            rate, cost = client_round(f"pulsar://127.0.0.1:{port}", proc.pid, args.messages)
            rates.append(rate)
            costs.append(cost)
            print(f"  round {n + 1}: {rate:8,.0f} msg/s, standalone CPU {cost:5.1f} us/msg")
        print(
            f"median: {statistics.median(rates):,.0f} msg/s, "
            f"{statistics.median(costs):.1f} us of standalone CPU per message"
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
