"""The bookie protocol over gRPC: a thin layer that turns requests into LedgerStorage calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
from google.protobuf.message import DecodeError

from magnetar.bookie.ledger_storage import LedgerStorage, StorageError
from magnetar.common.ledger.entry import decode_header
from magnetar.common.proto import bookie_pb2 as pb
from magnetar.common.proto import bookie_pb2_grpc

log = logging.getLogger(__name__)

#: gRPC message limit: an add request may batch many entries of up to max_entry_size each.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: At most this many entry bytes in one range read's response (the first entry excepted).
MAX_RANGE_BYTES = 16 * 1024 * 1024


class BookieService(bookie_pb2_grpc.BookieServicer):
    def __init__(self, storage: LedgerStorage, info: Callable[[], pb.BookieInfoResponse]) -> None:
        self.storage = storage
        self._info = info

    async def AddEntries(
        self, request_iterator: AsyncIterator[pb.AddRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.AddResponse]:
        # Requests are taken in as fast as they come (each is checked and journaled at once);
        # responses go back in request order as their journal groups become durable.
        pending: asyncio.Queue[tuple[pb.AddRequest, Awaitable[list[tuple[int, int, str]]]] | None]
        pending = asyncio.Queue()

        async def take_requests() -> None:
            try:
                async for request in request_iterator:
                    await self.storage.wait_for_capacity()
                    pending.put_nowait((request, self.storage.add(request.ops)))
            finally:
                pending.put_nowait(None)

        reader = asyncio.create_task(take_requests())
        try:
            while (item := await pending.get()) is not None:
                request, done = item
                failures = await done
                yield _add_response(request.ops, failures)
            try:
                await reader  # surfaces a broken request stream
            except DecodeError as e:
                log.warning("malformed AddRequest on the add stream from %s: %s", context.peer(), e)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed AddRequest: {e}")
        finally:
            reader.cancel()

    async def ReadEntry(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadResponse:
        try:
            if request.fence:
                await self.storage.fence(request.ledger_id)
            entry = await self.storage.read(request.ledger_id, request.entry_id)
        except StorageError as e:
            return pb.ReadResponse(
                status=e.status,
                message=e.message,
                ledger_id=request.ledger_id,
                entry_id=request.entry_id,
            )
        entry_id = decode_header(entry).entry_id  # -1 asked for the last one: say which it is
        return pb.ReadResponse(
            status=pb.OK, ledger_id=request.ledger_id, entry_id=entry_id, entry=entry
        )

    async def ReadEntries(
        self, request: pb.ReadRangeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadRangeResponse:
        # The response must fit in one gRPC message, whatever the client asks for.
        max_bytes = min(request.max_bytes or MAX_RANGE_BYTES, MAX_RANGE_BYTES)
        try:
            entries = await self.storage.read_range(
                request.ledger_id, request.first_entry_id, request.max_count, max_bytes
            )
        except StorageError as e:
            return pb.ReadRangeResponse(
                status=e.status,
                message=e.message,
                ledger_id=request.ledger_id,
                first_entry_id=request.first_entry_id,
            )
        return pb.ReadRangeResponse(
            status=pb.OK,
            ledger_id=request.ledger_id,
            first_entry_id=request.first_entry_id,
            entries=entries,
        )

    async def ReadLac(
        self, request: pb.ReadLacRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadLacResponse:
        wait_s = request.timeout_ms / 1000 if request.previous_lac >= -1 else 0.0
        try:
            state = await self.storage.read_lac(request.ledger_id, request.previous_lac, wait_s)
        except StorageError as e:
            return pb.ReadLacResponse(status=e.status, message=e.message, lac=-1, last_entry_id=-1)
        status = pb.TIMEOUT if wait_s > 0 and state.lac <= request.previous_lac else pb.OK
        return pb.ReadLacResponse(status=status, lac=state.lac, last_entry_id=state.last_entry_id)

    async def Fence(
        self, request: pb.FenceRequest, context: grpc.aio.ServicerContext
    ) -> pb.FenceResponse:
        try:
            state = await self.storage.fence(request.ledger_id)
        except StorageError as e:
            return pb.FenceResponse(status=e.status, message=e.message, lac=-1, last_entry_id=-1)
        return pb.FenceResponse(status=pb.OK, lac=state.lac, last_entry_id=state.last_entry_id)

    async def DeleteLedger(
        self, request: pb.DeleteLedgerRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteLedgerResponse:
        try:
            await self.storage.delete_ledger(request.ledger_id)
        except StorageError as e:
            return pb.DeleteLedgerResponse(status=e.status, message=e.message)
        return pb.DeleteLedgerResponse(status=pb.OK)

    async def GetBookieInfo(
        self, request: pb.BookieInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.BookieInfoResponse:
        return self._info()


def _add_response(ops: Sequence[pb.AddOp], failures: list[tuple[int, int, str]]) -> pb.AddResponse:
    if not failures:
        return pb.AddResponse(ok_tags=[op.tag for op in ops])
    failed = {i for i, _status, _message in failures}
    return pb.AddResponse(
        ok_tags=[op.tag for i, op in enumerate(ops) if i not in failed],
        results=[
            pb.AddResult(
                tag=ops[i].tag,
                ledger_id=ops[i].ledger_id,
                entry_id=ops[i].entry_id,
                status=status,
                message=message,
            )
            for i, status, message in failures
        ],
    )


def grpc_server_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # gRPC turns SO_REUSEPORT on by default: a second bookie would then bind a port already
        # in use without error and the kernel would split connections between the two.
        ("grpc.so_reuseport", 0),
    ]
