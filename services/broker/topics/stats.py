"""A topic's stats in the shapes of Pulsar's admin API (``TopicStats``, ``PublisherStats``,
``SubscriptionStats``, ``ConsumerStats``; ``PersistentTopicInternalStats`` for storage), which
Pulsar's Java and Go admin clients decode: ``publishers`` is a list, every rate and counter is
present, rates are over the last interval (:mod:`rates`). Both topic kinds build theirs here."""

from __future__ import annotations

import datetime
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from magnetar.broker.topics.dispatchers.failover import active_consumer
from magnetar.broker.topics.rates import RateWindow
from magnetar.common.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.topics.consumer import Consumer
    from magnetar.broker.topics.nonpersistent import NonPersistentTopic
    from magnetar.broker.topics.persistent import PersistentTopic
    from magnetar.broker.topics.producers import PublisherView


class TopicRates:
    """The rate windows of one topic: its in and out counters, and one per subscription,
    producer and consumer (by identity; forgotten when they go)."""

    def __init__(self) -> None:
        self._loaded = time.monotonic()
        # messages in, bytes in, messages out, bytes out
        self.topic = RateWindow(4, start=self._loaded)
        self._others: dict[object, RateWindow] = {}

    def of(self, key: object) -> RateWindow:
        """The window of a subscription, producer or consumer, made at its first stats: its
        counters so far are rated over the time since the topic loaded (not over the instant
        since the stats were asked, which would rate ten messages at millions a second)."""
        window = self._others.get(key)
        if window is None:
            window = self._others[key] = RateWindow(2, start=self._loaded)
        return window

    def keep_only(self, keys: set[object]) -> None:
        for gone in set(self._others) - keys:
            del self._others[gone]


def _average(size: int, messages: int) -> float:
    return size / messages if messages else 0.0


def publisher_stats(view: PublisherView, rates: RateWindow, now: float) -> dict[str, Any]:
    rate, throughput = rates.rates((view.messages, view.bytes), now)
    return {
        "accessMode": view.access_mode,
        "msgRateIn": rate,
        "msgThroughputIn": throughput,
        "averageMsgSize": _average(view.bytes, view.messages),
        "chunkedMessageRate": 0.0,
        "producerId": view.producer_id,
        "supportsPartialProducer": False,
        "producerName": view.name,
        "address": None,
        "connectedSince": view.connected_since,
        "clientVersion": None,
        "metadata": {},
    }


def consumer_stats(consumer: Consumer, rates: RateWindow, now: float) -> dict[str, Any]:
    rate, throughput = rates.rates((consumer.msg_out, consumer.bytes_out), now)
    return {
        "msgRateOut": rate,
        "msgThroughputOut": throughput,
        "bytesOutCounter": consumer.bytes_out,
        "msgOutCounter": consumer.msg_out,
        "msgRateRedeliver": 0.0,
        "chunkedMessageRate": 0.0,
        "consumerName": consumer.name,
        "availablePermits": consumer.permits,
        "unackedMessages": consumer.unacked,
        "avgMessagesPerEntry": 0,
        "blockedConsumerOnUnackedMsgs": consumer.max_unacked > 0
        and consumer.unacked >= consumer.max_unacked,
        "address": None,
        "connectedSince": consumer.connected_since,
        "clientVersion": None,
        "metadata": {},
    }


def _topic_stats(
    topic: PersistentTopic | NonPersistentTopic,
    rates: TopicRates,
    subscriptions: dict[str, dict[str, Any]],
    storage_size: int,
    backlog_size: int,
    now: float,
) -> dict[str, Any]:
    rate_in, throughput_in, rate_out, throughput_out = rates.topic.rates(
        (topic.messages_in, topic.bytes_in, topic.msg_out, topic.bytes_out), now
    )
    views = topic.producers.attached()
    rates.keep_only(
        {("producer", v.producer_id, v.name) for v in views}
        | {("subscription", name) for name in topic.subscriptions}
        | {
            ("consumer", name, c.consumer_id, id(c))
            for name, sub in topic.subscriptions.items()
            for c in sub.consumers
        }
    )
    return {
        "msgRateIn": rate_in,
        "msgThroughputIn": throughput_in,
        "msgRateOut": rate_out,
        "msgThroughputOut": throughput_out,
        "bytesInCounter": topic.bytes_in,
        "msgInCounter": topic.messages_in,
        "bytesOutCounter": topic.bytes_out,
        "msgOutCounter": topic.msg_out,
        "averageMsgSize": _average(topic.bytes_in, topic.messages_in),
        "msgChunkPublished": False,
        "storageSize": storage_size,
        "backlogSize": backlog_size,
        "offloadedStorageSize": 0,
        "waitingPublishers": 0,
        "publishRateLimitedTimes": topic.publish_throttle.limited_times,
        "publishers": [
            publisher_stats(v, rates.of(("producer", v.producer_id, v.name)), now) for v in views
        ],
        "subscriptions": subscriptions,
        "replication": {},
        "deduplicationStatus": "Enabled" if topic.deduplication is not None else "Disabled",
        "topicEpoch": topic.producers.topic_epoch or None,
    }


