"""Rows per second through the Spark source and sink, with a local Spark (``local[2]``).

Starts a ``magnetar standalone`` on free ports in a temp dir (journal fsync on, its default;
retention unlimited, so closed ledgers stay), fills a partitioned topic with a backlog of
``--messages`` 100-byte messages from the official client (batching on), unloads its
partitions (their ledgers are closed, as a historical backlog's are), then times, each with
the same Spark session and on the same backlog:

- batch reads of the whole backlog, counted (every row goes through the source's reader and
  into Spark): through the broker with tuples (``arrow=false``, the source before issue 23),
  through the broker with Arrow batches (``readFromStorage=never``), and from storage
  (``readFromStorage=always``: closed ledgers read from the bookie through the ledger client,
  the standalone's metadata store opened read-only);
- a streaming read from ``earliest`` with ``Trigger.AvailableNow`` into the ``noop`` sink with
  the defaults plus ``metadata.url`` (storage path for the closed ledgers; rows counted from the
  query's progress);
- the sink: ``df.write.format("pulsar")`` of ``--messages`` generated 100-byte rows (one task
  per partition) into a second topic with as many partitions (batching on), with Row objects
  (``arrow=false``) and with Arrow batches (into a third topic); then each written topic is
  read back and counted (a check).

Each line gives the standalone's CPU during that step (its broker and its bookie are one
process) and the 1-minute load average at its end. With ``--cluster`` the same steps run
against etcd, one bookie and one broker in their own processes (``tests.support.cluster``;
journal fsync on, ledgers on the one bookie), and each line gives the broker's and the
bookie's CPU apart: what a storage read leaves to the broker. Every step after the backlog
is run ``--rounds`` times, the paths in turn (a machine shared with other work moves single
figures by 2x), and the medians and their ratios are printed at the end. A Spark session is started and warmed
before anything is timed (a small read on every path, its ledgers closed, and a small write
with each sink, two tasks each), so the figures include neither the JVM start nor the Python
workers' first imports.
The numbers are printed; nothing is asserted.

    python bench/spark_bench.py [--messages 1000000] [--partitions 4] [--rounds 3] [--cluster]
                                [--producer-batch 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pulsar
from pyspark.sql import SparkSession

from magnetar.spark import register

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.etcd import free_port  # noqa: E402

PAYLOAD_BYTES = 100


class Standalone:
    """``magnetar standalone`` in a child process on free ports, its log in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.port, self.http_port = free_port(), free_port()
        self.log_path = workdir / "standalone.log"
        self.metadata_url = f"local://{(workdir / 'data' / 'meta.db').resolve()}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "magnetar.cli", "--log-level", "WARNING", "standalone",
                    "--data-dir", str(workdir / "data"), "--broker-port", str(self.port),
                    "--http-port", str(self.http_port), "--bookie-port", str(free_port()),
                    "--bookie-http-port", str(free_port()), "--journal-sync",
                    "--default-retention-time-minutes", "-1", "--default-retention-size-mb", "-1",
                ],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"standalone exited at start:\n{self.log_path.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("standalone did not listen within 60 s") from None
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def admin(self, method: str, path: str, body: object = None) -> object:
        request = urllib.request.Request(
            f"{self.admin_url}/admin/v2/{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time of the standalone process (user + system)."""
        return {"standalone": process_cpu_seconds(self.process.pid)}

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def process_cpu_seconds(pid: int) -> float:
    """CPU time of a process (user + system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cluster:
    """etcd, one bookie and one broker, each its own process (``--cluster``)."""

    def __init__(self, workdir: Path) -> None:
        from tests.support.cluster import MagnetarCluster

        self.cluster = MagnetarCluster(
            workdir,
            bookies=1,
            brokers=1,
            broker_settings={
                "ensemble_size": 1,
                "write_quorum": 1,
                "ack_quorum": 1,
                "default_retention_time_minutes": -1,
                "default_retention_size_mb": -1,
            },
            bookie_settings={"journal_sync": True},
        )
        self.cluster.start()
        self.cluster.create_namespace("public", "default")
        broker = self.cluster.brokers[0]
        self.url = broker.url
        self.admin_url = f"http://127.0.0.1:{broker.http_port}"
        self.metadata_url = self.cluster.url

    def admin(self, method: str, path: str, body: object = None) -> object:
        return self.cluster.admin_json(method, f"/admin/v2/{path}", body)

    def cpu_seconds(self) -> dict[str, float]:
        broker, bookie = self.cluster.brokers[0], self.cluster.bookies[0]
        assert broker.pid is not None and bookie.process is not None
        return {
            "broker": process_cpu_seconds(broker.pid),
            "bookie": process_cpu_seconds(bookie.process.pid),
        }

    def close(self) -> None:
        self.cluster.close()


@contextmanager
def timed(what: str, rows: int, node: Standalone | Cluster) -> Iterator[dict[str, float]]:
    """Prints ``what``: rows, seconds, rows/s, the CPU of the node's processes, the load."""
    out: dict[str, float] = {}
    cpu, start = node.cpu_seconds(), time.monotonic()
    yield out
    seconds = time.monotonic() - start
    counted = int(out.get("rows", rows))
    used = "".join(
        f"   {name} CPU {spent - cpu[name]:5.1f} s" for name, spent in node.cpu_seconds().items()
    )
    out["rate"] = counted / seconds
    print(
        f"{what:<34} {counted:>10,} rows in {seconds:7.1f} s = {counted / seconds:>9,.0f} rows/s"
        f"{used}   load {os.getloadavg()[0]:.1f}",
        flush=True,
    )


def produce_backlog(
    standalone: Standalone | Cluster, topic: str, messages: int, batch: int = 1000
) -> None:
    quiet = logging.getLogger("pulsar-client")
    quiet.setLevel(logging.WARNING)
    client = pulsar.Client(standalone.url, operation_timeout_seconds=60, logger=quiet)
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=batch,
        batching_max_publish_delay_ms=5,
        max_pending_messages=10_000,
        block_if_queue_full=True,
    )
    failed: list[str] = []

    def done(result: pulsar.Result, _msg_id: pulsar.MessageId) -> None:
        if result != pulsar.Result.Ok:
            failed.append(str(result))

    for i in range(messages):
        producer.send_async(f"{i:012d}".encode().ljust(PAYLOAD_BYTES, b"."), done)
    producer.flush()
    producer.close()
    client.close()
    if failed:
        raise SystemExit(f"{len(failed)} sends failed while producing the backlog: {failed[:5]}")


