"""Connections the proxy refuses (limits, handshake timeout, relay targets, brokers that refuse
or cannot be reached): each counted in ``rejected_connections{reason}`` and logged, a few lines
per interval however many arrive, so a client hammering the proxy cannot flood its log."""

from __future__ import annotations

import logging
import time

from prometheus_client import Counter

log = logging.getLogger(__name__)

#: ``rejected_connections`` ``reason`` label values.
MAX_CONNECTIONS = "max_connections"
MAX_CONNECTIONS_PER_IP = "max_connections_per_ip"
HANDSHAKE_TIMEOUT = "handshake_timeout"
PROTOCOL_VERSION = "protocol_version"
AUTHENTICATION = "authentication"
TARGET_NOT_ALLOWED = "target_not_allowed"
BROKER_REFUSED = "broker_refused"
BROKER_UNREACHABLE = "broker_unreachable"

LOGGED_PER_INTERVAL = 5
INTERVAL_S = 10.0


class RefusalLog:
    def __init__(self, counter: Counter, per_interval: int = LOGGED_PER_INTERVAL) -> None:
        self.counter = counter
        self.per_interval = per_interval
        self._window_start = 0.0
        self._logged = 0
        self._suppressed = 0

    def refused(self, reason: str, peer: str, detail: str) -> None:
        self.counter.labels(reason=reason).inc()
        now = time.monotonic()
        if now - self._window_start >= INTERVAL_S:
            if self._suppressed:
                log.warning(
                    "%d more refused connections in the last %.0f s were not logged "
                    "(see pulsar_proxy_rejected_connections)",
                    self._suppressed,
                    now - self._window_start,
                )
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < self.per_interval:
            self._logged += 1
            log.warning("connection %s refused (%s): %s", peer, reason, detail)
        else:
            self._suppressed += 1
