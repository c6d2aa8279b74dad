"""A real bookie process for tests: ``python -m magnetar.cli bookie`` on free loopback ports.

The journal and ledger directories, the log file and (by default) a ``local://`` metadata
store live in one tmp directory. ``stop()``/``kill()`` keep directories and ports, so
``start()``/``restart()`` afterwards is a restart of the same bookie, which is what crash
tests want. :class:`BookieFactory` starts bookies for one test and ends every process it
started, whatever the test did.

Ports: a bookie's address is its identity. Its cookie stays in the metadata store under
``/magnetar/cookies/<address>`` after the bookie (and its test) is gone, so a new bookie on a
shared store (the session-wide etcd) that got an earlier bookie's port from the kernel would be
refused as "that bookie with wiped disks". :func:`tests.support.etcd.free_port` therefore never
hands out a port twice in one test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

from tests.support.etcd import free_port
from tests.support.process import ServiceProcess

START_TIMEOUT_SECONDS = 20.0


class BookieStartError(RuntimeError):
    """The bookie exited or did not answer ``/ready`` in time; the message holds its log."""


class BookieProcess(ServiceProcess):
    """One bookie process.

    ``settings`` are extra ``magnetar bookie`` options, keyed by config field name
    (``{"max_entry_size": 4096, "journal_sync": False}``); a bool becomes ``--x``/``--no-x``.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        metadata_url: str | None = None,
        settings: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.base_dir = base_dir
        base_dir.mkdir(parents=True, exist_ok=True)
        self.journal_dir = base_dir / "journal"
        self.ledger_dir = base_dir / "ledgers"
        self.metadata_url = metadata_url or f"local://{(base_dir / 'meta.db').resolve()}"
        self.settings: dict[str, object] = dict(settings or {})
        self.env = dict(env or {})
        self.port = free_port()
        self.http_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- addresses ---------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` of the bookie protocol (what it registers under)."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "bookie.log"

    @property
    def journal_files(self) -> list[Path]:
        return sorted((self.journal_dir / "current").glob("*.jnl"))

    @property
    def entry_log_files(self) -> list[Path]:
        return sorted((self.ledger_dir / "current").glob("*.log"))

    # -- life cycle --------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "magnetar.cli",
            "bookie",
            "--metadata-url",
            self.metadata_url,
            "--bind-address",
            "127.0.0.1",
            "--advertised-address",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            "--journal-dir",
            str(self.journal_dir),
            "--ledger-dir",
            str(self.ledger_dir),
        ]
        for name, value in self.settings.items():
            option = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                cmd.append(option if value else "--no-" + name.replace("_", "-"))
            else:
                cmd += [option, str(value)]
        return cmd

    def start(self) -> BookieProcess:
        if self.running:
            return self
        self.starts += 1
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"--- start #{self.starts}: {' '.join(self.command())}\n".encode())
            log_file.flush()
            self.process = subprocess.Popen(
                self.command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._wait_ready()
        return self

    def describe(self) -> str:
        return f"bookie {self.address}"

    # -- HTTP --------------------------------------------------------------------------

    def http(self, method: str, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        """(status, body) of one request to the bookie's HTTP port."""
        request = urllib.request.Request(self.http_url + path, method=method, data=None)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def checkpoint(self) -> None:
        status, body = self.http("POST", "/api/v1/bookie/checkpoint")
        assert status == 200, f"checkpoint failed: {status} {body!r}"

    # -- logs --------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no bookie log)"

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_text()[-chars:]

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise BookieStartError(
                    f"bookie exited with code {code} during startup:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.http_url + "/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.kill()
        raise BookieStartError(
            f"bookie did not answer /ready with 200 within {START_TIMEOUT_SECONDS}s:\n"
            + self.log_tail()
        )


class BookieFactory:
    """Starts bookies in subdirectories of ``base_dir``; ``close()`` ends them all."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.bookies: list[BookieProcess] = []

    def create(
        self,
        *,
        metadata_url: str | None = None,
        env: Mapping[str, str] | None = None,
        **settings: object,
    ) -> BookieProcess:
        """A bookie that is configured but not started."""
        bookie = BookieProcess(
            self.base_dir / f"bookie-{len(self.bookies)}",
            metadata_url=metadata_url,
            settings=settings,
            env=env,
        )
        self.bookies.append(bookie)
        return bookie

    def start(
        self,
        *,
        metadata_url: str | None = None,
        env: Mapping[str, str] | None = None,
        **settings: object,
    ) -> BookieProcess:
        return self.create(metadata_url=metadata_url, env=env, **settings).start()

    def close(self) -> None:
        for bookie in self.bookies:
            try:
                bookie.stop()
            except AssertionError:
                pass  # stop() already fell back to SIGKILL

    def logs(self) -> str:
        return "\n".join(
            f"===== {b.address} ({b.log_path}) =====\n{b.log_tail()}" for b in self.bookies
        )

    def __enter__(self) -> BookieFactory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def bookie_factory_fixture(tmp_path: Path) -> Iterator[BookieFactory]:
    """Body of a ``bookies`` fixture: test modules wrap it in ``@pytest.fixture``.

    The bookies' logs are printed at teardown; pytest shows them only for a failed test.
    """
    factory = BookieFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()
        if factory.bookies:
            print(factory.logs())
