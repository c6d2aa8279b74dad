"""The connection state table (common/protocol/state.py), without sockets."""

from __future__ import annotations

import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol.state import (
    CLIENT_COMMANDS,
    ConnectionState,
    IllegalCommand,
    next_state,
)

Type = pb.BaseCommand.Type
BROKER_ONLY = [
    Type.CONNECTED,
    Type.SEND_RECEIPT,
    Type.SEND_ERROR,
    Type.MESSAGE,
    Type.SUCCESS,
    Type.ERROR,
    Type.PRODUCER_SUCCESS,
    Type.LOOKUP_RESPONSE,
    Type.PARTITIONED_METADATA_RESPONSE,
    Type.ACTIVE_CONSUMER_CHANGE,
    Type.GET_LAST_MESSAGE_ID_RESPONSE,
    Type.AUTH_CHALLENGE,
]


def test_connect_moves_to_connected() -> None:
    assert next_state(ConnectionState.AWAITING_CONNECT, Type.CONNECT) is ConnectionState.CONNECTED


@pytest.mark.parametrize("command", sorted(CLIENT_COMMANDS - {Type.PING, Type.PONG}))
def test_commands_before_connect_are_refused(command: int) -> None:
    with pytest.raises(IllegalCommand, match="before CONNECT"):
        next_state(ConnectionState.AWAITING_CONNECT, command)


@pytest.mark.parametrize("command", [Type.PING, Type.PONG])
def test_keepalive_is_legal_before_connect(command: int) -> None:
    assert next_state(ConnectionState.AWAITING_CONNECT, command) is ConnectionState.AWAITING_CONNECT


@pytest.mark.parametrize("command", sorted(CLIENT_COMMANDS))
def test_client_commands_keep_a_connection_connected(command: int) -> None:
    assert next_state(ConnectionState.CONNECTED, command) is ConnectionState.CONNECTED


def test_second_connect_is_refused() -> None:
    with pytest.raises(IllegalCommand, match="second CONNECT"):
        next_state(ConnectionState.CONNECTED, Type.CONNECT)


@pytest.mark.parametrize("command", BROKER_ONLY)
@pytest.mark.parametrize("state", [ConnectionState.AWAITING_CONNECT, ConnectionState.CONNECTED])
def test_broker_commands_are_never_legal_from_a_client(
    state: ConnectionState, command: int
) -> None:
    with pytest.raises(IllegalCommand, match="only by brokers"):
        next_state(state, command)


def test_nothing_is_legal_once_closed() -> None:
    for command in [Type.CONNECT, *CLIENT_COMMANDS]:
        with pytest.raises(IllegalCommand):
            next_state(ConnectionState.CLOSED, command)
