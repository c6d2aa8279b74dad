"""End-to-end throughput and publish latency: Magnetar against pulsar-lite, in one run.

For each broker in turn (never both at once, so they do not share the CPUs) this starts the
broker in its own process on free ports and a temp dir, then runs one producer process and one
consumer process on the official ``pulsar-client``: batching on (1 ms delay, at most 1,000
messages pending, as ``magnetar perf`` and pulsar-perf do), an exclusive subscription from the
earliest position, every message acknowledged on its own.

- throughput: the producer sends as fast as it can for ``--seconds``; the consumer receives
  until it has every acknowledged message. Consumed msg/s is messages over the time from the
  common start to the last message received, so a consumer that falls behind pays for its tail.
- latency: the same at a fixed ``--rate``; publish latency is from ``send_async`` to the
  broker's acknowledgement, end-to-end latency from the publish timestamp to the receive.

Every payload starts with its sequence number, so the consumer counts lost, duplicated and
reordered messages. Magnetar runs with the journal fsynced before every acknowledgement (the
default; ``--journal-sync`` is passed explicitly). pulsar-lite is started from the binary in
its wheel (``pip install pulsar-lite==0.2.0``); how durable it is gets printed in the header.

- cost (``--cost``): the broker's CPU per message, the workload of issue 24: 4 topics, 2
  producer processes (each sending to 2 of the topics), one consumer process on one shared
  subscription over the 4 topics, 256-byte messages, 60,000 messages, every message
  acknowledged on its own; unbatched (one message per entry) and batched (1 ms, <=1000
  pending). Broker CPU is user + system time of the broker's process tree from /proc over the
  run and through the work it leaves behind (``--settle`` seconds after the last message, less
  what the broker spends idle over as long, measured before the run: Magnetar's checkpoint
  flushes the run's entries to the entry log and index within 10 s), divided by the messages
  delivered; the end-to-end rate is messages over the time from the start to the last message
  received. The machine may be shared, so each round runs both
  brokers one after the other (alternating which goes first) and the figures to read are the
  ratios within a round; the load average is printed with each row.

    python bench/e2e_bench.py [--seconds 10] [--sizes 100,1024] [--rate 2000]
                              [--skip-magnetar] [--skip-lite]
    python bench/e2e_bench.py --cost [--rounds 3] [--messages 60000] [--size 256]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.etcd import free_port  # noqa: E402

T = TypeVar("T")

SEQUENCE_BYTES = 8
# After the producer is done, how long the consumer may take to receive the rest.
DRAIN_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0

# Established for pulsar-lite 0.2.0 from its source (storage/managed-ledger-rocksdb:
# entrylog.rs writes each batch with write_all + File::flush, a no-op for a std File;
# RocksDB is opened with use_fsync=false, manual_wal_flush=false and written without
# WriteOptions::sync) and checked with `strace -f -e fsync,fdatasync,sync_file_range`:
# fsyncs only while RocksDB opens, none while 20,000 messages were published. Its config
# (pulsar-lite.toml: addr, db_path, default_partitions, limits, metrics) has no sync setting.
LITE_DURABILITY_VERSION = "0.2.0"
LITE_DURABILITY = (
    "messages persisted to an append-only entry log + RocksDB index, but NOT fsynced: "
    "the publish is acknowledged once the bytes are written to the page cache (RocksDB WAL "
    "unsynced, entry log never fsynced); no setting turns fsync on. So acknowledged messages "
    "can survive a crash of the broker process, not an OS crash or a power loss."
)
MAGNETAR_DURABILITY = (
    "journal fdatasync'd (group commit) before every publish acknowledgement "
    "(standalone --journal-sync, the default): acknowledged messages survive power loss."
)


# --------------------------------------------------------------------------------------------
# Client roles: each runs in its own process (this script with --role), driven over its stdin.
# --------------------------------------------------------------------------------------------


def percentile_ms(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def _client(url: str) -> Any:
    import pulsar

    # The client's own console logger, not a Python one: with a Python logger the client
    # aborts now and then at interpreter exit ("terminate called without an active exception",
    # apache/pulsar-client-python#256).
    quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    return pulsar.Client(url, operation_timeout_seconds=30, logger=quiet)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_producer(args: argparse.Namespace) -> int:
    import pulsar

    client = _client(args.url)
    try:
        producer = client.create_producer(
            args.topic,
            batching_enabled=True,
            batching_max_publish_delay_ms=1,
            max_pending_messages=1000,
            block_if_queue_full=True,
            send_timeout_millis=60_000,
        )
        filler = os.urandom(args.size - SEQUENCE_BYTES)
        lock = threading.Lock()
        latencies: list[float] = []
        failed = 0

        def acked(result: Any, _msg_id: Any, sent_at: float) -> None:
            nonlocal failed
            now = time.monotonic()
            with lock:
                if result == pulsar.Result.Ok:
                    latencies.append(now - sent_at)
                else:
                    failed += 1

        _say("ready")
        sys.stdin.readline()  # "go"
        started = time.monotonic()
        deadline = started + args.seconds
        sent = 0
        while time.monotonic() < deadline:
            if args.rate > 0:
                delay = started + sent / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            sent_at = time.monotonic()
            payload = sent.to_bytes(SEQUENCE_BYTES, "big") + filler
            producer.send_async(payload, lambda r, m, t=sent_at: acked(r, m, t))
            sent += 1
        producer.flush()
        elapsed = time.monotonic() - started
        with lock:
            done = list(latencies)
            failures = failed
        _say(
            json.dumps(
                {
                    "sent": sent,
                    "acked": len(done),
                    "failed": failures,
                    "seconds": elapsed,
                    "msg_per_s": len(done) / elapsed,
                    "p50_ms": percentile_ms(done, 50),
                    "p99_ms": percentile_ms(done, 99),
                }
            )
        )
        producer.close()
    finally:
        client.close()
    return 0


def run_consumer(args: argparse.Namespace) -> int:
    import pulsar

    client = _client(args.url)
    try:
        consumer = client.subscribe(
            args.topic,
            "e2e-bench",
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        # Set by the stdin reader once the producer is done: how many messages to wait for,
        # and until when.
        target: list[tuple[int, float]] = []

        def read_target() -> None:
            line = sys.stdin.readline().split()  # "expect N"
            if line:
                target.append((int(line[1]), time.monotonic() + DRAIN_TIMEOUT_S))

        _say("ready")
        sys.stdin.readline()  # "go"
        threading.Thread(target=read_target, daemon=True).start()
        started = last_at = time.monotonic()
        hard_deadline = started + args.seconds + 120 + DRAIN_TIMEOUT_S
        seen = bytearray()
        unique = duplicates = reordered = 0
        highest = -1
        latencies: list[float] = []
        timed_out = False
        while True:
            if target and (unique >= target[0][0] or time.monotonic() > target[0][1]):
                timed_out = unique < target[0][0]
                break
            if time.monotonic() > hard_deadline:
                timed_out = True
                break
            try:
                message = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            last_at = time.monotonic()
            latencies.append(max(time.time() - message.publish_timestamp() / 1000, 0.0))
            sequence = int.from_bytes(message.data()[:SEQUENCE_BYTES], "big")
            consumer.acknowledge(message)
            if sequence >= len(seen):  # grow by at least doubling
                seen.extend(bytes(max(sequence + 1 - len(seen), len(seen))))
            if seen[sequence]:
                duplicates += 1
                continue
            seen[sequence] = 1
            unique += 1
            if sequence < highest:
                reordered += 1
            highest = max(highest, sequence)
        elapsed = last_at - started
        _say(
            json.dumps(
                {
                    "unique": unique,
                    "duplicates": duplicates,
                    "reordered": reordered,
                    "timed_out": timed_out,
                    "seconds": elapsed,
                    "msg_per_s": unique / elapsed if elapsed > 0 else 0.0,
                    "p50_ms": percentile_ms(latencies, 50),
                    "p99_ms": percentile_ms(latencies, 99),
                }
            )
        )
        consumer.close()
    finally:
        client.close()
    return 0


# pulsar-lite 0.2.0 leaves a few hundred batched messages of a shared subscription undelivered
# now and then; a shorter wait than the pair runs' keeps such a round from costing a minute.
COST_DRAIN_TIMEOUT_S = 15.0
#: Seconds the broker is watched with nothing to do before a cost run, for its idle CPU.
IDLE_SAMPLE_S = 3.0

# A cost-workload payload starts with (producer index << 40 | sequence), so one consumer over
# several topics and producers counts each message once.
PRODUCER_SHIFT = 40


def run_cost_producer(args: argparse.Namespace) -> int:
    """Send ``args.count`` messages round-robin over this process's topics, as fast as the
    client lets (at most 1,000 pending per producer), and report when all are acknowledged."""
    import pulsar

    client = _client(args.url)
    try:
        producers = [
            client.create_producer(
                topic,
                batching_enabled=args.batched,
                batching_max_publish_delay_ms=1,
                max_pending_messages=1000,
                block_if_queue_full=True,
                send_timeout_millis=60_000,
            )
            for topic in args.topic.split(",")
        ]
        filler = os.urandom(args.size - SEQUENCE_BYTES)
        base = args.index << PRODUCER_SHIFT
        results: dict[Any, int] = {}
        lock = threading.Lock()

        def acked(result: Any, _msg_id: Any) -> None:
            with lock:
                results[result] = results.get(result, 0) + 1

        _say("ready")
        sys.stdin.readline()  # "go"
        started = time.monotonic()
        count = len(producers)
        for sequence in range(args.count):
            payload = (base | sequence).to_bytes(SEQUENCE_BYTES, "big") + filler
            producers[sequence % count].send_async(payload, acked)
        for producer in producers:
            producer.flush()
        elapsed = time.monotonic() - started
        for producer in producers:
            producer.close()  # every send callback has run once it returns
        with lock:
            ok = results.pop(pulsar.Result.Ok, 0)
            failed = sum(results.values())
        _say(json.dumps({"acked": ok, "failed": failed, "seconds": elapsed}))
    finally:
        client.close()
    return 0


def run_cost_consumer(args: argparse.Namespace) -> int:
    """One shared-subscription consumer over every topic; receive until ``args.count`` unique
    messages came (or the drain timeout after the producers are done), each acknowledged."""
    import pulsar

    client = _client(args.url)
    try:
        consumer = client.subscribe(
            args.topic.split(","),
            "cost-bench",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        deadline: list[float] = []

        def read_deadline() -> None:
            if sys.stdin.readline():  # "producers done"
                deadline.append(time.monotonic() + COST_DRAIN_TIMEOUT_S)

        _say("ready")
        sys.stdin.readline()  # "go"
        threading.Thread(target=read_deadline, daemon=True).start()
        started = last_at = time.monotonic()
        seen: set[int] = set()
        duplicates = 0
        while len(seen) < args.count:
            if deadline and time.monotonic() > deadline[0]:
                break
            try:
                message = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            last_at = time.monotonic()
            consumer.acknowledge(message)
            key = int.from_bytes(message.data()[:SEQUENCE_BYTES], "big")
            if key in seen:
                duplicates += 1
            else:
                seen.add(key)
        elapsed = last_at - started
        _say(json.dumps({"unique": len(seen), "duplicates": duplicates, "seconds": elapsed}))
        consumer.close()
    finally:
        client.close()
    return 0


# --------------------------------------------------------------------------------------------
# Brokers and processes
# --------------------------------------------------------------------------------------------


class Processes:
    """Every child this run started, so that any exit (error, Ctrl-C, SIGTERM) ends them."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self, command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        # A session of its own: Ctrl-C reaches only this script, which then stops the
        # children in order instead of every process dying at once.
        process = subprocess.Popen(command, start_new_session=True, **kwargs)
        self.children.append(process)
        return process

    def stop(self, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if process in self.children:
            self.children.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.children)):
            self.stop(process, timeout=10.0)


