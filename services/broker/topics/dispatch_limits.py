"""How much a subscription's dispatcher may send: one record, built from the broker settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class DispatchLimits:
    #: Entries read from storage per dispatch round at most.
    dispatch_batch: int = 100
    #: Shared and key_shared: a consumer with this many unacknowledged messages is sent no more
    #: until it acknowledges some (Pulsar's maxUnackedMessagesPerConsumer; 0: no bound).
    max_unacked_per_consumer: int = 50_000
    #: Shared and key_shared: the whole subscription stops reading new entries at this many
    #: unacknowledged messages (Pulsar's maxUnackedMessagesPerSubscription; 0: no bound).
    max_unacked_per_subscription: int = 200_000
    #: Acknowledge entries no bookie can give back intact instead of waiting at them
    #: (Pulsar's autoSkipNonRecoverableData).
    auto_skip_non_recoverable_data: bool = False
