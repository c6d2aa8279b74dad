"""Disk usage and the read-only switch.

Usage is the disk's own used fraction of the fuller of the journal and ledger filesystems, or,
with ``disk_quota_bytes`` set, the bytes in the bookie's directories over that quota. Over
``disk_usage_threshold`` the bookie turns read-only; it turns writable again only under
``disk_usage_lwm``, so it does not flap around one value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from magnetar.bookie.fsutil import tree_bytes


@dataclass(slots=True, frozen=True)
class DiskUsage:
    usage: float
    free_bytes: int
    total_bytes: int


def measure(journal_dir: Path, ledger_dir: Path, quota_bytes: int) -> DiskUsage:
    if quota_bytes > 0:
        used = tree_bytes(journal_dir, ledger_dir)
        return DiskUsage(used / quota_bytes, max(quota_bytes - used, 0), quota_bytes)
    worst = DiskUsage(0.0, 0, 0)
    for directory in (journal_dir, ledger_dir):
        st = os.statvfs(directory)
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        usage = 1 - free / total if total else 1.0
        if usage >= worst.usage or worst.total_bytes == 0:
            worst = DiskUsage(usage, free, total)
    return worst


def read_only_reason(usage: float, was_read_only: bool, threshold: float, lwm: float) -> str | None:
    """The reason to be read-only at this usage, or None to be writable (hysteresis on lwm)."""
    if usage >= threshold or (was_read_only and usage >= lwm):
        return (
            f"disk usage {usage:.1%} (read-only at {threshold:.0%}, writable again under {lwm:.0%})"
        )
    return None
