"""The frame transport (common/protocol/transport.py) over a fake asyncio transport: no sockets.

Bytes are fed with ``data_received``; what the connection writes, and whether it reads, is
what the fake transport records.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.state import ConnectionState
from magnetar.common.protocol.transport import (
    FRAMES_PER_SLICE,
    FrameConnection,
    KeepAliveStep,
    keep_alive_delay,
    keep_alive_step,
)

Type = pb.BaseCommand.Type


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("10.0.0.1", 6650) if name == "peername" else default

    def frames(self) -> list[codec.Frame]:
        decoder = codec.FrameDecoder(1 << 20)
        decoder.receive_data(b"".join(self.writes))
        found = []
        while (frame := decoder.next_frame()) is not None:
            found.append(frame)
        return found


class Recorder(FrameConnection):
    """Handles a frame by remembering it; a frame of type ``fail_on`` raises."""

    def __init__(self, interval: float = 0, timeout: float = 0) -> None:
        super().__init__(1 << 20, interval, timeout)
        self.handled: list[int] = []
        self.checksum_errors: list[codec.ChecksumError] = []
        self.failed: list[int] = []
        self.closed_with: list[Exception | None] = []
        self.resumed = 0
        self.fail_on: int | None = None

    def handle_frame(self, frame: codec.Frame) -> None:
        if frame.type == self.fail_on:
            raise RuntimeError("handler bug")
        self.handled.append(frame.type)

    def checksum_failed(self, error: codec.ChecksumError) -> None:
        self.checksum_errors.append(error)

    def closed(self, exc: Exception | None) -> None:
        self.closed_with.append(exc)

    def frame_failed(self, frame: codec.Frame) -> None:
        self.failed.append(frame.type)

    def writing_resumed(self) -> None:
        self.resumed += 1


def connected(interval: float = 0, timeout: float = 0) -> tuple[Recorder, FakeTransport]:
    conn, transport = Recorder(interval, timeout), FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def turn() -> None:
    """Let the event loop run one turn (the connection's call_soon callbacks)."""
    await asyncio.sleep(0)


CONNECT = codec.encode_command(pb.CommandConnect(client_version="t", protocol_version=21))
PING = codec.encode_command(pb.CommandPing())


async def test_peer_is_named_from_the_transport() -> None:
    conn, _ = connected()
    assert conn.peer == "10.0.0.1:6650"


async def test_frames_split_anywhere_are_handled_once_whole() -> None:
    conn, _ = connected()
    data = CONNECT + PING
    for i in range(len(data)):
        conn.data_received(data[i : i + 1])
    assert conn.handled == [Type.CONNECT, Type.PING]
    assert conn.state is ConnectionState.CONNECTED


async def test_a_burst_is_handled_a_slice_per_loop_turn_with_reading_paused_between() -> None:
    conn, transport = connected()
    conn.data_received(CONNECT + PING * (2 * FRAMES_PER_SLICE + 5))
    assert len(conn.handled) == FRAMES_PER_SLICE
    assert not transport.reading
    await turn()
    assert len(conn.handled) == 2 * FRAMES_PER_SLICE
    assert not transport.reading
    await turn()
    assert len(conn.handled) == 2 * FRAMES_PER_SLICE + 6
    # The slice that found the buffer empty resumed reading; the one after it stays reading.
    assert transport.reading


async def test_a_short_read_keeps_reading() -> None:
    conn, transport = connected()
    conn.data_received(CONNECT + PING * 3)
    assert len(conn.handled) == 4
    assert transport.reading


async def test_everything_written_in_one_turn_leaves_in_one_write() -> None:
    conn, transport = connected()
    conn.write(b"a")
    conn.send(pb.CommandPong())
    conn.write(b"c")
    assert transport.writes == []
    await turn()
    assert transport.writes == [b"a" + codec.encode_command(pb.CommandPong()) + b"c"]
    conn.write(b"d")
    await turn()
    assert transport.writes[1:] == [b"d"]


async def test_close_flushes_what_was_written_first() -> None:
    conn, transport = connected()
    conn.write(b"last words")
    conn.close()
    assert transport.writes == [b"last words"] and transport.closing
    conn.write(b"after")
    await turn()
    assert transport.writes == [b"last words"]


async def test_writable_follows_the_transport_buffer() -> None:
    conn, _ = connected()
    conn.pause_writing()
    assert not conn.writable
    conn.resume_writing()
    assert conn.writable and conn.resumed == 1


async def test_a_malformed_frame_closes_the_connection() -> None:
    conn, transport = connected()
    conn.data_received(CONNECT + b"\x00\x00\x00\x02\xff\xff")
    assert conn.handled == [Type.CONNECT]
    assert transport.closing


async def test_an_illegal_command_closes_the_connection() -> None:
    conn, transport = connected()
    conn.data_received(codec.encode_command(pb.CommandFlow(consumer_id=1, messagePermits=1)))
    assert conn.handled == [] and transport.closing


async def test_a_bad_checksum_goes_to_its_hook_and_reading_goes_on() -> None:
    conn, transport = connected()
    send = codec.encode_payload_command(
        pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1),
        pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1),
        b"payload",
    )
    damaged = send[:-1] + bytes([send[-1] ^ 0xFF])
    conn.data_received(CONNECT + damaged + PING)
    assert len(conn.checksum_errors) == 1
    assert conn.checksum_errors[0].command.send.producer_id == 1
    assert conn.handled == [Type.CONNECT, Type.PING]
    assert not transport.closing


