"""PING, PONG, and the answer to commands this broker does not serve (CONNECT is in
``authentication.py``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec

if TYPE_CHECKING:
    from magnetar.broker.protocol.connection import ServerConnection

log = logging.getLogger(__name__)


def ping(conn: ServerConnection, body: pb.CommandPing, frame: codec.Frame) -> None:
    conn.send(pb.CommandPong())


def pong(conn: ServerConnection, body: pb.CommandPong, frame: codec.Frame) -> None:
    pass  # being heard is what counts


def unsupported(conn: ServerConnection, body: Any, frame: codec.Frame) -> None:
    request_id = getattr(body, "request_id", None)
    log.info("connection %s: %s is not served", conn.peer, frame.name)
    if request_id is not None:
        conn.error(request_id, pb.NotAllowedError, f"{frame.name} is not supported by this broker")
