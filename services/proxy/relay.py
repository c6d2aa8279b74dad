"""Relay mode: the bytes of one client connection and of its broker connection, both ways,
never decoded (Pulsar's ``DirectProxyHandler``).

Back-pressure is the transports' own: when the client's write buffer passes its high-water
mark (``pause_writing``), reading from the broker stops until it drains (``resume_writing``),
and the same the other way. So a relayed connection holds at most about a write buffer's
high-water mark plus one read per direction, however slow either side reads; the backlog waits
on the broker, where it belongs.

A relay ends when either side closes, when the broker sends nothing for
``broker_proxy_read_timeout_ms`` (brokers PING every keep-alive interval, so silence means it
is gone), or when the proxy closes it (the broker's registration disappeared, the client's
credentials expired).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from magnetar.proxy import metrics as m

if TYPE_CHECKING:
    from magnetar.proxy.broker_link import BrokerLink
    from magnetar.proxy.brokers import Address
    from magnetar.proxy.connection import ProxyConnection
    from magnetar.proxy.proxy import Proxy

log = logging.getLogger(__name__)

#: Write buffer limits of both transports of a relay: the bound on what it holds per direction.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class Relay:
    def __init__(
        self, proxy: Proxy, client: ProxyConnection, link: BrokerLink, broker: Address
    ) -> None:
        info = proxy.directory.broker_at(broker)
        self.client = client
        self.link = link
        self.broker = broker
        self.read_timeout = proxy.config.broker_proxy_read_timeout_ms / 1000
        metrics = proxy.metrics
        self._bytes_to_broker = metrics.binary_bytes.labels(direction=m.TO_BROKER)
        self._bytes_to_client = metrics.binary_bytes.labels(direction=m.TO_CLIENT)
        self._relayed = metrics.relayed_connections.labels(
            broker=info.broker_id if info else str(broker)
        )
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    def start(self, early: bytes) -> None:
        """Start relaying; ``early`` are client bytes that arrived before the broker answered."""
        client, broker = self.client.transport, self.link.transport
        assert client is not None and broker is not None
        for transport in (client, broker):
            transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        self._relayed.inc()
        self.link.on_pause_writing = self._broker_write_paused
        self.link.on_resume_writing = self._broker_write_resumed
        self.link.on_close(self._broker_closed)
        if self.link.closed:
            self._broker_closed()
            return
        self.link.relay_to(self.to_client)
        if early:
            self.to_broker(early)
        if self.read_timeout > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.read_timeout, self._check_broker_heard)

    # -- bytes ------------------------------------------------------------------------------------

    def to_broker(self, data: bytes) -> None:
        transport = self.link.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            self._bytes_to_broker.inc(len(data))

    def to_client(self, data: bytes) -> None:
        transport = self.client.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            self._bytes_to_client.inc(len(data))

    # -- back-pressure ----------------------------------------------------------------------------

    def client_write_paused(self) -> None:
        _pause(self.link.transport)

    def client_write_resumed(self) -> None:
        _resume(self.link.transport)

    def _broker_write_paused(self) -> None:
        _pause(self.client.transport)

    def _broker_write_resumed(self) -> None:
        _resume(self.client.transport)

    # -- the end ----------------------------------------------------------------------------------

    def _check_broker_heard(self) -> None:
        if self.closed:
            return
        silent = asyncio.get_running_loop().time() - self.link.last_heard
        if silent >= self.read_timeout:
            log.warning(
                "connection %s: broker %s sent nothing for %.0f s "
                "(broker_proxy_read_timeout_ms); closing the relay",
                self.client.peer,
                self.broker,
                silent,
            )
            self.close()
            return
        self._timer = asyncio.get_running_loop().call_later(
            self.read_timeout - silent, self._check_broker_heard
        )

    def _broker_closed(self) -> None:
        if not self.closed:
            self.close()

    def close(self) -> None:
        """Close both sides (what was written is still flushed)."""
        if self.closed:
            return
        self.closed = True
        self._relayed.dec()
        if self._timer is not None:
            self._timer.cancel()
        self.link.close()
        self.client.close()


def _pause(transport: asyncio.Transport | None) -> None:
    if transport is not None and not transport.is_closing():
        transport.pause_reading()


def _resume(transport: asyncio.Transport | None) -> None:
    if transport is not None and not transport.is_closing():
        transport.resume_reading()
