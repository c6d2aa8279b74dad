"""Ledger recovery time: how long a new owner waits to open a ledger whose writer stopped with
many entries past the LAC the bookies know.

Starts a private etcd and three real bookie processes; for each size N a writer pipelines N
adds (E3/Qw2/Qa2, 200-byte entries), all acknowledged, so nearly every entry carries a LAC far
behind it; then another client opens the ledger with recovery (fence, read past the LAC,
re-add, close). Prints the entries recovered and the time, per size and round.

    python bench/ledger_recovery_bench.py [--sizes 100,2000,5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.ledger_cluster import LedgerCluster  # noqa: E402


async def one_round(cluster: LedgerCluster, size: int) -> tuple[int, float]:
    """Write ``size`` entries; return (last entry recovered, seconds)."""
    async with cluster.client() as writer_client:
        handle = await writer_client.create_ledger(3, 2, 2)
        added = [await handle.add_async(b"x" * 200) for _ in range(size)]
        await asyncio.gather(*added)  # then the writer stops without closing the ledger
    async with cluster.client() as recoverer:
        started = time.perf_counter()
        recovered = await recoverer.open_ledger(handle.ledger_id)
        seconds = time.perf_counter() - started
    return recovered.metadata.last_entry_id, seconds


async def main(sizes: list[int], rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="magnetar-recovery-bench-") as workdir:
        cluster = LedgerCluster(Path(workdir), 3).start()
        try:
            for size in sizes:
                times = []
                for _ in range(rounds):
                    last, seconds = await one_round(cluster, size)
                    assert last == size - 1, f"recovered to entry {last}, expected {size - 1}"
                    times.append(seconds)
                best, worst = min(times), max(times)
                print(
                    f"{size:>6} pipelined entries: recovered in {best:.2f}-{worst:.2f} s "
                    f"({best / size * 1e3:.2f}-{worst / size * 1e3:.2f} ms per entry, "
                    f"{rounds} rounds)",
                    flush=True,
                )
        finally:
            cluster.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,2000,5000", help="comma list of ledger sizes")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.rounds))
