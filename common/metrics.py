"""What every service's ``/metrics`` has in common (anything may import this).

- ``process_*`` (CPU seconds, resident and virtual memory, open and maximum file descriptors,
  start time) and ``python_*`` (garbage collector, interpreter version), the collectors every
  Prometheus client library ships and every stock dashboard's "process" row reads;
- the text format 0.0.4 and its content type (``text/plain; version=0.0.4; charset=utf-8``),
  which Prometheus and Pulsar's own endpoints use (prometheus_client >= 0.21 announces
  ``version=1.0.0`` by default);
- no ``*_created`` series: Pulsar and BookKeeper export none, and each one doubles the series
  of a counter family for a timestamp no dashboard reads.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

#: The ``Content-Type`` of every ``/metrics`` answer (written out: prometheus_client names it
#: differently across versions).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def service_registry() -> CollectorRegistry:
    """A registry of its own for one service (tests and standalone run several in a process),
    already holding the process and interpreter collectors."""
    # Process-wide and read at scrape time: every Magnetar service wants it, so it is set by
    # whichever creates a registry first.
    prometheus_client.disable_created_metrics()
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry, *extra: str) -> bytes:
    """The registry in text format 0.0.4, followed by ``extra`` families already written in it
    (families whose exact names prometheus_client would change, such as BookKeeper's
    counters without ``_total``)."""
    body = generate_latest(registry)
    if extra:
        body += "".join(extra).encode()
    return body
