"""A real single-node etcd for tests, on free loopback ports with a throwaway data dir.

``stop()``/``kill()`` keep the data dir and ports, so ``start()`` afterwards is a restart of
the same member (what fault tests want); ``close()`` stops it and deletes the data dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """One etcd process. ``url`` is the Magnetar metadata URL (``etcd://127.0.0.1:PORT``)."""

    def __init__(self) -> None:
        self.binary = find_etcd()
        # tmpfs when available: etcd fsyncs every write and 3.4 has no --unsafe-no-fsync.
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.data_dir = Path(tempfile.mkdtemp(prefix="magnetar-etcd-", dir=base))
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    def start(self) -> EtcdServer:
        if self.process is not None and self.process.poll() is None:
            return self
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        command = [
            self.binary,
            "--name=test",
            f"--data-dir={self.data_dir / 'member-data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
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
        self._wait_healthy()
        return self

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
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _wait_healthy(self) -> None:
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

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no etcd log)"
