"""G1 at rack scale: ``fxkit gate g1 --stage health`` on 8, 32 and 64 lab hosts (issue 26 §5).

    sudo .venv/bin/python bench/g1_scale.py --hosts 8,32,64 --runs 3 \
        --json bench/results/g1-scale.json

One lab fleet of the largest size (profile mi308x: stand-in amd-smi, lspci, sysfs; docs/lab.md)
is brought up once; each run is the command as a user types it, ``fxkit gate g1 --stage health
-i <fleet> -i <gpu_nodes: the first N hosts> -e @<the site's figures> --out DIR``, through
fxkit's console entry point in a process of its own (the sizes interleaved, round by round).
That process is the controller: its CPU time (``getrusage``: every thread, paramiko's
transports, the checks, the console, the reports) is taken when the command ends, and split
into phases by wrapping ``GateRun.plan``, ``GateRun.run`` (the checks) and ``write_reports``.
After the command the process times the HTML report alone (``fxkit.gate.html.render`` on the
saved result.json, median of 3), which the command's own figures do not include. The 1-minute
load average is sampled every second while the command runs: this machine has 2 cores, which
the hosts' sshd and stand-ins share with the controller. ``--forks N`` passes ``-f N``;
``--cprofile DIR`` profiles the controller (cProfile on thread CPU time, every thread merged).

Targets: the controller's CPU per host-check flat from 8 to 64 hosts (64 hosts within 1.10x of
8, for the whole command and for the checks phase alone), the wall time growing <= 2.1x from 32
to 64 hosts, the HTML report of 64 hosts rendering in < 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
#: What only the site can give (the health stage's ``requires:``), and what the lab cannot
#: change: its hosts boot this machine's kernel (as scripts/gate_report_example.py).
SITE_VARS: dict[str, Any] = {
    "g1_memory_online_min_gib": 2048,
    "g1_idle_power_max_w": 300,
    "g1_idle_gfx_clock_max_mhz": 200,
    "rocm_host_kernel_args": [],
}
STAGE = "health"
#: Flat: CPU per host-check at the largest size within this factor of the smallest's.
FLAT = 1.10
WALL_GROWTH_MAX = 2.1
RENDER_MAX_S = 2.0


def cpu_s() -> float:
    """This process's CPU time so far, user and system, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Phases:
    """Wall and CPU seconds of the controller's phases, marked by wrapping its functions."""

    def __init__(self) -> None:
        self.marks: dict[str, tuple[float, float]] = {}

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), cpu_s()
            try:
                return original(*args, **kwargs)
            finally:
                self.marks[phase] = (time.perf_counter() - wall, cpu_s() - cpu)

        setattr(owner, name, timed)


@contextlib.contextmanager
def profiled(path: Path | None) -> Iterator[None]:
    """With ``path``: cProfile in every thread the block starts (paramiko's transports, the
    hosts' threads) and in this one, merged into one pstats file at ``path``."""
    if path is None:
        yield
        return
    profiles: list[cProfile.Profile] = []
    start = threading.Thread.run

    def run(thread: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        profiles.append(profile)
        profile.runcall(start, thread)

    threading.Thread.run = run  # type: ignore[method-assign,assignment]
    main_profile = cProfile.Profile(time.thread_time)
    main_profile.enable()
    try:
        yield
    finally:
        main_profile.disable()
        threading.Thread.run = start  # type: ignore[method-assign]
        stats = pstats.Stats(main_profile)
        for profile in profiles:
            with contextlib.suppress(TypeError):  # a thread still running: not yet stopped
                stats.add(profile)
        stats.dump_stats(path)


def worker(args: argparse.Namespace) -> None:
    """One run of the command in this process; its figures as JSON on ``args.report``."""
    imports_cpu = cpu_s()
    from fxkit.cli import gate as cli_gate
    from fxkit.cli import main
    from fxkit.gate import html
    from fxkit.gate.run import GateRun
    from fxkit.gate.verdicts import load_results

    phases = Phases()
    phases.wrap(GateRun, "plan", "plan")
    phases.wrap(GateRun, "run", "checks")
    phases.wrap(cli_gate, "write_reports", "reports")
    argv = ["gate", "g1", "--stage", STAGE, "--out", str(args.out), "-e", f"@{args.vars}"]
    argv += [part for source in args.inventory for part in ("-i", source)]
    argv += ["--forks", str(args.forks)] if args.forks else []
    code = 0
    sys.argv = ["fxkit", *argv]
    with profiled(args.cprofile):
        try:
            main()  # the console entry point, as `fxkit gate ...` runs it
        except SystemExit as exc:
            code = int(exc.code or 0)
    wall = time.time() - args.spawned
    cpu = cpu_s()
    result = load_results(args.out / "result.json")
    renders = []
    for _ in range(3):
        started = time.perf_counter()
        html.render(result)
        renders.append(time.perf_counter() - started)
    figures = {
        "exit_code": code,
        "wall_s": wall,
        "cpu_s": cpu,
        "python_start_cpu_s": imports_cpu,
        "phases": {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in phases.marks.items()},
        "render_s": statistics.median(renders),
        "hosts": len(result.hosts),
        "host_checks": sum(len(h.checks) for h in result.hosts.values()),
        "summary": {str(k): v for k, v in result.summary.items() if v},
    }
    args.report.write_text(json.dumps(figures))


@contextlib.contextmanager
def load_sampler(every: float = 1.0) -> Iterator[list[float]]:
    """The 1-minute load average, sampled every ``every`` seconds while the block runs."""
    samples = [os.getloadavg()[0]]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every):
            samples.append(os.getloadavg()[0])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()
        samples.append(os.getloadavg()[0])