@dataclass(slots=True)
class Broker:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def wait_listening(broker: Broker, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            raise RuntimeError(f"{broker.name} exited at start:\n{broker.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{broker.name} did not listen on {port}:\n{broker.log_tail()}")


def start_magnetar(
    processes: Processes, workdir: Path, name: str = "Magnetar", source: Path | None = None
) -> Broker:
    """A standalone of the installed magnetar, or of the source tree ``source`` (e.g. a git
    worktree of an earlier commit), to compare two versions in one run."""
    port = free_port()
    log_path = workdir / "magnetar.log"
    env = None
    if source is not None:
        env = dict(os.environ, PYTHONPATH=str(_package_of(source, workdir)))
    with open(log_path, "ab") as log:
        process = processes.start(
            [
                sys.executable, "-m", "magnetar.cli", "--log-level", "WARNING", "standalone",
                "--data-dir", str(workdir / "data"), "--broker-port", str(port),
                "--http-port", str(free_port()), "--bookie-port", str(free_port()),
                "--bookie-http-port", str(free_port()), "--journal-sync",
            ],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    broker = Broker(name, f"pulsar://127.0.0.1:{port}", process, log_path)
    wait_listening(broker, port)
    return broker


def _package_of(source: Path, workdir: Path) -> Path:
    """A directory where ``import magnetar`` finds ``source``'s code, laid out as pyproject's
    package-dir maps it (services -> magnetar, common -> magnetar.common, spark ->
    magnetar.spark); put first on PYTHONPATH it comes before the editable install."""
    root = workdir / "baseline-package"
    package = root / "magnetar"
    if not package.exists():
        package.mkdir(parents=True)
        for item in (source / "services").iterdir():
            (package / item.name).symlink_to(item.resolve())
        (package / "common").symlink_to((source / "common").resolve())
        (package / "spark").symlink_to((source / "spark").resolve())
    return root


def pulsar_lite_binary() -> str:
    try:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary
    except ImportError:
        raise SystemExit(
            "pulsar-lite is not installed: pip install pulsar-lite==0.2.0, or pass --skip-lite"
        ) from None
    return find_pulsar_lite_binary()


def start_pulsar_lite(processes: Processes, workdir: Path) -> Broker:
    port = free_port()
    # An explicit config (the binary reads ./pulsar-lite.toml by default): non-partitioned
    # topics, as Magnetar auto-creates them.
    config = workdir / "pulsar-lite.toml"
    config.write_text("default_partitions = 0\n")
    log_path = workdir / "pulsar-lite.log"
    with open(log_path, "ab") as log:
        process = processes.start(
            [
                pulsar_lite_binary(), "--config", str(config), "--addr", f"127.0.0.1:{port}",
                "--db-path", str(workdir / "db"), "--log-level", "warn",
            ],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        )  # fmt: skip
    broker = Broker("pulsar-lite", f"pulsar://127.0.0.1:{port}", process, log_path)
    wait_listening(broker, port)
    return broker


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class PairResult:
    """One producer process and one consumer process on one topic."""

    size: int
    rate: float
    produced: dict[str, Any]
    consumed: dict[str, Any]
    # Share of one CPU each process used during the run: whether a figure is the broker's limit
    # or a client's (each client is one Python process, so about 100% means it is the limit).
    cpu: dict[str, float]

    @property
    def lost(self) -> int:
        return max(self.produced["acked"] - self.consumed["unique"], 0)

    @property
    def problems(self) -> str:
        found = []
        if self.produced["failed"]:
            found.append(f"{self.produced['failed']} sends failed")
        if self.lost:
            found.append(f"{self.lost} acked messages not received")
        if self.consumed["duplicates"]:
            found.append(f"{self.consumed['duplicates']} duplicates")
        if self.consumed["reordered"]:
            found.append(f"{self.consumed['reordered']} out of order")
        if self.consumed["timed_out"]:
            found.append(f"consumer gave up after {DRAIN_TIMEOUT_S:.0f} s")
        return ", ".join(found) or "ok"


def read_line(process: subprocess.Popen[bytes], timeout: float, what: str) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            line = process.stdout.readline().decode().strip()
            if line:
                return line
            raise RuntimeError(f"{what} exited (code {process.wait(10)}) without answering")
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited (code {process.returncode}) without answering")
    raise RuntimeError(f"{what} did not answer within {timeout:.0f} s")


def _cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process so far (also readable while it is a zombie);
    NaN when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, IndexError):
        return float("nan"), float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (also readable while it is a zombie)."""
    return sum(_cpu_times(pid))


def tell(process: subprocess.Popen[bytes], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line.encode() + b"\n")
    process.stdin.flush()


def start_clients(
    processes: Processes, workdir: Path, commands: dict[str, list[str]]
) -> dict[str, subprocess.Popen[bytes]]:
    """One client process per role, talking over stdin/stdout, its stderr in ``ROLE.log``."""
    clients = {}
    for role, command in commands.items():
        with open(workdir / f"{role}.log", "ab") as log:
            clients[role] = processes.start(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0
            )
    return clients


def wait_ready(clients: dict[str, subprocess.Popen[bytes]], broker: Broker) -> None:
    for role, process in clients.items():
        if read_line(process, READY_TIMEOUT_S, f"{broker.name} {role}") != "ready":
            raise RuntimeError(f"{broker.name} {role} did not start")


def warn_exit_codes(clients: dict[str, subprocess.Popen[bytes]], broker: Broker) -> None:
    for role, process in clients.items():
        code = process.wait(30)
        if code != 0:
            print(f"  warning: {broker.name} {role} exited with code {code}", file=sys.stderr)


def run_pair(
    processes: Processes, broker: Broker, workdir: Path, size: int, rate: float, seconds: float
) -> PairResult:
    topic = f"persistent://public/default/e2e-{size}-{uuid.uuid4().hex[:8]}"
    common = [
        sys.executable, __file__, "--url", broker.url, "--topic", topic,
        "--size", str(size), "--rate", str(rate), "--seconds", str(seconds),
    ]  # fmt: skip
    commands = {role: [*common, "--role", role] for role in ("consumer", "producer")}
    clients = start_clients(processes, workdir, commands)
    try:
        wait_ready(clients, broker)
        pids = {"broker": broker.process.pid} | {r: p.pid for r, p in clients.items()}
        cpu_before = {role: cpu_seconds(pid) for role, pid in pids.items()}
        started = time.monotonic()
        for process in clients.values():
            tell(process, "go")
        produced = json.loads(
            read_line(clients["producer"], seconds + 120, f"{broker.name} producer")
        )
        cpu_after = {"producer": (cpu_seconds(pids["producer"]), time.monotonic())}
        tell(clients["consumer"], f"expect {produced['acked']}")
        consumed = json.loads(
            read_line(clients["consumer"], DRAIN_TIMEOUT_S + 30, f"{broker.name} consumer")
        )
        for role in ("broker", "consumer"):
            cpu_after[role] = (cpu_seconds(pids[role]), time.monotonic())
        cpu = {
            role: (used - cpu_before[role]) / (at - started)
            for role, (used, at) in cpu_after.items()
        }
        warn_exit_codes(clients, broker)
    finally:
        for process in clients.values():
            processes.stop(process, timeout=5.0)
    return PairResult(size, rate, produced, consumed, cpu)


def on_a_new_broker(
    processes: Processes,
    name: str,
    start: Callable[[Processes, Path], Broker],
    brokerdir: Path,
    run: Callable[[Processes, Broker, Path, argparse.Namespace], T],
    args: argparse.Namespace,
) -> T:
    """``run`` against a broker started in ``brokerdir`` for it, stopped after (its log's tail
    printed if ``run`` fails)."""
    brokerdir.mkdir()
    broker = start(processes, brokerdir)
    try:
        return run(processes, broker, brokerdir, args)
    except Exception:
        print(f"{name} log tail:\n{broker.log_tail()}", file=sys.stderr)
        raise
    finally:
        processes.stop(broker.process)


def measure(
    processes: Processes, broker: Broker, workdir: Path, args: argparse.Namespace
) -> dict[tuple[str, int], PairResult]:
    results = {}
    # Warm-up, not reported: first connections, topic creation, caches.
    run_pair(processes, broker, workdir, args.sizes[0], 0, min(args.seconds, 2.0))
    for size in args.sizes:
        for kind, rate in (("throughput", 0.0), ("latency", args.rate)):
            print(f"  {broker.name}: {kind}, {size} B ...", file=sys.stderr, flush=True)
            result = run_pair(processes, broker, workdir, size, rate, args.seconds)
            results[(kind, size)] = result
            if result.problems != "ok":
                print(f"  {broker.name} {kind} {size} B: {result.problems}", file=sys.stderr)
    return results


# --------------------------------------------------------------------------------------------
# The cost workload (--cost)
# --------------------------------------------------------------------------------------------

COST_TOPICS = 4
#: The name of the --baseline broker in the tables.
BASELINE = "baseline"
COST_PRODUCERS = 2


def process_tree_cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process and its live descendants, read in one walk."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, IndexError, ValueError, ProcessLookupError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    user, system, pending = 0.0, 0.0, [pid]
    while pending:
        current = pending.pop()
        used_user, used_system = _cpu_times(current)
        if used_user == used_user:  # not NaN: the process may have ended meanwhile
            user += used_user
            system += used_system
        pending.extend(children.get(current, []))
    return user, system


@dataclass(slots=True, frozen=True)
class CostResult:
    broker: str
    batched: bool
    load: float
    acked: int
    failed: int
    unique: int
    duplicates: int
    seconds: float
    broker_cpu: float  # during the run and after it (settling), idle time taken off
    broker_sys: float  # of broker_cpu, in the kernel
    broker_after: float  # of broker_cpu, after the last message (the run's deferred work)
    client_cpu: float

    @property
    def rate(self) -> float:
        return self.unique / self.seconds if self.seconds > 0 else 0.0

    @property
    def us_per_message(self) -> float:
        return self.broker_cpu / self.unique * 1e6 if self.unique else float("nan")

    @property
    def problems(self) -> str:
        found = []
        if self.failed:
            found.append(f"{self.failed} sends failed")
        if self.acked > self.unique:
            found.append(f"{self.acked - self.unique} acked messages not received")
        if self.duplicates:
            found.append(f"{self.duplicates} duplicates")
        return ", ".join(found) or "ok"


def run_cost(
    processes: Processes,
    broker: Broker,
    workdir: Path,
    messages: int,
    size: int,
    batched: bool,
    profile: Path | None = None,
    settle: float = 0.0,
) -> CostResult:
    run = uuid.uuid4().hex[:8]
    topics = [f"persistent://public/default/cost-{run}-{n}" for n in range(COST_TOPICS)]
    common = [sys.executable, __file__, "--url", broker.url, "--size", str(size)]
    if batched:
        common.append("--batched")
    commands = {
        "consumer": [*common, "--role", "cost-consumer", "--topic", ",".join(topics),
                     "--count", str(messages)],
    }  # fmt: skip
    share = messages // COST_PRODUCERS
    for index in range(COST_PRODUCERS):
        mine = topics[index::COST_PRODUCERS]
        count = share if index else messages - share * (COST_PRODUCERS - 1)
        commands[f"producer{index}"] = [
            *common, "--role", "cost-producer", "--topic", ",".join(mine),
            "--count", str(count), "--index", str(index),
        ]  # fmt: skip
    clients = start_clients(processes, workdir, commands)
    try:
        wait_ready(clients, broker)
        idle_rate = 0.0
        if settle > 0:  # what the broker spends with nothing to do, to take off the settling
            before = sum(process_tree_cpu_times(broker.process.pid))
            time.sleep(IDLE_SAMPLE_S)
            idle_rate = (sum(process_tree_cpu_times(broker.process.pid)) - before) / IDLE_SAMPLE_S
        load = os.getloadavg()[0]
        client_before = sum(cpu_seconds(p.pid) for p in clients.values())
        spy = None
        if profile is not None:
            spy = processes.start(
                ["py-spy", "record", "--pid", str(broker.process.pid), "--format", "raw",
                 "--rate", "200", "--gil", "--nolineno", "--output", str(profile)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)  # attached before the run starts
        broker_user_before, broker_sys_before = process_tree_cpu_times(broker.process.pid)
        for process in clients.values():
            tell(process, "go")
        produced = [
            json.loads(read_line(p, 300, f"{broker.name} {role}"))
            for role, p in clients.items()
            if role != "consumer"
        ]
        try:
            tell(clients["consumer"], "producers done")
        except BrokenPipeError:
            pass  # it already has every message and is gone
        consumed = json.loads(
            read_line(clients["consumer"], COST_DRAIN_TIMEOUT_S + 30, f"{broker.name} consumer")
        )
        print(
            "DIAG",
            broker.name,
            "producers s",
            [round(p["seconds"], 2) for p in produced],
            "consumer s",
            round(consumed["seconds"], 2),
            file=sys.stderr,
        )
        broker_user, broker_sys = process_tree_cpu_times(broker.process.pid)
        broker_sys -= broker_sys_before
        broker_cpu = broker_user - broker_user_before + broker_sys
        broker_after = 0.0
        if settle > 0:  # the run's deferred work (Magnetar: the checkpoint of its entries)
            time.sleep(settle)
            settled_user, settled_sys = process_tree_cpu_times(broker.process.pid)
            after = settled_user + settled_sys - broker_user - broker_sys - broker_sys_before
            broker_after = max(after - idle_rate * settle, 0.0)
            broker_cpu += broker_after
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(30)
            processes.stop(spy)
        client_cpu = sum(cpu_seconds(p.pid) for p in clients.values()) - client_before
        warn_exit_codes(clients, broker)
    finally:
        for process in clients.values():
            processes.stop(process, timeout=5.0)
    return CostResult(
        broker=broker.name,
        batched=batched,
        load=load,
        acked=sum(p["acked"] for p in produced),
        failed=sum(p["failed"] for p in produced),
        unique=consumed["unique"],
        duplicates=consumed["duplicates"],
        seconds=consumed["seconds"],
        broker_cpu=broker_cpu,
        broker_after=broker_after,
        broker_sys=broker_sys,
        client_cpu=client_cpu,
    )


def measure_cost(
    processes: Processes, broker: Broker, workdir: Path, args: argparse.Namespace
) -> list[CostResult]:
    # Warm-up, not reported: first connections, topic creation, caches.
    run_cost(processes, broker, workdir, 2_000, args.size, batched=False)
    results = []
    for label in args.modes:
        batched = label == "batched"
        print(f"  {broker.name}: {label} ...", file=sys.stderr, flush=True)
        profile = None
        if args.profile and broker.name == "Magnetar" and not batched:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            profile = Path(args.profile) / f"magnetar-unbatched-{time.time_ns()}.txt"
        result = run_cost(
            processes, broker, workdir, args.messages, args.size, batched, profile, args.settle
        )
        if profile is not None:
            print_profile(profile)
        if result.problems != "ok":
            print(f"  {broker.name} {label}: {result.problems}", file=sys.stderr)
        results.append(result)
    return results


def _frame_label(frame: str) -> str:
    """``function (path)`` as py-spy writes it -> ``function file.py``."""
    name, _, where = frame.partition(" (")
    return f"{name} {where.rstrip(')').rsplit('/', 1)[-1]}"


def print_profile(path: Path, top: int = 25) -> None:
    """The functions holding most samples of a py-spy raw profile (collapsed stacks): own
    samples (the frame on top) and total (anywhere on the stack), in percent of all samples."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        print(f"  no profile written to {path} (is py-spy installed?)", file=sys.stderr)
        return
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_label(f) for f in stack.split(";")]
        samples += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + count
    if not samples:
        return
    print(f"  profile {path} ({samples} samples), by own samples:", file=sys.stderr)
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(
            f"    {count / samples * 100:5.1f}% own {total[frame] / samples * 100:5.1f}% total  {frame}",
            file=sys.stderr,
        )


