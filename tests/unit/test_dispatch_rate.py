"""Dispatch rate limiting by fixed windows, as Pulsar's DispatchRateLimiter."""

from __future__ import annotations

import pytest

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


def test_relative_to_the_publish_rate() -> None:
    """relativeToPublishRate: the window's limits are the topic's publish rate plus the
    configured amounts (Pulsar's getRelativeDispatchRateInMsg), read as they change."""
    clock = Clock()
    publishing = [20.0, 4000.0]  # messages and bytes a second
    rate = DispatchRate(messages=5, bytes=100, period_s=2, relative_to_publish_rate=True)
    limiter = RateLimiter(rate, clock, publish_rates=lambda: (publishing[0], publishing[1]))
    assert limiter.limits() == (5 + 40, 100 + 8000)
    assert limiter.available() == 45
    limiter.consume(45, 1000)
    assert limiter.available() == 0 and limiter.delay() == 2.0
    publishing[0] = 30.0  # producers sped up: more may go out in this window
    assert limiter.available() == 20 and limiter.delay() == 0
    # No limit stays no limit; a rate not relative ignores the publish rate.
    unlimited = DispatchRate(messages=-1, bytes=100, relative_to_publish_rate=True)
    assert RateLimiter(unlimited, clock, publish_rates=lambda: (50.0, 0.0)).available() is None
    fixed = RateLimiter(DispatchRate(messages=5), clock, publish_rates=lambda: (50.0, 0.0))
    assert fixed.limits() == (5, -1)


def test_relative_flag_in_the_policy_document() -> None:
    from magnetar.broker.config import TopicSettings
    from magnetar.broker.namespace.policies import PolicyError, check_dispatch_rate, effective

    body = {"dispatchThrottlingRateInMsg": 10, "relativeToPublishRate": True}
    checked = check_dispatch_rate(body)
    assert checked["relativeToPublishRate"] is True
    assert (
        check_dispatch_rate({"dispatchThrottlingRateInMsg": 10})["relativeToPublishRate"] is False
    )
    document = {"topicDispatchRate": {"c": checked}}
    assert effective(document, TopicSettings()).dispatch_rate == (10, -1, 1, True)
    with pytest.raises(PolicyError, match="relativeToPublishRate"):
        check_dispatch_rate({**body, "relativeToPublishRate": "yes"})
