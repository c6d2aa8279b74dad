"""docs/security.md's walkthrough runs as written: its shell block, on free ports, in a scratch
directory, prints what the page says it prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from tests.support.etcd import REPO_ROOT, free_port

DOC = REPO_ROOT / "docs" / "security.md"
BLOCK = re.compile(
    r"<!-- security walkthrough: begin -->\n```sh\n(.*?)```\n<!-- security walkthrough: end -->",
    re.S,
)


def test_the_security_walkthrough_runs(tmp_path: Path) -> None:
    found = BLOCK.search(DOC.read_text())
    assert found, "docs/security.md has no walkthrough block"
    env = dict(
        os.environ,
        BROKER_PORT=str(free_port()),
        HTTP_PORT=str(free_port()),
        TLS_PORT=str(free_port()),
        HTTPS_PORT=str(free_port()),
    )
    process = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", found.group(1)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the standalone it starts goes with it, whatever happens
    )
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log = (tmp_path / "secure" / "standalone.log").read_text(errors="replace")
    assert process.returncode == 0, output + "\n--- standalone log ---\n" + log[-5000:]
    lines = output.splitlines()
    assert "without a token: 401" in lines, output
    assert '{"app-1": ["consume", "produce"]}' in lines, output
    assert "received b'order 1'" in lines, output
    assert "public/default: AuthorizationError" in lines, output
    assert "Traceback" not in log and " ERROR " not in log, log[-5000:]
    for token_file in ("admin.token", "app-1.token"):
        token = (tmp_path / "secure" / token_file).read_text().strip()
        assert token not in log and token not in output
