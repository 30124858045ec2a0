"""``fxkit bench load``: fxkit's loader beside the NFS baseline, the storage limit and peers.

Methods run in interleaved rounds, the order rotated each round, so slow drifts of a noisy machine
hit every method alike; ratios are the median over rounds of the ratio within a round. Each loader
run is a fresh Python process (imports done before the clock starts), so none inherits another's
memory, and its peak RSS is its own. Every loader materialises every byte: each tensor is touched
at one byte in every page (4 KiB) and at its last byte, which faults every page of an mmap in from
storage; the touch is the same cheap reduction for every method and is counted in its time. The
sum of those bytes is compared across methods. Cold runs evict the files (and ``also_evict``, for
example the server's copies behind a network mount) before every run, and verify with mincore.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from . import cache
from .errors import LoaderError
from .files import model_files

GB = 1e9
PREFETCH_THREADS = 8
PREFETCH_READ = 16 << 20
FIO_BLOCK = 16 << 20


# -- the methods -----------------------------------------------------------------------------------


def _nbytes(files: Sequence[Path]) -> int:
    return sum(f.stat().st_size for f in files)


# The methods read the model the user gave (``path``), whose files ``model_files`` found.


def _baseline(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    from safetensors.torch import load_file

    for f in files:
        yield from load_file(f).values()


def _prefetch_file(path: Path, start: int) -> None:
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        f.read(PREFETCH_READ)


def _prefetch(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    """vLLM's path for network file systems: read the files into the page cache, then load_file."""
    jobs = [(f, s) for f in files for s in range(0, f.stat().st_size, PREFETCH_READ)]
    with ThreadPoolExecutor(PREFETCH_THREADS) as pool:
        list(pool.map(lambda job: _prefetch_file(*job), jobs))
    yield from _baseline(path, files, options)


