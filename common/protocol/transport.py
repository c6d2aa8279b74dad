"""A Pulsar frame connection over asyncio, for any side that serves clients (broker, proxy).

The bytes go through the sans-I/O ``FrameDecoder``; the connection's state
(``common/protocol/state.py``) says whether a decoded command is legal now; what a legal frame
means is the subclass's business (``handle_frame``). This class only moves bytes:

* Writes are coalesced: everything written during one turn of the event loop leaves in one
  ``transport.write``.
* Frames are handled a slice at a time: after ``FRAMES_PER_SLICE`` the rest waits for the next
  turn of the event loop, with reading paused meanwhile, so replies and other connections' work
  go out while a burst is still being read.
* ``writable`` follows the transport's high-water mark (``pause_writing`` / ``resume_writing``).
* Keep-alive follows Pulsar: PING after ``keep_alive_interval`` without a frame from the peer,
  close after ``keep_alive_timeout`` more without one (the interval again when the timeout is 0);
  a peer that never sends CONNECT is closed after the first interval. An interval of 0 is off.

A malformed frame or an illegal command ends the connection, with one log line.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Iterator

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.state import ConnectionState, IllegalCommand, next_state

log = logging.getLogger(__name__)

#: Frames handled per turn of the event loop before the connection lets other work run. 128
#: rather than 32: 0.91-0.93x the broker's CPU per unbatched message (fewer turns, pauses and
#: writes; bench/e2e_bench.py --cost, docs/performance.md); 256 gained nothing more.
FRAMES_PER_SLICE = 128


class KeepAliveStep(enum.Enum):
    """What a keep-alive check decides (Pulsar's rule)."""

    HEARD = "heard"  # a frame arrived during the interval: all is well, wait another one
    PING = "ping"  # silence for an interval on a connected connection: ask
    CLOSE_NO_PONG = "close-no-pong"  # silence since the PING: the peer is gone
    CLOSE_NO_CONNECT = "close-no-connect"  # the peer never sent CONNECT in time


def keep_alive_step(*, heard: bool, ping_outstanding: bool, connected: bool) -> KeepAliveStep:
    """The decision of one keep-alive check: ``heard`` says whether a frame arrived since the
    last check, ``ping_outstanding`` whether that check sent a PING."""
    if heard:
        return KeepAliveStep.HEARD
    if ping_outstanding:
        return KeepAliveStep.CLOSE_NO_PONG
    if connected:
        return KeepAliveStep.PING
    return KeepAliveStep.CLOSE_NO_CONNECT


def keep_alive_delay(interval: float, timeout: float, ping_outstanding: bool) -> float | None:
    """Seconds until the next keep-alive check; None when keep-alive is off (interval 0). After a
    PING the peer has ``timeout`` to answer (the interval when the timeout is 0)."""
    if interval <= 0:
        return None
    if ping_outstanding and timeout > 0:
        return timeout
    return interval


class FrameConnection(asyncio.Protocol, abc.ABC):
    """The transport half of one connection: frames in, coalesced bytes out, keep-alive.

    Subclasses answer frames (``handle_frame``), a message whose checksum does not match
    (``checksum_failed``) and the end of the connection (``closed``)."""

    def __init__(self, max_frame_size: int, keep_alive_interval: float, keep_alive_timeout: float):
        self.decoder = codec.FrameDecoder(max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.state = ConnectionState.AWAITING_CONNECT
        #: False while the transport's buffer is above its high-water mark.
        self.writable = True
        self.keep_alive_interval = keep_alive_interval
        self.keep_alive_timeout = keep_alive_timeout
        self._out: list[bytes] = []
        self._heard = False  # a frame arrived since the last keep-alive check
        self._reading_paused = False
        #: Reading held back on purpose (a publish rate): frames already received wait too.
        self._reading_held = False
        self._ping_outstanding = False
        self._keepalive: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # see _running_loop

    # -- hooks --------------------------------------------------------------------------------

    @abc.abstractmethod
    def handle_frame(self, frame: codec.Frame) -> None:
        """Serve one frame, legal in the connection's state (already moved along)."""

    @abc.abstractmethod
    def checksum_failed(self, error: codec.ChecksumError) -> None:
        """A frame whose payload does not match its checksum; the following frames are read."""

    @abc.abstractmethod
    def closed(self, exc: Exception | None) -> None:
        """The connection is gone (state CLOSED, keep-alive stopped, nothing more is written)."""

    def frame_failed(self, frame: codec.Frame) -> None:
        """``handle_frame`` raised (logged already): answer the request if there is one."""

    def writing_resumed(self) -> None:
        """The transport drained below its low-water mark: whoever waits to write may go on."""

    def frames_handled(self) -> None:
        """A slice of frames was handled (``_process_frames``): work kept back to be done for
        several frames at once is done now."""

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport) or hasattr(transport, "write")
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._schedule_keepalive()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = ConnectionState.CLOSED
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._out.clear()
        self.closed(exc)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.writing_resumed()

    def data_received(self, data: bytes) -> None:
        self._heard = True
        self.decoder.receive_data(data)
        self._process_frames()

    # -- writing ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if not self._out:
            self._running_loop().call_soon(self._flush)
        self._out.append(data)

    def write_all(self, frames: list[bytes]) -> None:
        """``write`` of several encoded frames (they leave with the rest of the turn's)."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self._out:
            self._running_loop().call_soon(self._flush)
        self._out += frames

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The connection's event loop, asked once (each ``asyncio.get_running_loop()`` costs a
        ``getpid`` system call, and writes and slices ask per turn)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

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

    # -- reading ------------------------------------------------------------------------------

    def _process_frames(self) -> None:
        """Handle the frames received so far, a slice at a time: after FRAMES_PER_SLICE the
        rest waits for the next turn of the event loop (reading paused meanwhile), so journal
        completions and receipts go out while a burst is still being read. However the slice
        ends, ``frames_handled`` follows it."""
        if self._reading_held:
            return
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        try:
            for _ in range(FRAMES_PER_SLICE):
                if self.state is ConnectionState.CLOSED:
                    return
                if self._reading_held:
                    return  # hold_reading paused the transport and resumes it
                try:
                    frame = self.decoder.next_frame()
                except codec.ChecksumError as e:
                    self.checksum_failed(e)
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
                    self.handle_frame(frame)
                except Exception:
                    log.exception("connection %s: error handling %s", self.peer, frame.name)
                    self.frame_failed(frame)
        finally:
            self.frames_handled()
        if self.transport is not None and not self.transport.is_closing():
            self._reading_paused = True
            self.transport.pause_reading()
            self._running_loop().call_soon(self._process_frames)

    def hold_reading(self, seconds: float) -> None:
        """Read nothing from the peer for ``seconds`` (Pulsar pauses a producer's connection
        that went over its topic's publish rate): the frames already received wait as well,
        and are handled, in order, when the time is up. Nothing is refused or dropped."""
        if self._reading_held or self.transport is None or self.transport.is_closing():
            return
        self._reading_held = True
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._running_loop().call_later(seconds, self._release_reading)

    def _release_reading(self) -> None:
        self._reading_held = False
        if self.state is not ConnectionState.CLOSED:
            self._process_frames()

    def buffered_frames(self) -> Iterator[codec.Frame]:
        """The whole frames received and not handled yet (at close: the rest of a slice), up to
        the first malformed one."""
        while True:
            try:
                frame = self.decoder.next_frame()
            except codec.ProtocolError:
                return
            if frame is None:
                return
            yield frame

    # -- keep-alive ---------------------------------------------------------------------------

    def _schedule_keepalive(self) -> None:
        delay = keep_alive_delay(
            self.keep_alive_interval, self.keep_alive_timeout, self._ping_outstanding
        )
        if delay is not None:
            self._keepalive = asyncio.get_running_loop().call_later(delay, self.check_alive)

    @property
    def keep_alive_due(self) -> float | None:
        """The loop time of the next keep-alive check; None when none is scheduled."""
        if self._keepalive is None or self._keepalive.cancelled():
            return None
        return self._keepalive.when()

    def check_alive(self) -> None:
        """The keep-alive timer's check (``keep_alive_step`` decides); the next one is
        scheduled unless the connection is closed."""
        if self.state is ConnectionState.CLOSED:
            return
        step = keep_alive_step(
            heard=self._heard,
            ping_outstanding=self._ping_outstanding,
            connected=self.state is ConnectionState.CONNECTED,
        )
        if step is KeepAliveStep.HEARD:
            self._heard = False
            self._ping_outstanding = False
        elif step is KeepAliveStep.PING:
            self._ping_outstanding = True
            self.send(pb.CommandPing())
        elif step is KeepAliveStep.CLOSE_NO_PONG:
            log.warning("connection %s: no answer to PING; closing", self.peer)
            self.close()
            return
        else:
            log.warning("connection %s: no CONNECT in time; closing", self.peer)
            self.close()
            return
        self._schedule_keepalive()
