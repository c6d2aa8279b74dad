"""Publish rate limits (Pulsar's PublishRate: ``publishThrottlingRateInMsg`` and
``publishThrottlingRateInByte`` a second, per topic). As Pulsar does it, nothing is refused: what
a topic took in the current second is counted, and once a send takes it over either limit, the
connection that sent it is not read until the second is over (the client's further sends wait
in its socket and its own queue). Each such pause counts in ``limited_times`` (Pulsar's
``publishRateLimitedTimes``)."""

from __future__ import annotations

from magnetar.broker.topics.dispatch_rate import DispatchRate, RateLimiter

#: Added to each pause (see ``published``).
PAUSE_MARGIN_S = 0.005


class PublishThrottle:
    def __init__(self) -> None:
        self.limiter: RateLimiter | None = None
        #: Times a producer connection was paused for this topic's publish rate.
        self.limited_times = 0

    def apply(self, rate: tuple[int, int] | None) -> None:
        """The rate in force, ``(messages, bytes)`` a second (None: none); a limiter is kept
        while its rate is unchanged."""
        if rate is None:
            self.limiter = None
            return
        wanted = DispatchRate(rate[0] or -1, rate[1] or -1, 1)
        if self.limiter is None or self.limiter.rate != wanted:
            self.limiter = RateLimiter(wanted)

    def published(self, messages: int, size: int) -> float:
        """Count a stored send; the seconds its connection must not be read (0: none)."""
        limiter = self.limiter
        if limiter is None:
            return 0.0
        limiter.consume(messages, size)
        pause = limiter.delay()
        if pause <= 0:
            return 0.0
        self.limited_times += 1
        # A little past the window's end: a timer that fires a hair early would find the window
        # still full and pause the connection a second time for nothing.
        return pause + PAUSE_MARGIN_S
