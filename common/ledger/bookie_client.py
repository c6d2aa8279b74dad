"""A client of one bookie: pipelined adds over one gRPC stream, and the unary calls.

Adds are queued and a sender task packs whatever is waiting into one ``AddRequest`` per stream
message, so many adds share a message while the previous one is in flight. A receiver task
matches results to callers by tag. If the stream breaks, every pending add fails with
``BookieUnavailableError`` and the next add opens a new stream.

Channels are plain by default; with :class:`BookieTls` they are TLS channels, and gRPC checks the
bookie's certificate against the host of its ``host:port`` address (see :class:`BookieTls`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from magnetar.common.grpc_tls import GrpcClientTls
from magnetar.common.proto import bookie_pb2 as pb
from magnetar.common.proto import bookie_pb2_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Called with None when an add is durable, or with the error that failed it.
AddCallback = Callable[["BookieError | None"], None]
_MAX_BATCH_BYTES = 4 * 1024 * 1024


class BookieError(Exception):
    """A bookie answered with a status other than OK."""

    def __init__(self, address: str, status: int, message: str) -> None:
        self.address = address
        self.status = status
        self.status_name = pb.Status.Name(status)
        super().__init__(f"bookie {address}: {self.status_name}: {message}")


class BookieUnavailableError(BookieError):
    """The bookie could not be reached, or the call did not finish in time."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(address, pb.INTERNAL, message)
        self.status_name = "UNAVAILABLE"
        self.args = (f"bookie {address}: unavailable: {message}",)


