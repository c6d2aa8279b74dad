"""Autorecovery with real processes: the auditor (elected among the bookies) marks the ledgers
of a lost bookie, the replication workers copy them back, and nothing acknowledged is lost.

One cluster for the module (etcd, bookie processes, one broker writing E3/Qw2/Qa2 topic
ledgers and one writing E2/Qw2/Qa2); bookies are added as the tests kill them:

- the worker copying a ledger is killed mid-copy: its lock expires with its session, another
  worker finishes, and the metadata holds no partial or duplicate fragment;
- a bookie is killed (-9) for good while producers run: after the delay no ledger names it
  (broker topics, E3/Qw2/Qa2 and E2/Qw2/Qa2 ledgers written directly, and an open ledger whose
  writer was killed too, fenced and recovered by a worker); then a second bookie of the
  original ensembles is killed: every acknowledged message is still read through the broker,
  every acknowledged entry directly, and a topic's compacted ledger (made before the first
  loss) is replicated like the others and its compacted view read;
- the auditor's own bookie is killed: another bookie becomes auditor and its ledgers are
  replicated;
- a live bookie is decommissioned under traffic: no client error, no ledger names it after;
- with autorecovery disabled, ``magnetar bk recover BOOKIE`` re-replicates a lost bookie's
  ledgers with the workers' code.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from contextlib import closing

import pulsar
import pytest

from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.metadata import LEDGERS_PATH, LedgerMetadata
from magnetar.common.ledger.underreplication import LOCKS_PATH, MARKS_PATH
from magnetar.common.metadata.election import leader_key
from tests.support.bookie import BookieProcess
from tests.support.cluster import (
    ConsumerThread,
    MagnetarCluster,
    PacedProducer,
    assert_no_traceback,
    cluster_fixture,
    wait_delivered,
    wait_for_each,
)
from tests.support.ledger_cluster import payload_for, start_bookie
from tests.support.standalone import QUIET

SESSION_TTL_S = 3
BOOKIE_SETTINGS: dict[str, object] = {
    "session_ttl_s": SESSION_TTL_S,
    "lost_bookie_recovery_delay": 1.0,
    # Also the replication workers' poll of the marks (at most 5 s): an open ledger past its
    # grace period is fenced and copied within a second, not up to five.
    "auditor_periodic_check_interval": 1.0,
    "open_ledger_rereplication_grace_period": 3.0,
    "disk_check_interval_s": 0.5,
    # Slow enough that a multi-megabyte ledger takes seconds to copy (the mid-copy kill).
    "replication_rate_by_bytes": 2_000_000,
}
ENTRIES = 200
_BAD_LINE = re.compile(r"Traceback|\s(ERROR|CRITICAL)\s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MagnetarCluster]:
    """Four bookies; one broker writing E3/Qw2/Qa2 topic ledgers, one writing E2/Qw2/Qa2."""
    for cluster in cluster_fixture(
        tmp_path_factory.mktemp("autorecovery"),
        bookies=4,
        brokers=1,
        broker_settings={"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2},
        bookie_settings=BOOKIE_SETTINGS,
    ):
        cluster.add_broker(ensemble_size=2)
        cluster.wait_for(lambda: len(cluster.registered()) == 2, what="both brokers registered")  # noqa: B023
        yield cluster


# -- helpers ---------------------------------------------------------------------------------


def add_bookie(cluster: MagnetarCluster) -> BookieProcess:
    return start_bookie(cluster.factory.create(metadata_url=cluster.url, **cluster.settings))


def live(cluster: MagnetarCluster) -> set[str]:
    return {b.address for b in cluster.bookies if b.running}


def ledgers(cluster: MagnetarCluster) -> dict[int, LedgerMetadata]:
    return {
        int(key.rsplit("/", 1)[1]): LedgerMetadata.from_bytes(value)
        for key, value in cluster.scan(LEDGERS_PATH + "/").items()
    }


def named(metadata: LedgerMetadata) -> set[str]:
    return {b for f in metadata.fragments for b in f.bookies}


def assert_fragments_well_formed(ledger_id: int, metadata: LedgerMetadata) -> None:
    """No duplicate or partial fragment: starts strictly increase, each names E distinct bookies."""
    starts = [f.first_entry_id for f in metadata.fragments]
    assert starts == sorted(set(starts)) and starts[0] == 0, (ledger_id, metadata.fragments)
    for fragment in metadata.fragments:
        assert len(set(fragment.bookies)) == metadata.ensemble_size, (ledger_id, fragment)


def wait_fully_replicated(cluster: MagnetarCluster, lost: set[str], timeout: float = 60) -> None:
    """Until no mark is left and every ledger's ensembles name only live bookies."""

    def done() -> bool:
        if cluster.scan(MARKS_PATH + "/"):
            return False
        alive = live(cluster)
        return all(named(m) <= alive for m in ledgers(cluster).values())

    cluster.wait_for(done, what=f"ledgers of {sorted(lost)} re-replicated", timeout=timeout)
    for ledger_id, metadata in ledgers(cluster).items():
        assert not named(metadata) & lost, (ledger_id, metadata.fragments)
        assert_fragments_well_formed(ledger_id, metadata)