def print_cost(args: argparse.Namespace, rounds: list[dict[str, list[CostResult]]]) -> None:
    client = importlib.metadata.version("pulsar-client")
    try:
        lite = importlib.metadata.version("pulsar-lite")
    except importlib.metadata.PackageNotFoundError:
        lite = "not installed"
    print(
        f"Cost per message: {COST_TOPICS} topics, {COST_PRODUCERS} producer processes, 1 consumer "
        f"process (one shared subscription over the topics), {args.messages:,} x {args.size} B, "
        f"individual acks; official pulsar-client {client}, pulsar-lite {lite}; "
        f"{os.cpu_count()} CPUs; {len(rounds)} round(s), every broker in each"
    )
    print(f"  Magnetar durability: {MAGNETAR_DURABILITY}")
    print(f"  pulsar-lite durability: {LITE_DURABILITY}")
    print(
        f"\n{'round':<6}{'broker':<13}{'mode':<11}{'load':>6}{'e2e msg/s':>11}"
        f"{'broker us/msg':>15}{'broker CPU':>12}{'after run':>11}{'of it sys':>11}"
        f"{'clients CPU':>13}  check"
    )
    for number, by_broker in enumerate(rounds, 1):
        for name, results in by_broker.items():
            for r in results:
                mode = "batched" if r.batched else "unbatched"
                print(
                    f"{number:<6}{name:<13}{mode:<11}{r.load:>6.2f}{r.rate:>11,.0f}"
                    f"{r.us_per_message:>15.1f}{r.broker_cpu:>10.2f} s{r.broker_after:>9.2f} s"
                    f"{r.broker_sys:>9.2f} s"
                    f"{r.client_cpu:>11.2f} s  "
                    f"{r.acked:,} acked, {r.unique:,} received: {r.problems}"
                )
    for other in ("pulsar-lite", BASELINE):
        if not all("Magnetar" in r and other in r for r in rounds):
            continue
        print(f"\nMagnetar / {other}, per round (median)")
        for index, mode in enumerate(args.modes):
            rate = [r["Magnetar"][index].rate / r[other][index].rate for r in rounds]
            cost = [
                r["Magnetar"][index].us_per_message / r[other][index].us_per_message for r in rounds
            ]
            print(
                f"  {mode:<10} e2e rate {' '.join(f'{x:.2f}x' for x in rate)} "
                f"({statistics.median(rate):.2f}x);  broker CPU/msg "
                f"{' '.join(f'{x:.2f}x' for x in cost)} ({statistics.median(cost):.2f}x)"
            )


