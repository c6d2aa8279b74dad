"""A real etcd for tests, on free loopback ports with throwaway data dirs.

``EtcdServer`` is a single-node cluster; ``EtcdCluster`` starts several members (three by
default) that form one cluster, for failover tests. ``stop()``/``kill()`` keep a member's data
dir and ports, so ``start()`` afterwards is a restart of the same member (what fault tests
want); ``close()`` stops it and deletes the data dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.process import Pausable

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install-test-deps.sh"
START_TIMEOUT_SECONDS = 30.0


def find_etcd() -> str:
    """Path of the etcd binary; installs it with scripts/install-test-deps.sh if missing."""
    found = shutil.which("etcd")
    if found:
        return found
    result = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, check=False
    )
    found = shutil.which("etcd")
    if found:
        return found
    raise RuntimeError(
        "the etcd binary is not on PATH and scripts/install-test-deps.sh did not install it "
        f"(exit {result.returncode}). Install etcd 3.4+ (Debian: apt-get install etcd-server) "
        f"and rerun.\n--- installer output ---\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
    )


_PORTS_HANDED_OUT: set[int] = set()
_PORTS_LOCK = threading.Lock()  # clusters start bookies from a thread pool

# Under pytest-xdist (scripts/test.sh runs two workers) each worker takes ports from its own
# range below the kernel's ephemeral range (32768 and up on Linux), so two workers never hand
# out the same port and no outgoing connection's local port can take one meanwhile.
_WORKER_RANGE_START = 20000
_WORKER_RANGE_SIZE = 4000


def _worker_range() -> range | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    start = _WORKER_RANGE_START + int(worker[2:]) * _WORKER_RANGE_SIZE
    return range(start, start + _WORKER_RANGE_SIZE)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free loopback port never handed out before in this test run. The kernel can give
    the same port to two binds in a row once the first is closed (a standalone once got the
    same port for its broker's and its bookie's HTTP servers), and a bookie's address is its
    identity in a shared metadata store (its cookie outlives it)."""
    with _PORTS_LOCK:
        ports = _worker_range()
        if ports is not None:
            for port in ports:
                if port not in _PORTS_HANDED_OUT and _bindable(port):
                    _PORTS_HANDED_OUT.add(port)
                    return port
            raise RuntimeError(f"no free port left in {ports} for this test worker")
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _PORTS_HANDED_OUT:
                _PORTS_HANDED_OUT.add(port)
                return port


class EtcdServer(Pausable):
    """One etcd process. ``url`` is the Magnetar metadata URL (``etcd://127.0.0.1:PORT``).

    Alone it is a one-member cluster; ``EtcdCluster`` sets ``initial_cluster`` and
    ``cluster_token`` on each of its members before starting them.
    """

    def __init__(self, *, name: str = "test") -> None:
        self.binary = find_etcd()
        self.name = name
        # tmpfs when available: etcd fsyncs every write and 3.4 has no --unsafe-no-fsync.
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.data_dir = Path(tempfile.mkdtemp(prefix="magnetar-etcd-", dir=base))
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        #: ``name=peer-url,...`` of every member; None: a one-member cluster of this one.
        self.initial_cluster: str | None = None
        self.cluster_token: str | None = None

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    def start(self) -> EtcdServer:
        if self.running:
            return self
        self.spawn()
        self.wait_healthy()
        return self

    def spawn(self) -> None:
        """Start the process without waiting for it to be healthy (a cluster member is only
        healthy once a quorum of its peers runs)."""
        if self.running:
            return
        client = f"http://127.0.0.1:{self.client_port}"
        peer = self.peer_url
        cluster = ["--initial-cluster=" + (self.initial_cluster or f"{self.name}={peer}")]
        if self.cluster_token is not None:
            cluster.append(f"--initial-cluster-token={self.cluster_token}")
        command = [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir / 'member-data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            *cluster,
            # Ignored on a restart: the member's data dir already knows its cluster.
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-level=warn",
            # Faster raft ticks: a one-node cluster elects itself sooner after (re)start.
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )

    def stop(self) -> None:
        """Graceful stop (SIGTERM); the data dir stays for a later start()."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Crash it (SIGKILL); the data dir stays for a later start()."""
        self._end(signal.SIGKILL)

    def close(self) -> None:
        """Stop and delete the data dir."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _end(self, sig: signal.Signals) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        process.send_signal(signal.SIGCONT)  # a member a test paused (SIGSTOP) must see it too
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def wait_healthy(self) -> None:
        """Wait until the member answers /health with true (its cluster has a leader)."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        health = f"http://127.0.0.1:{self.client_port}/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with code {self.process.returncode} during startup:\n"
                    + self._log_tail()
                )
            try:
                with urllib.request.urlopen(health, timeout=1) as response:
                    if b'"true"' in response.read():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(
            f"etcd did not become healthy within {START_TIMEOUT_SECONDS}s:\n" + self._log_tail()
        )

    def status(self) -> tuple[str, str]:
        """(this member's id, the id of the leader it follows), from its maintenance status."""
        answer = self._post("/v3/maintenance/status", {})
        # The gateway leaves zero fields out: no "leader" while the member knows none ("0").
        return answer["header"]["member_id"], answer.get("leader", "0")

    def transfer_leadership(self, target_id: str) -> None:
        """Ask this member (the leader) to hand the leadership to member ``target_id``."""
        self._post("/v3/maintenance/transfer-leadership", {"targetID": target_id})

    def _post(self, path: str, body: dict[str, str]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.client_port}{path}",
            data=json.dumps(body).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            answer: dict[str, Any] = json.load(response)
        return answer

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no etcd log)"


class EtcdCluster:
    """``size`` etcd members forming one cluster; ``url`` lists every member's client port.

    Members are ``EtcdServer``s: kill, stop and start them one by one to test failover.
    """

    def __init__(self, size: int = 3) -> None:
        self.members = [EtcdServer(name=f"member{i}") for i in range(size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        token = f"magnetar-test-{uuid.uuid4().hex[:12]}"
        for member in self.members:
            member.initial_cluster = initial
            member.cluster_token = token

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{m.client_port}" for m in self.members)

    def member_on(self, port: int) -> EtcdServer:
        """The member whose client port is ``port``."""
        for member in self.members:
            if member.client_port == port:
                return member
        raise KeyError(f"no member listens for clients on port {port}")

    def move_leader_off(self, member: EtcdServer) -> None:
        """If ``member`` leads the cluster, hand the leadership to another member and wait
        until every running member follows it.

        A test that pauses (SIGSTOP) a member needs this: etcd before 3.4.28 and 3.5.11 lets a
        paused leader, on waking, revoke every lease whose keepalives went to the new leader
        while it slept (etcd issues 12528 and 15247), so pausing the leader tests etcd's bug,
        not the client.
        """
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            # A member between leaders answers "0", a transfer raft gave up on times out, a
            # member that just lost the leadership refuses the transfer: look again.
            with contextlib.suppress(OSError):
                own_id, leader_id = member.status()
                others = [m for m in self.members if m.running and m is not member]
                if own_id == leader_id:
                    member.transfer_leadership(others[0].status()[0])
                elif leader_id != "0" and all(m.status()[1] == leader_id for m in others):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"etcd on port {member.client_port} kept the leadership")

    def start(self) -> EtcdCluster:
        for member in self.members:
            member.spawn()
        for member in self.members:
            member.wait_healthy()  # the cluster has a leader
        return self

    def close(self) -> None:
        for member in self.members:
            member.close()

    def __enter__(self) -> EtcdCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
