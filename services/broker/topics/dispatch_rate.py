"""Dispatch rate limits (Pulsar's DispatchRate: ``dispatchThrottlingRateInMsg``,
``dispatchThrottlingRateInByte`` per ``ratePeriodInSecond``), for a whole topic and for each of
its subscriptions. As Pulsar's DispatchRateLimiter: a fixed window of ``period_s``; what was sent
in the window is counted, and a dispatcher over either limit waits for the next window. A limit
of -1 (or 0) is none."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class DispatchRate:
    messages: int = -1
    bytes: int = -1
    period_s: int = 1

    @property
    def unlimited(self) -> bool:
        return self.messages <= 0 and self.bytes <= 0


class RateLimiter:
    def __init__(self, rate: DispatchRate, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._window_start = clock()
        self._messages = 0
        self._bytes = 0

    def _roll(self) -> float:
        now = self._clock()
        if now - self._window_start >= self.rate.period_s:
            self._window_start = now
            self._messages = 0
            self._bytes = 0
        return now

    def available(self) -> int | None:
        """Messages that may go out in this window (None: no message limit)."""
        self._roll()
        if self.rate.messages <= 0:
            return None
        return max(self.rate.messages - self._messages, 0)

    def delay(self) -> float:
        """Seconds until dispatching may go on (0: now)."""
        now = self._roll()
        over = (self.rate.messages > 0 and self._messages >= self.rate.messages) or (
            self.rate.bytes > 0 and self._bytes >= self.rate.bytes
        )
        return max(self._window_start + self.rate.period_s - now, 0.0) if over else 0.0

    def consume(self, messages: int, size: int) -> None:
        self._roll()
        self._messages += messages
        self._bytes += size
