"""Server sockets: a bind that fails names the address and the setting that chose it."""

from __future__ import annotations


class AddressInUseError(OSError):
    """A server socket could not be bound (in use, or not an address of this host)."""


def listen_error(setting: str, host: str, port: int, cause: object) -> str:
    return (
        f"cannot listen on {host}:{port} ({setting}): address already in use or not available "
        f"({cause}); another process holds it: stop it or choose another {setting}"
    )