def spark_session() -> SparkSession:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="times every step is run")
    parser.add_argument(
        "--producer-batch",
        type=int,
        default=1000,
        help="at most this many messages per entry of the backlog (smaller: more entries)",
    )
    parser.add_argument(
        "--cluster", action="store_true", help="etcd, a bookie and a broker as separate processes"
    )
    args = parser.parse_args()
    n, partitions = args.messages, args.partitions

    with tempfile.TemporaryDirectory(prefix="spark-bench-") as tmp:
        workdir = Path(tmp)
        standalone = Cluster(workdir) if args.cluster else Standalone(workdir)
        try:
            print(
                f"{'cluster' if args.cluster else 'standalone'}: "
                f"{n:,} messages of {PAYLOAD_BYTES} bytes, {partitions} partitions, Spark "
                f"local[2], {os.cpu_count()} CPUs, load average at start "
                f"{os.getloadavg()[0]:.1f}, producer batches of up to {args.producer_batch}",
                flush=True,
            )
            source = "bench-backlog"
            standalone.admin("PUT", f"persistent/public/default/{source}/partitions", partitions)
            with timed("produce backlog (official client)", n, standalone):
                produce_backlog(standalone, source, n, args.producer_batch)

            for p in range(partitions):
                standalone.admin("PUT", f"persistent/public/default/{source}-partition-{p}/unload")

            spark = spark_session()
            options = {"service.url": standalone.url, "admin.url": standalone.admin_url}
            storage = {"metadata.url": standalone.metadata_url}
            # Warm-up on a small topic, its ledgers closed so the storage path reads it too,
            # two partitions so that both Python workers run every path once: the JVM, the
            # workers and their imports (the ledger client's, grpc's) are not timed.
            standalone.admin("PUT", "persistent/public/default/bench-warm-up/partitions", 2)
            produce_backlog(standalone, "bench-warm-up", 1000)
            for p in range(2):
                standalone.admin(
                    "PUT", f"persistent/public/default/bench-warm-up-partition-{p}/unload"
                )
            for extra in ({"arrow": "false"}, {"readFromStorage": "never"}, storage):
                spark.read.format("pulsar").options(**options, **extra).option(
                    "topic", "bench-warm-up"
                ).load().count()

            for arrow in ("false", "true"):
                spark.range(0, 1000, 1, 2).selectExpr(
                    "CAST(CAST(id AS STRING) AS BINARY) AS value"
                ).write.format("pulsar").option("service.url", standalone.url).option(
                    "topic", "bench-warm-up"
                ).option("arrow", arrow).mode("append").save()

            reads = (
                ("batch read, broker, tuples", {"arrow": "false", "readFromStorage": "never"}),
                ("batch read, broker, Arrow", {"readFromStorage": "never"}),
                ("batch read, storage, Arrow", {**storage, "readFromStorage": "always"}),
            )
            value = f"rpad(format_string('%012d', id), {PAYLOAD_BYTES}, '.')"
            rows = spark.range(0, n, 1, partitions).selectExpr(f"CAST({value} AS BINARY) AS value")
            rates: dict[str, list[float]] = {}
            for round_ in range(args.rounds):
                print(f"-- round {round_ + 1} of {args.rounds}", flush=True)
                for what, extra in reads:
                    with timed(what, n, standalone) as out:
                        out["rows"] = (
                            spark.read.format("pulsar")
                            .options(**options, **extra)
                            .option("topic", source)
                            .load()
                            .count()
                        )
                    rates.setdefault(what, []).append(out["rate"])

                what = "streaming, AvailableNow, storage"
                with timed(what, n, standalone) as out:
                    query = (
                        spark.readStream.format("pulsar")
                        .options(**options, **storage)
                        .option("topic", source)
                        .option("startingOffsets", "earliest")
                        .load()
                        .writeStream.format("noop")
                        .option("checkpointLocation", str(workdir / f"checkpoint-{round_}"))
                        .trigger(availableNow=True)
                        .start()
                    )
                    query.awaitTermination()
                    out["rows"] = sum(p["numInputRows"] for p in query.recentProgress)
                rates.setdefault(what, []).append(out["rate"])

                for arrow in ("false", "true"):
                    kind = "Arrow" if arrow == "true" else "rows"
                    target = f"bench-written-{kind.lower()}-{round_}"
                    standalone.admin(
                        "PUT", f"persistent/public/default/{target}/partitions", partitions
                    )
                    writer = (
                        rows.write.format("pulsar")
                        .option("service.url", standalone.url)
                        .option("topic", f"persistent://public/default/{target}")
                        .option("arrow", arrow)
                        .mode("append")
                    )
                    what = f"sink, df.write, {kind}"
                    with timed(what, n, standalone) as out:
                        writer.save()
                    rates.setdefault(what, []).append(out["rate"])
                    written = (
                        spark.read.format("pulsar")
                        .options(**options)
                        .option("topic", target)
                        .load()
                        .count()
                    )
                    if written != n:
                        print(f"   check: {target} holds {written:,} messages, not {n:,}")

            print(f"-- median of {args.rounds} rounds", flush=True)
            medians = {what: statistics.median(found) for what, found in rates.items()}
            for what, rate in medians.items():
                print(f"{what:<34} {rate:>10,.0f} rows/s", flush=True)
            base_read = medians["batch read, broker, tuples"]
            base_sink = medians["sink, df.write, rows"]
            for what in ("batch read, broker, Arrow", "batch read, storage, Arrow"):
                print(f"{what:<34} {medians[what] / base_read:>9.1f}x the broker with tuples")
            print(
                f"{'sink, df.write, Arrow':<34} "
                f"{medians['sink, df.write, Arrow'] / base_sink:>9.1f}x the row sink"
            )
            spark.stop()
        finally:
            standalone.close()


if __name__ == "__main__":
    main()
