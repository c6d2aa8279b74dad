"""What a topic's backlog is for its backlog quotas and its stats, as Pulsar counts it.

Pulsar compares a size quota with the managed ledger's estimated backlog size: the bytes after
the slowest *durable cursor* of the ledger (``ManagedLedger.getSlowestConsumer`` over every
cursor it holds), at the topic's average entry size. Geo-replicators' cursors
(``pulsar.repl.<remote>``) are durable cursors of the ledger like subscriptions' ones, so what a
remote cluster has not received yet counts: with a remote down, ``producer_request_hold`` and
``producer_exception`` hold the topic's producers once the replication backlog passes the
quota, and the topic's ``backlogSize`` in stats includes it. A message-age quota likewise looks
at the oldest entry some durable cursor still needs.

Eviction (``consumer_backlog_eviction``) is where Magnetar parts from Pulsar: Pulsar skips
entries on the slowest cursor whatever it is, a replicator's included (what the remote never
got is dropped); Magnetar evicts from subscriptions only and never moves a replicator's
cursor, so nothing stored is lost for a remote cluster.
"""

from __future__ import annotations

from collections.abc import Iterable


def estimated_backlog_size(cursor_backlogs: Iterable[int], total_size: int, entries: int) -> int:
    """Bytes behind the slowest durable cursor: its backlog (entries) at the average entry
    size ``total_size / entries`` of what the topic stores (0 with no cursor or no entry)."""
    if entries <= 0:
        return 0
    slowest = max(cursor_backlogs, default=0)
    return int(slowest * total_size / entries)
