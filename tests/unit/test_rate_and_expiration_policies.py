"""How a namespace's (or topic's) policy document resolves the publish rate and the subscription
expiration time over the broker's settings (Pulsar's resolution), and the publish throttle's
pauses, without a broker."""

from __future__ import annotations

import pytest

from magnetar.broker.config import TopicSettings
from magnetar.broker.namespace.policies import (
    PolicyError,
    check_expiration_minutes,
    check_publish_rate,
    effective,
)
from magnetar.broker.topics.dispatch_rate import DispatchRate, RateLimiter
from magnetar.broker.topics.publish_rate import PAUSE_MARGIN_S, PublishThrottle


def test_publish_rate_from_the_document_else_the_broker() -> None:
    plain = TopicSettings()
    assert effective({}, plain).publish_rate is None  # no limit anywhere
    broker = TopicSettings(max_publish_rate_per_topic_in_messages=500)
    assert effective({}, broker).publish_rate == (500, 0)
    own = {"publishMaxMessageRate": {"c": {"publishThrottlingRateInMsg": -1,
                                           "publishThrottlingRateInByte": 2048}}}  # fmt: skip
    assert effective(own, broker).publish_rate == (0, 2048)  # the document's wins
    unlimited = {"publishMaxMessageRate": {"c": {"publishThrottlingRateInMsg": -1}}}
    assert effective(unlimited, broker).publish_rate is None


def test_subscription_expiration_from_the_document_else_the_broker() -> None:
    broker = TopicSettings(subscription_expiration_time_minutes=0.5)
    assert effective({}, broker).subscription_expiration_minutes == 0.5
    document = {"subscription_expiration_time_minutes": 0}
    assert effective(document, broker).subscription_expiration_minutes == 0  # off here
    assert effective({"subscription_expiration_time_minutes": 30}, broker).subscription_expiration_minutes == 30  # fmt: skip


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10", None])
def test_expiration_minutes_must_be_a_whole_number(bad: object) -> None:
    with pytest.raises(PolicyError):
        check_expiration_minutes(bad)


def test_publish_rate_checks() -> None:
    assert check_publish_rate({"publishThrottlingRateInMsg": 10}) == {
        "publishThrottlingRateInMsg": 10,
        "publishThrottlingRateInByte": -1,
    }
    for bad in ([], {"publishThrottlingRateInMsg": -2}, {"publishThrottlingRateInByte": "1"}):
        with pytest.raises(PolicyError):
            check_publish_rate(bad)


def test_the_throttle_pauses_for_the_rest_of_the_window_once_over() -> None:
    now = [100.0]
    throttle = PublishThrottle()
    assert throttle.published(1, 10) == 0.0  # no rate: never
    throttle.apply((3, 0))
    assert throttle.limiter is not None
    throttle.limiter = RateLimiter(DispatchRate(3, -1, 1), clock=lambda: now[0])
    assert [throttle.published(1, 10) for _ in range(2)] == [0.0, 0.0]
    now[0] = 100.25
    assert throttle.published(1, 10) == pytest.approx(0.75 + PAUSE_MARGIN_S)  # the third
    assert throttle.limited_times == 1
    now[0] = 101.01  # the next window: taken again
    assert throttle.published(1, 10) == 0.0
    kept = throttle.limiter
    throttle.apply((3, 0))
    assert throttle.limiter is kept  # same rate: the window goes on
    throttle.apply(None)
    assert throttle.limiter is None
