"""A small asyncio Pulsar-protocol producer: what a broker needs to write to another cluster
(geo-replication), on ``codec``'s frames. CONNECT (with the broker's client credentials; ``pulsar+ssl://`` with a client TLS context),
LOOKUP (redirects followed), PRODUCER, then SENDs whose receipts resolve futures in order.

It knows nothing of the broker: a SEND carries an already encoded payload section, so the
caller decides its metadata (e.g. ``replicated_from``). Any error closes the connection and
fails every pending send; the caller reconnects and sends again from what it has not got a
receipt for (at-least-once, order kept per producer).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from urllib.parse import urlparse

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

log = logging.getLogger(__name__)

CLIENT_VERSION = "magnetar-replicator"
MAX_REDIRECTS = 8


class ProducerClientError(Exception):
    """The remote broker refused or the connection failed; reconnect and send again."""


def _host_port(url: str) -> tuple[str, int, bool]:
    """Host, port and whether the URL asks for TLS (``pulsar+ssl://``)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("pulsar", "pulsar+ssl", ""):
        raise ProducerClientError(f"not a Pulsar service URL: {url!r}")
    tls = parsed.scheme == "pulsar+ssl"
    return parsed.hostname or "localhost", parsed.port or (6651 if tls else 6650), tls


class _Connection:
    """One connection to one broker: requests by id, receipts by (producer, sequence)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = codec.FrameDecoder()
        self._requests: dict[int, asyncio.Future[codec.Frame]] = {}
        self._receipts: dict[tuple[int, int], asyncio.Future[pb.MessageIdData]] = {}
        self._connected: asyncio.Future[codec.Frame] = asyncio.get_running_loop().create_future()
        self._ids = itertools.count(1)
        self._task = asyncio.create_task(self._read_loop(), name="producer-client-read")
        self.closed = False

    def next_id(self) -> int:
        return next(self._ids)

    async def _read_loop(self) -> None:
        error: BaseException = ProducerClientError("connection closed by the remote broker")
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                for frame in self._decoder.feed(data):
                    self._handle(frame)
        except (OSError, codec.ProtocolError) as e:
            error = ProducerClientError(f"connection failed: {e}")
        except asyncio.CancelledError:
            error = ProducerClientError("connection closed")
        finally:
            self._fail_all(error)

    def _fail_all(self, error: BaseException) -> None:
        self.closed = True
        pending = [self._connected, *self._requests.values(), *self._receipts.values()]
        self._requests.clear()
        self._receipts.clear()
        for future in pending:
            if not future.done():
                future.set_exception(error)
                future.exception()  # seen: an unawaited failure is not "never retrieved"
        self._writer.close()

    def _handle(self, frame: codec.Frame) -> None:
        body = frame.body
        name = frame.name
        if name == "PING":
            self.write(pb.CommandPong())
        elif name in ("CONNECTED", "AUTH_CHALLENGE") and not self._connected.done():
            self._connected.set_result(frame)
        elif name == "SEND_RECEIPT":
            future = self._receipts.pop((body.producer_id, body.sequence_id), None)
            if future is not None and not future.done():
                future.set_result(body.message_id)
        elif name == "SEND_ERROR":
            self._fail_all(ProducerClientError(f"send failed: {body.message}"))
        elif name == "CLOSE_PRODUCER":
            self._fail_all(ProducerClientError("the remote broker closed the producer"))
        elif name == "ERROR" and not self._connected.done():
            self._connected.set_exception(ProducerClientError(body.message))
        elif hasattr(body, "request_id"):
            future_request = self._requests.pop(body.request_id, None)
            if future_request is not None and not future_request.done():
                future_request.set_result(frame)

    def write(self, command: object) -> None:
        if self.closed:
            raise ProducerClientError("connection closed")
        self._writer.write(codec.encode_command(command))  # type: ignore[arg-type]

    async def connect(self, auth_method: str, auth_data: bytes, timeout: float) -> None:
        connect = pb.CommandConnect(
            client_version=CLIENT_VERSION, protocol_version=codec.SERVER_PROTOCOL_VERSION
        )
        if auth_method:
            connect.auth_method_name = auth_method
            connect.auth_data = auth_data
        self.write(connect)
        async with asyncio.timeout(timeout):  # not wait_for: see magnetar.common.tasks.wait_set
            frame = await asyncio.shield(self._connected)
        if frame.name != "CONNECTED":
            raise ProducerClientError("the remote broker asked for an authentication challenge")

    async def request(self, command: object, timeout: float) -> codec.Frame:
        request_id = command.request_id  # type: ignore[attr-defined]
        future: asyncio.Future[codec.Frame] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        self.write(command)
        async with asyncio.timeout(timeout):
            frame = await future
        if frame.name == "ERROR":
            raise ProducerClientError(
                f"{pb.ServerError.Name(frame.body.error)}: {frame.body.message}"
            )
        return frame

    def send(
        self, producer_id: int, sequence_id: int, num_messages: int, section: bytes
    ) -> asyncio.Future[pb.MessageIdData]:
        future: asyncio.Future[pb.MessageIdData] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_exception(ProducerClientError("connection closed"))
            return future
        self._receipts[(producer_id, sequence_id)] = future
        command = pb.CommandSend(
            producer_id=producer_id, sequence_id=sequence_id, num_messages=num_messages
        )
        self._writer.write(codec.encode_payload_command_raw(command, section))
        return future

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class ProducerClient:
    """A producer on ``topic`` at the cluster whose binary service is ``service_url``."""

    def __init__(
        self,
        service_url: str,
        topic: str,
        producer_name: str,
        *,
        auth_method: str = "",
        auth_data: bytes = b"",
        timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.service_url = service_url
        #: For ``pulsar+ssl://`` URLs (the broker's client trust and certificate).
        self.tls = tls
        self.topic = topic
        self.producer_name = producer_name
        self.auth_method = auth_method
        self.auth_data = auth_data
        self.timeout = timeout
        self._connection: _Connection | None = None
        self._producer_id = 1

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.closed

    async def _open(self, url: str) -> _Connection:
        host, port, tls = _host_port(url)
        if tls and self.tls is None:
            raise ProducerClientError(f"{url} needs TLS and no client TLS context is set")
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self.tls if tls else None
                )
        except (OSError, TimeoutError) as e:
            raise ProducerClientError(f"cannot reach {url}: {e}") from None
        connection = _Connection(reader, writer)
        try:
            await connection.connect(self.auth_method, self.auth_data, self.timeout)
        except BaseException:
            await connection.close()
            raise
        return connection

    async def start(self) -> None:
        """Find the topic's owner (LOOKUP, following redirects) and create the producer."""
        await self.close()
        url, authoritative = self.service_url, False
        for _ in range(MAX_REDIRECTS):
            connection = await self._open(url)
            try:
                lookup = pb.CommandLookupTopic(
                    topic=self.topic, request_id=connection.next_id(), authoritative=authoritative
                )
                answer = (await connection.request(lookup, self.timeout)).body
            except BaseException:
                await connection.close()
                raise
            kind = answer.response
            if kind == pb.CommandLookupTopicResponse.Failed:
                await connection.close()
                raise ProducerClientError(f"lookup of {self.topic} failed: {answer.message}")
            target = answer.brokerServiceUrl
            if kind == pb.CommandLookupTopicResponse.Connect and (
                answer.proxy_through_service_url or not target or target == url
            ):
                break
            await connection.close()
            if kind == pb.CommandLookupTopicResponse.Connect:
                connection = await self._open(target)
                url = target
                break
            url, authoritative = target, answer.authoritative
        else:
            raise ProducerClientError(f"lookup of {self.topic}: too many redirects")
        try:
            command = pb.CommandProducer(
                topic=self.topic,
                producer_id=self._producer_id,
                request_id=connection.next_id(),
                producer_name=self.producer_name,
            )
            await connection.request(command, self.timeout)
        except BaseException:
            await connection.close()
            raise
        self._connection = connection
        log.info("producer %s on %s connected to %s", self.producer_name, self.topic, url)

    def send(
        self, sequence_id: int, section: bytes, num_messages: int = 1
    ) -> asyncio.Future[pb.MessageIdData]:
        """Send one payload section; the future resolves on its receipt."""
        if self._connection is None:
            raise ProducerClientError("not connected")
        return self._connection.send(self._producer_id, sequence_id, num_messages, section)

    async def close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.close()