def main_cost(args: argparse.Namespace) -> int:
    if not args.skip_lite:
        pulsar_lite_binary()  # fail before Magnetar has run, not after
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    processes = Processes()
    workdir = Path(tempfile.mkdtemp(prefix="cost-bench-", dir=args.dir))
    starters: list[tuple[str, Callable[[Processes, Path], Broker]]] = [
        ("Magnetar", start_magnetar),
        ("pulsar-lite", start_pulsar_lite),
    ]
    skipped = {"Magnetar": args.skip_magnetar, "pulsar-lite": args.skip_lite, BASELINE: False}
    if args.baseline:
        source = Path(args.baseline).resolve()
        starters.insert(1, (BASELINE, lambda p, d: start_magnetar(p, d, BASELINE, source)))
    rounds: list[dict[str, list[CostResult]]] = []
    try:
        for number in range(args.rounds):
            by_broker: dict[str, list[CostResult]] = {}
            rounds.append(by_broker)
            for name, start in starters if number % 2 == 0 else starters[::-1]:
                if skipped[name]:
                    continue
                by_broker[name] = on_a_new_broker(
                    processes, name, start, workdir / f"{name}-{number}", measure_cost, args
                )
            # Magnetar's rows first in every round, whichever ran first.
            rounds[-1] = {n: by_broker[n] for n, _ in starters if n in by_broker}
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    print_cost(args, rounds)
    return 0


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def print_broker_table(name: str, results: dict[tuple[str, int], PairResult]) -> None:
    print(f"\n{name} (CPU: share of one core; a client near 100% is the limit, not the broker)")
    print(
        f"{'run':<16}{'size':>7}{'produced':>11}{'consumed':>11}{'cons MB/s':>10}"
        f"{'pub p50':>9}{'pub p99':>9}{'e2e p50':>9}{'e2e p99':>9}{'CPU % broker':>14}  check"
    )
    print(
        f"{'':<16}{'':>7}{'msg/s':>11}{'msg/s':>11}{'':>10}{'ms':>9}{'ms':>9}{'ms':>9}{'ms':>9}"
        f"{'/prod/cons':>14}"
    )
    for (kind, size), r in results.items():
        label = "throughput" if kind == "throughput" else f"latency @{r.rate:,.0f}/s"
        p, c = r.produced, r.consumed
        cpu = "/".join(f"{r.cpu[role] * 100:.0f}" for role in ("broker", "producer", "consumer"))
        print(
            f"{label:<16}{size:>5} B{p['msg_per_s']:>11,.0f}{c['msg_per_s']:>11,.0f}"
            f"{c['msg_per_s'] * size / 1e6:>10.2f}{p['p50_ms']:>9.2f}{p['p99_ms']:>9.2f}"
            f"{c['p50_ms']:>9.1f}{c['p99_ms']:>9.1f}{cpu:>14}  "
            f"{p['acked']:,} acked, {c['unique']:,} received: {r.problems}"
        )


