"""The proxy's own connection to a broker: opened with the proxy's CONNECT (its role, the
client's ``original_principal``), then either asked lookups by request id (the lookup pool) or
handed to a relay, after which its bytes go to the client undecoded.

Frames are cut here by their size prefix and decoded one at a time, so that when the broker's
CONNECTED arrives the bytes after it are still raw: a relay starts from exactly there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.proxy.brokers import Address

log = logging.getLogger(__name__)
Type = pb.BaseCommand.Type
_U32 = struct.Struct(">I")


class BrokerUnreachable(Exception):
    """The broker could not be reached, or did not answer in time; the message says which."""


@dataclass(slots=True)
class BrokerRefused(Exception):
    """The broker answered CONNECT with an error: passed back to the client with its code."""

    error: int
    message: str

    def __str__(self) -> str:
        return f"{pb.ServerError.Name(self.error)}: {self.message}"


class BrokerLink(asyncio.Protocol):
    """One connection to ``address``. ``connected`` resolves with the broker's CONNECTED;
    ``request`` sends a command with a fresh request id and awaits the answer with that id;
    ``relay_to(sink)`` turns it into a byte pipe (what was received past CONNECTED included)."""

    def __init__(self, address: Address, max_frame_size: int) -> None:
        loop = asyncio.get_running_loop()
        self.address = address
        self.max_frame_size = max_frame_size
        self.transport: asyncio.Transport | None = None
        self.connected: asyncio.Future[pb.CommandConnected] = loop.create_future()
        self.closed = False
        #: Loop time of the last bytes from the broker (the relay's read timeout).
        self.last_heard = loop.time()
        #: Loop time of the last request (the lookup pool's idle check).
        self.last_used = loop.time()
        self._buffer = bytearray()
        self._pending: dict[int, asyncio.Future[codec.Frame]] = {}
        self._ids = itertools.count()
        self._sink: Callable[[bytes], None] | None = None
        self._on_close: list[Callable[[], None]] = []
        #: Called when this connection's write buffer passes its high-water mark and when it
        #: drains again (the relay pauses and resumes reading the client meanwhile).
        self.on_pause_writing: Callable[[], None] | None = None
        self.on_resume_writing: Callable[[], None] | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_heard = asyncio.get_running_loop().time()
        if self._sink is not None:
            self._sink(data)
            return
        self._buffer += data
        while self._sink is None and len(self._buffer) >= 4:
            size = _U32.unpack_from(self._buffer)[0]
            if size + 4 > self.max_frame_size or size < 4:
                log.warning(
                    "broker %s: frame of %d bytes cannot be read; closing", self.address, size
                )
                self.close()
                return
            if len(self._buffer) < size + 4:
                return
            body = bytes(self._buffer[4 : size + 4])
            del self._buffer[: size + 4]
            try:
                frame = codec.decode_frame(body)
            except codec.ProtocolError as e:
                log.warning("broker %s: malformed frame, closing: %s", self.address, e)
                self.close()
                return
            self._frame(frame)

    def pause_writing(self) -> None:
        if self.on_pause_writing is not None:
            self.on_pause_writing()

    def resume_writing(self) -> None:
        if self.on_resume_writing is not None:
            self.on_resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        error = BrokerUnreachable(f"connection to broker {self.address} closed")
        if not self.connected.done():
            self.connected.set_exception(error)
            self.connected.exception()  # retrieved: nobody may be waiting any more
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for callback in self._on_close:
            callback()

    # -- frames -----------------------------------------------------------------------------------

    def _frame(self, frame: codec.Frame) -> None:
        kind = frame.type
        if kind == Type.CONNECTED:
            if not self.connected.done():
                self.connected.set_result(frame.body)  # type: ignore[arg-type]
            return
        if kind == Type.PING:
            self.write(codec.encode_command(pb.CommandPong()))
            return
        if kind == Type.PONG:
            return
        body = frame.body
        request_id = getattr(body, "request_id", None)
        future = self._pending.pop(request_id, None) if request_id is not None else None
        if future is not None:
            if not future.done():
                future.set_result(frame)
            return
        if kind == Type.ERROR and not self.connected.done():
            self.connected.set_exception(BrokerRefused(body.error, body.message))  # type: ignore[attr-defined]
            self.close()
            return
        log.info(
            "broker %s: unexpected %s on a lookup connection; ignored", self.address, frame.name
        )

    # -- use --------------------------------------------------------------------------------------

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def request(self, body: object, timeout: float) -> codec.Frame:
        """Send ``body`` (a command with a ``request_id`` field, overwritten here) and await
        the broker's answer to it (``BrokerUnreachable`` on close or timeout)."""
        if self.closed:
            raise BrokerUnreachable(f"connection to broker {self.address} closed")
        request_id = next(self._ids)
        body.request_id = request_id  # type: ignore[attr-defined]
        future: asyncio.Future[codec.Frame] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self.last_used = asyncio.get_running_loop().time()
        self.write(codec.encode_command(body))
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise BrokerUnreachable(
                f"broker {self.address} did not answer within {timeout:g} s"
            ) from None
        finally:
            self._pending.pop(request_id, None)

    def relay_to(self, sink: Callable[[bytes], None]) -> None:
        """From now on every byte from the broker goes to ``sink``, starting with those already
        received past CONNECTED."""
        self._sink = sink
        rest, self._buffer = bytes(self._buffer), bytearray()
        if rest:
            sink(rest)


async def open_link(
    address: Address,
    dial_host: str,
    connect: pb.CommandConnect,
    *,
    ssl_context: object | None,
    server_hostname: str | None,
    timeout: float,
    max_frame_size: int,
) -> BrokerLink:
    """Dial the broker, send ``connect``, wait for its CONNECTED: all within ``timeout``
    (``BrokerUnreachable``), or the broker's refusal (``BrokerRefused``)."""
    loop = asyncio.get_running_loop()
    link: BrokerLink | None = None
    try:
        async with asyncio.timeout(timeout):
            _, link = await loop.create_connection(
                lambda: BrokerLink(address, max_frame_size),
                dial_host,
                address.port,
                ssl=ssl_context,  # type: ignore[arg-type]
                server_hostname=server_hostname if ssl_context is not None else None,
            )
            link.write(codec.encode_command(connect))
            await link.connected
    except BaseException as e:
        if link is not None:
            link.close()  # also when the client went away meanwhile (cancelled)
        if isinstance(e, TimeoutError):
            raise BrokerUnreachable(
                f"broker {address} did not complete CONNECT within {timeout:g} s "
                "(broker_proxy_connect_timeout_ms)"
            ) from None
        if isinstance(e, OSError):
            raise BrokerUnreachable(f"cannot connect to broker {address}: {e}") from None
        raise
    return link
