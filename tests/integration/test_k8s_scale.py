"""The dev overlay, run as Kubernetes would run it (tests/support/k8s_pods.py: each pod a local
process with exactly its manifest's command, arguments and environment, on its own loopback
address), scaled as an operator scales it, with the official client producing and consuming
through the proxy in all four subscription modes the whole time:

1. bookies 3 -> 4: new ledgers are placed on the new bookie;
2. brokers 2 -> 3: the load manager moves bundles to the new broker;
3. brokers 3 -> 2: the removed broker, on SIGTERM, hands its bundles over; producers see no
   error;
4. bookies 4 -> 3: first the check refuses what would leave ledgers under their write quorum;
   then the operator step (``magnetar bk decommissionbookie --no-wait``, in a cluster
   ``magnetar bk scaledown --replicas 3``) marks the leaving bookie, and its pod's preStop
   hook (``magnetar bk prestop``) holds it until its ledgers are copied away: none names it
   after, none is under-replicated.

No receipted message is lost. The pause each step caused (the longest gap between two receipts
of a producer) is printed for docs/kubernetes.md, never asserted."""

from __future__ import annotations

import asyncio
import copy
import itertools
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.cluster.bundles import BundleRange, bundle_for_hash, topic_hash
from magnetar.broker.cluster.ownership import OWNERSHIP_ROOT
from magnetar.common.cluster.broker_info import BROKERS_ROOT, BrokerInfo
from magnetar.common.ledger.metadata import LEDGERS_PATH, LedgerMetadata
from magnetar.common.ledger.underreplication import DECOMMISSIONING_PATH, list_marks
from magnetar.common.metadata import open_store
from tests.support.cluster import ConsumerThread, PacedProducer, wait_delivered
from tests.support.k8s import Manifests, render
from tests.support.k8s_pods import ENTRYPOINT, PodRunner
from tests.support.polling import wait_until

MODES = {
    "exclusive": (pulsar.ConsumerType.Exclusive, 1),
    "failover": (pulsar.ConsumerType.Failover, 2),
    "shared": (pulsar.ConsumerType.Shared, 2),
    "key-shared": (pulsar.ConsumerType.KeyShared, 2),
}


