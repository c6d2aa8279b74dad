"""Stats rates are measured over the last window, not since load."""

from __future__ import annotations

from magnetar.broker.topics.rates import RateWindow


def test_rate_is_over_the_last_window_not_since_load() -> None:
    start = 100.0
    window = RateWindow(1, window_s=10.0, start=start)
    # A burst in the first seconds, then nothing for a minute.
    window.sample((1000,), start + 5)
    for t in range(6, 70):
        window.sample((1000,), start + t)
    assert window.rates((1000,), start + 70) == (0.0,)
    # 100 messages in the last 10 s: 10 per second.
    for t in range(71, 81):
        window.sample((1000 + 10 * (t - 70),), start + t)
    (rate,) = window.rates((1100,), start + 80)
    assert 9.0 <= rate <= 11.0


def test_samples_stay_bounded() -> None:
    start = 100.0
    window = RateWindow(2, window_s=10.0, start=start)
    for i in range(10_000):
        window.sample((i, i), start + i * 0.01)
    assert len(window) <= 12


def test_young_topic_rate_is_since_its_start() -> None:
    start = 100.0
    window = RateWindow(1, window_s=10.0, start=start)
    assert window.rates((20,), start + 2) == (10.0,)
