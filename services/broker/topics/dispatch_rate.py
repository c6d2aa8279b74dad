"""Dispatch rate limits (Pulsar's DispatchRate: ``dispatchThrottlingRateInMsg``,
``dispatchThrottlingRateInByte`` per ``ratePeriodInSecond``), for a whole topic and for each of
its subscriptions. As Pulsar's DispatchRateLimiter: a fixed window of ``period_s``; what was sent
in the window is counted, and a dispatcher over either limit waits for the next window. A limit
of -1 (or 0) is none. With ``relativeToPublishRate`` a limit is the topic's publish rate plus the
configured amount (Pulsar's ``getRelativeDispatchRateInMsg``: the last measured average publish
rate + ``dispatchThrottlingRateInMsg``; the same for bytes), so consumers may keep up with what
producers send and catch up by at most the configured amount."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: A topic's publish rate now: (messages, bytes) a second.
PublishRates = Callable[[], tuple[float, float]]


@dataclass(slots=True, frozen=True)
class DispatchRate:
    messages: int = -1
    bytes: int = -1
    period_s: int = 1
    relative_to_publish_rate: bool = False

    @property
    def unlimited(self) -> bool:
        return self.messages <= 0 and self.bytes <= 0


class RateLimiter:
    def __init__(
        self,
        rate: DispatchRate,
        clock: Callable[[], float] = time.monotonic,
        publish_rates: PublishRates | None = None,
    ) -> None:
        self.rate = rate
        self._clock = clock
        self._publish_rates = publish_rates
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

    def limits(self) -> tuple[int, int]:
        """(messages, bytes) allowed in a window (<= 0: no limit), the publish rate added in
        when the rate is relative to it."""
        messages, size = self.rate.messages, self.rate.bytes
        if self.rate.relative_to_publish_rate and self._publish_rates is not None:
            in_messages, in_bytes = self._publish_rates()
            period = self.rate.period_s
            if messages > 0:
                messages += int(in_messages * period)
            if size > 0:
                size += int(in_bytes * period)
        return messages, size

    def available(self) -> int | None:
        """Messages that may go out in this window (None: no message limit)."""
        self._roll()
        messages, _ = self.limits()
        if messages <= 0:
            return None
        return max(messages - self._messages, 0)

    def delay(self) -> float:
        """Seconds until dispatching may go on (0: now)."""
        return self.hold()[0]

    def hold(self) -> tuple[float, bool, bool]:
        """The seconds until dispatching may go on (0: now), and whether the window's message
        and byte limits are reached."""
        now = self._roll()
        messages, size = self.limits()
        over_messages = messages > 0 and self._messages >= messages
        over_bytes = size > 0 and self._bytes >= size
        if not (over_messages or over_bytes):
            return 0.0, False, False
        return max(self._window_start + self.rate.period_s - now, 0.0), over_messages, over_bytes

    def consume(self, messages: int, size: int) -> None:
        self._roll()
        self._messages += messages
        self._bytes += size
