"""A/B of fxkit against an earlier fxkit on one lab fleet: first and second runs of
bench/provision.py's workload, the two trees in alternating order each round; the medians of the
within-round ratios (this tree / the earlier one) of wall time, controller CPU and hosts' CPU.

    .venv/bin/python bench/provision_ab.py --base 0679e60 --hosts 32 --rounds 5
    .venv/bin/python bench/provision_ab.py --hash-costs   # openssl's and sha256sum's CPU per file

Needs root (the lab fleet); the earlier tree is a temporary ``git worktree``. docs/BENCHMARKS.md,
Runs 6 and 7.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import provision as P

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"2 kB": 2000, "1 MiB": 2**20, "8 MiB": 8 * 2**20}


def hash_costs(times: int = 100) -> None:
    """CPU (user + system) of one ``openssl dgst -sha256`` and one ``sha256sum`` per file size."""
    with tempfile.TemporaryDirectory() as tmp:
        for label, size in SIZES.items():
            path = Path(tmp) / "f"
            path.write_bytes(bytes(size))
            costs = []
            for argv in (["openssl", "dgst", "-sha256", "-r"], ["sha256sum"]):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                for _ in range(times):
                    subprocess.run([*argv, str(path)], stdout=subprocess.DEVNULL, check=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                costs.append(f"{argv[0]} {cpu / times * 1000:.2f} ms")
            print(f"{label}: {', '.join(costs)}")


def ab(base: str, hosts: int, rounds: int, prefix: str) -> None:
    with tempfile.TemporaryDirectory(prefix="provision-ab-") as tmp:
        tree = Path(tmp) / "base"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "-q", str(tree), base], check=True)
        try:
            tools = {"base": replace(P.fxkit_tool(), env={"PYTHONPATH": str(tree)}),
                     "this": P.fxkit_tool()}  # fmt: skip
            measured = _rounds(tools, hosts, rounds, prefix, Path(tmp))
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=False)
    for phase in ("first", "second"):
        for what in ("wall_s", "controller_cpu_s", "hosts_cpu_s"):
            ratios = [
                getattr(r["this"][phase], what) / getattr(r["base"][phase], what) for r in measured
            ]
            print(f"{phase} run, {what}: this / {base} = {statistics.median(ratios):.2f} "
                  f"(rounds: {' '.join(f'{x:.2f}' for x in ratios)})")  # fmt: skip


def _rounds(tools: dict, hosts: int, rounds: int, prefix: str, tmp: Path) -> list[dict]:
    P.become_subreaper()
    measured = []
    with P.lab_fleet(tmp / "lab", prefix, hosts) as fleet:
        names = sorted(fleet.hosts, key=lambda n: fleet.hosts[n]["index"])[:hosts]
        inventory = P.write_inventories(fleet, names, tmp)
        for number in range(rounds):
            order = ["base", "this"] if number % 2 == 0 else ["this", "base"]
            row: dict[str, dict[str, P.Run]] = {}
            for tag in order:
                P.reset(fleet, names)
                row[tag] = {
                    phase: P.measure(tools[tag], fleet, names, inventory, phase, number)
                    for phase in ("first", "second")
                }
                print(f"round {number + 1} {tag}: " + ", ".join(
                    f"{phase} {run.wall_s:.2f} s wall, {run.controller_cpu_s:.2f} s controller, "
                    f"{run.hosts_cpu_s:.2f} s hosts" for phase, run in row[tag].items()
                ), flush=True)  # fmt: skip
            measured.append(row)
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the earlier fxkit (a git revision)")
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefix", default="127.91.7", help="the fleet's addresses (127.x.y)")
    parser.add_argument("--hash-costs", action="store_true", help="only the hashers' CPU")
    args = parser.parse_args()
    if args.hash_costs:
        hash_costs()
    else:
        ab(args.base, args.hosts, args.rounds, args.prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
