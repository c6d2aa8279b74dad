"""Geo-replication of one topic to one remote cluster (Pulsar's PersistentReplicator).

A durable cursor ``pulsar.repl.<remote>`` reads the topic from where it last got a receipt; each
entry goes to the same topic on the remote cluster through a producer of our own
(``common/protocol/producer_client``), with ``replicated_from`` set to the local cluster. The
cursor's mark-delete moves only over entries the remote acknowledged, in order, so a broker
restart, an unload or a remote outage loses nothing: what was sent without a receipt is sent
again (at-least-once). A remote with deduplication drops the resends: for a replicator's
producer (named ``pulsar.repl.<local>``) it deduplicates by the original producer name and
sequence id in the message metadata, as Pulsar does.

A partition replicates to the same partition of the remote, whose partitioned topic is created
with the local partition count when missing (``ensure_remote_partitions``).

Not sent: entries that came by replication (``replicated_from`` set: no loops, in any mesh) and
entries whose ``replicate_to`` does not name the remote (the client's ``replication_clusters``;
``disable_replication`` is ``replicate_to = ["__local__"]``).

Markers (replicated subscriptions, ``replicated_subscriptions.py``) travel like messages, their
``replicate_to`` choosing where; a marker that came from the remote is handed to the topic's
controller when this replicator reads it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from magnetar.broker.model.entry import entry_metadata, entry_payload, message_count
from magnetar.broker.model.markers import is_marker
from magnetar.broker.model.position import Position
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.clusters import ClusterData
from magnetar.broker.topics.replicated_subscriptions import ReplicatedSubscriptionSettings
from magnetar.common.protocol import codec
from magnetar.common.protocol.producer_client import ProducerClient
from magnetar.common.tasks import wait_set

if TYPE_CHECKING:
    from magnetar.broker.ledger.cursor import ManagedCursor
    from magnetar.broker.topics.persistent import PersistentTopic
    from magnetar.common.proto import pulsar_api_pb2 as pb

log = logging.getLogger(__name__)

#: Cursor names of replicators: never a subscription (Pulsar's ``replicatorPrefix``).
REPLICATOR_PREFIX = "pulsar.repl."


def cursor_name(remote: str) -> str:
    return f"{REPLICATOR_PREFIX}{remote}"


def is_replicator_cursor(name: str) -> bool:
    return name.startswith(REPLICATOR_PREFIX)


def outgoing_entry(
    stored: bytes, local: str, remote: str, metadata: pb.MessageMetadata | None = None
) -> tuple[bytes, int] | None:
    """What a replicator sends to ``remote`` for a stored entry: its payload section with
    ``replicated_from = local`` and its message count; None for an entry not to send (it came
    by replication, or its ``replicate_to`` leaves ``remote`` out). ``metadata``: the entry's,
    when the caller decoded it already (it is changed)."""
    if metadata is None:
        metadata = entry_metadata(stored)
    if metadata.HasField("replicated_from"):
        return None
    if metadata.replicate_to and remote not in metadata.replicate_to:
        return None
    metadata.replicated_from = local
    section = codec.encode_headers_and_payload(metadata, entry_payload(stored))
    return section, message_count(metadata)


@dataclass(slots=True)
class ReplicationContext:
    """What every replicator of a broker shares: the local cluster's name, how to find a
    remote cluster's URLs (the configuration store), the broker's client credentials."""

    local_cluster: str
    find_cluster: Callable[[str], Awaitable[ClusterData | None]]
    auth_method: str = ""
    auth_data: Callable[[], bytes] = bytes
    #: For a partition: make sure the remote has its partitioned topic (Pulsar shares that
    #: metadata through the configuration store; here each cluster keeps its own).
    ensure_remote_partitions: Callable[[ClusterData, TopicName], Awaitable[None]] | None = None
    batch_size: int = 100
    #: Set (``broker_client_trust_certs_file_path``): remotes are reached on their
    #: ``brokerServiceUrlTls`` when they have one.
    tls: ssl.SSLContext | None = None
    max_backoff_seconds: float = 10.0
    replicated_subscriptions: ReplicatedSubscriptionSettings = field(
        default_factory=ReplicatedSubscriptionSettings
    )


class Replicator:
    def __init__(self, topic: PersistentTopic, remote: str, context: ReplicationContext) -> None:
        self.topic = topic
        self.remote = remote
        self.context = context
        self.cursor: ManagedCursor | None = None
        self.client: ProducerClient | None = None
        self.connected = False
        self.msg_out = 0
        self.bytes_out = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Set by ``stop``: the loops end at their next turn even if a cancellation was lost.
        self._stopped = False
        self._rate_mark = (time.monotonic(), 0, 0)
        self._rates = (0.0, 0.0)
        self.last_error = ""
        #: SEND sequence ids of this replicator (receipts are matched by them); the remote
        #: deduplicates by the messages' own producer and sequence id instead.
        self._next_sequence = 0
        #: Publish time (ms) of the oldest entry sent or being sent without a receipt yet.
        self._oldest_unacked_ms: int | None = None

    def __repr__(self) -> str:
        return f"replicator {self.topic.name} -> {self.remote}"

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=repr(self))

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop sending (the cursor stays, at the last receipt, for the next owner)."""
        self._stopped = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
        self.connected = False

    async def remove(self) -> None:
        """The remote left the replication list: stop and drop the cursor (its backlog)."""
        await self.stop()
        self.cursor = None
        await self.topic.ml.delete_cursor(cursor_name(self.remote))

    @property
    def backlog(self) -> int:
        return self.cursor.backlog if self.cursor is not None else 0

    def delay_seconds(self) -> float:
        """How old the oldest entry read and not yet acknowledged by the remote is (0 when
        caught up). Measured on the batch in flight: entries stored while the replicator
        could not connect and read nothing yet are not counted until it reads them."""
        if self._oldest_unacked_ms is None or self.backlog == 0:
            return 0.0
        return max(0.0, time.time() - self._oldest_unacked_ms / 1000)

    def stats(self) -> dict[str, object]:
        """One remote's entry of topic stats' ``replication`` (Pulsar's ReplicatorStats)."""
        now = time.monotonic()
        then, msgs, size = self._rate_mark
        if now - then >= 1.0:
            self._rates = (
                (self.msg_out - msgs) / (now - then),
                (self.bytes_out - size) / (now - then),
            )
            self._rate_mark = (now, self.msg_out, self.bytes_out)
        return {
            "msgRateIn": 0.0,
            "msgThroughputIn": 0.0,
            "msgRateOut": self._rates[0],
            "msgThroughputOut": self._rates[1],
            "msgOutCounter": self.msg_out,
            "bytesOutCounter": self.bytes_out,
            "replicationBacklog": self.backlog,
            "connected": self.connected,
            "replicationDelayInSeconds": self.delay_seconds(),
            "outboundConnection": self.client.service_url if self.client is not None else None,
            "lastError": self.last_error or None,
        }

    async def _run(self) -> None:
        backoff = 0.1
        name = cursor_name(self.remote)
        while not self._stopped:
            try:
                if self.cursor is None:
                    found = self.topic.ml.cursors.get(name)
                    self.cursor = found or await self.topic.ml.open_cursor(name, "earliest")
                cluster = await self.context.find_cluster(self.remote)
                if cluster is None:
                    raise LookupError(f"cluster {self.remote} is not registered")
                name = self.topic.name
                if name.partition_index >= 0 and self.context.ensure_remote_partitions:
                    await self.context.ensure_remote_partitions(cluster, name)
                url = cluster.broker_service_url or cluster.service_url.replace(
                    "http://", "pulsar://"
                )
                if self.context.tls is not None and cluster.broker_service_url_tls:
                    url = cluster.broker_service_url_tls
                self.client = ProducerClient(
                    url,
                    str(self.topic.name),
                    f"{REPLICATOR_PREFIX}{self.context.local_cluster}",
                    auth_method=self.context.auth_method,
                    auth_data=self.context.auth_data() if self.context.auth_method else b"",
                    tls=self.context.tls,
                )
                await self.client.start()
                self.connected = True
                self.last_error = ""
                backoff = 0.1
                self.cursor.rewind()  # from the last receipt: what was in flight goes again
                await self._replicate(self.cursor, self.client)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.connected = False
                self.last_error = str(e)
                log.warning("%s: %s; retrying in %.1f s", self, e, backoff)
                if self.client is not None:
                    await self.client.close()
                await self._note_oldest_unacked()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.context.max_backoff_seconds)

    async def _note_oldest_unacked(self) -> None:
        """While the remote cannot be reached, the delay counts from the first entry it has
        not acknowledged (read once per outage)."""
        cursor = self.cursor
        if cursor is None or self._oldest_unacked_ms is not None or not cursor.backlog:
            return
        ml = self.topic.ml
        first = ml.first_at_or_after(ml.next_position(cursor.mark_delete_position))
        if first is None:
            return
        try:
            entries = await ml.read_entries(first, 1)
        except Exception:
            return  # the delay stays unknown (0) until a read succeeds
        if entries:
            self._oldest_unacked_ms = entry_metadata(entries[0][1]).publish_time

    async def _replicate(self, cursor: ManagedCursor, client: ProducerClient) -> None:
        local, remote = self.context.local_cluster, self.remote
        while not self._stopped:
            self._wake.clear()
            entries = await cursor.read_entries(self.context.batch_size)
            if not entries:
                if not client.connected:
                    raise ConnectionError("the remote broker closed the connection")
                await wait_set(self._wake, 1.0)
                continue
            sent: list[tuple[Position, asyncio.Future[object] | None, int, int]] = []
            if self._oldest_unacked_ms is None:
                self._oldest_unacked_ms = entry_metadata(entries[0][1]).publish_time
            for position, stored in entries:
                metadata = entry_metadata(stored)
                if is_marker(metadata) and metadata.replicated_from == remote:
                    # The remote's markers reach its topic's owner here (Pulsar: each
                    # replicator handles those of its own remote, so each is handled once).
                    await self.topic.received_marker(position, metadata, entry_payload(stored))
                outgoing = outgoing_entry(stored, local, remote, metadata)
                if outgoing is None:
                    sent.append((position, None, 0, 0))
                    continue
                section, count = outgoing
                self._next_sequence += 1
                future = client.send(self._next_sequence, section, count)
                sent.append((position, future, count, len(section)))  # type: ignore[arg-type]
            for position, future, count, size in sent:
                if future is not None:
                    await future
                    self.msg_out += count
                    self.bytes_out += size
                cursor.mark_delete(position)
            self._oldest_unacked_ms = None
