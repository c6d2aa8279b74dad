"""What the test support's process wrappers share: crash, stop, restart, pause and resume one
service process (a bookie, a broker) the way the fault tests need it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Self

#: How long the kernel may take to stop every thread of a process after SIGSTOP.
STOP_TIMEOUT_SECONDS = 10.0


def pause(pid: int) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads has stopped.

    kill() returns as soon as the signal is queued: the kernel wakes one thread to begin the
    stop, and the process's other threads run on until that one gets a CPU. Measured here, an
    etcd answered 6 of 200 requests sent right after kill(SIGSTOP) returned, so a test that
    pauses a process to make it silent must wait for the stop to be complete.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while not _every_thread_stopped(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} still runs {STOP_TIMEOUT_SECONDS}s after SIGSTOP")
        time.sleep(0.001)


def resume(pid: int) -> None:
    """SIGCONT: a paused process runs on."""
    os.kill(pid, signal.SIGCONT)


def _every_thread_stopped(pid: int) -> bool:
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        raise ProcessLookupError(f"process {pid} is gone")
    for task in tasks.iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        # The state follows the command name, which is in parentheses and may hold any byte.
        if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z", "X"):
            return False
    return True


class Pausable:
    """SIGSTOP / SIGCONT of the running ``process`` (a bookie, a broker, an etcd member)."""

    process: subprocess.Popen[bytes] | None

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and connections but answers nothing (from
        the moment this returns: see :func:`pause`)."""
        assert self.process is not None and self.process.poll() is None
        pause(self.process.pid)

    def resume(self) -> None:
        assert self.process is not None and self.process.poll() is None
        resume(self.process.pid)


class ServiceProcess(Pausable):
    """Subclasses set ``process`` when they start, and give ``start``, ``log_tail`` and
    ``describe`` (how error messages name the process)."""

    http_port: int
    #: How long a SIGTERM may take before the process is killed and the test fails.
    stop_timeout: float = 15.0

    def describe(self) -> str:
        raise NotImplementedError

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Self:
        raise NotImplementedError

    def log_tail(self, chars: int = 6000) -> str:
        raise NotImplementedError

    def kill(self) -> None:
        """Crash it (SIGKILL): nothing is flushed, unloaded or unregistered."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused process must still die
            process.kill()
        process.wait()

    def stop(self) -> int:
        """Clean shutdown (SIGTERM, wait); returns the exit code. SIGKILL if it hangs."""
        process, self.process = self.process, None
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                return process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise AssertionError(
                    f"{self.describe()} did not stop within {self.stop_timeout}s of "
                    f"SIGTERM:\n{self.log_tail()}"
                ) from None
        return process.returncode

    def restart(self, *, kill: bool = False) -> Self:
        """Stop (or kill) and start again on the same directories and ports."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()
