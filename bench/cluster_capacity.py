"""Cluster capacity: messages per broker CPU-second with 1 and 3 brokers, and broker memory for
many topics spread over 3 brokers.

Each run starts its own cluster from the test support (``MagnetarCluster``: one etcd, two
bookie processes, E2/Qw2/Qa2) and reads every process's CPU time (user + system,
``/proc/PID/stat``) and RSS (``VmRSS``, ``/proc/PID/status``) itself.

- ``cpu``: with 1 broker, then 3, one producer per topic (``--topics`` topics in a namespace
  of ``--bundles`` bundles, so they spread over the brokers) sends ``--size``-byte messages as
  fast as it can: async sends, at most ``--window`` in flight, ``block_if_queue_full``. After
  ``--warmup`` seconds the receipts and the CPU of every process are counted for ``--seconds``.
  Prints msg/s, broker CPU-seconds and messages per broker CPU-second, with the CPU of the
  bookies, etcd and this (client) process beside them: they share the machine's cores.
- ``topics``: 3 brokers; ``--topics`` topics in a namespace of ``--bundles`` bundles, each
  loaded by one producer that sends one message (``--threads`` calls in flight over
  ``--clients`` client objects). Producers stay open unless ``--close-producers``. Prints each
  broker's RSS before and after, the topics it loaded (its ``magnetar_broker_topics`` gauge,
  checked against the topics hashing into the bundles it owns) and the memory per topic.

    python bench/cluster_capacity.py cpu [--seconds 20] [--topics 24] [--batching off|on|both]
    python bench/cluster_capacity.py topics [--topics 10000] [--threads 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from tests.support.cluster import MagnetarCluster
from tests.support.standalone import QUIET

TENANT = "bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- processes ---------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Process:
    role: str  # broker, bookie, etcd, client
    name: str
    pid: int


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (every thread), from /proc/PID/stat."""
    # The command name may hold spaces: count the fields after its ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def processes(cluster: MagnetarCluster) -> list[Process]:
    """Every process of the cluster, and this one (the clients)."""
    found = [Process("broker", b.broker_id, b.pid) for b in cluster.brokers if b.pid]
    found += [Process("bookie", b.address, b.process.pid) for b in cluster.bookies if b.process]
    if cluster.etcd.process is not None:
        found.append(Process("etcd", "etcd", cluster.etcd.process.pid))
    found.append(Process("client", "this process", os.getpid()))
    return found


def cpu_snapshot(procs: list[Process]) -> dict[int, float]:
    return {p.pid: cpu_seconds(p.pid) for p in procs}


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)"


# -- cluster helpers ---------------------------------------------------------------------------


def create_namespace(cluster: MagnetarCluster, namespace: str, bundles: int) -> None:
    status, body = cluster.admin("PUT", f"/admin/v2/tenants/{TENANT}", {})
    assert status in (204, 409), f"create tenant {TENANT}: {status} {body!r}"
    path = f"/admin/v2/namespaces/{TENANT}/{namespace}"
    status, body = cluster.admin("PUT", path, {"bundles": {"numBundles": bundles}})
    assert status == 204, f"create namespace {TENANT}/{namespace}: {status} {body!r}"


def topics_by_owner(cluster: MagnetarCluster, topics: list[str]) -> Counter[str]:
    """How many of ``topics`` hash into bundles each broker owns (``?`` for an unowned one)."""
    owned: dict[str, list[tuple[BundleRange, str]]] = {}
    for (namespace, bundle), owner in cluster.ownership().items():
        owned.setdefault(namespace, []).append((BundleRange.parse(bundle), owner))
    counts: Counter[str] = Counter()
    for topic in topics:
        namespace = topic.split("://", 1)[1].rsplit("/", 1)[0]
        h = topic_hash(topic)
        owner = next((o for r, o in owned.get(namespace, []) if r.contains(h)), "?")
        counts[owner] += 1
    return counts


