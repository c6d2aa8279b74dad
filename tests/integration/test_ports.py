"""A broker (standalone) started on a port another process listens on refuses to start, naming
the address and the setting; the first one keeps serving."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.etcd import free_port
from tests.support.raw_client import round_trip
from tests.support.standalone import StandaloneProcess


@pytest.mark.parametrize("taken", ["broker-port", "http-port"])
def test_second_standalone_on_a_port_in_use_refuses(tmp_path: Path, taken: str) -> None:
    first = StandaloneProcess(tmp_path / "first").start()
    try:
        ports = {
            "broker-port": free_port(),
            "http-port": free_port(),
            "bookie-port": free_port(),
            "bookie-http-port": free_port(),
        }
        ports[taken] = first.port if taken == "broker-port" else first.http_port
        args = [f"--{name}={port}" for name, port in ports.items()]
        second = subprocess.run(
            [sys.executable, "-m", "magnetar.cli", "standalone", "--data-dir",
             str(tmp_path / "second"), *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        setting = "port" if taken == "broker-port" else "http_port"
        assert second.returncode != 0
        assert f":{ports[taken]} ({setting}): address already in use" in second.stderr
        assert "Traceback" not in second.stderr
        round_trip(first, f"persistent://public/default/still-{taken}")
    finally:
        first.stop()
