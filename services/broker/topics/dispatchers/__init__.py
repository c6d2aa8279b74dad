"""One dispatcher per subscription mode; ``for_mode`` picks it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnetar.broker.topics.dispatchers.base import Dispatcher
from magnetar.broker.topics.dispatchers.exclusive import ExclusiveDispatcher
from magnetar.broker.topics.dispatchers.failover import FailoverDispatcher
from magnetar.broker.topics.dispatchers.key_shared import KeySharedDispatcher
from magnetar.broker.topics.dispatchers.shared import SharedDispatcher
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.topics.subscription import Subscription


def for_mode(sub_type: int, subscription: Subscription) -> Dispatcher:
    if sub_type == pb.CommandSubscribe.Exclusive:
        return ExclusiveDispatcher(subscription)
    if sub_type == pb.CommandSubscribe.Failover:
        return FailoverDispatcher(subscription)
    if sub_type == pb.CommandSubscribe.Shared:
        return SharedDispatcher(subscription)
    if sub_type == pb.CommandSubscribe.Key_Shared:
        return KeySharedDispatcher(subscription)
    raise NotImplementedError(
        f"subscription type {pb.CommandSubscribe.SubType.Name(sub_type)} is not served yet"
    )
