"""Ledger add throughput and latency through the ledger client, on three local bookies.

Starts a private etcd and three real bookie processes (journal fsync on), then runs
``magnetar bk simpletest`` in its own process: E3/Qw2/Qa2, 1 KB entries, pipelined adds. Prints
adds/s and add latency percentiles; with ``--rate`` the adds are paced, for latency at a fixed
load.

    python bench/ledger_bench.py [--entries 100000] [--entry-size 1024] [--rate 0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.etcd import EtcdServer, free_port  # noqa: E402


def start_bookie(
    workdir: Path, metadata_url: str, index: int
) -> tuple[subprocess.Popen[bytes], int]:
    port, http_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "magnetar.cli", "--log-level", "WARNING", "bookie",
            "--metadata-url", metadata_url, "--bind-address", "127.0.0.1",
            "--advertised-address", "127.0.0.1", "--port", str(port), "--http-port", str(http_port),
            "--journal-dir", str(workdir / f"bookie{index}" / "journal"),
            "--ledger-dir", str(workdir / f"bookie{index}" / "ledgers"), "--journal-sync",
        ]
    )  # fmt: skip
    return process, http_port


def wait_ready(http_port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"bookie with HTTP port {http_port} did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument(
        "--rate", type=float, default=0, help="adds per second (0: as fast as possible)"
    )
    parser.add_argument("--dir", help="scratch directory [default: a temp dir]")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="ledger-bench-", dir=args.dir))
    etcd = EtcdServer()
    etcd.start()
    bookies = []
    try:
        for i in range(3):
            bookies.append(start_bookie(workdir, etcd.url, i))
        for _process, http_port in bookies:
            wait_ready(http_port)
        command = [
            sys.executable, "-m", "magnetar.cli", "bk", "simpletest", "--metadata-url", etcd.url,
            "--ensemble", "3", "--write-quorum", "2", "--ack-quorum", "2",
            "--entries", str(args.entries), "--entry-size", str(args.entry_size),
            "--rate", str(args.rate), "--json",
        ]  # fmt: skip
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        for process, _ in bookies:
            process.terminate()
        for process, _ in bookies:
            process.wait(30)
        etcd.close()
        shutil.rmtree(workdir, ignore_errors=True)

    pace = f"paced at {args.rate:,.0f}/s" if args.rate else "unpaced (10,000 in flight at most)"
    print(f"ledger E3/Qw2/Qa2 on 3 bookies, journal fsync on, {args.entry_size} B entries, {pace}")
    lat = result["latency_ms"]
    print(
        f"{result['acked']:,} acked, {result['failed']} failed in {result['seconds']:.2f} s: "
        f"{result['adds_per_s']:,.0f} adds/s, {result['mb_per_s']:.1f} MB/s, "
        f"latency p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms max {lat['max']:.2f} ms"
    )


if __name__ == "__main__":
    main()