def print_comparison(
    magnetar: dict[tuple[str, int], PairResult], lite: dict[tuple[str, int], PairResult]
) -> None:
    print("\nMagnetar / pulsar-lite")
    print(f"{'figure':<40}{'Magnetar':>12}{'pulsar-lite':>13}{'ratio':>9}")
    rows: list[tuple[str, float, float, str]] = []
    for (kind, size), m in magnetar.items():
        lr = lite[(kind, size)]
        if kind == "throughput":
            rows.append(
                (
                    f"consumed msg/s, {size} B",
                    m.consumed["msg_per_s"],
                    lr.consumed["msg_per_s"],
                    ",.0f",
                )
            )
        else:
            at = f"@{m.rate:,.0f}/s, {size} B"
            rows.append(
                (f"publish p50 ms {at}", m.produced["p50_ms"], lr.produced["p50_ms"], ".2f")
            )
            rows.append(
                (f"publish p99 ms {at}", m.produced["p99_ms"], lr.produced["p99_ms"], ".2f")
            )
            rows.append(
                (f"end-to-end p50 ms {at}", m.consumed["p50_ms"], lr.consumed["p50_ms"], ".1f")
            )
            rows.append(
                (f"end-to-end p99 ms {at}", m.consumed["p99_ms"], lr.consumed["p99_ms"], ".1f")
            )
    for label, mine, theirs, fmt in rows:
        ratio = f"{mine / theirs:.2f}x" if theirs else "-"
        print(f"{label:<40}{format(mine, fmt):>12}{format(theirs, fmt):>13}{ratio:>9}")
    for name, results in (("Magnetar", magnetar), ("pulsar-lite", lite)):
        for (kind, size), r in results.items():
            if r.problems != "ok":
                print(f"  note: {name} {kind} {size} B: {r.problems} (msg/s count each once)")


