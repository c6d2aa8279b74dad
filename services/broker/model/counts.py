"""What the broker counts for metrics at its doors: connections (Pulsar's
``pulsar_connection_*`` and ``pulsar_active_connections``) and topic lookups, binary and HTTP
(``pulsar_broker_lookup*``). Plain integers and recent lookup times, read when scraped. A leaf
module: it imports nothing of the broker, so the protocol and admin rooms both count here."""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

#: Lookup times kept for the quantiles of ``pulsar_broker_lookup``.
RECENT_LOOKUPS = 1024


@dataclass(slots=True)
class ConnectionCounts:
    """Client connections since the broker started."""

    created: int = 0  # accepted by the listener
    succeeded: int = 0  # CONNECT answered with CONNECTED
    failed: int = 0  # CONNECT refused (credentials, version)
    closed: int = 0


@dataclass(slots=True)
class LookupCounts:
    """Binary LOOKUP requests since the broker started: answered here (``answers``),
    redirected to another broker (``redirects``), failed (``failures``), in flight
    (``pending``), and how long each took (milliseconds)."""

    answers: int = 0
    redirects: int = 0
    failures: int = 0
    pending: int = 0
    count: int = 0
    sum_ms: float = 0.0
    recent_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_LOOKUPS))

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        """Around one lookup: pending while it runs, its time recorded, a failure counted
        when it raises (the caller counts the answer: :meth:`answered`)."""
        self.pending += 1
        started = time.monotonic()
        try:
            yield
        except BaseException:
            self.failures += 1
            raise
        finally:
            self.pending -= 1
            self.record(time.monotonic() - started)

    def answered(self, *, redirect: bool) -> None:
        if redirect:
            self.redirects += 1
        else:
            self.answers += 1

    def record(self, seconds: float) -> None:
        ms = seconds * 1000.0
        self.count += 1
        self.sum_ms += ms
        self.recent_ms.append(ms)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the recent lookup times (NaN before the first)."""
        values = sorted(self.recent_ms)
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]