def _fxkit(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    from . import load

    yield from load(path, **options).values()


def _runai(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_files([str(f) for f in files])
        for _, tensor in streamer.get_tensors():
            yield tensor


def _fastsafetensors(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    from fastsafetensors import fastsafe_open

    with fastsafe_open([str(f) for f in files], device="cpu", nogds=True) as st:
        names = st.keys()  # a method of fastsafe_open, not a dict
        for name in names:
            yield st.get_tensor(name)


@dataclass(frozen=True)
class Method:
    """A way to load a checkpoint. ``read`` yields its tensors; ``needs`` is a tool, a module, or
    ``module:attribute``."""

    name: str
    about: str
    needs: str
    read: Callable[[Path, list[Path], dict[str, Any]], Iterator[Any]] | None = None

    def missing(self) -> str | None:
        """Why this method cannot run here, or None."""
        if self.read is None:
            return None if shutil.which(self.needs) else f"{self.needs} is not installed"
        return missing_module(self.needs)


def missing_module(needs: str) -> str | None:
    """Why ``module`` or ``module:attribute`` is not there to import, or None."""
    module, _, attr = needs.partition(":")
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return f"Python package {module} is not installed"
    if attr and not hasattr(importlib.import_module(module), attr):
        return f"{module} has no {attr} (yet)"
    return None


METHODS = {
    m.name: m
    for m in (
        Method("baseline", "load_file per shard (mmap): NFS baseline", "safetensors", _baseline),
        Method(
            "prefetch",
            "vLLM-style: 8 threads read 16 MiB pieces into the page cache, then load_file",
            "safetensors",
            _prefetch,
        ),
        Method("fxkit", "fxkit.loader.load", "fxkit.loader:load", _fxkit),
        Method("fio", "fio O_DIRECT sequential read, a job per file: storage limit", "fio"),
        Method("runai", "Run:ai Model Streamer at its defaults", "runai_model_streamer", _runai),
        Method("fastsafetensors", "CPU, nogds", "fastsafetensors", _fastsafetensors),
    )
}

# Issue 4's targets: fxkit's speed over each method's, within a round (median over rounds).
TARGETS = {
    "cold": {"fio": 0.85, "baseline": 1.3, "runai": 1.0, "fastsafetensors": 1.5},
    "hot": {"baseline": 0.8},
}


# -- one run ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """One method's load of the whole checkpoint."""

    method: str
    round: int
    seconds: float = 0.0
    nbytes: int = 0
    gbps: float = 0.0
    tensors: int | None = None
    checksum: int | None = None
    peak_rss: int | None = None
    rss_before: int | None = None
    resident_before: int | None = None
    error: str | None = None

    def line(self) -> str:
        """``round 2  fxkit  1.93 GB/s (3.3 s)``: one line of progress."""
        result = self.error or f"{self.gbps:.3f} GB/s ({self.seconds:.1f} s)"
        return f"round {self.round + 1:<2} {self.method:<16} {result}"


def touch(tensor: Any) -> int:
    """Read one byte in every page of the tensor's bytes, and its last byte; return their sum."""
    import torch

    if tensor.numel() == 0:
        return 0
    flat = tensor.reshape(-1).view(torch.uint8)
    return int(flat[:: cache.PAGE_SIZE].sum(dtype=torch.int64)) + int(flat[-1])


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * cache.PAGE_SIZE


def measure(method: str, path: str, options: dict[str, Any]) -> dict[str, Any]:
    """Load the checkpoint with ``method`` in this process, timed; meant for a fresh process."""
    import torch  # noqa: F401  (imported before the clock starts, as every method needs it)

    spec = METHODS[method]
    if spec.read is None:
        raise LoaderError(f"{method} is not a loader: it runs as a tool, not in this process")
    importlib.import_module(spec.needs.partition(":")[0])
    files = model_files(path).files
    return {**consume(spec.read(Path(path), files, options)), "nbytes": _nbytes(files)}


def consume(tensors: Iterable[Any]) -> dict[str, Any]:
    """Touch and keep every tensor, timed: seconds, tensor count, checksum, RSS before and peak."""
    rss_before = _rss_now()
    kept, checksum = [], 0
    start = time.perf_counter()
    for tensor in tensors:
        checksum += touch(tensor)
        kept.append(tensor)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "tensors": len(kept),
        "checksum": checksum,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_before": rss_before,
    }


def _run_loader(method: str, path: Path, options: dict[str, Any], run: Run) -> None:
    argv = [sys.executable, "-m", "fxkit.loader.bench", method, str(path), json.dumps(options)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        run.error = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return
    for key, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        setattr(run, key, value)


def fio_job(files: Sequence[Path]) -> str:
    """A fio job file: every file read sequentially with O_DIRECT in 16 MiB blocks (smaller for
    small files: fio reads whole blocks only), 4 in flight per file, all files at once."""
    head = "[global]\nrw=read\ndirect=1\nioengine=libaio\niodepth=4\ngroup_reporting=1\n"
    jobs = []
    for i, f in enumerate(files):
        block = min(FIO_BLOCK, f.stat().st_size // cache.PAGE_SIZE * cache.PAGE_SIZE)
        if block:
            jobs.append(f"[f{i}]\nfilename={f}\nbs={block}\n")
    return head + "".join(jobs)


def fio_read(report: str) -> tuple[int, float]:
    """Bytes read and seconds from ``fio --output-format=json`` (the jobs' read totals)."""
    jobs = json.loads(report[report.index("{") :])["jobs"]
    nbytes = sum(job["read"]["io_bytes"] for job in jobs)
    seconds = max(job["read"]["runtime"] for job in jobs) / 1000
    if nbytes == 0 or seconds == 0:
        errors = [job.get("error") for job in jobs]
        raise LoaderError(f"fio read nothing (job errors: {errors})")
    return nbytes, seconds


def _run_fio(files: list[Path], run: Run) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".fio") as job:
        job.write(fio_job(files))
        job.flush()
        proc = subprocess.run(
            ["fio", "--output-format=json", job.name], capture_output=True, text=True, check=False
        )
    try:
        run.nbytes, run.seconds = fio_read(proc.stdout)
    except (LoaderError, ValueError, KeyError) as exc:
        run.error = f"fio exit {proc.returncode}: {exc}; {proc.stderr.strip()[-200:]}"


# -- rounds and the report -------------------------------------------------------------------------


@dataclass
class Summary:
    """One method over all rounds; ratios are medians of within-round ratios."""

    method: str
    about: str
    gbps_median: float | None = None
    gbps_min: float | None = None
    gbps_max: float | None = None
    vs_baseline: float | None = None
    vs_fio: float | None = None
    peak_rss: int | None = None
    rss_before: int | None = None
    checksum_ok: bool | None = None
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class Report:
    model: str
    files: int
    nbytes: int
    cold: bool
    rounds: int
    machine: dict[str, Any]
    options: dict[str, Any]
    summaries: list[Summary]
    runs: list[Run]
    eviction_failures: list[str]
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def summary(self, method: str) -> Summary | None:
        return next((s for s in self.summaries if s.method == method), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def machine() -> dict[str, Any]:
    """What the numbers depend on: cores, memory, kernel, CPU."""
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return {
        "nproc": os.cpu_count(),
        "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "kernel": platform.release(),
        "cpu": cpu,
        "python": platform.python_version(),
    }


def filesystem(path: Path) -> str:
    """``type device`` of the mount holding ``path`` (from /proc/self/mounts)."""
    path = path.resolve()
    best = ("", "?", "?")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        device, mountpoint, fstype = line.split()[:3]
        if path.is_relative_to(mountpoint) and len(mountpoint) >= len(best[0]):
            best = (mountpoint, fstype, device)
    return f"{best[1]} on {best[2]} ({best[0]})"


def _prepare(files: list[Path], cold: bool, also_evict: Sequence[Path], run: Run) -> str | None:
    """Evict (cold) or warm (hot) the files before a run; a message when that failed."""
    if cold:
        left = cache.evict_all([*files, *also_evict])
        run.resident_before = sum(left.values())
        return f"still resident after eviction: {left}" if left else None
    missing = cache.warm(files)
    run.resident_before = _nbytes(files) - sum(missing.values())
    return f"not fully cached: {missing}" if missing else None


def ratio(runs: list[Run], method: str, other: str) -> float | None:
    """Median over rounds of ``method``'s speed over ``other``'s in the same round."""
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        if not r.error and r.gbps:
            by_round.setdefault(r.round, {})[r.method] = r.gbps
    ratios = [g[method] / g[other] for g in by_round.values() if method in g and other in g]
    return statistics.median(ratios) if ratios else None


def _summarise(method: Method, runs: list[Run], reference: int | None) -> Summary:
    mine = [r for r in runs if r.method == method.name]
    good = [r for r in mine if not r.error]
    s = Summary(method.name, method.about, errors=[r.error for r in mine if r.error])
    if good:
        speeds = [r.gbps for r in good]
        s.gbps_median, s.gbps_min, s.gbps_max = statistics.median(speeds), min(speeds), max(speeds)
        s.vs_baseline = ratio(runs, method.name, "baseline")
        s.vs_fio = ratio(runs, method.name, "fio")
        peaks = [r.peak_rss for r in good if r.peak_rss]
        s.peak_rss = max(peaks) if peaks else None
        s.rss_before = min((r.rss_before for r in good if r.rss_before), default=None)
        sums = {r.checksum for r in good if r.checksum is not None}
        if sums and reference is not None:
            s.checksum_ok = sums == {reference}
    return s


def bench(
    model: str | os.PathLike[str],
    methods: Sequence[str] = tuple(METHODS),
    runs: int = 5,
    cold: bool = True,
    fxkit_options: dict[str, Any] | None = None,
    also_evict: Sequence[Path] = (),
    on_run: Callable[[Run], None] | None = None,
    targets: dict[str, float] | None = None,
) -> Report:
    """Run ``methods`` in ``runs`` interleaved rounds (order rotated each round).

    ``targets`` (fxkit's speed over a method's) defaults to issue 4's for local disk.
    """
    if unknown := [m for m in methods if m not in METHODS]:
        raise LoaderError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    path, files = Path(model), model_files(model).files
    options = dict(fxkit_options or {})
    skipped = {m: why for m in methods if (why := METHODS[m].missing())}
    active = [m for m in methods if m not in skipped]
    all_runs: list[Run] = []
    eviction_failures: list[str] = []
    for rnd in range(runs):
        shift = rnd % len(active) if active else 0
        for name in active[shift:] + active[:shift]:
            run = Run(name, rnd)
            if problem := _prepare(files, cold, also_evict, run):
                eviction_failures.append(f"round {rnd} {name}: {problem}")
            if name == "fio":
                _run_fio(files, run)
            else:
                _run_loader(name, path, options if name == "fxkit" else {}, run)
            if not run.error:
                run.gbps = run.nbytes / run.seconds / GB
            all_runs.append(run)
            if on_run:
                on_run(run)
    reference = next((r.checksum for r in all_runs if r.method == "baseline" and not r.error), None)
    summaries = [
        Summary(m, METHODS[m].about, skipped=skipped[m])
        if m in skipped
        else _summarise(METHODS[m], all_runs, reference)
        for m in methods
    ]
    report = Report(
        model=str(path),
        files=len(files),
        nbytes=_nbytes(files),
        cold=cold,
        rounds=runs,
        machine={**machine(), "filesystem": filesystem(path)},
        options=options,
        summaries=summaries,
        runs=all_runs,
        eviction_failures=eviction_failures,
    )
    report.targets = check_targets(report, targets or TARGETS["cold" if cold else "hot"])
    return report


def check_targets(report: Report, targets: dict[str, float]) -> dict[str, dict[str, Any]]:
    """fxkit's within-round ratio against each method a target is set for."""
    fx = [r for r in report.runs if r.method == "fxkit"]
    out = {}
    for other, target in targets.items():
        if fx and any(r.method == other for r in report.runs):
            x = ratio(report.runs, "fxkit", other)
            out[other] = {"target": target, "ratio": x, "met": x is not None and x >= target}
    return out


class _Json(Protocol):
    def to_json(self) -> str: ...


def save_json(report: _Json, path: str | os.PathLike[str]) -> None:
    """Write the report as JSON, atomically (temp file in the same directory, then rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(report.to_json() + "\n")
    os.replace(tmp, path)


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.2f}" if n else "-"


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "-"


def render(report: Report, console: Any) -> None:
    """Print the report as a rich table, with the machine and the targets."""
    from rich.table import Table

    m = report.machine
    title = (
        f"{report.model}: {report.files} files, {report.nbytes / GB:.2f} GB, "
        f"{'cold (evicted, mincore-verified)' if report.cold else 'hot (page cache)'}, "
        f"{report.rounds} interleaved rounds"
    )
    table = Table(title=title, caption="GB = 1e9 bytes; ratios: median of within-round ratios")
    columns = ("method", "GB/s median", "min", "max", "x baseline", "x fio", "RSS GiB", "notes")
    for col in columns:
        table.add_column(col, justify="left" if col in ("method", "notes") else "right")
    for s in report.summaries:
        notes = s.skipped or ("; ".join(s.errors[:1]) if s.errors else "")
        if s.checksum_ok is False:
            notes = f"CHECKSUM DIFFERS from baseline {notes}"
        if s.peak_rss and s.rss_before:
            notes = f"{notes} (+{_gib(s.peak_rss - s.rss_before)} over imports)".strip()
        speeds = (s.gbps_median, s.gbps_min, s.gbps_max)
        gbps = [f"{v:.2f}" if v is not None else "-" for v in speeds]
        table.add_row(s.method, *gbps, _x(s.vs_baseline), _x(s.vs_fio), _gib(s.peak_rss), notes)
    console.print(table)
    console.print(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_bytes'] / 2**30:.0f} GiB RAM, "
        f"Linux {m['kernel']}, {m['filesystem']}"
    )
    for failure in report.eviction_failures:
        console.print(f"[yellow]page cache: {failure}[/]", highlight=False)
    for other, t in report.targets.items():
        mark = "[green]met[/]" if t["met"] else "[red]missed[/]"
        console.print(f"target fxkit >= {t['target']}x {other}: {_x(t['ratio'])} {mark}")


def _main(argv: list[str]) -> None:
    method, path, options = argv
    print(json.dumps(measure(method, path, json.loads(options))))


if __name__ == "__main__":
    _main(sys.argv[1:])
