"""Raw Pulsar frames against a real broker, and the checks the client-flow suites share.

`RawConnection` is a hand-driven, blocking Pulsar connection: the test builds each frame with
Magnetar's codec (or writes bytes the codec would never produce) and reads the broker's answers
frame by frame. The other helpers run one standalone per test module, read a process's RSS, and
check that a standalone's log holds no traceback and no ERROR line.
"""

from __future__ import annotations

import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pulsar

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.standalone import StandaloneProcess, client

Type = pb.BaseCommand.Type

# "2024-05-01 12:00:00,123 ERROR magnetar.broker: ..." (the CLI's logging format)
_BAD_LOG_LINE = re.compile(r"Traceback|\s(ERROR|CRITICAL)\s")
#: How long a drain waits for a message that must come: only a broker that never sends it fails.
EXPECTED_MS = 10_000


class RawConnection:
    """A blocking Pulsar connection that sends whatever bytes the test gives it.

    `expect` answers the broker's PINGs by itself unless `answer_pings` is false, so a test of
    keep-alive can play a peer that never answers.
    """

    def __init__(
        self, node: StandaloneProcess, *, timeout: float = 10, answer_pings: bool = True
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", node.port), timeout=timeout)
        self.timeout = timeout
        self.answer_pings = answer_pings
        self.decoder = codec.FrameDecoder(64 * 1024 * 1024)
        self.pings_seen = 0

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(self, body: object) -> None:
        """Encode and send a simple command (a BaseCommand or a bare body)."""
        self.send(codec.encode_command(body))  # type: ignore[arg-type]

    def connect(self, protocol_version: int = codec.SERVER_PROTOCOL_VERSION) -> pb.CommandConnected:
        self.command(
            pb.CommandConnect(client_version="magnetar-raw-test", protocol_version=protocol_version)
        )
        return self.expect(Type.CONNECTED).body  # type: ignore[return-value]

    def next_frame(self, timeout: float | None = None) -> codec.Frame:
        """The next frame from the broker; raises TimeoutError or EOFError."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                if frame.type == Type.PING:
                    self.pings_seen += 1
                    if self.answer_pings:
                        self.command(pb.CommandPong())
                        continue
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the broker in time")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the broker closed the connection")
            self.decoder.receive_data(data)

    def expect(self, kind: int, timeout: float | None = None) -> codec.Frame:
        """The next frame, which must be of type `kind`."""
        frame = self.next_frame(timeout)
        assert frame.type == kind, (
            f"expected {codec.command_name(kind)}, got {frame.name}: {frame.body}"
        )
        return frame

    def closed_by_peer(self, timeout: float = 10) -> bool:
        """True once the broker closed the connection (EOF or reset) within `timeout`.

        Frames the broker sends before closing are read and dropped (PINGs included, unanswered).
        """
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.sock.settimeout(remaining)
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


def send_frame(
    producer_id: int, sequence_id: int, payload: bytes, *, producer_name: str = "raw"
) -> bytes:
    """A SEND of one unbatched message."""
    metadata = pb.MessageMetadata(
        producer_name=producer_name, sequence_id=sequence_id, publish_time=int(time.time() * 1000)
    )
    command = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=1)
    return codec.encode_payload_command(command, metadata, payload)


def admin(
    node: StandaloneProcess, method: str, path: str, body: str | None = None
) -> tuple[int, str]:
    """One admin REST call; (status, body text), also for error statuses."""
    request = urllib.request.Request(
        node.admin_url + path,
        method=method,
        data=None if body is None else body.encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def bad_log_lines(node: StandaloneProcess) -> list[str]:
    """Lines of the standalone's log that hold a traceback or an ERROR/CRITICAL record."""
    try:
        text = node.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if _BAD_LOG_LINE.search(line)]


def assert_log_clean(node: StandaloneProcess) -> None:
    bad = bad_log_lines(node)
    assert not bad, "the standalone logged errors:\n" + "\n".join(bad[:40])


def drain(
    consumer: pulsar.Consumer, quiet_ms: int = 1500, expect: int = 0, *, acknowledge: bool = True
) -> list[pulsar.Message]:
    """Everything the consumer receives (acknowledged one by one unless ``acknowledge`` is
    false): the first ``expect`` messages waited for long (a loaded machine may pause for
    seconds), then more until ``quiet_ms`` of silence."""
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=EXPECTED_MS if len(got) < expect else quiet_ms)
        except pulsar.Timeout:
            return got
        if acknowledge:
            consumer.acknowledge(msg)
        got.append(msg)


def read_until(
    receive: Callable[..., pulsar.Message],
    must: set[bytes],
    quiet_ms: int,
    within_s: float = 60.0,
) -> list[bytes]:
    """The data of what ``receive`` (a Consumer's ``receive``, a Reader's ``read_next``) gives,
    in order, nothing acknowledged: until each of ``must`` came (waited for long: a loaded or
    restarted node may stall for seconds) or ``within_s`` passed, then until ``quiet_ms`` of
    silence (what else there is, doubles included)."""
    got: list[bytes] = []
    seen: set[bytes] = set()
    deadline = time.monotonic() + within_s
    while True:
        waiting = not must <= seen and time.monotonic() < deadline
        try:
            data = receive(timeout_millis=EXPECTED_MS if waiting else quiet_ms).data()
        except pulsar.Timeout:
            if waiting:
                continue
            return got
        got.append(data)
        seen.add(data)


def round_trip(node: StandaloneProcess, topic: str) -> None:
    """A fresh official client produces one message and a fresh subscription consumes it."""
    c = client(node)
    try:
        consumer = c.subscribe(
            topic, f"rt-{time.monotonic_ns()}", initial_position=pulsar.InitialPosition.Latest
        )
        producer = c.create_producer(topic, batching_enabled=False)
        token = f"round-trip-{time.monotonic_ns()}".encode()
        producer.send(token)
        msg = consumer.receive(timeout_millis=10_000)
        assert msg.data() == token
        consumer.acknowledge(msg)
    finally:
        c.close()


def module_standalone(
    data_dir: Path, extra: list[str] | None = None
) -> Iterator[StandaloneProcess]:
    """Generator body for a module-scoped fixture: one running standalone, its log checked.

    The log check runs when the module is done, so every test of the module is covered by it.
    """
    node = StandaloneProcess(data_dir, extra=extra).start()
    try:
        yield node
    finally:
        node.stop()
        print(node.log_tail())
    assert_log_clean(node)