def _subscription_rates(
    rates: TopicRates, name: str, msg_out: int, bytes_out: int, now: float
) -> dict[str, Any]:
    rate, throughput = rates.of(("subscription", name)).rates((msg_out, bytes_out), now)
    return {
        "msgRateOut": rate,
        "msgThroughputOut": throughput,
        "bytesOutCounter": bytes_out,
        "msgOutCounter": msg_out,
        "msgRateRedeliver": 0.0,
        "chunkedMessageRate": 0.0,
    }


def _consumers(
    rates: TopicRates, name: str, consumers: list[Consumer], now: float
) -> list[dict[str, Any]]:
    return [
        consumer_stats(c, rates.of(("consumer", name, c.consumer_id, id(c))), now)
        for c in consumers
    ]


def persistent_stats(topic: PersistentTopic, rates: TopicRates) -> dict[str, Any]:
    ml = topic.ml
    entry_size = _average(ml.total_size, ml.number_of_entries)
    now = time.monotonic()  # one instant for every rate of the answer
    subscriptions: dict[str, dict[str, Any]] = {}
    for name, sub in topic.subscriptions.items():
        consumers = sub.dispatcher.consumers
        backlog = sub.cursor.backlog
        active = None
        if sub.sub_type in (pb.CommandSubscribe.Exclusive, pb.CommandSubscribe.Failover):
            active = active_consumer(list(consumers), topic.name)
        subscriptions[name] = {
            **_subscription_rates(rates, name, sub.msg_out, sub.bytes_out, now),
            "msgBacklog": backlog,
            "backlogSize": int(backlog * entry_size),
            "msgBacklogNoDelayed": backlog,
            "blockedSubscriptionOnUnackedMsgs": False,
            "msgDelayed": 0,
            "unackedMessages": sum(c.unacked for c in consumers),
            "type": sub.type_name,
            "activeConsumerName": None if active is None else active.name,
            "msgRateExpired": 0.0,
            "totalMsgExpired": sub.expired,
            "lastExpireTimestamp": sub.last_expired_ms,
            "consumers": _consumers(rates, name, list(consumers), now),
            "isDurable": sub.durable,
            "isReplicated": sub.replicated,
            "nonContiguousDeletedMessagesRanges": len(sub.cursor.individually_acked),
            "subscriptionProperties": {},
            **_throttled(sub.throttled),
        }
    compacted = ml.compacted.size if ml.compacted is not None else 0
    quota = topic.backlog_quota
    return {
        # Pulsar's topic backlogSize: behind the slowest durable cursor, a replicator's too.
        **_topic_stats(
            topic, rates, subscriptions, ml.total_size + compacted, topic.backlog_size(), now
        ),
        "compaction": topic.compaction.stats(),
        # Pulsar's: the backlog quota in force, bytes and seconds (-1: none).
        "backlogQuotaLimitSize": quota.limit_size if quota is not None else -1,
        "backlogQuotaLimitTime": quota.limit_time if quota is not None else -1,
        "entries": ml.number_of_entries,
        # Entries no bookie could give back intact (digest errors on every copy).
        "unreadableEntries": {str(p): why for p, why in sorted(ml.unreadable.items())},
    }


def _throttled(counts: Counter[tuple[str, str]]) -> dict[str, int]:
    """Pulsar's dispatchThrottled{Msg,Bytes}EventsBy{Subscription,Topic,Broker}Limit (there is
    no broker-wide dispatch rate here: those stay 0)."""
    out = {}
    for by in ("Subscription", "Topic", "Broker"):
        out[f"dispatchThrottledMsgEventsBy{by}Limit"] = counts[(by.lower(), "messages")]
        out[f"dispatchThrottledBytesEventsBy{by}Limit"] = counts[(by.lower(), "bytes")]
    return out


