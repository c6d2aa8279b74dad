"""etcd members killed and restarted under a live cluster: three etcd members, three bookie
processes and one ``magnetar broker`` process, the official Pulsar client producing throughout.

The member the broker talks to is SIGKILLed (and later restarted), then the member it moved to.
Each stays down longer than the metadata sessions' TTL, so a session whose keepalives did not
move to another member would expire. Afterwards: the bookies' registrations are the same keys
of the same sessions (never re-registered), neither the broker nor a bookie logged a lost
session, the broker logged no Traceback, and a subscription created before the first message
receives every acknowledged message exactly once.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pulsar
import pytest

from magnetar.common.ledger.bookies import registration_key
from magnetar.common.metadata import Versioned, open_store
from tests.support.bookie import BookieFactory, BookieProcess
from tests.support.etcd import EtcdCluster, EtcdServer, free_port
from tests.support.ledger_cluster import start_bookie
from tests.support.standalone import QUIET

TOPIC = "persistent://public/default/etcd-member-restart"
#: The session TTL of the bookies and of the broker; each member stays down longer than this.
#: Short (the same as the cluster fault tests' brokers), so the outages are short too.
SESSION_TTL_S = 4
DOWN_FOR_S = 6
#: Small, so the topic rolls over to new ledgers (metadata writes) while members are down.
ENTRIES_PER_LEDGER = 250
PROGRESS_TIMEOUT_S = 30.0

_MEMBER = re.compile(r"(?:session opened on|moved to|reconnected to) etcd 127\.0\.0\.1:(\d+)")
_LEASE = re.compile(r"\(lease ([0-9a-f]+)")


def session_leases(log: str) -> set[str]:
    """The etcd leases a process's metadata sessions used (one: the session was never lost)."""
    return set(_LEASE.findall(log))


class BrokerProcess:
    """``python -m magnetar.cli broker`` on free loopback ports."""

    def __init__(self, base_dir: Path, metadata_url: str) -> None:
        base_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = base_dir / "broker.log"
        self.metadata_url = metadata_url
        self.port = free_port()
        self.http_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        command = [
            sys.executable, "-m", "magnetar.cli", "broker",
            "--metadata-url", self.metadata_url,
            "--bind-address", "127.0.0.1", "--advertised-address", "127.0.0.1",
            "--port", str(self.port), "--http-port", str(self.http_port),
            "--ensemble-size", "3", "--write-quorum", "2", "--ack-quorum", "2",
            "--max-entries-per-ledger", str(ENTRIES_PER_LEDGER),
            "--broker-session-ttl-seconds", str(SESSION_TTL_S),
        ]  # fmt: skip
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"broker exited:\n{self.log_text()[-5000:]}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"broker did not listen on {self.port}:\n{self.log_text()[-5000:]}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def current_member(log: str, cluster: EtcdCluster) -> EtcdServer:
    """The etcd member a process's metadata session talks to, from its last log line on it."""
    ports = _MEMBER.findall(log)
    assert ports, f"no metadata session line in the log:\n{log[-3000:]}"
    return cluster.member_on(int(ports[-1]))


class Producer:
    """Sends numbered messages with the official client from a thread; keeps the ones that
    were acknowledged (a send that failed may or may not be stored: it is not counted)."""

    def __init__(self, url: str) -> None:
        self.client = pulsar.Client(url, operation_timeout_seconds=30, logger=QUIET)
        try:
            self.producer = self.client.create_producer(
                TOPIC, batching_enabled=False, send_timeout_millis=30_000
            )
        except BaseException:
            self.client.close()
            raise
        self.acked: list[str] = []
        self.failed: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            body = f"message-{n:06}"
            n += 1
            try:
                self.producer.send(body.encode())
            except Exception as e:  # the client's error types: timeout, disconnected, ...
                self.failed.append((body, repr(e)))
                continue
            self.acked.append(body)
            time.sleep(0.002)

    def wait_for(self, more: int) -> None:
        """Wait until ``more`` further messages are acknowledged (production goes on)."""
        target = len(self.acked) + more
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while len(self.acked) < target:
            assert self._thread.is_alive(), "the producer thread ended"
            assert time.monotonic() < deadline, (
                f"production stalled at {len(self.acked)} acknowledged messages "
                f"(failed sends: {self.failed[-5:]})"
            )
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.producer.close()
        self.client.close()


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(3) as cluster:
        yield cluster


