"""Dispatch rate limiting by fixed windows, as Pulsar's DispatchRateLimiter."""

from __future__ import annotations

from magnetar.broker.topics.dispatch_rate import DispatchRate, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_messages_per_window() -> None:
    clock = Clock()
    limiter = RateLimiter(DispatchRate(messages=10, period_s=2), clock)
    assert limiter.available() == 10 and limiter.delay() == 0
    limiter.consume(7, 700)
    assert limiter.available() == 3 and limiter.delay() == 0
    limiter.consume(3, 300)
    assert limiter.available() == 0
    clock.now += 0.5
    assert limiter.delay() == 1.5  # until the window ends
    clock.now += 1.5
    assert limiter.available() == 10 and limiter.delay() == 0  # a new window


def test_bytes_and_no_limit() -> None:
    clock = Clock()
    limiter = RateLimiter(DispatchRate(bytes=1000), clock)
    assert limiter.available() is None
    limiter.consume(1, 1200)  # an entry may overshoot; the next waits
    assert limiter.delay() == 1.0
    assert DispatchRate().unlimited and not DispatchRate(messages=5).unlimited
