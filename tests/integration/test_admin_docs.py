"""Every example of docs/admin.md runs, in order, against a fresh standalone: each ``magnetar``
and ``curl`` line of its ``bash`` blocks exits 0 (the broker's address put in for
``localhost``), and the broker logs no error."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.raw_client import module_standalone
from tests.support.standalone import StandaloneProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "admin.md"


def examples() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("admin-docs") / "standalone")


def as_run(line: str, node: StandaloneProcess) -> list[str]:
    argv = shlex.split(line)
    if argv[0] == "curl":
        return [a.replace("localhost:8080", f"127.0.0.1:{node.http_port}") for a in argv] + [
            "--fail-with-body"
        ]
    assert argv[0] == "magnetar", line
    tool, rest = argv[1], argv[2:]
    if tool == "admin":
        where = ["--admin-url", f"http://127.0.0.1:{node.http_port}"]
    elif tool == "perf":  # pulsar-perf's -u, after the mode
        where, rest = [rest[0], "-u", node.url], rest[1:]
    else:
        where = ["--url", node.url]
    return [sys.executable, "-m", "magnetar.cli", tool, *where, *rest]


def test_every_example_runs(node: StandaloneProcess) -> None:
    lines = examples()
    assert len(lines) > 40 and all(line.split()[0] in ("magnetar", "curl") for line in lines)
    if shutil.which("curl") is None:
        lines = [line for line in lines if not line.startswith("curl")]
    for line in lines:
        done = subprocess.run(as_run(line, node), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        if line.startswith("magnetar perf"):
            assert "Aggregated throughput stats --- 200 records" in done.stdout, done.stdout
            assert "Aggregated latency stats --- Latency: mean:" in done.stdout, done.stdout
        if "peek-messages" in line:
            assert '"payload": "e1"' in done.stdout, done.stdout
        if line.endswith("partitioned-stats persistent://acme/orders/incoming --per-partition"):
            assert '"msgInCounter": 20' in done.stdout, done.stdout
