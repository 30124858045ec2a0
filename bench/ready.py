#!/usr/bin/env python3
"""Time to ready: N `fxkit serve-probe` instances on one host, fxkit's loader against the baseline.

For each N (1, 2, 4) and each loader, N instances of the probe are started at once on loopback
ports, all loading the same checkpoint from one disk, cold: before every fleet the checkpoint's
files (and, behind a FUSE mount, their backing files) are evicted from the page cache and checked
with mincore; ``--drop-caches`` also drops the whole page cache (``echo 1 >
/proc/sys/vm/drop_caches``: Python and torch start cold too). An instance's time to ready runs
from just before its process is spawned to the first ``GET /v1/models`` that lists its served name
(polled every 10 ms); the **fleet time to ready** runs from the first spawn to the last instance
ready, as a rollout's batch waits. From each instance's /metrics: its load seconds, its startup
(spawn to the load's start: Python, torch, the imports) and its CPU seconds when ready (the table
gives the slowest instance's load and startup, and the fleet's CPU seconds summed).

``fxkit`` is ``--load-format fxkit`` (its default, ``--share``: the instances split each file's
reads and map one copy in the page cache); ``baseline`` is ``--load-format safetensors``
(``safetensors.torch.load_file`` per file, mmap, which also shares the page cache). Rounds are
interleaved, the order of the loaders rotated each round; ``x baseline`` is the median over rounds
of the baseline's fleet seconds over fxkit's within the round (``load x baseline``: the same for
the slowest instance's load seconds, the loader alone). ``disk`` is the bytes read from the
checkpoint's block device (/proc/diskstats) during the fleet's start, over the checkpoint's bytes.

``--latency MS`` serves the checkpoint through bench/latency_fuse (a read-only FUSE passthrough
that delays every request MS ms, as network storage would; see bench/remote_fs.py).

    python bench/ready.py MODEL --instances 1,2,4 --rounds 3 --json docs/bench/ready.json
    python bench/ready.py MODEL --latency 1 --json docs/bench/ready_fuse.json   # needs root
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fxkit.loader import cache, open_checkpoint
from fxkit.loader.files import model_files
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from fxkit.loadbench.bench_ranks import SECTOR, block_device, sectors_read

METHODS = {"baseline": "safetensors", "fxkit": "fxkit"}  # name -> --load-format
TARGET = {"instances": 4, "x_baseline": 1.5}  # issue 11: fleet time to ready at N = 4
POLL = 0.01  # seconds between sweeps of /v1/models
TIMEOUT = 600.0  # seconds for a fleet to be ready


@dataclass
class Instance:
    """One probe process: its port, served name, spawn and ready times (time.monotonic)."""

    name: str
    port: int
    proc: subprocess.Popen
    spawned: float
    spawned_unix: float
    ready: float | None = None

    def answers(self) -> bool:
        url = f"http://127.0.0.1:{self.port}/v1/models"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                listed = [card["id"] for card in json.load(response)["data"]]
        except OSError:
            return False
        return self.name in listed

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of its /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            families = text_string_to_metric_families(r.read().decode())
        return {s.name: s.value for family in families for s in family.samples if not s.labels}


@dataclass
class Fleet:
    """One fleet start: N instances of one loader, in one round."""

    method: str
    instances: int
    round: int
    fleet_s: float = 0.0
    ready_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    #: from the spawn to the load's start (Python, torch, fxkit: the imports), per instance
    startup_s: list[float] = field(default_factory=list)
    #: CPU seconds (user + system) of each instance's process when it was ready
    cpu_s: list[float] = field(default_factory=list)
    disk: float | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(model: Path, method: str, name: str) -> Instance:
    port = free_port()
    argv = [
        sys.executable, "-m", "fxkit", "serve-probe", str(model), "--port", str(port),
        "--served-model-name", name, "--load-format", METHODS[method],
    ]  # fmt: skip
    spawned, spawned_unix = time.monotonic(), time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return Instance(name, port, proc, spawned, spawned_unix)


def stop(instances: list[Instance]) -> list[str]:
    """SIGTERM each (by PID), wait; the problems (a status other than 0, with stderr's tail)."""
    for inst in instances:
        if inst.proc.poll() is None:
            inst.proc.send_signal(signal.SIGTERM)
    problems = []
    for inst in instances:
        try:
            _, err = inst.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            inst.proc.kill()
            _, err = inst.proc.communicate()
        if inst.proc.returncode != 0:
            problems.append(f"{inst.name}: exit {inst.proc.returncode}: {err.strip()[-300:]}")
    return problems


def cold(files: list[Path], drop_all: bool) -> None:
    if drop_all:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    if left := cache.evict_all(files):
        raise RuntimeError(f"still resident after eviction: {left}")


def start_fleet(model: Path, method: str, n: int, rnd: int, evict: list[Path], args) -> Fleet:
    """N instances of ``method`` at once, cold; timed until every one lists its model."""
    cold(evict, args.drop_caches)
    disk = block_device(evict[0])
    before = sectors_read(disk) if disk else 0
    started = time.monotonic()
    fleet = [spawn(model, method, f"{method}-{i}") for i in range(n)]
    try:
        deadline = started + TIMEOUT
        while (waiting := [i for i in fleet if i.ready is None]) and time.monotonic() < deadline:
            for inst in waiting:
                if inst.proc.poll() is not None:
                    raise RuntimeError(f"{inst.name} exited {inst.proc.returncode}: "
                                       f"{inst.proc.stderr.read().strip()[-500:]}")  # fmt: skip
                if inst.answers():
                    inst.ready = time.monotonic()
            time.sleep(POLL)
        if waiting:
            raise RuntimeError(f"not ready after {TIMEOUT} s: {[i.name for i in waiting]}")
        after = sectors_read(disk) if disk else 0
        result = Fleet(method, n, rnd)
        result.fleet_s = max(i.ready for i in fleet if i.ready) - started
        result.ready_s = [i.ready - i.spawned for i in fleet if i.ready]
        for inst in fleet:
            metrics = inst.metrics()
            result.load_s.append(metrics["fxkit_load_seconds"])
            loaded = metrics["fxkit_load_end_time_seconds"] - metrics["fxkit_load_seconds"]
            result.startup_s.append(loaded - inst.spawned_unix)
            result.cpu_s.append(metrics["process_cpu_seconds_total"])
        if disk:
            result.disk = (after - before) * SECTOR / args.file_bytes
    finally:
        problems = stop(fleet)
    if problems:
        raise RuntimeError("; ".join(problems))
    return result


def bench(model: Path, evict: list[Path], args) -> list[Fleet]:
    """Interleaved rounds: in each, every N, every loader (order rotated per round)."""
    runs, console = [], Console(stderr=True)
    names = list(METHODS)
    for rnd in range(args.rounds):
        for n in args.instances:
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for method in order:
                run = start_fleet(model, method, n, rnd, evict, args)
                disk = "-" if run.disk is None else f"{run.disk:.2f}"
                console.print(
                    f"round {rnd} N={n} {method}: fleet {run.fleet_s:.2f} s, startup "
                    f"{max(run.startup_s):.2f} s, load {max(run.load_s):.2f} s, disk {disk}",
                    highlight=False,
                )
                runs.append(run)
    return runs


def summarise(runs: list[Fleet], counts: list[int], rounds: int) -> list[dict]:
    rows = []
    for n in counts:
        for method in METHODS:
            mine = [r for r in runs if r.instances == n and r.method == method]
            ratios, load_ratios = [], []
            for rnd in range(rounds):
                (base,) = [
                    r for r in runs if (r.instances, r.method, r.round) == (n, "baseline", rnd)
                ]
                (this,) = [r for r in mine if r.round == rnd]
                ratios.append(base.fleet_s / this.fleet_s)
                load_ratios.append(max(base.load_s) / max(this.load_s))
            disks = [r.disk for r in mine if r.disk is not None]
            rows.append({
                "instances": n,
                "method": method,
                "fleet_s": statistics.median(r.fleet_s for r in mine),
                "fleet_min_s": min(r.fleet_s for r in mine),
                "fleet_max_s": max(r.fleet_s for r in mine),
                "ready_median_s": statistics.median(s for r in mine for s in r.ready_s),
                "load_s": statistics.median(max(r.load_s) for r in mine),
                "startup_s": statistics.median(max(r.startup_s) for r in mine),
                "cpu_s": statistics.median(sum(r.cpu_s) for r in mine),
                "disk": statistics.median(disks) if disks else None,
                "x_baseline": statistics.median(ratios),
                "load_x_baseline": statistics.median(load_ratios),
            })  # fmt: skip
    return rows


COLUMNS = (  # header, summary key (seconds unless said)
    ("fleet s", "fleet_s"), ("min", "fleet_min_s"), ("max", "fleet_max_s"),
    ("instance s", "ready_median_s"), ("startup s", "startup_s"), ("load s", "load_s"),
    ("CPU s", "cpu_s"),
    ("disk", "disk"), ("x baseline", "x_baseline"), ("load x baseline", "load_x_baseline"),
)  # fmt: skip


def table(rows: list[dict], title: str) -> Table:
    out = Table(title=title)
    for header in ("N", "loader", *(h for h, _ in COLUMNS)):
        out.add_column(header, justify="right")
    for r in rows:
        cells = ("-" if r[key] is None else f"{r[key]:.2f}" for _, key in COLUMNS)
        out.add_row(str(r["instances"]), r["method"], *cells)
    return out


@contextlib.contextmanager
def served(model: Path, latency: float | None) -> Iterator[tuple[Path, list[Path]]]:
    """The path the probes load, and the files to evict (behind a FUSE mount: both sides)."""
    files = model_files(model).files
    if latency is None:
        yield model, files
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from remote_fs import build_latency_fuse, latency_fuse_mount

    with tempfile.TemporaryDirectory(prefix="fxbench-ready-") as work:
        program = build_latency_fuse(Path(work))
        with latency_fuse_mount(program, model, Path(work) / "mnt", latency) as mnt:
            yield mnt, [*files, *model_files(mnt).files]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="checkpoint directory")
    parser.add_argument(
        "--instances", default="1,2,4", type=lambda s: [int(x) for x in s.split(",")]
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--latency", type=float, help="ms per request, through a FUSE passthrough")
    parser.add_argument("--drop-caches", action="store_true", help="drop the whole page cache too")
    parser.add_argument("--json", help="write the runs and the summary here")
    args = parser.parse_args()
    model = Path(args.model).resolve()
    checkpoint = open_checkpoint(model)
    args.file_bytes = sum(f.stat().st_size for f in model_files(model).files)
    console = Console(width=120)
    load_before = os.getloadavg()
    with served(model, args.latency) as (path, evict):
        runs = bench(path, evict, args)
    load_after = os.getloadavg()
    rows = summarise(runs, args.instances, args.rounds)
    where = f"through FUSE +{args.latency} ms" if args.latency is not None else "local"
    title = (
        f"time to ready, {checkpoint.total_bytes / 1e9:.2f} GB in {len(checkpoint.files)} files, "
        f"{where}, cold, {args.rounds} rounds; load average {load_before[0]:.1f} -> "
        f"{load_after[0]:.1f} on {os.cpu_count()} CPUs"
    )
    console.print(table(rows, title))
    target = next(
        (r for r in rows if r["instances"] == TARGET["instances"] and r["method"] == "fxkit"), None
    )
    if target is not None:
        met = target["x_baseline"] >= TARGET["x_baseline"]
        console.print(
            f"target: fxkit fleet time to ready >= {TARGET['x_baseline']}x the baseline's at "
            f"N = {TARGET['instances']}: {target['x_baseline']:.2f}x, {'met' if met else 'missed'}"
        )
    if args.json:
        report = {
            "model": str(model), "latency_ms": args.latency, "rounds": args.rounds,
            "drop_caches": args.drop_caches, "nbytes": checkpoint.total_bytes,
            "loadavg_before": load_before, "loadavg_after": load_after, "cpus": os.cpu_count(),
            "summary": rows, "runs": [asdict(r) for r in runs],
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
