"""The official pulsar-client against a real `magnetar standalone` process.

One standalone serves the module's tests, each on topics of its own; the tests that restart the
process, or list every topic, run their own (``own``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pulsar
import pytest

from tests.support.standalone import StandaloneProcess, client


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    node = StandaloneProcess(tmp_path_factory.mktemp("broker") / "standalone").start()
    try:
        yield node
    finally:
        node.stop()
        print(node.log_tail())


@pytest.fixture
def own(tmp_path: Path) -> Iterator[StandaloneProcess]:
    """A standalone for one test; its log tail is printed afterwards."""
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
        yield node
    finally:
        node.stop()
        print(node.log_tail())


def test_exclusive_in_order_and_a_second_consumer_is_refused(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer("orders", batching_enabled=False)
        sent = [producer.send(f"order-{i}".encode()) for i in range(30)]
        assert [(m.ledger_id(), m.entry_id()) for m in sent] == sorted(
            (m.ledger_id(), m.entry_id()) for m in sent
        )
        consumer = c.subscribe("orders", "audit", initial_position=pulsar.InitialPosition.Earliest)
        got = []
        for _ in range(30):
            message = consumer.receive(timeout_millis=10_000)
            got.append(message.data())
            consumer.acknowledge(message)
        assert got == [f"order-{i}".encode() for i in range(30)]
        with pytest.raises(pulsar.ConsumerBusy):
            c.subscribe("orders", "audit")
    finally:
        c.close()


def test_batched_messages_arrive_one_by_one(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        consumer = c.subscribe("batched", "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(
            "batched", batching_enabled=True, batching_max_publish_delay_ms=20
        )
        for i in range(25):
            producer.send_async(f"b{i}".encode(), None)
        producer.flush()
        got = []
        for _ in range(25):
            message = consumer.receive(timeout_millis=10_000)
            got.append(message.data())
            consumer.acknowledge(message)
        assert got == [f"b{i}".encode() for i in range(25)]
    finally:
        c.close()


def test_shared_splits_and_redelivers_a_closed_consumers_unacked_messages(
    standalone: StandaloneProcess,
) -> None:
    c = client(standalone)
    try:
        first = c.subscribe(
            "jobs", "workers", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
        )
        second = c.subscribe(
            "jobs", "workers", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5
        )
        producer = c.create_producer("jobs", batching_enabled=False)
        for i in range(20):
            producer.send(f"job-{i}".encode())
        held = [first.receive(timeout_millis=10_000) for _ in range(3)]  # never acked
        first.close()
        seen = {m.data() for m in held}
        redelivered = set()
        done = set()
        while len(done) < 20:
            message = second.receive(timeout_millis=10_000)
            if message.data() in seen:
                redelivered.add(message.data())
            done.add(message.data())
            second.acknowledge(message)
        assert done == {f"job-{i}".encode() for i in range(20)}
        assert redelivered == seen, "the closed consumer's unacked messages must go to the other"
    finally:
        c.close()


def test_sigkill_loses_no_received_message_and_acks_survive(own: StandaloneProcess) -> None:
    c = client(own)
    producer = c.create_producer("durable", batching_enabled=False)
    ids = [producer.send(f"d{i}".encode()) for i in range(40)]
    assert len(ids) == 40
    consumer = c.subscribe("durable", "reader", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(15):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    time.sleep(2.5)  # cursor state is persisted at most every second (docs: the bound)
    c.close()

    own.kill()
    own.start()

    c = client(own)
    try:
        consumer = c.subscribe("durable", "reader")
        first = consumer.receive(timeout_millis=10_000)
        assert first.data() == b"d15", (
            "acked messages must not come back after the documented bound"
        )
        everything = c.subscribe(
            "durable", "fresh", initial_position=pulsar.InitialPosition.Earliest
        )
        got = [everything.receive(timeout_millis=10_000).data() for _ in range(40)]
        assert got == [f"d{i}".encode() for i in range(40)]
    finally:
        c.close()


def test_failover_has_one_active_consumer_and_hands_over_unacked_messages(
    standalone: StandaloneProcess,
) -> None:
    c = client(standalone)
    try:
        a = c.subscribe(
            "stream",
            "fo",
            consumer_type=pulsar.ConsumerType.Failover,
            consumer_name="a",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        b = c.subscribe(
            "stream",
            "fo",
            consumer_type=pulsar.ConsumerType.Failover,
            consumer_name="b",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        producer = c.create_producer("stream", batching_enabled=False)
        for i in range(10):
            producer.send(f"s{i}".encode())
        # "a" sorts first: it is the active consumer and gets everything, in order; "b" nothing.
        got_a = [a.receive(timeout_millis=10_000).data() for _ in range(10)]
        assert got_a == [f"s{i}".encode() for i in range(10)]
        with pytest.raises(pulsar.Timeout):
            b.receive(timeout_millis=1000)
        a.close()  # nothing acked: all ten go to "b", in order
        got_b = []
        for _ in range(10):
            message = b.receive(timeout_millis=10_000)
            got_b.append(message.data())
            b.acknowledge(message)
        assert got_b == got_a
    finally:
        c.close()


def test_readers_start_at_earliest_latest_and_a_message_id(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer("log", batching_enabled=False)
        ids = [producer.send(f"r{i}".encode()) for i in range(10)]

        reader = c.create_reader("log", pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(10)] == [
            f"r{i}".encode() for i in range(10)
        ]
        assert not reader.has_message_available()
        reader.close()

        after = c.create_reader("log", ids[4])  # exclusive: starts after message 4
        assert after.read_next(10_000).data() == b"r5"
        after.close()
        inclusive = c.create_reader("log", ids[4], start_message_id_inclusive=True)
        assert inclusive.read_next(10_000).data() == b"r4"
        inclusive.close()

        latest = c.create_reader("log", pulsar.MessageId.latest)
        producer.send(b"new")
        assert latest.read_next(10_000).data() == b"new"
        latest.close()
    finally:
        c.close()


def test_seek_by_message_id_and_by_publish_time(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer("replay", batching_enabled=False)
        ids = [producer.send(f"p{i}".encode()) for i in range(10)]
        time.sleep(0.05)
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        later = [producer.send(f"q{i}".encode()) for i in range(3)]
        assert later
        consumer = c.subscribe("replay", "s", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(13):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))

        # The broker resets to the message itself; the client drops it unless the consumer asked
        # for an inclusive start (as with readers).
        consumer.seek(ids[7])
        assert consumer.receive(timeout_millis=10_000).data() == b"p8"
        inclusive = c.subscribe(
            "replay",
            "t",
            initial_position=pulsar.InitialPosition.Earliest,
            start_message_id_inclusive=True,
        )
        inclusive.seek(ids[7])
        assert inclusive.receive(timeout_millis=10_000).data() == b"p7"

        consumer.seek(middle)
        assert consumer.receive(timeout_millis=10_000).data() == b"q0"
    finally:
        c.close()


def _admin(
    node: StandaloneProcess, method: str, path: str, body: str | None = None
) -> tuple[int, str]:
    request = urllib.request.Request(
        node.admin_url + path, method=method, data=None if body is None else body.encode()
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_partitioned_topic_created_through_the_admin_api(standalone: StandaloneProcess) -> None:
    assert _admin(standalone, "PUT", "/persistent/public/default/clicks/partitions", "3")[0] == 204
    assert _admin(standalone, "PUT", "/persistent/public/default/clicks/partitions", "3")[0] == 409
    assert _admin(standalone, "PUT", "/persistent/public/default/bad/partitions", "zero")[0] == 400
    status, body = _admin(standalone, "GET", "/persistent/public/default/clicks/partitions")
    assert (status, json.loads(body)) == (200, {"partitions": 3})

    c = client(standalone)
    try:
        consumer = c.subscribe("clicks", "all", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(
            "clicks",
            batching_enabled=False,
            message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        )
        round_robin = {producer.send(f"c{i}".encode()).partition() for i in range(9)}
        assert round_robin == {0, 1, 2}
        keyed = {producer.send(b"k", partition_key="user-42").partition() for _ in range(5)}
        assert len(keyed) == 1, "one key always goes to one partition"
        got = set()
        for _ in range(14):
            message = consumer.receive(timeout_millis=10_000)
            got.add(message.data())
            consumer.acknowledge(message)
        assert got == {f"c{i}".encode() for i in range(9)} | {b"k"}
    finally:
        c.close()
    status, body = _admin(standalone, "GET", "/persistent/public/default")
    assert {f"persistent://public/default/clicks-partition-{i}" for i in range(3)} <= set(
        json.loads(body)
    )
    assert _admin(standalone, "DELETE", "/persistent/public/default/clicks/partitions")[0] == 204


def test_negative_ack_and_ack_timeout_redeliver_with_a_redelivery_count(
    standalone: StandaloneProcess,
) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer("retries", batching_enabled=False)
        nacking = c.subscribe(
            "retries", "nack", consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest, negative_ack_redelivery_delay_ms=100,
        )  # fmt: skip
        timing_out = c.subscribe(
            "retries", "timeout", consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest, unacked_messages_timeout_ms=10_000,
        )  # fmt: skip
        producer.send(b"flaky")

        first = nacking.receive(timeout_millis=10_000)
        assert first.redelivery_count() == 0
        nacking.negative_acknowledge(first)
        again = nacking.receive(timeout_millis=10_000)
        assert (again.data(), again.redelivery_count()) == (b"flaky", 1)
        nacking.acknowledge(again)

        timing_out.receive(timeout_millis=10_000)  # not acknowledged: comes back after the timeout
        again = timing_out.receive(timeout_millis=30_000)
        assert (again.data(), again.redelivery_count()) == (b"flaky", 1)
        timing_out.acknowledge(again)
    finally:
        c.close()


def test_cumulative_ack_on_exclusive(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer("cumulative", batching_enabled=False)
        for i in range(10):
            producer.send(f"m{i}".encode())
        consumer = c.subscribe("cumulative", "s", initial_position=pulsar.InitialPosition.Earliest)
        messages = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
        consumer.acknowledge_cumulative(messages[6])
        consumer.redeliver_unacknowledged_messages()
        assert consumer.receive(timeout_millis=10_000).data() == b"m7"
    finally:
        c.close()


def test_producer_access_modes(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        exclusive = c.create_producer(
            "guarded", access_mode=pulsar.ProducerAccessMode.Exclusive, send_timeout_millis=3000
        )
        with pytest.raises(pulsar.ProducerBusy):
            c.create_producer("guarded")  # shared, while an exclusive producer holds the topic
        with pytest.raises(pulsar.ProducerFenced):  # as Pulsar: a second exclusive is fenced
            c.create_producer("guarded", access_mode=pulsar.ProducerAccessMode.Exclusive)
        exclusive.send(b"first owner")

        fencing = c.create_producer(
            "guarded", access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing
        )
        fencing.send(b"second owner")
        with pytest.raises(pulsar.PulsarException):
            exclusive.send(b"fenced out")

        fencing.close()
        shared = c.create_producer("guarded")
        shared.send(b"shared again")
        shared.close()

        reader = c.create_reader("guarded", pulsar.MessageId.earliest)
        got = [reader.read_next(10_000).data() for _ in range(3)]
        assert got == [b"first owner", b"second owner", b"shared again"]
    finally:
        c.close()


def test_exclusive_producer_is_fenced_by_shared_ones_and_names_are_unique(
    standalone: StandaloneProcess,
) -> None:
    c = client(standalone)
    try:
        shared = c.create_producer("named", producer_name="billing")
        with pytest.raises(pulsar.ProducerFenced):  # shared producers hold the topic
            c.create_producer("named", access_mode=pulsar.ProducerAccessMode.Exclusive)
        with pytest.raises(pulsar.ProducerBusy):  # the name is taken on this topic
            c.create_producer("named", producer_name="billing")
        shared.send(b"still here")
        shared.close()
        again = c.create_producer("named", producer_name="billing")  # free once closed
        again.send(b"back")
    finally:
        c.close()


def test_deduplication_drops_resent_messages_across_restarts(tmp_path: Path) -> None:
    node = StandaloneProcess(tmp_path / "dedup", extra=["--deduplication-enabled"]).start()
    try:
        with closing(client(node)) as c:
            producer = c.create_producer(
                "payments", producer_name="billing", batching_enabled=False
            )
            for i in range(5):
                producer.send(f"pay-{i}".encode(), sequence_id=i)
            producer.send(b"pay-3 resent", sequence_id=3)  # a retry of something already stored

        node.kill()
        node.start()

        with closing(client(node)) as c:
            producer = c.create_producer(
                "payments", producer_name="billing", batching_enabled=False
            )
            assert producer.last_sequence_id() == 4
            producer.send(b"pay-4 resent after restart", sequence_id=4)
            producer.send(b"pay-5", sequence_id=5)
            reader = c.create_reader("payments", pulsar.MessageId.earliest)
            got = [reader.read_next(10_000).data() for _ in range(6)]
            assert got == [f"pay-{i}".encode() for i in range(6)]
            assert not reader.has_message_available()
    finally:
        node.stop()


def test_admin_namespaces_stats_and_topic_deletion(standalone: StandaloneProcess) -> None:
    assert json.loads(_admin(standalone, "GET", "/tenants")[1]) == ["public"]
    assert json.loads(_admin(standalone, "GET", "/namespaces/public")[1]) == ["public/default"]
    c = client(standalone)
    try:
        with pytest.raises(pulsar.PulsarException):
            c.create_producer("persistent://public/nowhere/t")  # no such namespace: clear error
        assert _admin(standalone, "PUT", "/namespaces/public/team")[0] == 204
        producer = c.create_producer("persistent://public/team/metrics", batching_enabled=False)
        consumer = c.subscribe("persistent://public/team/metrics", "dash")
        for i in range(5):
            producer.send(f"v{i}".encode())
        status, body = _admin(standalone, "GET", "/persistent/public/team/metrics/stats")
        stats = json.loads(body)
        assert status == 200 and stats["msgInCounter"] == 5 and len(stats["publishers"]) == 1
        assert stats["subscriptions"]["dash"]["msgBacklog"] == 5
        # A batch counts as its messages, as in Pulsar's stats.
        batched = c.create_producer(
            "persistent://public/team/metrics",
            batching_enabled=True,
            batching_max_messages=10,
            batching_max_publish_delay_ms=10_000,
        )
        for i in range(10):
            batched.send_async(f"b{i}".encode(), None)
        batched.flush()
        batched.close()
        stats = json.loads(_admin(standalone, "GET", "/persistent/public/team/metrics/stats")[1])
        assert stats["msgInCounter"] == 15
        assert json.loads(
            _admin(standalone, "GET", "/persistent/public/team/metrics/subscriptions")[1]
        ) == ["dash"]
        assert _admin(standalone, "DELETE", "/persistent/public/team/metrics")[0] == 412  # busy
        producer.close()
        consumer.close()
        assert _admin(standalone, "DELETE", "/persistent/public/team/metrics")[0] == 204
        assert "persistent://public/team/metrics" not in json.loads(
            _admin(standalone, "GET", "/persistent/public/team")[1]
        )
    finally:
        c.close()


def test_pattern_subscription_and_topic_listing_after_a_restart(
    own: StandaloneProcess,
) -> None:
    import re

    c = client(own)
    try:
        for name in ("metrics-a", "metrics-b", "other"):
            c.create_producer(name).send(f"first on {name}".encode())
    finally:
        c.close()
    own.stop()
    own.start()  # nothing loaded now: the listing comes from storage
    listed = json.loads(_admin(own, "GET", "/persistent/public/default")[1])
    assert listed == [
        "persistent://public/default/metrics-a",
        "persistent://public/default/metrics-b",
        "persistent://public/default/other",
    ]
    c = client(own)
    try:
        consumer = c.subscribe(
            re.compile("persistent://public/default/metrics-.*"),
            "dashboards",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        got = set()
        for _ in range(2):
            message = consumer.receive(timeout_millis=10_000)
            got.add(message.data())
            consumer.acknowledge(message)
        assert got == {b"first on metrics-a", b"first on metrics-b"}
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)  # "other" does not match
    finally:
        c.close()


def test_seek_to_earliest_and_latest(standalone: StandaloneProcess) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer("rewindable", batching_enabled=False)
        consumer = c.subscribe("rewindable", "s", initial_position=pulsar.InitialPosition.Earliest)
        for i in range(5):
            producer.send(f"v{i}".encode())
        for _ in range(5):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        consumer.seek(pulsar.MessageId.earliest)
        again = [consumer.receive(timeout_millis=10_000) for _ in range(5)]
        assert [m.data() for m in again] == [f"v{i}".encode() for i in range(5)]
        for message in again:
            consumer.acknowledge(message)
        consumer.seek(pulsar.MessageId.latest)
        producer.send(b"after latest")
        assert consumer.receive(timeout_millis=10_000).data() == b"after latest"
    finally:
        c.close()


@pytest.mark.parametrize("batch_index_acks", [True, False])
def test_cumulative_ack_inside_a_batch(
    standalone: StandaloneProcess, batch_index_acks: bool
) -> None:
    topic = f"batched-cumulative-{batch_index_acks}"
    c = client(standalone)
    try:
        consumer = c.subscribe(
            topic,
            "s",
            initial_position=pulsar.InitialPosition.Earliest,
            batch_index_ack_enabled=batch_index_acks,
        )
        producer = c.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=10,
            batching_max_publish_delay_ms=200,
        )
        for i in range(10):
            producer.send_async(f"b{i}".encode(), None)
        producer.flush()
        got = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
        assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1
        consumer.acknowledge_cumulative(got[3])  # the middle of the first entry of the topic
        time.sleep(0.5)
        consumer.close()
        producer.send(b"next entry")
        consumer = c.subscribe(topic, "s", batch_index_ack_enabled=batch_index_acks)
        rest = []
        while True:
            try:
                message = consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                break
            rest.append(message.data())
            consumer.acknowledge(message)
        # Nothing after the acknowledged message is lost; with batch-index acks nothing before
        # it comes back (without them the whole batch may, as in Pulsar).
        assert rest[-1] == b"next entry"
        expected = [f"b{i}".encode() for i in range(4, 10)]
        if batch_index_acks:
            assert rest[:-1] == expected
        else:
            assert rest[-7:-1] == expected
    finally:
        c.close()


def test_force_delete_closes_producers_and_they_come_back_to_a_new_topic(
    standalone: StandaloneProcess,
) -> None:
    c = client(standalone)
    try:
        producer = c.create_producer("doomed", batching_enabled=False)
        producer.send(b"old")
        assert (
            _admin(standalone, "DELETE", "/persistent/public/default/doomed?force=true")[0] == 204
        )
        # The producer was closed by the broker; the client reconnects and the topic is
        # auto-created afresh: the send succeeds and only the new message is stored.
        deadline = time.monotonic() + 20
        while True:
            try:
                producer.send(b"new")
                break
            except pulsar.PulsarException:
                assert time.monotonic() < deadline, "the producer never came back"
                time.sleep(0.2)
        reader = c.create_reader("doomed", pulsar.MessageId.earliest)
        assert reader.read_next(10_000).data() == b"new"
        assert not reader.has_message_available()
    finally:
        c.close()
