"""Small file-system helpers shared by the journal and the entry logger."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a file creation or removal in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tree_bytes(*directories: Path) -> int:
    """Bytes of the regular files under the given directories."""
    total = 0
    for directory in directories:
        for root, _dirs, files in os.walk(directory):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    pass
    return total