def nonpersistent_stats(topic: NonPersistentTopic, rates: TopicRates) -> dict[str, Any]:
    now = time.monotonic()  # one instant for every rate of the answer
    subscriptions = {
        name: {
            **_subscription_rates(rates, name, sub.msg_out, sub.bytes_out, now),
            "msgBacklog": 0,
            "backlogSize": 0,
            "unackedMessages": 0,
            "type": pb.CommandSubscribe.SubType.Name(sub.sub_type),
            "msgDropped": sub.dropped,
            "msgRateExpired": 0.0,
            "totalMsgExpired": 0,
            "consumers": _consumers(rates, name, list(sub.consumers), now),
            "isDurable": False,
            "isReplicated": False,
        }
        for name, sub in topic.subscriptions.items()
    }
    return {**_topic_stats(topic, rates, subscriptions, 0, 0, now), "msgDropRate": 0.0}


def _iso(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def deleted_ranges(ranges: list[tuple[int, int, int]]) -> str:
    """Individually acknowledged ranges as Pulsar prints them: ``[(3:4..3:7], (5:-1..5:2]]``,
    each open below and closed above."""
    return (
        "[" + ", ".join(f"({lid}:{first - 1}..{lid}:{last}]" for lid, first, last in ranges) + "]"
    )


def _ledger_state(fenced: bool, terminated: bool, writing: bool) -> str:
    """The managed ledger's state as Pulsar's internal stats name it."""
    if fenced:
        return "Fenced"
    if terminated:
        return "Terminated"
    return "LedgerOpened" if writing else "ClosedLedger"


def internal_stats(topic: PersistentTopic) -> dict[str, Any]:
    """PersistentTopicInternalStats: the managed ledger's ledgers (entries, bytes), its state,
    and each durable cursor's positions and individually deleted ranges."""
    ml = topic.ml
    ledgers = ml.ledger_sizes()
    current = ledgers[-1] if ledgers and not ledgers[-1][0].closed else None
    cursors = {}
    for name, sub in topic.subscriptions.items():
        if not sub.durable:
            continue
        cursor = sub.cursor
        acked = cursor.individually_acked
        persistence = cursor.persistence_stats()
        cursors[name] = {
            "markDeletePosition": str(cursor.mark_delete_position),
            "readPosition": str(cursor.read_position),
            "waitingReadOp": False,
            "pendingReadOps": 0,
            "messagesConsumedCounter": ml.number_of_entries - cursor.backlog,
            "cursorLedger": persistence["cursorLedger"],
            "cursorLedgerLastEntry": -1,
            "individuallyDeletedMessages": deleted_ranges(acked.ranges()),
            "lastLedgerSwitchTimestamp": "",
            "state": "Open",
            "numberOfEntriesSinceFirstNotAckedMessage": max(
                ml.entries_after(cursor.mark_delete_position)
                - ml.entries_after(cursor.read_position)
                + 1,
                0,
            ),
            "totalNonContiguousDeletedMessagesRange": acked.range_count,
            "properties": {},
            **persistence,
        }
    return {
        "entriesAddedCounter": topic.msg_in,
        "numberOfEntries": ml.number_of_entries,
        "totalSize": ml.total_size,
        "currentLedgerEntries": current[1] if current else 0,
        "currentLedgerSize": current[2] if current else 0,
        "lastLedgerCreatedTimestamp": _iso(current[0].ctime_ms) if current else "",
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "lastConfirmedEntry": str(ml.last_confirmed_position),
        "state": _ledger_state(ml.is_fenced, ml.terminated_at is not None, current is not None),
        "ledgers": [
            {
                "ledgerId": info.ledger_id,
                "entries": entries,
                "size": size,
                "offloaded": False,
                "underReplicated": False,
            }
            for info, entries, size in ledgers
        ],
        "cursors": cursors,
        "compactedLedger": _compacted_ledger(topic),
    }


def _compacted_ledger(topic: PersistentTopic) -> dict[str, Any]:
    """Pulsar's ``compactedLedger`` (-1 fields: none)."""
    view = topic.ml.compacted
    return {
        "ledgerId": view.ledger_id if view is not None else -1,
        "entries": view.entries if view is not None else -1,
        "size": view.size if view is not None else -1,
        "offloaded": False,
        "underReplicated": False,
    }
