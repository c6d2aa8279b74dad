"""Broker registry: each live broker's ephemeral key with how to reach it and its load report.

``/magnetar/brokers/{broker_id}`` holds ``{"info": BrokerInfo, "report": LoadReport}`` as an
ephemeral key of the broker's session (Pulsar's ``/loadbalance/brokers/{broker}`` znode with its
``LocalBrokerData``): a broker is active exactly while its key exists, so a broker whose lease
expired drops out of the registry (and out of the load manager's choices) by itself.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from magnetar.broker.cluster.bundles import BundleRange
from magnetar.common.cluster.broker_info import (
    BROKERS_ROOT,
    BrokerInfo,
    registered_broker,
    registration_document,
)
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataError, MetadataStore
from magnetar.common.metadata.prefix_cache import PrefixCache

log = logging.getLogger(__name__)


class BundleStats(NamedTuple):
    """Load of one bundle on its owner: messages in + out per second and topics loaded."""

    namespace: str
    bundle: BundleRange
    msg_rate: float
    topics: int


@dataclass(slots=True, frozen=True)
class LoadReport:
    """A broker's load (Pulsar's ``LocalBrokerData``, the parts Magnetar measures)."""

    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    throughput_in: float = 0.0  # bytes per second
    throughput_out: float = 0.0
    topics: int = 0
    bundles: int = 0
    cpu_percent: float = 0.0  # of one core, this process
    memory_mb: float = 0.0  # resident
    timestamp_ms: int = 0
    #: Per-bundle load, for the leader's shedding and splitting decisions.
    bundle_stats: tuple[BundleStats, ...] = field(default=())
    #: Shutting down: its bundles are being handed to the others and it takes no new ones.
    #: (Pulsar removes a stopping broker from the load-balance registry; here it stays
    #: registered so the proxy and redirects still reach it while its bundles move.)
    draining: bool = False
    #: Usage in percent of what the broker may use (cluster/resource_usage.py), as Pulsar's
    #: LocalBrokerData has them.
    cpu_usage: float = 0.0
    memory_usage: float = 0.0
    bandwidth_in_usage: float = 0.0
    bandwidth_out_usage: float = 0.0

    @property
    def msg_rate(self) -> float:
        return self.msg_rate_in + self.msg_rate_out

    @property
    def max_resource_usage(self) -> float:
        """The highest usage percentage (Pulsar's ``getMaxResourceUsage``)."""
        return max(
            self.cpu_usage, self.memory_usage, self.bandwidth_in_usage, self.bandwidth_out_usage
        )

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["bundle_stats"] = [
            {
                "namespace": s.namespace,
                "bundle": str(s.bundle),
                "msgRate": s.msg_rate,
                "topics": s.topics,
            }
            for s in self.bundle_stats
        ]
        return {_CAMEL[k]: v for k, v in document.items()}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    @classmethod
    def from_dict(cls, document: Any) -> LoadReport:
        try:
            values = {k: document[c] for k, c in _CAMEL.items() if c in document}
            values["bundle_stats"] = tuple(
                BundleStats(
                    str(s["namespace"]),
                    BundleRange.parse(s["bundle"]),
                    float(s["msgRate"]),
                    int(s["topics"]),
                )
                for s in values.get("bundle_stats", ())
            )
            return cls(**values)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a load report: {document!r} ({e})") from e

    @classmethod
    def from_json(cls, data: bytes | str) -> LoadReport:
        try:
            return cls.from_dict(json.loads(data))
        except ValueError as e:
            raise ValueError(f"not a load report: {data!r} ({e})") from e


_CAMEL = {
    "msg_rate_in": "msgRateIn",
    "msg_rate_out": "msgRateOut",
    "throughput_in": "msgThroughputIn",
    "throughput_out": "msgThroughputOut",
    "topics": "numTopics",
    "bundles": "numBundles",
    "cpu_percent": "cpuPercent",
    "memory_mb": "memoryMb",
    "cpu_usage": "cpuUsage",
    "memory_usage": "memoryUsage",
    "bandwidth_in_usage": "bandwidthInUsage",
    "bandwidth_out_usage": "bandwidthOutUsage",
    "timestamp_ms": "timestamp",
    "bundle_stats": "bundleStats",
    "draining": "draining",
}


def broker_key(broker_id: str) -> str:
    if not broker_id or "/" in broker_id:
        raise ValueError(f"broker id must be non-empty and contain no '/': {broker_id!r}")
    return f"{BROKERS_ROOT}/{broker_id}"


def encode_entry(info: BrokerInfo, report: LoadReport) -> bytes:
    return json.dumps({"info": info.to_dict(), "report": report.to_dict()}).encode()


def decode_entry(value: bytes) -> tuple[BrokerInfo, LoadReport]:
    try:
        report = LoadReport.from_dict(registration_document(value)["report"])
        return registered_broker(value), report
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a broker registration: {value!r} ({e})") from e


class BrokerRegistry:
    """This broker's registration, and every active broker's (watch-backed once started)."""

    def __init__(self, store: MetadataStore, info: BrokerInfo) -> None:
        self.info = info
        self.key = broker_key(info.broker_id)
        self._store = store
        self._cache = PrefixCache(store, BROKERS_ROOT + "/")
        self._registered = False

    @property
    def registered(self) -> bool:
        return self._registered

    async def start(self) -> None:
        """Start following every broker's registration (``active()`` then reads no store)."""
        await self._cache.start()

    async def register(self, report: LoadReport) -> None:
        """Create our ephemeral key. A key of our broker id left by a previous session of this
        broker (same addresses) is taken over; one with other addresses is another broker
        configured with our id, which is refused (MetadataError)."""
        value = encode_entry(self.info, report)
        while True:
            try:
                version = await self._store.put(self.key, value, NOT_EXISTS, ephemeral=True)
                break
            except BadVersionError:
                current = await self._store.get(self.key)
                if current is None:
                    continue
                try:
                    holder, _ = decode_entry(current.value)
                except ValueError:
                    holder = None
                if holder is not None and holder != self.info:
                    raise MetadataError(
                        f"broker id {self.info.broker_id} is already registered by a broker at "
                        f"{holder.service_url} / {holder.http_url}; give each broker its own "
                        "advertised address and HTTP port"
                    ) from None
                try:
                    version = await self._store.put(
                        self.key, value, current.version, ephemeral=True
                    )
                except BadVersionError:
                    continue
                log.warning(
                    "broker %s: took over the registration a previous session left",
                    self.info.broker_id,
                )
                break
        self._cache.apply(self.key, value, version)
        self._registered = True
        log.info("broker %s registered", self.info.broker_id)

    async def update(self, report: LoadReport) -> None:
        """Refresh our load report (registering if not yet registered)."""
        if not self._registered:
            await self.register(report)
            return
        value = encode_entry(self.info, report)
        version = await self._store.put(self.key, value, ephemeral=True)
        self._cache.apply(self.key, value, version)

    async def active(self) -> dict[str, tuple[BrokerInfo, LoadReport]]:
        """Every registered broker: broker id -> (info, latest report)."""
        if self._cache.started:
            entries = self._cache.items()
        else:
            entries = {k: v.value for k, v in (await self._store.scan(BROKERS_ROOT + "/")).items()}
        result: dict[str, tuple[BrokerInfo, LoadReport]] = {}
        for key, value in entries.items():
            try:
                info, report = decode_entry(value)
            except ValueError as e:
                log.warning("ignoring unreadable broker registration %s: %s", key, e)
                continue
            result[info.broker_id] = (info, report)
        return result

    async def unregister(self) -> None:
        """Delete our key (graceful shutdown; a lost session deletes it by itself)."""
        self._registered = False
        if not self._store.session_lost:
            await self._store.delete(self.key)

    async def close(self) -> None:
        await self._cache.close()


class CpuMemorySampler:
    """This process's CPU use since the previous sample and its resident memory, from /proc."""

    def __init__(self) -> None:
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: tuple[float, float] | None = None

    def sample(self) -> tuple[float, float]:
        """``(cpu_percent, memory_mb)``; cpu_percent is of one core (may pass 100 with threads)
        and 0.0 on the first sample."""
        now = time.monotonic()
        cpu = self._cpu_seconds()
        last, self._last = self._last, (now, cpu)
        percent = 0.0
        if last is not None and now > last[0]:
            percent = max(0.0, (cpu - last[1]) / (now - last[0]) * 100.0)
        return percent, self._resident_mb()

    def _cpu_seconds(self) -> float:
        try:
            with open("/proc/self/stat") as f:
                # The command name (field 2) may hold spaces; fields after its ')' are fixed.
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / self._ticks  # utime, stime
        except (OSError, IndexError, ValueError):
            return time.process_time()

    @staticmethod
    def _resident_mb() -> float:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024.0
        except (OSError, IndexError, ValueError):
            pass
        return 0.0


_sampler = CpuMemorySampler()


def cpu_and_memory() -> tuple[float, float]:
    """``(cpu_percent, memory_mb)`` of this process: CPU since the previous call (of one core),
    resident memory now. Read from /proc (no psutil)."""
    return _sampler.sample()
