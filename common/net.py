"""Server sockets: a bind that fails names the address and the setting that chose it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from aiohttp import web


class AddressInUseError(OSError):
    """A server socket could not be bound (in use, or not an address of this host)."""


def listen_error(setting: str, host: str, port: int, cause: object) -> str:
    return (
        f"cannot listen on {host}:{port} ({setting}): address already in use or not available "
        f"({cause}); another process holds it: stop it or choose another {setting}"
    )


async def listen_http(
    runner: web.AppRunner, host: str, port: int, setting: str, tls: ssl.SSLContext | None
) -> tuple[web.TCPSite, int]:
    """Serve ``runner``'s app on ``host:port`` (HTTPS with ``tls``): the site and the port bound.
    Never shares a port another process listens on (``reuse_port`` off)."""
    site = web.TCPSite(runner, host, port, reuse_port=False, ssl_context=tls)
    try:
        await site.start()
    except OSError as e:
        raise AddressInUseError(listen_error(setting, host, port, e)) from None
    return site, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def listen_binary(
    factory: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    setting: str,
    tls: ssl.SSLContext | None,
) -> tuple[asyncio.AbstractServer, int]:
    """Serve connections made by ``factory`` on ``host:port`` (over TLS with ``tls``): the
    server and the port bound."""
    try:
        server = await asyncio.get_running_loop().create_server(
            factory, host, port, reuse_port=False, ssl=tls
        )
    except OSError as e:
        raise AddressInUseError(listen_error(setting, host, port, e)) from None
    return server, server.sockets[0].getsockname()[1]
