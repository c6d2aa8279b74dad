"""A broker's resource usage in percent of what it may use (Pulsar's ``SystemResourceUsage``):
CPU, memory, and network bandwidth in and out. The load report carries them, the load manager
avoids placing bundles on a broker whose highest usage passes
``load_balancer_broker_overloaded_threshold_percentage`` (Pulsar's meaning), and ``/metrics``
exports them as ``pulsar_lb_*_usage``.

What each is measured against (Linux, from /proc and /sys; no psutil):

- CPU: this process's CPU time since the previous sample over the CPUs it may use (the
  cgroup's ``cpu.max`` quota when one is set, else the CPUs of its affinity mask);
- memory: this process's resident memory over the cgroup's ``memory.max`` when one is set,
  else the machine's physical memory;
- bandwidth: the bytes per second the broker's topics take in and send out over the NIC speed
  (``load_balancer_override_broker_nic_speed_gbps`` when set, else the fastest speed
  /sys/class/net reports for a physical interface); 0 when no speed is known.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYS_NET = Path("/sys/class/net")


@dataclass(slots=True, frozen=True)
class ResourceUsage:
    """Percentages (0-100, CPU may pass 100 briefly when the quota is exceeded)."""

    cpu: float = 0.0
    memory: float = 0.0
    bandwidth_in: float = 0.0
    bandwidth_out: float = 0.0


def cpu_limit() -> float:
    """How many CPUs this process may use: the cgroup v2 quota, else its affinity mask."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max" and float(period) > 0:
            return max(float(quota) / float(period), 0.01)
    except (OSError, ValueError):
        pass
    try:
        return float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return float(os.cpu_count() or 1)


def memory_limit_bytes() -> float:
    """The cgroup v2 memory limit, else the machine's physical memory."""
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text != "max":
            return float(text)
    except (OSError, ValueError):
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 0.0


def nic_speed_bytes_per_second(override_gbps: float | None) -> float:
    """The NIC speed in bytes per second: the override, else the fastest physical interface
    (one with a ``device`` link) /sys/class/net reports; 0 when unknown."""
    if override_gbps:
        return override_gbps * 1e9 / 8
    fastest = 0.0
    try:
        interfaces = list(SYS_NET.iterdir())
    except OSError:
        return 0.0
    for interface in interfaces:
        if not (interface / "device").exists():
            continue  # loopback, bridges, veth pairs
        try:
            mbps = float((interface / "speed").read_text().strip())
        except (OSError, ValueError):
            continue
        fastest = max(fastest, mbps)
    return fastest * 1e6 / 8


class ResourceSampler:
    """Turns the process's CPU and memory (``registry.cpu_and_memory``, read once per load
    report) and the broker's throughput into :class:`ResourceUsage` percentages of its
    limits."""

    def __init__(self, nic_speed_gbps: float | None = None) -> None:
        self._cpus = cpu_limit()
        self._memory = memory_limit_bytes()
        self._nic = nic_speed_bytes_per_second(nic_speed_gbps)

    def sample(
        self, cpu_percent: float, memory_mb: float, throughput_in: float, throughput_out: float
    ) -> ResourceUsage:
        """``cpu_percent``: of one core since the last sample; ``throughput_in``/``_out``: the
        broker's bytes per second."""
        cpu = cpu_percent / self._cpus
        memory = memory_mb * 1024 * 1024 / self._memory * 100.0 if self._memory > 0 else 0.0
        if self._nic > 0:
            bandwidth_in = throughput_in / self._nic * 100.0
            bandwidth_out = throughput_out / self._nic * 100.0
        else:
            bandwidth_in = bandwidth_out = 0.0
        return ResourceUsage(cpu, memory, bandwidth_in, bandwidth_out)