async def write_ledger(client: LedgerClient, e: int, qw: int, qa: int, *, close: bool) -> int:
    handle = await client.create_ledger(e, qw, qa)
    for entry_id in range(ENTRIES):
        await handle.add_async(payload_for(handle.ledger_id, entry_id))
    await handle.add(payload_for(handle.ledger_id, ENTRIES))
    if close:
        await handle.close()
    return handle.ledger_id


async def read_all(client: LedgerClient, ledger_id: int) -> list[bytes]:
    handle = await client.open_ledger(ledger_id, recovery=True)
    return [e.payload for e in await handle.read(0, handle.readable_last_entry)]


def assert_clean_logs(cluster: MagnetarCluster) -> None:
    for bookie in cluster.bookies:
        bad = [line for line in bookie.log_text().splitlines() if _BAD_LINE.search(line)]
        assert not bad, f"bookie {bookie.address} logged errors:\n" + "\n".join(bad[:20])
    for broker in cluster.brokers:
        assert_no_traceback(broker)


def metric_values(bookie: BookieProcess) -> dict[str, float]:
    """The bookie's unlabelled metrics from ``/metrics``."""
    status, body = bookie.http("GET", "/metrics")
    assert status == 200, (status, body)
    values = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def client_for(cluster: MagnetarCluster) -> pulsar.Client:
    return pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=30, logger=QUIET)


def topics_on_each_broker(cluster: MagnetarCluster, client: pulsar.Client) -> list[str]:
    """One topic owned by each broker (subscribing makes the load manager assign its bundle)."""
    chosen: dict[str, str] = {}
    for i in range(32):
        topic = f"persistent://public/default/autorecovery-{i}"
        client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest).close()
        owner = cluster.owner_of_topic(topic)
        assert owner is not None, topic
        chosen.setdefault(owner, topic)
        if len(chosen) == len(cluster.brokers):
            return list(chosen.values())
    raise AssertionError(f"32 topics did not reach every broker: {chosen}")


def compact_keyed(cluster: MagnetarCluster, client: pulsar.Client, topic: str) -> int:
    """Ten keys written twice to ``topic`` (beside its other messages), compacted by its owner;
    the compacted ledger."""
    producer = client.create_producer(topic, batching_enabled=False)
    for round_ in range(2):
        for i in range(10):
            producer.send(f"r{round_}-{i}".encode(), partition_key=f"compacted-{i}")
    producer.close()
    path = "/admin/v2/" + topic.replace("://", "/") + "/compaction"
    cluster.admin_json("PUT", path)  # redirected to the owner
    cluster.wait_for(
        lambda: cluster.admin_json("GET", path)["status"] == "SUCCESS", what=f"{topic} compacted"
    )
    internal = cluster.admin_json("GET", path.replace("/compaction", "/internalStats"))
    ledger_id: int = internal["compactedLedger"]["ledgerId"]
    assert internal["compactedLedger"]["entries"] >= 10
    return ledger_id