def one_run(
    fleet_inventory: Path,
    names: list[str],
    folder: Path,
    cprofile: Path | None = None,
    forks: int | None = None,
) -> dict[str, Any]:
    """``fxkit gate g1 --stage health`` on ``names``, in a process of its own: its figures."""
    groups = folder / "gpu_nodes.yml"
    hosts: dict[str, dict[str, Any]] = {name: {} for name in names}
    nodes = {"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}
    groups.write_text(yaml.safe_dump(nodes))
    extra = folder / "vars.yml"
    extra.write_text(yaml.safe_dump(SITE_VARS))
    report = folder / "figures.json"
    command = [
        sys.executable, __file__, "--worker", "--out", str(folder / "out"),
        "--vars", str(extra), "--report", str(report),
        "-i", str(fleet_inventory), "-i", str(groups),
    ]  # fmt: skip
    if cprofile is not None:
        command += ["--cprofile", str(cprofile)]
    if forks:
        command += ["--forks", str(forks)]
    with (folder / "console.log").open("w") as log, load_sampler() as load:
        command += ["--spawned", repr(time.time())]
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not report.is_file():
        tail = (folder / "console.log").read_text()[-2000:]
        raise SystemExit(f"the gate run on {len(names)} hosts failed ({done.returncode}):\n{tail}")
    figures: dict[str, Any] = json.loads(report.read_text())
    figures["load_max"] = max(load)
    figures["load_mean"] = statistics.fmean(load)
    return figures


def _median(figures: list[dict[str, Any]], get: Callable[[dict[str, Any]], float]) -> float:
    return statistics.median(get(f) for f in figures)


def summarize(runs: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per size: the medians of the runs."""
    rows = []
    for hosts, figures in sorted(runs.items()):
        median = functools.partial(_median, figures)

        checks = figures[0]["host_checks"]
        cpu = median(lambda f: f["cpu_s"])
        checks_cpu = median(lambda f: f["phases"]["checks"]["cpu_s"])
        rows.append({
            "hosts": hosts,
            "runs": len(figures),
            "host_checks": checks,
            "wall_s": round(median(lambda f: f["wall_s"]), 2),
            "checks_wall_s": round(median(lambda f: f["phases"]["checks"]["wall_s"]), 2),
            "cpu_s": round(cpu, 2),
            "checks_cpu_s": round(checks_cpu, 2),
            "cpu_ms_per_host_check": round(1000 * cpu / checks, 2),
            "checks_cpu_ms_per_host_check": round(1000 * checks_cpu / checks, 2),
            "start_cpu_s": round(median(lambda f: f["cpu_s"] - sum(
                p["cpu_s"] for p in f["phases"].values())), 2),
            "reports_s": round(median(lambda f: f["phases"]["reports"]["wall_s"]), 2),
            "render_s": round(median(lambda f: f["render_s"]), 3),
            "load_max": round(max(f["load_max"] for f in figures), 2),
            "load_mean": round(statistics.fmean(f["load_mean"] for f in figures), 2),
            "summary": figures[0]["summary"],
        })  # fmt: skip
    return rows


def targets(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each target, its figure and whether it is met (None: the sizes were not run)."""
    by = {r["hosts"]: r for r in rows}
    goals: dict[str, dict[str, Any]] = {}
    if 8 in by and 64 in by:
        for key, label in (
            ("cpu_ms_per_host_check", "whole command"),
            ("checks_cpu_ms_per_host_check", "checks phase"),
        ):
            ratio = by[64][key] / by[8][key]
            goals[f"CPU per host-check flat 8->64 ({label})"] = {
                "figure": f"{by[8][key]:.2f} -> {by[64][key]:.2f} ms ({ratio:.2f}x)",
                "met": ratio <= FLAT,
            }
    if 32 in by and 64 in by:
        growth = by[64]["wall_s"] / by[32]["wall_s"]
        goals["wall growth 32->64 <= 2.1x"] = {
            "figure": f"{by[32]['wall_s']:.2f} -> {by[64]['wall_s']:.2f} s ({growth:.2f}x)",
            "met": growth <= WALL_GROWTH_MAX,
        }
    if 64 in by:
        goals["64-host HTML report renders < 2 s"] = {
            "figure": f"{by[64]['render_s']:.3f} s",
            "met": by[64]["render_s"] < RENDER_MAX_S,
        }
    return goals


def print_table(rows: list[dict[str, Any]], goals: dict[str, dict[str, Any]]) -> None:
    print(
        "| hosts | host-checks | wall s | controller CPU s | CPU ms per host-check "
        "| checks phase: wall s, CPU ms per host-check | render s | load avg (max) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['hosts']} | {r['host_checks']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} "
            f"| {r['cpu_ms_per_host_check']:.2f} | {r['checks_wall_s']:.2f}, "
            f"{r['checks_cpu_ms_per_host_check']:.2f} | {r['render_s']:.3f} "
            f"| {r['load_mean']:.2f} ({r['load_max']:.2f}) |"
        )
    for goal, got in goals.items():
        print(f"- {goal}: {got['figure']}: {'met' if got['met'] else 'NOT met'}")


def parse_counts(text: str) -> list[int]:
    return sorted({int(part) for part in text.split(",") if part.strip()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=parse_counts, default=[8, 32, 64])
    parser.add_argument("--runs", type=int, default=3, help="rounds (each size once a round)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--forks", type=int, help="fxkit gate's -f (default: its own, 50)")
    parser.add_argument("--keep", type=Path, help="keep each run's reports and console here")
    parser.add_argument(
        "--cprofile", type=Path, help="profile the controller (every thread): pstats files here"
    )
    # The worker: one run of the command, started by the benchmark.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--vars", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    parser.add_argument("-i", dest="inventory", action="append", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from fxkit.lab import Fleet

    prefix = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.hosts}
    with tempfile.TemporaryDirectory(prefix="fxkit-g1-scale-") as tmp:
        base = args.keep or Path(tmp)
        fleet = Fleet(Path(tmp) / "lab", prefix=prefix)
        print(f"lab fleet in {fleet.dir} (fxkit lab down --dir {fleet.dir} if interrupted)")
        try:
            started = time.perf_counter()
            names = fleet.up(max(args.hosts), timeout=600, profile="mi308x")
            names = sorted(fleet.hosts)
            print(f"{len(names)} mi308x hosts up in {time.perf_counter() - started:.1f} s")
            for round_ in range(args.runs):
                order = args.hosts if round_ % 2 == 0 else args.hosts[::-1]
                for count in order:
                    folder = base / f"h{count}-r{round_}"
                    folder.mkdir(parents=True, exist_ok=True)
                    profile = None
                    if args.cprofile is not None:
                        args.cprofile.mkdir(parents=True, exist_ok=True)
                        profile = args.cprofile / f"g1-{count}-r{round_}.pstats"
                    figures = one_run(fleet.inventory, names[:count], folder, profile, args.forks)
                    runs[count].append(figures)
                    print(
                        f"round {round_ + 1}, {count} hosts: {figures['wall_s']:.2f} s wall, "
                        f"{figures['cpu_s']:.2f} s CPU, render {figures['render_s']:.3f} s, "
                        f"load {figures['load_max']:.2f}, {figures['summary']}",
                        flush=True,
                    )
        finally:
            fleet.down()
    rows = summarize(runs)
    goals = targets(rows)
    print_table(rows, goals)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join(["bench/g1_scale.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cores": os.cpu_count(),
            "stage": STAGE,
            "forks": args.forks,
            "rows": rows,
            "targets": goals,
            "runs": {str(k): v for k, v in runs.items()},
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
