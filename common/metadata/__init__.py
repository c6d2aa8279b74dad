"""Metadata store: one interface, an etcd and an embedded implementation."""

from magnetar.common.metadata.factory import open_store as _open
from magnetar.common.metadata.store import (
    NOT_EXISTS,
    BadVersionError,
    Delete,
    EventType,
    Expect,
    LeaderElection,
    MetadataDamagedError,
    MetadataError,
    MetadataStore,
    NoSuchKeyError,
    Operation,
    OutcomeUnknownError,
    Put,
    SessionLostError,
    StoreClosedError,
    Versioned,
    WatchEvent,
)

__all__ = [
    "NOT_EXISTS",
    "BadVersionError",
    "Delete",
    "EventType",
    "Expect",
    "LeaderElection",
    "MetadataDamagedError",
    "MetadataError",
    "MetadataStore",
    "NoSuchKeyError",
    "Operation",
    "OutcomeUnknownError",
    "Put",
    "SessionLostError",
    "StoreClosedError",
    "Versioned",
    "WatchEvent",
    "open_store",
]


async def open_store(url: str, **options: object) -> MetadataStore:
    """Open the store named by ``url`` (``etcd://h:p[,h:p]`` or ``local:///path/meta.db``).

    Options: ``session_ttl``, ``request_timeout`` and ``tls`` (an
    ``magnetar.common.metadata.etcd.EtcdTls`` for etcd over TLS; None: plain), see
    ``magnetar.common.metadata.factory.open_store``."""
    return await _open(url, **options)
