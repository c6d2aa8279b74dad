"""Damaging a stopped node's files on purpose, for fault tests."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def flip_byte_of(files: Iterable[Path], payload: bytes) -> Path:
    """Flip one byte in the middle of ``payload`` where it lies in ``files`` (it must lie there
    exactly once: give unique payloads); returns the file changed."""
    found = []
    for path in files:
        data = path.read_bytes()
        at = data.find(payload)
        if at >= 0:
            found.append((path, at))
    assert len(found) == 1, f"{payload[:40]!r} found {len(found)} times"
    path, at = found[0]
    with open(path, "r+b") as f:
        f.seek(at + len(payload) // 2)
        byte = f.read(1)
        f.seek(at + len(payload) // 2)
        f.write(bytes([byte[0] ^ 0x5A]))
    return path