async def test_a_failing_handler_is_answered_and_the_next_frame_handled() -> None:
    conn, transport = connected()
    conn.fail_on = Type.PING
    conn.data_received(CONNECT + PING + codec.encode_command(pb.CommandPong()))
    assert conn.failed == [Type.PING]
    assert conn.handled == [Type.CONNECT, Type.PONG]
    assert not transport.closing


async def test_connection_lost_closes_state_drops_output_and_calls_the_hook() -> None:
    conn, transport = connected(interval=30)
    conn.write(b"never sent")
    conn.connection_lost(None)
    assert conn.state is ConnectionState.CLOSED and conn.closed_with == [None]
    await turn()
    assert transport.writes == []
    conn.data_received(PING)
    assert conn.handled == []


async def test_buffered_frames_are_the_rest_of_a_slice() -> None:
    conn, _ = connected()
    conn.data_received(CONNECT + PING * (FRAMES_PER_SLICE + 2))
    rest = list(conn.buffered_frames())
    assert [f.type for f in rest] == [Type.PING] * 3


# -- keep-alive ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heard", "ping_outstanding", "connected_", "step"),
    [
        (True, False, True, KeepAliveStep.HEARD),
        (True, True, True, KeepAliveStep.HEARD),
        (True, False, False, KeepAliveStep.HEARD),
        (False, False, True, KeepAliveStep.PING),
        (False, True, True, KeepAliveStep.CLOSE_NO_PONG),
        (False, False, False, KeepAliveStep.CLOSE_NO_CONNECT),
    ],
)
def test_keep_alive_step(
    heard: bool, ping_outstanding: bool, connected_: bool, step: KeepAliveStep
) -> None:
    assert keep_alive_step(
        heard=heard, ping_outstanding=ping_outstanding, connected=connected_
    ) is (step)


def test_keep_alive_delay() -> None:
    assert keep_alive_delay(0, 10, False) is None  # off
    assert keep_alive_delay(0, 10, True) is None
    assert keep_alive_delay(30, 10, False) == 30
    assert keep_alive_delay(30, 10, True) == 10  # the answer to a PING is due sooner
    assert keep_alive_delay(30, 0, True) == 30  # no timeout: another interval


async def test_keep_alive_pings_a_silent_peer_then_closes() -> None:
    conn, transport = connected(interval=30, timeout=10)
    conn.data_received(CONNECT)
    conn.check_alive()  # heard CONNECT: nothing to do
    await turn()
    assert transport.writes == [] and not transport.closing
    conn.check_alive()  # silent for an interval: PING
    await turn()
    assert [f.type for f in transport.frames()] == [Type.PING]
    due = conn.keep_alive_due
    assert due is not None and due - asyncio.get_running_loop().time() == pytest.approx(10, abs=1)
    conn.check_alive()  # still silent: closed
    assert transport.closing


async def test_keep_alive_is_reset_by_any_frame_after_a_ping() -> None:
    conn, transport = connected(interval=30, timeout=10)
    conn.data_received(CONNECT)
    conn.check_alive()
    conn.check_alive()  # PING
    conn.data_received(codec.encode_command(pb.CommandPong()))
    conn.check_alive()
    assert not transport.closing
    conn.check_alive()  # a new interval of silence: PING again, not close
    await turn()
    assert [f.type for f in transport.frames()] == [Type.PING, Type.PING]


async def test_keep_alive_closes_a_peer_that_never_connects() -> None:
    conn, transport = connected(interval=30)
    conn.check_alive()
    assert transport.closing
    assert transport.frames() == []


async def test_keep_alive_off_schedules_nothing() -> None:
    conn, _ = connected(interval=0)
    assert conn.keep_alive_due is None


async def test_keep_alive_is_scheduled_an_interval_ahead_and_stops_at_close() -> None:
    conn, _ = connected(interval=30, timeout=10)
    due = conn.keep_alive_due
    assert due is not None and due - asyncio.get_running_loop().time() == pytest.approx(30, abs=1)
    conn.connection_lost(None)
    assert conn.keep_alive_due is None
