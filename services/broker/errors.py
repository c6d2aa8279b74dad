"""The broker's shared exceptions: raised in one room, answered in another (the protocol room
maps them to Pulsar's ServerError, the admin room to HTTP statuses). A leaf: it imports only
leaf values."""

from __future__ import annotations

from magnetar.common.cluster.broker_info import BrokerInfo


class NamespaceNotFoundError(Exception):
    """A topic was asked for in a namespace that does not exist."""


class NamespaceNotInClusterError(Exception):
    """The namespace is replicated to clusters that do not include this broker's: its topics are
    not served here (Pulsar's "Namespace missing local cluster name in clusters list")."""


class TopicNotFoundError(Exception):
    """The topic does not exist and may not be created automatically."""


class TopicNotOwnedError(Exception):
    """This broker does not serve the topic now (another owns its bundle, or it is moving):
    the client gets ServiceNotReady and looks the topic up again; an admin call is redirected
    (307) to ``owner`` (the owner, or the broker that decides) when it is known."""

    def __init__(self, message: str, owner: BrokerInfo | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class TopicUnloadingError(Exception):
    """The topic is being unloaded from this broker: the client sends again to the next owner."""


class TopicBusyError(Exception):
    """The topic still has producers or consumers (delete without force)."""


class SubscriptionNotFoundError(Exception):
    """No subscription of that name on the topic."""


class SubscriptionBusyError(Exception):
    """The subscription still has consumers (delete without force)."""


class TopicTerminatedError(Exception):
    """The topic was terminated: it takes no producer and no message any more (Pulsar's
    TopicTerminatedError); its consumers drain what it holds."""


class BacklogQuotaExceededError(Exception):
    """A producer refused because the topic's backlog is over its quota (one subclass per
    quota policy, each answered with its own Pulsar error)."""


class ProducerHeldByQuotaError(BacklogQuotaExceededError):
    """``producer_request_hold`` (ProducerBlockedQuotaExceededError): the client keeps its
    messages and tries again."""


class ProducerRefusedByQuotaError(BacklogQuotaExceededError):
    """``producer_exception`` (ProducerBlockedQuotaExceededException): the client fails its
    messages."""
