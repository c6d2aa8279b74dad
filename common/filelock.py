"""Exclusive ownership of a file or directory by one process, through ``flock``."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path


class LockedError(OSError):
    """Another process holds the lock."""


def acquire_lock(lock_path: Path, what: str) -> int:
    """Take the exclusive lock on ``lock_path`` (created if needed) for ``what``, or raise
    LockedError naming the holder's pid. The lock lasts while the returned fd is open."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockedError(
            errno.EBUSY,
            f"{what} is in use: {lock_path} is locked by another process (pid {holder}); "
            "stop that process or use another path",
        ) from None
    # Record our pid so the next refused opener can say who holds the lock.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