def print_header(args: argparse.Namespace) -> None:
    client = importlib.metadata.version("pulsar-client")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"End-to-end: 1 producer + 1 consumer process, official pulsar-client {client}, batching "
        f"on (1 ms, <=1000 pending), exclusive subscription, individual acks; {args.seconds:g} s "
        f"per run; {os.cpu_count()} CPUs, load average {load} at start"
    )
    if not args.skip_magnetar:
        print(f"  Magnetar durability: {MAGNETAR_DURABILITY}")
    if not args.skip_lite:
        try:
            version = importlib.metadata.version("pulsar-lite")
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        note = LITE_DURABILITY
        if version != LITE_DURABILITY_VERSION:
            note += f" (established for {LITE_DURABILITY_VERSION}; recheck for this version)"
        print(f"  pulsar-lite {version} durability: {note}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="per run [default: 10]")
    parser.add_argument(
        "--sizes", default="100,1024", help="message sizes in bytes [default: 100,1024]"
    )
    parser.add_argument(
        "--rate", type=float, default=2000, help="messages/s of the latency runs [default: 2000]"
    )
    parser.add_argument("--skip-magnetar", action="store_true", help="do not run Magnetar")
    parser.add_argument("--skip-lite", action="store_true", help="do not run pulsar-lite")
    parser.add_argument("--dir", help="scratch directory [default: a temp dir]")
    parser.add_argument(
        "--cost", action="store_true", help="run the cost workload (broker CPU per message)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="--cost rounds [default: 3]")
    parser.add_argument(
        "--settle",
        type=float,
        default=12.0,
        help="--cost: seconds after a run whose broker CPU (less idle) is the run's too: the "
        "work it left behind, e.g. Magnetar's checkpoint every 10 s; 0: none [default: 12]",
    )
    parser.add_argument(
        "--baseline",
        help="--cost: also run a Magnetar from this source tree (e.g. a git worktree of an "
        "earlier commit) in every round, and print Magnetar / baseline",
    )
    parser.add_argument(
        "--modes",
        default="unbatched,batched",
        help="--cost workloads, in order [default: unbatched,batched]",
    )
    parser.add_argument(
        "--profile",
        help="--cost: record Magnetar's unbatched runs with py-spy into this directory and "
        "print the top functions",
    )
    parser.add_argument(
        "--messages", type=int, default=60_000, help="--cost messages per run [default: 60000]"
    )
    parser.add_argument(
        "--size", type=int, default=256, help="--cost message size in bytes [default: 256]"
    )
    # A client process (this script started by itself).
    parser.add_argument(
        "--role",
        choices=["producer", "consumer", "cost-producer", "cost-consumer"],
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--batched", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is None:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        args.modes = args.modes.split(",")
        if not args.modes or set(args.modes) - {"unbatched", "batched"}:
            parser.error("--modes: unbatched, batched or both")
        if min(args.sizes) < SEQUENCE_BYTES or args.size < SEQUENCE_BYTES:
            parser.error(f"--sizes: each message carries a {SEQUENCE_BYTES}-byte sequence number")
        if args.skip_magnetar and args.skip_lite:
            parser.error("nothing to run")
    return args


def main() -> int:
    args = parse_args()
    if args.role == "producer":
        return run_producer(args)
    if args.role == "consumer":
        return run_consumer(args)
    if args.role == "cost-producer":
        return run_cost_producer(args)
    if args.role == "cost-consumer":
        return run_cost_consumer(args)
    if args.cost:
        return main_cost(args)

    if not args.skip_lite:
        pulsar_lite_binary()  # fail before Magnetar has run, not after
    # SIGTERM unwinds like Ctrl-C, through the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    processes = Processes()
    workdir = Path(tempfile.mkdtemp(prefix="e2e-bench-", dir=args.dir))
    results: dict[str, dict[tuple[str, int], PairResult]] = {}
    starters = [("Magnetar", start_magnetar), ("pulsar-lite", start_pulsar_lite)]
    skipped = {"Magnetar": args.skip_magnetar, "pulsar-lite": args.skip_lite}
    try:
        for name, start in starters:
            if skipped[name]:
                continue
            results[name] = on_a_new_broker(processes, name, start, workdir / name, measure, args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)

    print_header(args)
    for name, table in results.items():
        print_broker_table(name, table)
    if len(results) == 2:
        print_comparison(results["Magnetar"], results["pulsar-lite"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
