"""A ``magnetar proxy`` process for tests: its own free ports, its log in a file, killed or
stopped like the other service processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tests.support.etcd import REPO_ROOT, free_port
from tests.support.process import ServiceProcess

START_TIMEOUT_SECONDS = 30.0


class ProxyProcess(ServiceProcess):
    """One ``python -m magnetar.cli proxy`` process in front of the brokers registered in
    ``metadata_url``. ``settings`` are extra options keyed by config field name (a bool becomes
    ``--x`` / ``--no-x``). ``port`` is what ``RawConnection`` dials, ``url`` what the official
    client is given."""

    def __init__(
        self,
        base_dir: Path,
        metadata_url: str,
        *,
        settings: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir = base_dir
        self.metadata_url = metadata_url
        self.settings: dict[str, object] = dict(settings or {})
        self.env = dict(env or {})
        self.port = free_port()
        self.http_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "proxy.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def describe(self) -> str:
        return f"proxy 127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "magnetar.cli", "proxy",
            "--metadata-url", self.metadata_url,
            "--bind-address", "127.0.0.1", "--advertised-address", "127.0.0.1",
            "--port", str(self.port), "--http-port", str(self.http_port),
        ]  # fmt: skip
        for name, value in self.settings.items():
            option = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                cmd.append(option if value else "--no-" + name.replace("_", "-"))
            else:
                cmd += [option, str(value)]
        return cmd

    def spawn(self) -> None:
        if self.running:
            return
        self.starts += 1
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"--- start #{self.starts}: {' '.join(self.command())}\n".encode())
            log_file.flush()
            self.process = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    def wait_serving(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Wait until the Pulsar port accepts connections and ``/ready`` answers 200 (a broker
        is registered), or ``/status.html`` when the HTTP half has no ``/ready``."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"{self.describe()} exited with code {self.process.returncode} during "
                    f"startup:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if self.http_status("/ready") == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(
            f"{self.describe()} did not serve within {timeout}s:\n{self.log_tail()}"
        )

    def start(self) -> ProxyProcess:
        self.spawn()
        self.wait_serving()
        return self

    def http_status(self, path: str, timeout: float = 2.0) -> int:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=timeout) as response:
                return int(response.status)
        except urllib.error.HTTPError as e:
            return e.code

    def metrics(self) -> str:
        with urllib.request.urlopen(self.http_url + "/metrics", timeout=5) as response:
            return str(response.read().decode())

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no proxy log)"

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_text()[-chars:]

    def log_lines(self, *needles: str) -> list[str]:
        return [line for line in self.log_text().splitlines() if any(n in line for n in needles)]
