"""Non-persistent topics with the official client: delivered live, never stored."""

from __future__ import annotations

import json
import urllib.request

import pulsar
import pytest

from tests.support.raw_client import drain as drain_messages
from tests.support.standalone import StandaloneProcess, client

TOPIC = "non-persistent://public/default/ticks"


def drain(consumer: pulsar.Consumer, wait_ms: int = 1000, expect: int = 0) -> list[bytes]:
    """The data of what the consumer receives (``raw_client.drain``)."""
    return [message.data() for message in drain_messages(consumer, wait_ms, expect)]


def test_live_delivery_to_connected_consumers_only(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer(TOPIC, batching_enabled=False)
        producer.send(b"before anyone listens")  # acknowledged, and gone
        shared = [c.subscribe(TOPIC, "workers", consumer_type=pulsar.ConsumerType.Shared)]
        shared.append(c.subscribe(TOPIC, "workers", consumer_type=pulsar.ConsumerType.Shared))
        audit = c.subscribe(TOPIC, "audit")
        with pytest.raises(pulsar.ConsumerBusy):
            c.subscribe(TOPIC, "audit")  # exclusive, as on persistent topics
        sent = [f"tick-{i}".encode() for i in range(20)]
        for data in sent:
            producer.send(data)
        split = [drain(consumer) for consumer in shared]
        assert sorted(split[0] + split[1]) == sorted(sent)  # each once, between the two
        assert split[0] and split[1]
        assert (
            drain(audit, expect=len(sent)) == sent
        )  # every subscription gets its own copy, in order
        late = c.subscribe(TOPIC, "late")
        assert drain(late, 500) == []  # nothing was stored for it
        producer.send(b"now")
        assert drain(late, expect=1) == [b"now"]
        with pytest.raises(pulsar.PulsarException):
            audit.seek(pulsar.MessageId.earliest)  # nothing to seek in
        stats_url = f"{standalone.admin_url}/non-persistent/public/default/ticks/stats"
        with urllib.request.urlopen(stats_url, timeout=10) as response:
            stats = json.loads(response.read())
        assert stats["msgInCounter"] == 22 and len(stats["publishers"]) == 1
        assert set(stats["subscriptions"]) == {"workers", "audit", "late"}
    finally:
        c.close()


def test_failover_and_key_shared_choose_like_persistent_topics(
    standalone: StandaloneProcess,
) -> None:
    c = client(standalone)
    topic = "non-persistent://public/default/modes"
    try:
        failover = [
            c.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name=n)
            for n in ("a", "b")
        ]
        keyed = [
            c.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared) for _ in range(2)
        ]
        producer = c.create_producer(topic, batching_enabled=False)
        sent = [(f"k{i % 8}", f"m{i}".encode()) for i in range(40)]
        for key, data in sent:
            producer.send(data, partition_key=key)
        # Failover: only the active consumer (first by name) gets them, all of them, in order.
        assert drain(failover[0], expect=len(sent)) == [data for _, data in sent]
        assert drain(failover[1], wait_ms=300) == []
        # Key_Shared: every message once, and each key on exactly one consumer.
        received = [drain(consumer) for consumer in keyed]
        assert sorted(received[0] + received[1]) == sorted(data for _, data in sent)
        key_of = {data: key for key, data in sent}
        keys = [{key_of[data] for data in got} for got in received]
        assert not keys[0] & keys[1]
    finally:
        c.close()
