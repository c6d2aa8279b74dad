"""The metrics a topic counts into, as Protocols: the broker's ``metrics.py`` provides them (its
``BrokerMetrics`` fits), so a topic never imports the metrics binding above it. A topic made
without instruments (tests, tools) counts into :data:`UNCOUNTED`."""

from __future__ import annotations

from typing import Protocol


class Counting(Protocol):
    """One counter: Prometheus' ``Counter`` fits."""

    def inc(self, amount: float = 1) -> None: ...


class TopicInstruments(Protocol):
    """The counters a topic's dispatchers increment."""

    @property
    def dispatch_failures(self) -> Counting: ...

    @property
    def unreadable_entries(self) -> Counting: ...

    @property
    def skipped_entries(self) -> Counting: ...


class _NoCounter:
    def inc(self, amount: float = 1) -> None:
        pass


class _Uncounted:
    """Instruments that count nothing."""

    dispatch_failures = unreadable_entries = skipped_entries = _NoCounter()


UNCOUNTED: TopicInstruments = _Uncounted()
