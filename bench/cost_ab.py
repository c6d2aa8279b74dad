"""A/B of the broker's cost per message: this tree against another (``--baseline``, e.g. a git
worktree of an earlier commit) or against itself under other environment variables
(``--variant NAME=VAR=VALUE,...``), on the unbatched workload of ``e2e_bench.py --cost``.

Each round starts a fresh standalone per side, in alternating order, and runs the workload once
(no warm-up, so no checkpoint falls inside the run: this compares the hot path only; the
checkpoint's cost is counted by ``e2e_bench.py --cost --settle``). ``--pin`` puts the broker on
CPU 1 and the clients on CPU 0, which takes most of the scheduler's noise out of a comparison
of code (the absolute figures then differ from a shared machine's).

    python bench/cost_ab.py --baseline /tmp/wt_base [--rounds 4] [--pin] [--messages 100000]
    python bench/cost_ab.py --variant nice=MAGNETAR_X=1 [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="source tree to compare with (a git worktree)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=VAR=VALUE[,VAR=VALUE]: this tree with these environment variables",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--pin", action="store_true", help="broker on CPU 1, clients on CPU 0")
    args = parser.parse_args()
    sides: dict[str, tuple[Path | None, dict[str, str]]] = {"current": (None, {})}
    if args.baseline:
        sides["baseline"] = (Path(args.baseline).resolve(), {})
    for spec in args.variant:
        name, _, assignments = spec.partition("=")
        env = dict(item.split("=", 1) for item in assignments.split(",") if "=" in item)
        sides[name] = (None, env)
    if len(sides) < 2:
        parser.error("give --baseline or at least one --variant")
    if args.pin and (os.cpu_count() or 1) < 2:
        parser.error("--pin needs two CPUs")
    results: dict[str, list[e2e_bench.CostResult]] = {name: [] for name in sides}
    processes = e2e_bench.Processes()
    saved_env = dict(os.environ)
    try:
        for number in range(args.rounds):
            order = list(sides.items())
            if number % 2:
                order.reverse()
            for name, (source, env) in order:
                workdir = Path(tempfile.mkdtemp(prefix="cost-ab-"))
                os.environ.update(env)
                if args.pin:
                    os.sched_setaffinity(0, {1})  # the broker inherits it
                try:
                    broker = e2e_bench.start_magnetar(processes, workdir, name, source)
                finally:
                    os.environ.clear()
                    os.environ.update(saved_env)
                if args.pin:
                    os.sched_setaffinity(0, {0})  # and the clients this one
                try:
                    result = e2e_bench.run_cost(
                        processes, broker, workdir, args.messages, 256, batched=False
                    )
                finally:
                    processes.stop(broker.process)
                    if args.pin:
                        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
                results[name].append(result)
                print(
                    f"round {number + 1} {name:<10} {result.us_per_message:6.2f} us/msg "
                    f"{result.rate:9,.0f} msg/s  {result.problems}",
                    flush=True,
                )
    finally:
        processes.stop_all()
    print()
    for name, runs in results.items():
        print(
            f"{name:<10} median {statistics.median(r.us_per_message for r in runs):6.2f} us/msg"
            f"  min {min(r.us_per_message for r in runs):6.2f}"
            f"  rate median {statistics.median(r.rate for r in runs):9,.0f} msg/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