def topic_per_bundle() -> dict[str, str]:
    """One topic per subscription mode, each in another of public/default's 4 bundles, so
    every broker owns traffic and a new one has bundles to take."""
    size = 1 << 32
    bundles = [BundleRange(i * size // 4, (i + 1) * size // 4 - 1) for i in range(4)]
    bundles[-1] = BundleRange(bundles[-1].lower, 0xFFFFFFFF)
    topics: dict[str, str] = {}
    for index, mode in enumerate(MODES):
        for n in range(10_000):
            name = f"persistent://public/default/k8s-{mode}-{n}"
            if bundle_for_hash(bundles, topic_hash(name)) == bundles[index]:
                topics[mode] = name
                break
    return topics


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[PodRunner]:
    pods = PodRunner(Manifests(copy.deepcopy(render("dev"))), tmp_path)
    try:
        yield pods
    finally:
        pods.close()
        failed = [
            p for p in pods.pods.values() if p.process and p.process.returncode not in (0, -9)
        ]
        for pod in failed:
            print(f"--- {pod.name} exited {pod.process.returncode}:\n{pod.log_tail(2000)}")  # type: ignore[union-attr]


class Store:
    """Reads of the cluster's metadata store, from the test."""

    def __init__(self, url: str) -> None:
        self.url = url

    def scan(self, prefix: str) -> dict[str, bytes]:
        async def scan() -> dict[str, bytes]:
            store = await open_store(self.url)
            try:
                return {k: v.value for k, v in (await store.scan(prefix)).items()}
            finally:
                await store.close()

        return asyncio.run(scan())

    def ledgers(self) -> dict[int, LedgerMetadata]:
        return {
            int(k.rsplit("/", 1)[1]): LedgerMetadata.from_bytes(v)
            for k, v in self.scan(LEDGERS_PATH + "/").items()
            if k.rsplit("/", 1)[1].isdigit()
        }

    def marks(self) -> dict[int, object]:
        async def marks() -> dict[int, object]:
            store = await open_store(self.url)
            try:
                return dict(await list_marks(store))
            finally:
                await store.close()

        return asyncio.run(marks())

    def owners(self) -> dict[str, int]:
        """Broker id -> bundles it owns."""
        counts: dict[str, int] = {}
        for value in self.scan(OWNERSHIP_ROOT + "/").values():
            owner = BrokerInfo.from_json(value).broker_id
            counts[owner] = counts.get(owner, 0) + 1
        return counts


def bk(runner: PodRunner, pod_name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl exec POD -- magnetar bk ...``: the tool with the pod's environment."""
    pod = runner.pods[pod_name]
    return subprocess.run(
        [*ENTRYPOINT, "bk", *args],
        env=runner.process_env(pod),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def longest_gap(producers: list[PacedProducer], since: float) -> float:
    """The longest pause between two receipts of one producer after ``since``."""
    worst = 0.0
    for producer in producers:
        times = sorted(t for t in list(producer.receipted.values()) if t >= since)
        worst = max([worst, *(b - a for a, b in itertools.pairwise(times))])
    return worst


def test_scale_bookies_and_brokers_from_the_manifests(runner: PodRunner) -> None:
    figures: dict[str, float] = {}
    began = time.monotonic()
    runner.scale("StatefulSet", "etcd", 1)
    runner.run_job(runner.workload("Job", "initialize-cluster-metadata"))
    runner.scale("StatefulSet", "bookie", 3)
    runner.scale("Deployment", "broker", 2)
    [proxy] = runner.scale("Deployment", "proxy", 1)
    figures["cluster up (s)"] = time.monotonic() - began
    store = Store(runner.pods["bookie-0"].env["MAGNETAR_METADATA_URL"])
    service_url = f"pulsar://{proxy.ip}:{proxy.env['MAGNETAR_PORT']}"

    topics = topic_per_bundle()
    with closing(pulsar.Client(service_url, operation_timeout_seconds=30)) as client:
        consumers = [
            ConsumerThread(client, topic, f"sub-{mode}", MODES[mode][0], name=f"{mode}-{i}").start()
            for mode, topic in topics.items()
            for i in range(MODES[mode][1])
        ]
        # One bundle hotter than the rest: with 2+2 bundles of equal load, no move to a third
        # broker would bring the others nearer the average (the shedder's rule).
        producers = [
            PacedProducer(
                client, topic, tag=mode, interval=0.003 if mode == "exclusive" else 0.01
            ).start()
            for mode, topic in topics.items()
        ]
        for producer in producers:
            producer.wait_for(20)

        # 1. bookies 3 -> 4: new ledgers use the new bookie.
        step = time.monotonic()
        [new_bookie] = runner.scale("StatefulSet", "bookie", 4)
        new_address = f"{new_bookie.ip}:{new_bookie.env['MAGNETAR_PORT']}"
        before = set(store.ledgers())
        with closing(client.create_producer("persistent://public/default/k8s-probe")) as probe:
            probe.send(b"x")

        def on_new_bookie() -> bool:
            # Each new topic opens a ledger; writers choose among all writable bookies. The
            # subscription keeps the topic (and its ledger) from being deleted as inactive.
            topic = f"k8s-new-{time.monotonic_ns()}"
            client.subscribe(topic, "keep").close()
            with closing(client.create_producer(topic)) as p:
                p.send(b"x")
            return any(
                new_address in f.bookies
                for i, m in store.ledgers().items()
                if i not in before
                for f in m.fragments
            )

        wait_until(on_new_bookie, "a new ledger placed on the new bookie", timeout=60)
        figures["bookies 3->4: longest receipt gap (s)"] = longest_gap(producers, step)

        # 2. brokers 2 -> 3: the load manager moves bundles to the new broker.
        step = time.monotonic()
        [new_broker] = runner.scale("Deployment", "broker", 3)
        new_id = f"{new_broker.ip}:{new_broker.env['MAGNETAR_HTTP_PORT']}"
        wait_until(
            lambda: store.owners().get(new_id, 0) > 0,
            f"the load manager gives broker {new_id} bundles",
            timeout=150,
        )
        figures["brokers 2->3: until the new broker owns a bundle (s)"] = time.monotonic() - step
        figures["brokers 2->3: longest receipt gap (s)"] = longest_gap(producers, step)

        # 3. brokers 3 -> 2: the newest broker goes (SIGTERM): its bundles are handed over.
        step = time.monotonic()
        for producer in producers:
            producer.wait_for(10)
        runner.scale("Deployment", "broker", 2)
        assert not new_broker.running
        assert new_broker.process is not None and new_broker.process.returncode == 0
        assert "killed" not in new_broker.figures, new_broker.log_tail()
        assert new_id not in store.owners()
        assert not any(k.endswith(new_id) for k in store.scan(BROKERS_ROOT + "/"))
        for producer in producers:
            producer.wait_for(20)
        figures["brokers 3->2: SIGTERM to exit (s)"] = new_broker.figures["sigterm_to_exit_s"]
        figures["brokers 3->2: longest receipt gap (s)"] = longest_gap(producers, step)

        # 4. bookies 4 -> 3: refused below the write quorum, then decommissioned by preStop.
        step = time.monotonic()
        addresses = sorted(
            f"{runner.pods[f'bookie-{i}'].ip}:{new_bookie.env['MAGNETAR_PORT']}" for i in range(4)
        )
        refused = bk(runner, "bookie-0", "decommissionbookie", ",".join(addresses[:3]), "--check")
        assert refused.returncode == 1, refused
        assert "refused" in refused.stderr and "ensemble of 2" in refused.stderr, refused.stderr
        allowed = bk(runner, "bookie-0", "decommissionbookie", new_address, "--check")
        assert allowed.returncode == 0 and "allowed" in allowed.stdout, allowed
        # A bookie that is not leaving (a restart, an upgrade) passes its preStop at once.
        restart = bk(runner, "bookie-0", "prestop", "--timeout", "5")
        assert restart.returncode == 0 and "not being decommissioned" in restart.stdout, restart
        on_leaving = [
            i
            for i, m in store.ledgers().items()
            if any(new_address in f.bookies for f in m.fragments)
        ]
        assert on_leaving, "the leaving bookie holds ledgers: the decommission has work to do"
        figures["bookies 4->3: ledgers copied off the leaving bookie"] = len(on_leaving)
        marked = bk(runner, "bookie-0", "decommissionbookie", new_address, "--no-wait")
        assert marked.returncode == 0, marked
        runner.scale("StatefulSet", "bookie", 3)
        assert new_bookie.figures["prestop_exit"] == 0, new_bookie.log_tail()
        assert "killed" not in new_bookie.figures
        assert all(
            new_address not in f.bookies for m in store.ledgers().values() for f in m.fragments
        )
        assert not store.marks(), store.marks()
        assert not store.scan(DECOMMISSIONING_PATH + "/")
        figures["bookies 4->3: preStop decommission (s)"] = new_bookie.figures["prestop_s"]
        figures["bookies 4->3: longest receipt gap (s)"] = longest_gap(producers, step)

        for producer in producers:
            producer.wait_for(10)
            producer.stop()
        try:
            for producer in producers:
                assert not producer.errors and not producer.raised, (
                    producer.topic,
                    producer.errors[:3],
                    producer.raised[:3],
                )
            wanted = {p: set(p.receipted) for p in producers}
            for producer in producers:
                mine = [c for c in consumers if c.subscription == f"sub-{producer.tag}"]
                missing = wait_delivered(mine, wanted[producer], timeout=60)
                assert not missing, f"{producer.topic}: lost {sorted(missing)[:10]}"
            figures["messages receipted"] = sum(len(w) for w in wanted.values())
        finally:
            for consumer in consumers:
                consumer.close()
            for producer in producers:
                producer.close()
    figures["whole test (s)"] = time.monotonic() - began
    print("\nk8s scale figures:")
    for name, value in figures.items():
        print(f"  {name}: {value:.2f}")
