"""Autorecovery: re-replication throughput and the time from a bookie's loss to full replication.

Starts a private etcd and N real bookie processes (``tests/support/ledger_cluster``), writes
``--mb`` MB in E2/Qw2/Qa2 ledgers (closed), then SIGKILLs the bookie holding most of them and
measures, while a paced writer keeps adding to a ledger on the other bookies:

- loss -> marked: until the auditor marks the first ledger (session TTL + lost_bookie_recovery_delay);
- marked -> replicated: until no mark is left and no ledger names the lost bookie;
- MB/s: bytes the workers copied (their ``magnetar_bookie_replicated_bytes``) over that time;
- the paced writer's add latency before the loss and during re-replication (p50 / p99).

    python bench/recovery_bench.py [--mb 64] [--bookies 4] [--rate-by-bytes 0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from magnetar.common.ledger.client import LedgerClient  # noqa: E402
from magnetar.common.ledger.metadata import LEDGERS_PATH, LedgerMetadata  # noqa: E402
from magnetar.common.ledger.underreplication import MARKS_PATH  # noqa: E402
from magnetar.common.metadata import open_store  # noqa: E402
from tests.support.ledger_cluster import LedgerCluster  # noqa: E402

ENTRY_SIZE = 4096
LEDGERS = 8
_REPLICATED = re.compile(r"^magnetar_bookie_replicated_bytes_total (\S+)$", re.M)


def replicated_bytes(http_url: str) -> float:
    with urllib.request.urlopen(http_url + "/metrics", timeout=5) as response:
        found = _REPLICATED.search(response.read().decode())
    return float(found.group(1)) if found else 0.0


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


class PacedWriter:
    """Adds 1 KiB entries at ``rate``/s to one ledger, recording each add's latency."""

    def __init__(self, client: LedgerClient, rate: float) -> None:
        self.client = client
        self.rate = rate
        self.latencies: list[tuple[float, float]] = []  # (sent at, seconds)
        self._stop = asyncio.Event()

    async def run(self, avoid: str) -> None:
        handle = await self.client.create_ledger(2, 2, 2)
        while avoid in handle.ensemble:  # keep the writer off the bookie that will die
            await handle.close()
            handle = await self.client.create_ledger(2, 2, 2)
        payload = b"x" * 1024
        while not self._stop.is_set():
            started = time.monotonic()
            await handle.add(payload)
            self.latencies.append((started, time.monotonic() - started))
            await asyncio.sleep(max(0.0, 1 / self.rate - (time.monotonic() - started)))
        await handle.close()

    def stop(self) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> list[float]:
        return [s for t, s in self.latencies if start <= t < end]


async def bench(args: argparse.Namespace, cluster: LedgerCluster) -> dict[str, object]:
    store = await open_store(cluster.url)
    client = LedgerClient(store)
    per_ledger = int(args.mb * 1e6 / ENTRY_SIZE / LEDGERS)
    payload = b"r" * ENTRY_SIZE
    for _ in range(LEDGERS):
        handle = await client.create_ledger(2, 2, 2)
        for _ in range(per_ledger):
            await handle.add_async(payload)
        await handle.close()

    async def ledgers() -> dict[int, LedgerMetadata]:
        found = await store.scan(LEDGERS_PATH + "/")
        return {
            int(k.rsplit("/", 1)[1]): LedgerMetadata.from_bytes(v.value) for k, v in found.items()
        }

    counts: dict[str, int] = {}
    for metadata in (await ledgers()).values():
        for address in {b for f in metadata.fragments for b in f.bookies}:
            counts[address] = counts.get(address, 0) + 1
    victim = max(counts, key=counts.__getitem__)
    lost_bytes = sum(
        m.length for m in (await ledgers()).values() if victim in m.fragments[0].bookies
    )

    writer = PacedWriter(client, args.writer_rate)
    writer_task = asyncio.create_task(writer.run(victim))
    await asyncio.sleep(args.baseline_s)
    survivors = [b for b in cluster.bookies if b.address != victim]
    before = sum(replicated_bytes(b.http_url) for b in survivors)
    killed_at = time.monotonic()
    cluster.bookie(victim).kill()
    marked_at = None
    while True:
        marks = await store.scan(MARKS_PATH + "/")
        now = time.monotonic()
        if marks and marked_at is None:
            marked_at = now
        if marked_at is not None and not marks:
            if all(
                victim not in {b for f in m.fragments for b in f.bookies}
                for m in (await ledgers()).values()
            ):
                break
        await asyncio.sleep(0.05)
    done_at = time.monotonic()
    copied = sum(replicated_bytes(b.http_url) for b in survivors) - before
    writer.stop()
    await writer_task
    baseline = writer.between(killed_at - args.baseline_s, killed_at)
    during = writer.between(marked_at, done_at)
    await client.close()
    await store.close()
    return {
        "data_mb": round(args.mb, 1),
        "bookies": args.bookies,
        "lost_bookie_mb": round(lost_bytes / 1e6, 1),
        "copied_mb": round(copied / 1e6, 1),
        "replication_rate_by_bytes": args.rate_by_bytes,
        "loss_to_marked_s": round(marked_at - killed_at, 2),
        "marked_to_replicated_s": round(done_at - marked_at, 2),
        "loss_to_replicated_s": round(done_at - killed_at, 2),
        "rereplication_mb_per_s": round(copied / 1e6 / (done_at - marked_at), 1),
        "writer_add_ms_before": {
            "p50": round(percentile(baseline, 50), 2),
            "p99": round(percentile(baseline, 99), 2),
        },
        "writer_add_ms_during": {
            "p50": round(percentile(during, 50), 2),
            "p99": round(percentile(during, 99), 2),
            "mean": round(statistics.fmean(during) * 1000, 2) if during else None,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64.0, help="data written first [64]")
    parser.add_argument("--bookies", type=int, default=4, help="bookie processes [4]")
    parser.add_argument(
        "--rate-by-bytes", type=int, default=0, help="replication_rate_by_bytes [0: no limit]"
    )
    parser.add_argument("--writer-rate", type=float, default=200.0, help="paced adds/s [200]")
    parser.add_argument("--baseline-s", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp:
        cluster = LedgerCluster(
            Path(tmp),
            args.bookies,
            session_ttl_s=3,
            lost_bookie_recovery_delay=0.0,
            replication_rate_by_bytes=args.rate_by_bytes,
            journal_sync=True,
        )
        try:
            cluster.start()
            result = asyncio.run(bench(args, cluster))
        finally:
            cluster.close()
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
