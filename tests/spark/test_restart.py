"""Exactly once on the read side across SIGKILL (issue 12), with the storage path on (issue 23).

A streaming query reads a 4-partition topic from ``earliest`` into parquet files with a
checkpoint, in its own process, while the official client keeps producing. The query's process
group (Python driver and its JVM) is SIGKILLed after a micro-batch, restarted from the
checkpoint in a new process, and killed again after its next micro-batch. (The new process
starts with the first and waits, Spark up, for its cue before it starts the query: the restart
does not wait out a JVM start.) Once production has stopped the query is restarted a second
time, in the test's own Spark (same checkpoint, same query, ``Trigger.AvailableNow``: one JVM
start fewer): the parquet sink then holds every acknowledged message exactly once.

The standalone rolls its ledgers every 20 entries and keeps them (retention unlimited), and the
query is given ``metadata.url``: the closed ledgers a restarted query catches up on are read
from the bookie, the open ledger's tail through the broker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pulsar
import pytest
from pyspark.sql import SparkSession

from magnetar.spark.options import SourceOptions
from magnetar.spark.source import PulsarBatchReader
from tests.spark.helpers import create_partitioned, source_options
from tests.spark.stream_job import stream
from tests.support.raw_client import assert_log_clean, module_standalone
from tests.support.standalone import StandaloneProcess, client

TOPIC = "spark-restart"
ROOT = Path(__file__).resolve().parents[2]
PAUSE_S = 0.25


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(
        tmp_path_factory.mktemp("spark-restart") / "standalone",
        extra=[
            "--max-entries-per-ledger", "20",
            "--default-retention-time-minutes", "-1",
            "--default-retention-size-mb", "-1",
        ],
    )  # fmt: skip


def metadata_url(node: StandaloneProcess) -> str:
    return f"local://{(node.data_dir / 'meta.db').resolve()}"


class Producer(threading.Thread):
    """Sends numbered messages in groups of 10 every ``PAUSE_S`` until told to stop (so that
    messages arrive before, between and after the kills); keeps the numbers the broker
    acknowledged."""

    def __init__(self, node: StandaloneProcess) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.stop = threading.Event()
        self.acked: list[int] = []
        self.failed: list[str] = []

    def run(self) -> None:
        with closing(client(self.node)) as c:
            producer = c.create_producer(TOPIC, batching_enabled=False, block_if_queue_full=True)
            lock = threading.Lock()

            def done_for(i: int) -> Callable[[pulsar.Result, pulsar.MessageId], None]:
                def done(result: pulsar.Result, _msg_id: pulsar.MessageId) -> None:
                    with lock:
                        (
                            self.acked.append(i)
                            if result == pulsar.Result.Ok
                            else self.failed.append(str(result))
                        )

                return done

            i = 0
            while not self.stop.is_set():
                for _ in range(10):
                    producer.send_async(f"r-{i:06d}".encode(), done_for(i))
                    i += 1
                producer.flush()
                self.stop.wait(PAUSE_S)
            producer.flush()
            producer.close()


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    if not commits.exists():
        return 0
    return len([f for f in os.listdir(commits) if f.isdigit()])


def start_job(
    node: StandaloneProcess, sink: Path, checkpoint: Path, log: Path, *, on_cue: bool = False
) -> subprocess.Popen[bytes]:
    """The query's process; ``on_cue``: it starts the query only once ``cue`` is called."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "tests.spark.stream_job", node.url, node.admin_url, TOPIC,
            str(sink), str(checkpoint), *(["--on-cue"] if on_cue else []),
            "--metadata-url", metadata_url(node),
        ],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def cue(job: subprocess.Popen[bytes]) -> None:
    """Let a job started ``on_cue`` start its query (at once if it is ready, else when it is)."""
    assert job.stdin is not None
    job.stdin.write(b"go\n")
    job.stdin.close()


def wait_for_batches(job: subprocess.Popen[bytes], checkpoint: Path, count: int, log: Path) -> None:
    deadline = time.monotonic() + 120
    while committed_batches(checkpoint) < count:
        assert job.poll() is None, f"the query exited:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {count} batches:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def kill(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL the query's whole process group: the Python driver and its JVM."""
    with contextlib.suppress(ProcessLookupError):  # killed before
        os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)


@pytest.mark.timeout(600)  # two Spark starts in subprocesses; slow when the machine is shared
def test_killed_twice_the_sink_holds_every_message_exactly_once(
    spark: SparkSession, node: StandaloneProcess, tmp_path: Path
) -> None:
    create_partitioned(node, TOPIC, 4)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    producer = Producer(node)
    producer.start()
    first_log, restart_log = tmp_path / "job-1.log", tmp_path / "job-2.log"
    first = start_job(node, sink, checkpoint, first_log)
    restart = start_job(node, sink, checkpoint, restart_log, on_cue=True)  # ready meanwhile
    try:
        wait_for_batches(first, checkpoint, committed_batches(checkpoint) + 1, first_log)
        kill(first)
        assert producer.is_alive(), "the producer stopped before the kill"
        cue(restart)  # the first is dead: the query starts again from its checkpoint
        wait_for_batches(restart, checkpoint, committed_batches(checkpoint) + 1, restart_log)
        kill(restart)
        assert producer.is_alive(), "the producer stopped before the kill"
    finally:
        kill(first)
        kill(restart)
        producer.stop.set()
        producer.join(60)
    assert not producer.failed
    # The second restart: in this process, from the same checkpoint, until what exists is read.
    drain = stream(
        spark, node.url, node.admin_url, TOPIC, str(sink), str(checkpoint), metadata_url(node)
    )
    query = drain.trigger(availableNow=True).start()
    assert query.awaitTermination(240), "Trigger.AvailableNow did not stop by itself"
    assert query.exception() is None
    assert query.recentProgress[0]["batchId"] > 0, "the drain did not resume from the checkpoint"

    rows = spark.read.parquet(str(sink)).collect()
    assert len(producer.acked) > 0
    assert len(rows) == len(producer.acked)
    assert sorted(r.value for r in rows) == [f"r-{i:06d}" for i in sorted(producer.acked)]
    assert len({bytes(r["__messageId"]) for r in rows}) == len(rows)
    assert {r["__topic"] for r in rows} == {
        f"persistent://public/default/{TOPIC}-partition-{p}" for p in range(4)
    }
    # The query's ranges did cross closed ledgers, which the storage path read.
    options = {"metadata.url": metadata_url(node), "readFromStorage": "always"}
    reader = PulsarBatchReader(
        SourceOptions.parse({**source_options(node), **options, "topic": TOPIC}, streaming=False)
    )
    assert any(p.segments for p in reader.partitions()), "no closed ledger to read from storage"


def test_standalone_log_is_clean(node: StandaloneProcess) -> None:
    """Runs last: the module's standalone logged no traceback and no ERROR line."""
    assert_log_clean(node)
