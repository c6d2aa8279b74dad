"""What the test support's process wrappers share: crash, stop, restart, pause and resume one
service process (a bookie, a broker) the way the fault tests need it."""

from __future__ import annotations

import signal
import subprocess
from typing import Self


class Pausable:
    """SIGSTOP / SIGCONT of the running ``process`` (a bookie, a broker, an etcd member)."""

    process: subprocess.Popen[bytes] | None

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and connections but answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


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