class RangeReadUnsupportedError(BookieError):
    """The bookie has no range read (it predates ``ReadEntries``): read its entries one by one."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(address, pb.BAD_REQUEST, f"no range read: {message}")


class BookieTlsConfigError(ValueError):
    """A TLS file for bookie connections cannot be used; the message names the file."""


@dataclass(slots=True, frozen=True)
class BookieTls(GrpcClientTls):
    """TLS of the gRPC channels to bookies (Pulsar's ``bookkeeperTLS*`` client settings).

    - ``trust_certs_file``: PEM CA certificates the bookies' certificates must chain to (empty:
      gRPC's bundled public roots, which a private CA is not in).
    - ``certificate_file`` / ``key_file``: a PEM client certificate and its unencrypted key, shown
      to bookies that require one (BookKeeper's ``tlsClientAuthentication``); both or neither.

    Hostname verification is gRPC's and cannot be turned off: the bookie's certificate must name
    the host of the address the bookie registers under (``advertised_address``), as a DNS name
    or an IP address in its subjectAltName. BookKeeper's ``tlsHostnameVerificationEnabled=false``
    has no equivalent here.
    """

    PEER = "bookie"
    ERROR = BookieTlsConfigError


@dataclass(slots=True, frozen=True)
class LedgerPosition:
    lac: int
    last_entry_id: int


class GroupAnswer:
    """A bookie's answers to the entries of a group, told on as one: the first error, or
    None once every entry was answered."""

    __slots__ = ("error", "left", "tell")

    def __init__(self, tell: AddCallback, count: int) -> None:
        self.tell = tell
        self.left = count
        self.error: BookieError | None = None

    def __call__(self, error: BookieError | None) -> None:
        self.answered(1, error)

    def answered(self, count: int, error: BookieError | None) -> None:
        """``count`` of the group's entries answered alike (a client that completes adds in
        runs tells a run at once)."""
        if error is not None and self.error is None:
            self.error = error
        self.left -= count
        if not self.left:
            self.tell(self.error)


def add_entries(
    bookie: BookieClient,
    ledger_id: int,
    first_entry_id: int,
    entries: list[bytes],
    callback: AddCallback,
    *,
    master_key: bytes = b"",
) -> None:
    """``add_entry`` of consecutive entries to one bookie (either client), answered once:
    ``callback`` gets the first error, or None once every one of them is durable. A client
    with ``add_run`` (the in-process one) takes them in one call."""
    answer = GroupAnswer(callback, len(entries))
    add_run = getattr(bookie, "add_run", None)
    if add_run is not None:
        add_run(ledger_id, first_entry_id, entries, answer, master_key=master_key)
        return
    for entry_id, entry in enumerate(entries, first_entry_id):
        bookie.add_entry(ledger_id, entry_id, entry, answer, master_key=master_key)


def add_future() -> tuple[asyncio.Future[None], AddCallback]:
    """A future and the add callback that settles it (for ``add`` on top of ``add_entry``)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settle(error: BookieError | None) -> None:
        if not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    return fut, settle


class BookieClient:
    """``credentials`` (from :meth:`BookieTls.channel_credentials`): a TLS channel; None: plain."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self._channel = grpc.aio.secure_channel(address, credentials, options=options)
        self._stub = bookie_pb2_grpc.BookieStub(self._channel)
        self._tags = itertools.count(1)
        self._waiting: dict[int, AddCallback] = {}
        self._outbox: list[pb.AddOp] = []
        self._outbox_ready = asyncio.Event()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        self._fail_all("client closed")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._call is not None:
            self._call.cancel()
        await self._channel.close()

    async def __aenter__(self) -> BookieClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- adds ----------------------------------------------------------------------------

    def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        entry: bytes,
        callback: AddCallback,
        *,
        recovery: bool = False,
        master_key: bytes = b"",
    ) -> None:
        """Queue an add (``master_key``: the ledger's, from its metadata); ``callback(None)`` runs once the bookie made it durable, or
        ``callback(error)`` if it failed. Callbacks run on the event loop, straight from the
        receive loop (no future, no extra loop turn: this is the ledger client's hot path)."""
        if self._closed:
            raise BookieUnavailableError(self.address, "client closed")
        if self._call is None:
            self._open_stream()
        tag = next(self._tags)
        self._waiting[tag] = callback
        self._outbox.append(
            pb.AddOp(
                tag=tag,
                ledger_id=ledger_id,
                entry_id=entry_id,
                entry=entry,
                recovery=recovery,
                master_key=master_key,
            )
        )
        if not self._outbox_ready.is_set():
            self._outbox_ready.set()

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        entry: bytes,
        *,
        recovery: bool = False,
        master_key: bytes = b"",
    ) -> asyncio.Future[None]:
        """Queue an add; the future completes when the bookie made it durable."""
        fut, settle = add_future()
        self.add_entry(ledger_id, entry_id, entry, settle, recovery=recovery, master_key=master_key)
        return fut

    @property
    def pending_adds(self) -> int:
        return len(self._waiting)

    def _open_stream(self) -> None:
        call = self._stub.AddEntries()
        self._call = call
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(
            asyncio.create_task(self._send(call), name=f"bookie-send-{self.address}")
        )
        self._tasks.append(
            asyncio.create_task(self._receive(call), name=f"bookie-recv-{self.address}")
        )

    async def _send(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            while True:
                if self._call is not call:
                    # This stream broke and another may have replaced it: its sender must not
                    # take that stream's adds (they would go to a dead call, unanswered).
                    return
                if not self._outbox:
                    self._outbox_ready.clear()
                    await self._outbox_ready.wait()
                    continue
                take, size = 0, 0
                for op in self._outbox:
                    take += 1
                    size += len(op.entry)
                    if size >= _MAX_BATCH_BYTES:
                        break
                batch = self._outbox[:take]
                del self._outbox[:take]
                await call.write(pb.AddRequest(ops=batch))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._stream_broken(call, e)

    async def _receive(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            async for response in call:
                waiting = self._waiting
                for tag in response.ok_tags:
                    callback = waiting.pop(tag, None)
                    if callback is not None:
                        callback(None)
                for result in response.results:
                    callback = waiting.pop(result.tag, None)
                    if callback is not None:
                        callback(BookieError(self.address, result.status, result.message))
            self._stream_broken(call, EOFError("stream ended"))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._stream_broken(call, e)

    def _stream_broken(self, call: grpc.aio.StreamStreamCall, error: BaseException) -> None:
        if self._call is not call:
            return
        self._call = None
        call.cancel()
        detail = error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error)
        if self._waiting:
            log.warning(
                "bookie %s: add stream broken (%s); failing %d adds",
                self.address,
                detail,
                len(self._waiting),
            )
        self._outbox.clear()
        self._outbox_ready.set()  # its sender wakes up and ends
        self._fail_all(f"add stream broken: {detail}")

    def _fail_all(self, reason: str) -> None:
        waiting, self._waiting = self._waiting, {}
        error = BookieUnavailableError(self.address, reason)
        for callback in waiting.values():
            callback(error)

    # -- unary calls --------------------------------------------------------------------

    async def _unary(self, method: str, request: object, timeout: float | None = None) -> object:
        try:
            return await getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except grpc.aio.AioRpcError as e:
            raise BookieUnavailableError(
                self.address, f"{method}: {e.code().name}: {e.details()}"
            ) from None

    def _check(self, response: object) -> None:
        status = response.status  # type: ignore[attr-defined]
        if status != pb.OK:
            raise BookieError(self.address, status, response.message)  # type: ignore[attr-defined]

    async def read(self, ledger_id: int, entry_id: int, *, fence: bool = False) -> bytes:
        """The formatted entry (``entry_id`` -1: the last one this bookie stores)."""
        response = await self._unary(
            "ReadEntry", pb.ReadRequest(ledger_id=ledger_id, entry_id=entry_id, fence=fence)
        )
        self._check(response)
        return response.entry  # type: ignore[attr-defined,no-any-return]

    async def read_range(
        self, ledger_id: int, first: int, max_count: int, max_bytes: int
    ) -> list[bytes]:
        """A range read (the bookie's ``ReadEntries``): formatted entries ``first``,
        ``first + 1``, ..., at least one, at most ``max_count`` and about ``max_bytes``.
        RangeReadUnsupportedError when the bookie predates range reads."""
        request = pb.ReadRangeRequest(
            ledger_id=ledger_id, first_entry_id=first, max_count=max_count, max_bytes=max_bytes
        )
        try:
            response = await self._stub.ReadEntries(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise RangeReadUnsupportedError(self.address, e.details() or "") from None
            raise BookieUnavailableError(
                self.address, f"ReadEntries: {e.code().name}: {e.details()}"
            ) from None
        self._check(response)
        return list(response.entries)

    async def read_lac(
        self, ledger_id: int, *, previous: int = -2, wait_ms: int = 0
    ) -> LedgerPosition:
        """LAC and last entry; with ``previous`` >= -1 and ``wait_ms``, a long poll that returns
        when the LAC passes ``previous`` (status TIMEOUT raises BookieError)."""
        request = pb.ReadLacRequest(ledger_id=ledger_id, previous_lac=previous, timeout_ms=wait_ms)
        response = await self._unary("ReadLac", request, timeout=self.timeout + wait_ms / 1000)
        self._check(response)
        return LedgerPosition(response.lac, response.last_entry_id)  # type: ignore[attr-defined]

    async def fence(self, ledger_id: int) -> LedgerPosition:
        response = await self._unary("Fence", pb.FenceRequest(ledger_id=ledger_id))
        self._check(response)
        return LedgerPosition(response.lac, response.last_entry_id)  # type: ignore[attr-defined]

    async def delete_ledger(self, ledger_id: int) -> None:
        response = await self._unary("DeleteLedger", pb.DeleteLedgerRequest(ledger_id=ledger_id))
        self._check(response)

    async def info(self) -> pb.BookieInfoResponse:
        return await self._unary("GetBookieInfo", pb.BookieInfoRequest())  # type: ignore[return-value]

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the channel is connected (TimeoutError if not within ``timeout``)."""
        await asyncio.wait_for(self._channel.channel_ready(), timeout)
