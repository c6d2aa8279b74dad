"""The authentication service of a broker or proxy: the configured providers, the anonymous
role, and one place that logs refusals (with the client's address and the reason, never the
credentials, at most a few lines per interval however many clients fail).

The binary protocol names its method (``auth_method_name``: ``token``, ``tls``, ``basic``); HTTP
names it by the ``Authorization`` scheme (``Bearer`` is a token, ``Basic`` is basic) or, with no
header, by the client certificate a TLS connection showed. A method no provider serves, or no
credentials at all, get the anonymous role when ``anonymous_user_role`` is set and are refused
otherwise, as in Pulsar.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from magnetar.common.auth.basic import BasicAuthenticator, from_http_header
from magnetar.common.auth.provider import (
    Authenticated,
    AuthenticationError,
    Credentials,
    Provider,
)
from magnetar.common.auth.settings import SecuritySettings
from magnetar.common.auth.tls import TlsAuthenticator
from magnetar.common.auth.token import TokenAuthenticator, TokenSettings

log = logging.getLogger(__name__)

#: At most this many refusals are logged per interval; the rest are counted and summed up.
FAILURES_LOGGED_PER_INTERVAL = 5
FAILURE_LOG_INTERVAL_S = 10.0


def build_providers(settings: SecuritySettings) -> dict[str, Provider]:
    """The providers ``authentication_providers`` names (``KeyConfigError`` when a key or file
    they need cannot be used: a start-up error)."""
    providers: dict[str, Provider] = {}
    for name in settings.provider_names():
        if name == "token":
            providers[name] = TokenAuthenticator(
                TokenSettings(
                    secret_key=settings.token_secret_key or None,
                    public_key=settings.token_public_key or None,
                    public_alg=settings.token_public_alg,
                    auth_claim=settings.token_auth_claim,
                    audience_claim=settings.token_audience_claim or None,
                    audience=settings.token_audience or None,
                )
            )
        elif name == "basic":
            providers[name] = BasicAuthenticator(settings.basic_auth_conf)
        elif name == "tls":
            providers[name] = TlsAuthenticator()
    return providers


class FailureLog:
    """Logs refused attempts, a few per interval; the others are counted and reported once the
    interval is over, so a client hammering bad credentials cannot flood the log."""

    def __init__(
        self,
        per_interval: int = FAILURES_LOGGED_PER_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_interval = per_interval
        self._clock = clock
        self._window_start = 0.0
        self._logged = 0
        self._suppressed = 0
        self.total = 0

    def refused(self, what: str, address: str, reason: str) -> None:
        self.total += 1
        now = self._clock()
        if now - self._window_start >= FAILURE_LOG_INTERVAL_S:
            if self._suppressed:
                log.warning(
                    "%d more authentication failures in the last %.0f s were not logged",
                    self._suppressed,
                    now - self._window_start,
                )
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < self.per_interval:
            self._logged += 1
            log.warning("%s from %s refused: %s", what, address, reason)
        else:
            self._suppressed += 1


#: Pulsar's provider names, as its metrics label them.
PROVIDER_LABELS = {
    "token": "AuthenticationProviderToken",
    "tls": "AuthenticationProviderTls",
    "basic": "AuthenticationProviderBasic",
}


class AuthenticationService:
    def __init__(self, settings: SecuritySettings) -> None:
        self.enabled = settings.authentication_enabled
        self.anonymous_role = settings.anonymous_user_role or None
        self.providers = build_providers(settings) if self.enabled else {}
        self.failures = FailureLog()
        #: Attempts per (provider, method): Pulsar's pulsar_authentication_success_total and
        #: pulsar_authentication_failures_total, read by the metrics when scraped.
        self.successes: Counter[tuple[str, str]] = Counter()
        self.refusals: Counter[tuple[str, str]] = Counter()

    def authenticate(self, method: str, credentials: Credentials) -> Authenticated:
        """The identity ``credentials`` prove by ``method`` (``AuthenticationError`` if none).
        With authentication off, everyone is anonymous (role None is the caller's to give)."""
        provider = self.providers.get(method)
        label = (PROVIDER_LABELS.get(method, "anonymous"), method or "none")
        try:
            if provider is None:
                if self.anonymous_role is not None:
                    found = Authenticated(self.anonymous_role)
                elif not method or method == "none":
                    raise AuthenticationError("Authentication required")
                else:
                    raise AuthenticationError(f"No authentication provider for method {method!r}")
            else:
                found = provider.authenticate(credentials)
        except AuthenticationError:
            self.refusals[label] += 1
            raise
        self.successes[label] += 1
        return found

    def authenticate_http(
        self, authorization: str | None, peer_certificate: bytes | None
    ) -> Authenticated:
        """An HTTP request's identity from its ``Authorization`` header, else its TLS client
        certificate, else the anonymous role."""
        if authorization:
            scheme, _, value = authorization.strip().partition(" ")
            scheme = scheme.lower()
            if scheme == "bearer":
                return self.authenticate("token", Credentials(value.strip().encode()))
            if scheme == "basic":
                return self.authenticate("basic", from_http_header(value.strip()))
            raise AuthenticationError(f"unsupported Authorization scheme {scheme!r}")
        if peer_certificate is not None and "tls" in self.providers:
            return self.authenticate("tls", Credentials(peer_certificate=peer_certificate))
        return self.authenticate("", Credentials())
