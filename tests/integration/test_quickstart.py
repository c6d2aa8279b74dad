"""The quick start's single-node section, followed in order against a standalone: every
``magnetar client`` / ``magnetar admin`` line and the Python snippet run as written (the
standalone's free ports given through ``MAGNETAR_SERVICE_URL`` / ``MAGNETAR_ADMIN_URL``, and put
in the snippet for ``localhost:6650``); and the install command brings the official client along
(``pulsar-client`` a runtime dependency, not an extra). Installing into a fresh virtual
environment is walked too (``test_the_section_walked_in_a_fresh_virtual_environment``): the
install command run as written in a new venv, the standalone it starts on free ports given
through ``MAGNETAR_*`` variables, and every command and the snippet run with that venv's
``magnetar`` and ``python3``."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.etcd import free_port
from tests.support.polling import wait_until
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


def test_the_section_walked_in_a_fresh_virtual_environment(tmp_path: Path) -> None:
    """The README's first command in a new virtual environment (nothing of the test run's
    packages visible), then the rest of the section with what it installed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    ports = {name: free_port() for name in ("BROKER", "HTTP", "BOOKIE", "BOOKIE_HTTP")}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        **{f"MAGNETAR_{name}_PORT": str(port) for name, port in ports.items()},
        "MAGNETAR_DATA_DIR": str(tmp_path / "data"),
        "MAGNETAR_SERVICE_URL": f"pulsar://127.0.0.1:{ports['BROKER']}",
        "MAGNETAR_ADMIN_URL": f"http://127.0.0.1:{ports['HTTP']}",
    }
    blocks = re.findall(r"```(bash|python)\n(.*?)```", single_node_section(), flags=re.S)
    first = blocks[0][1].strip().split(" #", 1)[0].strip()
    assert first == "bash scripts/install.sh && magnetar standalone"
    log = (tmp_path / "standalone.log").open("wb")
    node = subprocess.Popen(
        ["bash", "-c", first],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        wait_until(
            lambda: node.poll() is not None or _answers(ports["HTTP"]),
            what="the venv's install and standalone",
            timeout=240,
        )
        assert node.poll() is None, (tmp_path / "standalone.log").read_text()[-3000:]
        installed = subprocess.run(
            [str(bin_dir / "python3"), "-c", "import pulsar, magnetar; print(magnetar.__file__)"],
            capture_output=True, text=True, timeout=60, env=env, check=True,
        )  # fmt: skip
        assert installed.stdout.startswith(str(venv)), installed.stdout  # not the test run's
        ran = 0
        for kind, block in blocks[1:]:
            if kind == "python":
                code = block.replace("pulsar://localhost:6650", env["MAGNETAR_SERVICE_URL"])
                done = subprocess.run(
                    [str(bin_dir / "python3"), "-c", code],
                    capture_output=True, text=True, timeout=60, env=env,
                )  # fmt: skip
                assert done.returncode == 0, (code, done.stderr)
                ran += 1
                continue
            for line in (raw.strip() for raw in block.splitlines()):
                if not line or line.startswith("magnetar perf"):
                    continue  # runs for 30 s; tested in test_perf_cli
                argv = shlex.split(line.split(" #", 1)[0])
                done = subprocess.run(
                    [str(bin_dir / argv[0]), *argv[1:]],
                    capture_output=True, text=True, timeout=60, env=env,
                )  # fmt: skip
                assert done.returncode == 0, (line, done.stdout, done.stderr)
                ran += 1
        assert ran >= 9
    finally:
        os.killpg(node.pid, signal.SIGINT)  # Ctrl-C, as the section says
        try:
            code = node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            code = node.wait()
        log.close()
    assert code == 0, (tmp_path / "standalone.log").read_text()[-3000:]
    assert "Traceback" not in (tmp_path / "standalone.log").read_text()


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/v2/brokers/ready", timeout=2):
            return True
    except (OSError, urllib.error.URLError):
        return False
