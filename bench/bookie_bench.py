"""Bookie add throughput and latency against the disk's own limits, measured in one run.

Starts a real bookie process (journal fsync on) on a scratch directory, then for each entry size
keeps ``--in-flight`` adds outstanding over one gRPC stream and reports adds/s, MB/s and add
latency percentiles. Beside them it measures the same disk's fsync rate (4 KiB write +
fdatasync, one at a time) and sequential write bandwidth (1 MiB writes, fsync at the end) and
prints the ratio.

    python bench/bookie_bench.py [--dir /path/on/the/disk] [--seconds 5] [--in-flight 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from magnetar.common.ledger.bookie_client import BookieClient
from magnetar.common.ledger.entry import encode_entry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.etcd import free_port  # noqa: E402


def disk_fsync_rate(directory: Path, seconds: float) -> float:
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = os.urandom(4096)
    count = 0
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            os.write(fd, block)
            os.fdatasync(fd)
            count += 1
    finally:
        os.close(fd)
        path.unlink()
    return count / seconds


def disk_seq_bandwidth(directory: Path, total_bytes: int) -> float:
    path = directory / "seq-probe"
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    try:
        for _ in range(total_bytes // len(block)):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    path.unlink()
    return total_bytes / elapsed


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


async def run_size(
    address: str, ledger_id: int, size: int, seconds: float, in_flight: int
) -> dict[str, float]:
    payload = os.urandom(size)
    latencies: list[float] = []
    async with BookieClient(address, timeout=30) as client:
        await client.wait_ready()
        window = asyncio.Semaphore(in_flight)
        entry_id = 0
        started = time.perf_counter()
        deadline = started + seconds
        pending: set[asyncio.Future[None]] = set()

        def done(fut: asyncio.Future[None], t0: float) -> None:
            window.release()
            pending.discard(fut)
            if fut.exception() is None:
                latencies.append(time.perf_counter() - t0)

        while time.perf_counter() < deadline:
            await window.acquire()
            t0 = time.perf_counter()
            fut = client.add(
                ledger_id, entry_id, encode_entry(ledger_id, entry_id, entry_id - 1, 0, payload)
            )
            fut.add_done_callback(lambda f, t0=t0: done(f, t0))
            pending.add(fut)
            entry_id += 1
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.perf_counter() - started
    latencies.sort()
    acked = len(latencies)
    return {
        "size": size,
        "adds_s": acked / elapsed,
        "mb_s": acked * size / elapsed / 1e6,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "failed": entry_id - acked,
    }


def start_bookie(workdir: Path, port: int, http_port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "magnetar.cli", "--log-level", "WARNING", "bookie",
            "--metadata-url", f"local://{workdir / 'meta.db'}",
            "--bind-address", "127.0.0.1", "--port", str(port), "--http-port", str(http_port),
            "--journal-dir", str(workdir / "journal"), "--ledger-dir", str(workdir / "ledgers"),
            "--journal-sync",
        ]
    )  # fmt: skip


async def measure_bookie(args: argparse.Namespace, address: str) -> list[dict[str, float]]:
    async with BookieClient(address) as probe:
        await probe.wait_ready(30)
    rows = []
    for i, size in enumerate(args.sizes):
        rows.append(await run_size(address, 1000 + i, size, args.seconds, args.in_flight))
    return rows


def report(args: argparse.Namespace, workdir: Path, rows: list[dict[str, float]]) -> None:
    fsync_rate = disk_fsync_rate(workdir, 2.0)
    seq_bw = disk_seq_bandwidth(workdir, args.seq_mb << 20)
    print(f"disk ({workdir}): fsync {fsync_rate:,.0f}/s, sequential write {seq_bw / 1e6:,.1f} MB/s")
    print(
        f"bookie: journal fsync on, {args.in_flight} adds in flight, {args.seconds:.0f} s per size"
    )
    print(
        f"{'entry':>7} {'adds/s':>10} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'of seq bw':>9} {'failed':>6}"
    )
    for r in rows:
        ratio = r["mb_s"] * 1e6 / seq_bw
        print(
            f"{int(r['size']):>7} {r['adds_s']:>10,.0f} {r['mb_s']:>8.1f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} {ratio:>9.1%} {int(r['failed']):>6}"
        )
    one_k = next((r for r in rows if r["size"] == 1024), None)
    if one_k is not None:
        target = min(0.5 * seq_bw / 1024, 40_000)
        print(
            f"1 KB target: min(50% of seq bw, 40k adds/s) = {target:,.0f} adds/s; measured {one_k['adds_s']:,.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dir", help="scratch directory on the disk to measure [default: a temp dir]"
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1024, 65536])
    parser.add_argument(
        "--seq-mb", type=int, default=512, help="MiB written for the sequential probe"
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bookie-bench-", dir=args.dir))
    try:
        port, http_port = free_port(), free_port()
        bookie = start_bookie(workdir, port, http_port)
        try:
            rows = uvloop.run(measure_bookie(args, f"127.0.0.1:{port}"))
        finally:
            bookie.terminate()
            bookie.wait(30)
        report(args, workdir, rows)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
