"""What every authentication provider shares: the credentials a client presents, the identity
they prove, and the refusal. A provider (``token``, ``tls``, ``basic``) has a ``method`` (the
``auth_method_name`` Pulsar clients send) and ``authenticate(credentials) -> Authenticated``,
raising :class:`AuthenticationError`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class AuthenticationError(Exception):
    """The credentials do not authenticate anyone; the message is safe to log and to send (it
    never repeats the credentials)."""


@dataclass(slots=True, frozen=True)
class Authenticated:
    role: str
    #: When the credentials stop being valid (seconds since the epoch); None: never.
    expires_at: float | None = None


@dataclass(slots=True, frozen=True)
class Credentials:
    """What a client presented: ``data`` is the binary protocol's ``auth_data`` or the HTTP
    ``Authorization`` header's value after its scheme (``Bearer``, ``Basic``);
    ``peer_certificate`` the DER of the certificate the client showed on TLS, if any."""

    data: bytes = b""
    peer_certificate: bytes | None = None


class Provider(Protocol):
    method: str

    def authenticate(self, credentials: Credentials) -> Authenticated: ...
