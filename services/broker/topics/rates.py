"""Rates over the last interval, as Pulsar's stats give them (``msgRateIn``, ``msgRateOut``, ...):
counters are sampled, and a rate is the change over the newest window of samples, not an
average since the topic was loaded. Anything in the topics room may import this module."""

from __future__ import annotations

import datetime
import time
from collections import deque

#: The span a rate is measured over (Pulsar refreshes its stats every 60 s by default; a shorter
#: window shows a change sooner).
RATE_WINDOW_S = 10.0
#: Samples closer together than this are not kept (bounded memory however often stats are read).
MIN_SAMPLE_GAP_S = 1.0


def now_iso() -> str:
    """A timestamp as Pulsar's stats write ``connectedSince``."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class RateWindow:
    """Rates of a fixed set of counters over the last :data:`RATE_WINDOW_S` seconds.

    Each :meth:`rates` (and :meth:`sample`) call records the counters at most once a
    :data:`MIN_SAMPLE_GAP_S`; a rate is ``(now - oldest kept) / elapsed``, where the oldest kept
    sample is the newest one at least a window old (or the first one, younger than a window).
    """

    def __init__(
        self, counters: int, window_s: float = RATE_WINDOW_S, start: float | None = None
    ) -> None:
        self._window = window_s
        self._samples: deque[tuple[float, tuple[int, ...]]] = deque(
            [(time.monotonic() if start is None else start, (0,) * counters)]
        )

    def __len__(self) -> int:
        """Samples kept."""
        return len(self._samples)

    def sample(self, counters: tuple[int, ...], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self._samples[-1][0] >= MIN_SAMPLE_GAP_S:
            self._samples.append((now, counters))
        while len(self._samples) > 1 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()

    def rates(self, counters: tuple[int, ...], now: float | None = None) -> tuple[float, ...]:
        now = time.monotonic() if now is None else now
        self.sample(counters, now)
        since, old = self._samples[0]
        elapsed = now - since
        if elapsed <= 0:
            return (0.0,) * len(counters)
        return tuple(max(c - o, 0) / elapsed for c, o in zip(counters, old, strict=True))