def broker_gauge(http_url: str, name: str) -> int:
    """A broker-wide gauge of the broker's ``/metrics`` (``magnetar_broker_topics``:
    its loaded topics; ``magnetar_broker_in_entries``: entries they stored)."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=120) as response:
        for raw in response:
            line = raw.decode()
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
    raise RuntimeError(f"{http_url}/metrics has no {name}")


def entries_stored(cluster: MagnetarCluster) -> int:
    return sum(broker_gauge(b.http_url, "magnetar_broker_in_entries") for b in cluster.brokers)


# -- cpu: messages per broker CPU-second -------------------------------------------------------


class FullSpeedProducer:
    """One producer sending as fast as its window allows, from a thread; counts receipts."""

    def __init__(
        self, client: pulsar.Client, topic: str, *, batching: bool, window: int, size: int
    ) -> None:
        self.producer = client.create_producer(
            topic,
            batching_enabled=batching,
            block_if_queue_full=True,
            max_pending_messages=window,
            send_timeout_millis=30_000,
        )
        self.payload = b"x" * size
        self.receipts = 0
        self.errors = 0
        self._window = threading.Semaphore(window)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"send {topic}", daemon=True)

    def start(self) -> FullSpeedProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._window.acquire(timeout=0.5):
                continue
            self.producer.send_async(self.payload, self._done)

    def _done(self, result: Any, _message_id: Any) -> None:
        self._window.release()
        with self._lock:
            if result == pulsar.Result.Ok:
                self.receipts += 1
            else:
                self.errors += 1

    def stop_sending(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._thread.join(10)
        try:
            self.producer.flush()
            self.producer.close()
        except Exception:
            pass  # the figures are taken already


@dataclass(slots=True)
class CpuRun:
    brokers: int
    batching: bool
    receipts: int
    entries: int  # stored by the brokers: one per message, or one per batch
    errors: int
    seconds: float
    cpu: dict[str, float]  # role -> CPU-seconds over the window
    broker_cpu: dict[str, float]  # broker id -> CPU-seconds over the window
    topics_per_broker: Counter[str]
    idle_broker_cpu: float  # broker CPU-seconds per second with no traffic
    load: str


def idle_broker_cpu(cluster: MagnetarCluster, seconds: float) -> float:
    """Broker CPU-seconds per second with no traffic (load reports, sessions, keep-alives)."""
    brokers = [p for p in processes(cluster) if p.role == "broker"]
    before = cpu_snapshot(brokers)
    time.sleep(seconds)
    after = cpu_snapshot(brokers)
    return sum(after[p.pid] - before[p.pid] for p in brokers) / seconds


def measure_cpu(
    cluster: MagnetarCluster, args: argparse.Namespace, batching: bool, idle: float
) -> CpuRun:
    namespace = f"cpu-{'batch' if batching else 'single'}"
    create_namespace(cluster, namespace, args.bundles)
    topics = [f"persistent://{TENANT}/{namespace}/t{i}" for i in range(args.topics)]
    window = args.window * (10 if batching else 1)  # a batch is only as large as the window
    client = pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=60, logger=QUIET)
    producers: list[FullSpeedProducer] = []
    try:
        # Every producer exists before any sends: creating one while the others' threads hold
        # the GIL at full speed takes seconds.
        producers = [
            FullSpeedProducer(client, topic, batching=batching, window=window, size=args.size)
            for topic in topics
        ]
        for producer in producers:
            producer.start()
        time.sleep(args.warmup)
        procs = processes(cluster)
        # The scrapes stay outside the window, so their CPU is not counted.
        before_entries = entries_stored(cluster)
        before_cpu, before_receipts = cpu_snapshot(procs), sum(p.receipts for p in producers)
        started = time.monotonic()
        time.sleep(args.seconds)
        after_cpu, after_receipts = cpu_snapshot(procs), sum(p.receipts for p in producers)
        elapsed = time.monotonic() - started
        entries = entries_stored(cluster) - before_entries
        load = load_average()
    finally:
        for producer in producers:
            producer.stop_sending()
        for producer in producers:
            producer.close()
        client.close()
    cpu: Counter[str] = Counter()
    for p in procs:
        cpu[p.role] += after_cpu[p.pid] - before_cpu[p.pid]
    return CpuRun(
        brokers=len(cluster.brokers),
        batching=batching,
        receipts=after_receipts - before_receipts,
        entries=entries,
        errors=sum(p.errors for p in producers),
        seconds=elapsed,
        cpu=dict(cpu),
        broker_cpu={
            p.name: after_cpu[p.pid] - before_cpu[p.pid] for p in procs if p.role == "broker"
        },
        topics_per_broker=topics_by_owner(cluster, topics),
        idle_broker_cpu=idle,
        load=load,
    )


def print_cpu_run(run: CpuRun) -> None:
    rate = run.receipts / run.seconds
    broker_cpu = run.cpu.get("broker", 0.0)
    per_cpu = run.receipts / broker_cpu if broker_cpu else float("nan")
    print(
        f"{run.brokers} broker{'s' if run.brokers > 1 else ' '} batching "
        f"{'on ' if run.batching else 'off'}: {rate:8,.0f} msg/s  "
        f"broker CPU {broker_cpu:6.2f} s / {run.seconds:.1f} s  "
        f"=> {per_cpu:8,.0f} msg per broker CPU-second  ({run.errors} send errors)"
    )
    others = "  ".join(
        f"{role} {run.cpu.get(role, 0.0):6.2f} s" for role in ("bookie", "etcd", "client")
    )
    total = sum(run.cpu.values())
    print(
        f"    CPU over the window: broker {broker_cpu:6.2f} s  {others}  "
        f"total {total:6.2f} s of {run.seconds * (os.cpu_count() or 1):.0f} available"
    )
    for broker_id, seconds in sorted(run.broker_cpu.items()):
        print(
            f"    broker {broker_id}: {run.topics_per_broker.get(broker_id, 0):3} topics, "
            f"CPU {seconds:6.2f} s ({seconds / run.seconds:4.0%} of a core)"
        )
    per_entry = broker_cpu / run.entries * 1e6 if run.entries else float("nan")
    print(
        f"    {run.entries:,} entries stored ({run.receipts / max(run.entries, 1):.1f} messages "
        f"per entry), {per_entry:,.0f} us of broker CPU per entry"
    )
    busy = broker_cpu - run.idle_broker_cpu * run.seconds
    print(
        f"    idle brokers burn {run.idle_broker_cpu:.3f} CPU-s/s; net of that "
        f"{run.receipts / busy if busy > 0 else float('nan'):,.0f} msg per broker CPU-second"
    )
    print(f"    {run.load}")


def run_cpu(args: argparse.Namespace) -> None:
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.batching]
    print(
        f"cpu: {args.topics} topics ({args.bundles} bundles), one producer each, "
        f"{args.size}-byte messages, window {args.window} in flight per producer "
        f"(x10 with batching), warm-up {args.warmup:.0f} s, measured {args.seconds:.0f} s; "
        f"1 etcd, 2 bookies (E2/Qw2/Qa2)"
    )
    print(load_average())
    runs = []
    for brokers in (1, 3):
        with tempfile.TemporaryDirectory(prefix="cluster-capacity-") as work:
            with MagnetarCluster(Path(work), bookies=2, brokers=brokers) as cluster:
                idle = idle_broker_cpu(cluster, args.idle)
                for batching in modes:
                    run = measure_cpu(cluster, args, batching, idle)
                    print_cpu_run(run)
                    runs.append(run)
    for batching in modes:
        one, three = (r for r in runs if r.batching == batching)
        ratio = (three.receipts / three.seconds) / (one.receipts / one.seconds)
        print(f"batching {'on ' if batching else 'off'}: 3 brokers / 1 broker msg/s = {ratio:.2f}")


# -- topics: memory per topic over 3 brokers ---------------------------------------------------


@dataclass(slots=True)
class TopicLoad:
    producers: list[pulsar.Producer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def load_topic(client: pulsar.Client, topic: str, keep: bool, load: TopicLoad) -> None:
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(topic.encode())
    except Exception as e:  # counted and reported; the run goes on
        with load.lock:
            load.errors.append(f"{topic}: {e!r}")
        return
    if keep:
        with load.lock:
            load.producers.append(producer)
    else:
        producer.close()


def timed(call: Callable[[], None]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def run_topics(args: argparse.Namespace) -> None:
    keep = not args.close_producers
    print(
        f"topics: {args.topics:,} topics ({args.bundles} bundles) over 3 brokers, one producer "
        f"each sending one message, {args.threads} calls in flight over {args.clients} clients, "
        f"producers {'kept open' if keep else 'closed after their message'}; "
        f"1 etcd, 2 bookies (E2/Qw2/Qa2)"
    )
    print(load_average())
    with tempfile.TemporaryDirectory(prefix="cluster-capacity-") as work:
        with MagnetarCluster(Path(work), bookies=2, brokers=3) as cluster:
            create_namespace(cluster, "topics", args.bundles)
            topics = [f"persistent://{TENANT}/topics/t{i}" for i in range(args.topics)]
            time.sleep(args.settle)
            procs = processes(cluster)
            rss_before = {p.pid: rss_kib(p.pid) for p in procs}
            cpu_before = cpu_snapshot(procs)
            clients = [
                pulsar.Client(cluster.brokers[0].url, operation_timeout_seconds=120, logger=QUIET)
                for _ in range(args.clients)
            ]
            load = TopicLoad()
            try:
                with ThreadPoolExecutor(args.threads) as pool:
                    setup_s = timed(
                        lambda: list(
                            pool.map(
                                lambda it: load_topic(
                                    clients[it[0] % len(clients)], it[1], keep, load
                                ),
                                enumerate(topics),
                            )
                        )
                    )
                cpu_after = cpu_snapshot(procs)
                time.sleep(args.settle)
                rss_after = {p.pid: rss_kib(p.pid) for p in procs}
                gauges = {
                    b.broker_id: broker_gauge(b.http_url, "magnetar_broker_topics")
                    for b in cluster.brokers
                }
                by_hash = topics_by_owner(cluster, topics)
                bundles = Counter(owner for owner in cluster.ownership().values())
                after_load = load_average()
            finally:
                for client in clients:
                    client.close()

    print(
        f"set up {args.topics - len(load.errors):,} of {args.topics:,} topics in {setup_s:.1f} s "
        f"({(args.topics - len(load.errors)) / setup_s:,.0f} topics/s)"
    )
    total_topics, total_delta = 0, 0
    for p in procs:
        if p.role != "broker":
            continue
        loaded = gauges[p.name]
        delta = rss_after[p.pid] - rss_before[p.pid]
        total_topics += loaded
        total_delta += delta
        per_topic = f"{delta / loaded:6.1f} KiB/topic" if loaded else "   n/a"
        print(
            f"broker {p.name}: {bundles[p.name]:3} bundles, {loaded:6,} topics loaded "
            f"({by_hash.get(p.name, 0):,} by hash), RSS {rss_before[p.pid] / 1024:6.1f} -> "
            f"{rss_after[p.pid] / 1024:6.1f} MiB (+{delta / 1024:6.1f}), {per_topic}, "
            f"CPU during set-up {cpu_after[p.pid] - cpu_before[p.pid]:6.1f} s"
        )
    if total_topics:
        print(
            f"all brokers: {total_topics:,} topics, +{total_delta / 1024:.1f} MiB RSS, "
            f"{total_delta / total_topics:.1f} KiB per topic"
        )
    for role in ("bookie", "etcd", "client"):
        members = [p for p in procs if p.role == role]
        cpu = sum(cpu_after[p.pid] - cpu_before[p.pid] for p in members)
        rss = "  ".join(
            f"{rss_before[p.pid] / 1024:.0f} -> {rss_after[p.pid] / 1024:.0f} MiB" for p in members
        )
        print(f"{role}: CPU during set-up {cpu:6.1f} s, RSS {rss}")
    print(f"after: {after_load}")
    if load.errors:
        print(f"{len(load.errors)} topics failed; first ones:")
        for error in load.errors[:5]:
            print(f"  {error}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    cpu = commands.add_parser("cpu", help="messages per broker CPU-second, 1 vs 3 brokers")
    cpu.add_argument("--seconds", type=float, default=20.0, help="measured window")
    cpu.add_argument("--warmup", type=float, default=5.0)
    cpu.add_argument("--idle", type=float, default=5.0, help="idle window before traffic")
    cpu.add_argument("--topics", type=int, default=24)
    cpu.add_argument("--bundles", type=int, default=12)
    cpu.add_argument("--size", type=int, default=100, help="message size in bytes")
    cpu.add_argument("--window", type=int, default=100, help="sends in flight per producer")
    cpu.add_argument("--batching", choices=("off", "on", "both"), default="both")
    topics = commands.add_parser("topics", help="broker memory per topic over 3 brokers")
    topics.add_argument("--topics", type=int, default=10_000)
    topics.add_argument("--bundles", type=int, default=48)
    topics.add_argument("--threads", type=int, default=16, help="client calls in flight")
    topics.add_argument("--clients", type=int, default=4, help="pulsar.Client objects")
    topics.add_argument("--close-producers", action="store_true")
    topics.add_argument("--settle", type=float, default=3.0, help="seconds before RSS readings")
    args = parser.parse_args()
    {"cpu": run_cpu, "topics": run_topics}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
