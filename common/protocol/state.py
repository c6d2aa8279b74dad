"""Which commands a client may send, in which state of its connection: a table, no I/O.

Modelled on h11's ``_state.py``: the connection's state is an explicit enum, the commands legal
in each state are data, and one function moves the state along or says why a command is
refused. The broker's connection consults it before dispatching any command.

States of the server's side of one connection:

* ``AWAITING_CONNECT``: only CONNECT (and PING/PONG, which Pulsar allows at any time).
* ``CONNECTED``: every client command; a second CONNECT is refused.
* ``CLOSED``: nothing.

Commands only a broker sends (CONNECTED, SEND_RECEIPT, MESSAGE, ...) are never legal from a
client, in any state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from magnetar.common.proto import pulsar_api_pb2 as pb

Type = pb.BaseCommand.Type


class ConnectionState(enum.Enum):
    AWAITING_CONNECT = "awaiting-connect"
    CONNECTED = "connected"
    CLOSED = "closed"


#: Commands a client sends once connected.
CLIENT_COMMANDS: frozenset[int] = frozenset(
    {
        Type.PING,
        Type.PONG,
        Type.PARTITIONED_METADATA,
        Type.LOOKUP,
        Type.PRODUCER,
        Type.SEND,
        Type.CLOSE_PRODUCER,
        Type.SUBSCRIBE,
        Type.FLOW,
        Type.ACK,
        Type.REDELIVER_UNACKNOWLEDGED_MESSAGES,
        Type.CLOSE_CONSUMER,
        Type.UNSUBSCRIBE,
        Type.SEEK,
        Type.GET_TOPICS_OF_NAMESPACE,
        Type.GET_LAST_MESSAGE_ID,
        Type.GET_SCHEMA,
        Type.GET_OR_CREATE_SCHEMA,
        Type.AUTH_RESPONSE,
        Type.CONSUMER_STATS,
        Type.NEW_TXN,
        Type.ADD_PARTITION_TO_TXN,
        Type.ADD_SUBSCRIPTION_TO_TXN,
        Type.END_TXN,
        Type.END_TXN_ON_PARTITION,
        Type.END_TXN_ON_SUBSCRIPTION,
        Type.TC_CLIENT_CONNECT_REQUEST,
        Type.WATCH_TOPIC_LIST,
        Type.WATCH_TOPIC_LIST_CLOSE,
    }
)

#: What may arrive in each state.
LEGAL: dict[ConnectionState, frozenset[int]] = {
    ConnectionState.AWAITING_CONNECT: frozenset({Type.CONNECT, Type.PING, Type.PONG}),
    ConnectionState.CONNECTED: CLIENT_COMMANDS,
    ConnectionState.CLOSED: frozenset(),
}

#: State changes caused by a command; any other legal command keeps the state.
TRANSITIONS: dict[tuple[ConnectionState, int], ConnectionState] = {
    (ConnectionState.AWAITING_CONNECT, Type.CONNECT): ConnectionState.CONNECTED,
}


@dataclass(slots=True, frozen=True)
class IllegalCommand(Exception):
    """A command arrived in a state where it is not allowed; the connection must be closed."""

    state: ConnectionState
    command: int

    def __str__(self) -> str:
        name = Type.Name(self.command) if self.command in Type.values() else str(self.command)
        if self.command not in CLIENT_COMMANDS and self.command != Type.CONNECT:
            return f"{name} is sent only by brokers, never by a client"
        if self.state is ConnectionState.AWAITING_CONNECT:
            return f"{name} before CONNECT"
        if self.command == Type.CONNECT:
            return "a second CONNECT on a connected connection"
        return f"{name} on a {self.state.value} connection"


def next_state(state: ConnectionState, command: int) -> ConnectionState:
    """The state after the client sent ``command`` in ``state``; raises IllegalCommand."""
    if state is ConnectionState.CONNECTED:  # every frame after CONNECT: no enum hashed
        if command in CLIENT_COMMANDS:
            return state
        raise IllegalCommand(state, command)
    if command not in LEGAL[state]:
        raise IllegalCommand(state, command)
    return TRANSITIONS.get((state, command), state)