def read_compacted_keys(client: pulsar.Client, topic: str) -> dict[str, bytes]:
    """The latest value of each ``compacted-*`` key, read through the compacted view."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    try:
        view = {}
        while reader.has_message_available():
            message = reader.read_next(30_000)
            if message.partition_key().startswith("compacted-"):
                view[message.partition_key()] = message.data()
        return view
    finally:
        reader.close()


def consume_all(client: pulsar.Client, topic: str, wanted: set[str]) -> None:
    consumer = ConsumerThread(
        client, topic, f"check-{time.monotonic_ns()}", pulsar.ConsumerType.Exclusive
    ).start()
    try:
        missing = wait_delivered([consumer], wanted, timeout=60)
    finally:
        consumer.close()
    assert not missing, (
        f"{topic}: {len(missing)} acknowledged messages not readable: {sorted(missing)[:10]}"
    )


# -- tests -----------------------------------------------------------------------------------


def test_worker_killed_mid_copy(cluster: MagnetarCluster) -> None:
    # First in the module: the two kills below come close together, so no other ledger may
    # exist yet (any with both bookies in one write set would lose entries). Six bookies: room
    # to replace both even when the worker was the only bookie outside the ensemble.
    add_bookie(cluster)
    add_bookie(cluster)

    async def write() -> int:
        async with cluster.client() as client:
            # Qa = Qw: every entry is on all three, so killing the worker even when it is one
            # of the replicas leaves a full copy.
            handle = await client.create_ledger(3, 3, 3)
            for entry_id in range(600):
                await handle.add_async(payload_for(handle.ledger_id, entry_id, 10_000))
            await handle.add(payload_for(handle.ledger_id, 600, 10_000))
            await handle.close()
            return handle.ledger_id

    ledger_id = asyncio.run(write())
    lost = ledgers(cluster)[ledger_id].fragments[0].bookies[0]
    cluster.bookie(lost).kill()
    holder = cluster.wait_for(
        lambda: cluster.scan(f"{LOCKS_PATH}/{ledger_id}").get(f"{LOCKS_PATH}/{ledger_id}"),
        what=f"a worker locks ledger {ledger_id}",
        every=0.05,
    ).decode()
    assert lost in named(ledgers(cluster)[ledger_id])  # still copying: nothing committed yet
    cluster.bookie(holder).kill()
    wait_fully_replicated(cluster, {lost, holder})
    metadata = ledgers(cluster)[ledger_id]
    assert len(metadata.fragments) == 1, metadata.fragments  # one fragment, replaced in place

    async def read_then_delete() -> None:
        async with cluster.client() as client:
            payloads = await read_all(client, ledger_id)
            assert payloads == [payload_for(ledger_id, i, 10_000) for i in range(601)]
            # Checked: gone, so that the next tests find the cluster as they would alone (each
            # of their bookie losses would otherwise copy these 6 MB again, at 2 MB/s).
            await client.delete_ledger(ledger_id)

    asyncio.run(read_then_delete())


def test_lost_bookies_ledgers_are_replicated_and_stay_readable(cluster: MagnetarCluster) -> None:
    with closing(client_for(cluster)) as pulsar_client:
        topics = topics_on_each_broker(cluster, pulsar_client)
        producers = [PacedProducer(pulsar_client, t, interval=0.01).start() for t in topics]
        wait_for_each(producers, 100)
        compacted = compact_keyed(cluster, pulsar_client, topics[0])

        async def write_direct() -> dict[int, int]:
            async with cluster.client() as client:
                closed = {
                    await write_ledger(client, 3, 2, 2, close=True): 3,
                    await write_ledger(client, 2, 2, 2, close=True): 2,
                }
                return closed

        direct = asyncio.run(write_direct())
        # An open ledger whose writer is killed: a worker must fence and recover it.
        writer = cluster.writer_process(2, 2, 2, 100_000)
        assert writer.stdout is not None
        open_id = int(writer.stdout.readline().split()[1])
        acked = -1
        while acked < ENTRIES:
            line = writer.stdout.readline()
            if line.startswith("acked"):
                acked = int(line.split()[1])
        writer.kill()
        writer.wait()
        original = ledgers(cluster)[open_id].fragments[0].bookies
        first, second = original  # E2: both of its bookies die, one after the other

        cluster.bookie(first).kill()
        wait_fully_replicated(cluster, {first})  # the compacted ledger too
        assert compacted in ledgers(cluster)
        wait_for_each(producers, 50)  # the writers moved off the lost bookie and go on
        for producer in producers:
            producer.stop()
        assert all(not p.errors and not p.raised for p in producers), [
            (p.errors[:3], p.raised[:3]) for p in producers
        ]
        topic_quorums = {
            (m.ensemble_size, m.write_quorum, m.ack_quorum)
            for m in ledgers(cluster).values()
            if "managed-ledger" in m.custom_metadata
        }
        assert topic_quorums == {(3, 2, 2), (2, 2, 2)}, topic_quorums
        reopened = ledgers(cluster)[open_id]
        assert reopened.is_closed and reopened.last_entry_id >= acked, reopened

        # Hold the auditor back while reading with two bookies gone (set at run time, in the store).
        held = cluster.bk("lostbookierecoverydelay", "--set", "3600", "--json")
        assert held.returncode == 0 and json.loads(held.stdout) == {
            "lost_bookie_recovery_delay": 3600
        }
        cluster.bookie(second).kill()
        for producer, topic in zip(producers, topics, strict=True):
            consume_all(pulsar_client, topic, set(producer.receipted))
            producer.close()
        assert read_compacted_keys(pulsar_client, topics[0]) == {
            f"compacted-{i}": f"r1-{i}".encode() for i in range(10)
        }

    async def read_direct() -> None:
        async with cluster.client() as client:
            for ledger_id in [*direct, open_id]:
                payloads = await read_all(client, ledger_id)
                assert len(payloads) >= (acked + 1 if ledger_id == open_id else ENTRIES + 1)
                assert payloads == [payload_for(ledger_id, i) for i in range(len(payloads))]

    asyncio.run(read_direct())
    # Room again for E3 ledgers, then the second loss is repaired too.
    add_bookie(cluster)
    add_bookie(cluster)
    assert cluster.bk("lostbookierecoverydelay", "--set", "1").returncode == 0
    wait_fully_replicated(cluster, {first, second})
    listed = cluster.bk("listunderreplicated", "--json")
    assert listed.returncode == 0 and listed.stdout == "", listed


def test_auditor_failover(cluster: MagnetarCluster) -> None:
    auditor = cluster.scan(leader_key("auditor"))[leader_key("auditor")].decode()

    async def write() -> None:
        async with cluster.client() as client:
            for _ in range(3):
                await write_ledger(client, 3, 2, 2, close=True)

    asyncio.run(write())
    assert any(auditor in named(m) for m in ledgers(cluster).values())
    cluster.bookie(auditor).kill()
    cluster.wait_for(
        lambda: (
            (leader := cluster.scan(leader_key("auditor")).get(leader_key("auditor")))
            and leader.decode() != auditor
        ),
        what="another bookie becomes the auditor",
    )
    wait_fully_replicated(cluster, {auditor})
    status = cluster.bk("autorecovery", "status", "--json")
    assert status.returncode == 0, status
    new_auditor = json.loads(status.stdout)["auditor"]
    assert new_auditor in live(cluster), status.stdout
    metrics = {b.address: metric_values(b) for b in cluster.bookies if b.running}
    assert [a for a, m in metrics.items() if m.get("magnetar_bookie_auditor") == 1] == [new_auditor]
    # The auditor reports the marks it sees every tick: the last mark may have gone after its
    # latest report (seen once: the gauge still said 1 right after the marks were cleared).
    new_auditor_bookie = cluster.bookie(new_auditor)
    cluster.wait_for(
        lambda: metric_values(new_auditor_bookie)["magnetar_bookie_under_replicated_ledgers"] == 0,
        what="the new auditor reports no under-replicated ledger",
        timeout=10,
    )
    assert sum(m["magnetar_bookie_fragments_replicated_total"] for m in metrics.values()) > 0
    assert sum(m["magnetar_bookie_replicated_bytes_total"] for m in metrics.values()) > 0


def test_decommission_under_traffic(cluster: MagnetarCluster) -> None:
    add_bookie(cluster)
    with closing(client_for(cluster)) as pulsar_client:
        topic = "persistent://public/default/autorecovery-decommission"
        pulsar_client.subscribe(
            topic, "keep", initial_position=pulsar.InitialPosition.Earliest
        ).close()
        producer = PacedProducer(pulsar_client, topic, interval=0.005).start()
        producer.wait_for(100)
        on_bookies: dict[str, int] = {}
        for metadata in ledgers(cluster).values():
            for address in named(metadata):
                on_bookies[address] = on_bookies.get(address, 0) + 1
        target = max((a for a in on_bookies if a in live(cluster)), key=on_bookies.__getitem__)

        result = cluster.bk("decommissionbookie", target, "--timeout", "60", "--json")
        producer.wait_for(50)
        producer.stop()
        assert result.returncode == 0, result
        assert json.loads(result.stdout.splitlines()[-1])["remaining"] == [], result.stdout
        assert not producer.errors and not producer.raised, (
            producer.errors[:3],
            producer.raised[:3],
        )
        assert all(target not in named(m) for m in ledgers(cluster).values())
        cluster.bookie(target).stop()  # removable: nothing needs it any more
        consume_all(pulsar_client, topic, set(producer.receipted))
        producer.close()


def test_recover_bookie_by_hand_while_autorecovery_is_disabled(cluster: MagnetarCluster) -> None:
    add_bookie(cluster)
    add_bookie(cluster)
    disabled = cluster.bk("autorecovery", "disable", "--json")
    assert disabled.returncode == 0 and json.loads(disabled.stdout)["enabled"] is False, disabled

    async def write() -> list[int]:
        async with cluster.client() as client:
            return [await write_ledger(client, 3, 2, 2, close=True) for _ in range(2)]

    written = asyncio.run(write())
    lost = ledgers(cluster)[written[0]].fragments[0].bookies[0]
    cluster.bookie(lost).kill()
    recovered = cluster.bk("recover", lost, "--json")
    assert recovered.returncode == 0, (recovered, lost, ledgers(cluster))
    assert json.loads(recovered.stdout)["not_done"] == [], recovered.stdout
    assert all(lost not in named(m) for m in ledgers(cluster).values())
    assert cluster.bk("autorecovery", "enable").returncode == 0
    wait_fully_replicated(cluster, {lost})

    async def read() -> None:
        async with cluster.client() as client:
            for ledger_id in written:
                payloads = await read_all(client, ledger_id)
                assert payloads == [payload_for(ledger_id, i) for i in range(ENTRIES + 1)]

    asyncio.run(read())
    assert_clean_logs(cluster)
