"""Runs a real ``magnetar standalone`` process on free ports for tests."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pulsar

from tests.support.etcd import free_port
from tests.support.process import Pausable


class StandaloneProcess(Pausable):
    def __init__(self, data_dir: Path, extra: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra = list(extra or [])
        self.port = free_port()
        self.bookie_port = free_port()
        self.bookie_http_port = free_port()
        self.http_port = free_port()
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/admin/v2"

    def start(self) -> StandaloneProcess:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "magnetar.cli", "standalone", "--data-dir", str(self.data_dir),
                "--broker-port", str(self.port), "--bookie-port", str(self.bookie_port),
                "--bookie-http-port", str(self.bookie_http_port), "--no-journal-sync",
                "--http-port", str(self.http_port), *self.extra,
            ],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"standalone exited:\n{self.log_tail()}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"standalone did not listen on {self.port}:\n{self.log_tail()}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 5000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


#: The official client's own logging, quietened to warnings.
QUIET = logging.getLogger("pulsar-client")
QUIET.setLevel(logging.WARNING)


def client(node: StandaloneProcess) -> pulsar.Client:
    """An official Pulsar client connected to ``node``."""
    return pulsar.Client(node.url, operation_timeout_seconds=10, logger=QUIET)