async def registrations(url: str, bookies: list[BookieProcess]) -> dict[str, Versioned | None]:
    store = await open_store(url)
    try:
        return {b.address: await store.get(registration_key(b.address)) for b in bookies}
    finally:
        await store.close()


def kill_and_wait(member: EtcdServer, producer: Producer) -> None:
    member.kill()
    producer.wait_for(50)  # writes go on with two members of three
    time.sleep(DOWN_FOR_S)  # longer than a session TTL: a session not kept alive would expire
    producer.wait_for(50)


async def test_etcd_members_killed_under_a_live_broker_and_bookies(
    etcd: EtcdCluster, tmp_path: Path
) -> None:
    with BookieFactory(tmp_path / "bookies") as factory:
        bookies = [
            factory.create(metadata_url=etcd.url, journal_sync=False, session_ttl_s=SESSION_TTL_S)
            for _ in range(3)
        ]
        for bookie in bookies:
            start_bookie(bookie)
        broker = BrokerProcess(tmp_path / "broker", etcd.url).start()
        try:
            before = await registrations(etcd.url, bookies)
            assert all(before.values()), before
            with closing(
                pulsar.Client(broker.url, operation_timeout_seconds=30, logger=QUIET)
            ) as listener:
                consumer = listener.subscribe(
                    TOPIC,
                    "after-restarts",
                    initial_position=pulsar.InitialPosition.Earliest,
                )
                producer = Producer(broker.url).start()
                try:
                    producer.wait_for(100)

                    first = current_member(broker.log_text(), etcd)
                    kill_and_wait(first, producer)
                    first.start()  # back, with its data dir: it rejoins the cluster
                    producer.wait_for(50)

                    second = current_member(broker.log_text(), etcd)
                    assert second is not first, (
                        "the broker's session did not move off the killed member"
                    )
                    kill_and_wait(second, producer)
                    second.start()
                    producer.wait_for(50)
                    # Enough messages for four rollovers (checked in the log below), however
                    # slowly a loaded machine produced during the outages.
                    producer.wait_for(max(0, 4 * ENTRIES_PER_LEDGER + 50 - len(producer.acked)))
                finally:
                    producer.stop()

                after = await registrations(etcd.url, bookies)
                for bookie in bookies:
                    assert after[bookie.address] == before[bookie.address], (
                        f"bookie {bookie.address} registered again: {before} -> {after}\n"
                        f"{bookie.log_tail()}"
                    )
                    assert bookie.running, bookie.log_tail()
                    assert "lost its metadata session" not in bookie.log_text()
                    assert "metadata session LOST" not in bookie.log_text()
                    assert len(session_leases(bookie.log_text())) == 1, bookie.log_tail()

                received: Counter[str] = Counter()
                acked = set(producer.acked)
                deadline = time.monotonic() + 60
                while not acked <= received.keys() and time.monotonic() < deadline:
                    try:
                        message = consumer.receive(timeout_millis=2000)
                    except pulsar.Timeout:
                        continue
                    received[message.data().decode()] += 1
                    consumer.acknowledge(message)
                missing = sorted(acked - received.keys())
                assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:10]}"
                duplicated = {m: c for m, c in received.items() if c > 1}
                assert not duplicated, f"delivered more than once: {list(duplicated.items())[:10]}"
        finally:
            broker.stop()
        log = broker.log_text()
        assert "Traceback" not in log, log[-8000:]
        assert "metadata session LOST" not in log, log[-8000:]
        assert len(session_leases(log)) == 1, log[-8000:]
        assert log.count("moved to etcd") >= 2, log[-8000:]
        # New ledgers were created (metadata writes) all along, outages included.
        assert log.count("rolled over from ledger") >= 4, log[-8000:]
        print(
            f"acknowledged {len(producer.acked)}, failed sends {len(producer.failed)}: "
            f"{producer.failed[:3]}"
        )
