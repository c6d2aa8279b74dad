"""The quick start's single-node section, followed in order against a standalone: every
``magnetar client`` / ``magnetar admin`` line and the Python snippet run as written (the
standalone's free ports given through ``MAGNETAR_SERVICE_URL`` / ``MAGNETAR_ADMIN_URL``, and put
in the snippet for ``localhost:6650``); and the install command brings the official client along
(``pulsar-client`` a runtime dependency, not an extra). Installing into a fresh virtual
environment is not walked here: building the package needs ``wheel`` from the network."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.raw_client import module_standalone
from tests.support.standalone import StandaloneProcess

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"


def single_node_section() -> str:
    text = QUICKSTART.read_text()
    return text.split("## Run a single node", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("quickstart") / "standalone")


def test_install_brings_the_official_client() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pulsar-client") for d in project["dependencies"])
    assert "pip install" in (ROOT / "scripts" / "install.sh").read_text()
    assert single_node_section().lstrip().startswith("```bash\nbash scripts/install.sh")


def test_single_node_section_runs_in_order(node: StandaloneProcess) -> None:
    section = single_node_section()
    for port in ("6650", "8080", "3181", "8000"):
        assert f"| {port} |" in section  # every port the standalone takes is stated
    env = {
        **os.environ,
        "MAGNETAR_SERVICE_URL": node.url,
        "MAGNETAR_ADMIN_URL": f"http://127.0.0.1:{node.http_port}",
    }
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, flags=re.S)
    ran = 0
    for kind, block in blocks:
        if kind == "python":
            code = block.replace("pulsar://localhost:6650", node.url)
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
            )
            assert done.returncode == 0, (code, done.stderr)
            ran += 1
            continue
        for line in (raw.strip() for raw in block.splitlines()):
            if not line or line.startswith(("bash scripts/install.sh", "magnetar perf")):
                continue  # installing is above; perf runs for 30 s, tested in test_perf
            argv = shlex.split(line.split(" #", 1)[0])
            assert argv[0] == "magnetar", line
            done = subprocess.run(
                [sys.executable, "-m", "magnetar.cli", *argv[1:]],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            assert done.returncode == 0, (line, done.stdout, done.stderr)
            ran += 1
    assert ran >= 9
