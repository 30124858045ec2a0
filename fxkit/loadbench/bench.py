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
import mmap
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

from fxkit.loadbench import balloon
from fxkit.loader import LoaderError, evict_all, model_files, touch, warm
from fxkit.localfile import write_whole

GB = 1e9
PREFETCH_THREADS = 8
PREFETCH_READ = 16 << 20


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
    from fxkit.loader import load

    yield from load(path, **options).values()


def _fxkit_direct(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    """fxkit with the explicit option ``direct_io="on"`` (over the run's other options)."""
    yield from _fxkit(path, files, {**options, "direct_io": "on"})


def _runai(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    """Run:ai's streamer; its settings are environment variables (``Method.env``)."""
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_files([str(f) for f in files])
        for _, tensor in streamer.get_tensors():
            yield tensor


def _fastsafetensors(path: Path, files: list[Path], options: dict[str, Any]) -> Iterator[Any]:
    """fastsafetensors' own loader on CPU; ``options`` are its knobs: ``max_threads`` and
    ``bbuf_size_kb`` (SafeTensorsFileLoader), ``max_copy_block_size`` (copy_files_to_device)."""
    from fastsafetensors import SafeTensorsFileLoader

    copy = {k: options[k] for k in ("max_copy_block_size",) if k in options}
    knobs = {k: v for k, v in options.items() if k not in copy}
    loader = SafeTensorsFileLoader(None, "cpu", nogds=True, **knobs)
    try:
        loader.add_filenames({0: [str(f) for f in files]})
        buffer = loader.copy_files_to_device(**copy)
        try:
            for name in list(buffer.key_to_rank_lidx):
                yield buffer.get_tensor(name)
        finally:
            buffer.close()
    finally:
        loader.close()


@dataclass(frozen=True)
class Method:
    """A way to load a checkpoint. ``read`` yields its tensors; ``needs`` is a tool, a module, or
    ``module:attribute``. ``options`` go to ``read``; ``env`` is set in this method's process
    only (a peer's own settings); ``peer`` marks another project's loader."""

    name: str
    about: str
    needs: str
    read: Callable[[Path, list[Path], dict[str, Any]], Iterator[Any]] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    peer: bool = False

    def missing(self) -> str | None:
        """Why this method cannot run here, or None."""
        if self.read is None:
            return None if shutil.which(self.needs) else f"{self.needs} is not installed"
        return missing_module(self.needs)

    def environ(self) -> dict[str, str]:
        """The environment to start this method's process with: ours plus its own settings."""
        return {**os.environ, **self.env}


def missing_module(needs: str) -> str | None:
    """Why ``module`` or ``module:attribute`` is not there to import, or None."""
    module, _, attr = needs.partition(":")
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return f"Python package {module} is not installed"
    if attr and not hasattr(importlib.import_module(module), attr):
        return f"{module} has no {attr} (yet)"
    return None


# The tuned peers' settings, each from the peer's own documentation, the values chosen by a
# measured sweep on this machine (docs/BENCHMARKS.md "Peers at their defaults and tuned").
# Run:ai: unlimited memory (its documented full-throughput mode; vLLM's ``memory_limit``) and
# 32 MiB chunks for its asynchronous (io_uring) reader, the default here; queue depth,
# concurrency, read strategy and ring buffers measured no better than their defaults.
# fastsafetensors: 64 MiB copy blocks (16 GiB by default: one read per file) with 4 MiB bounce
# buffers.
RUNAI_TUNED = {
    "RUNAI_STREAMER_MEMORY_LIMIT": "-1",
    "RUNAI_STREAMER_FS_CHUNK_BYTESIZE": str(32 << 20),
}
FASTSAFETENSORS_TUNED = {"max_copy_block_size": 64 << 20, "bbuf_size_kb": 4 << 10}


def _settings(settings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())


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
        Method(
            "fxkit-direct",
            "fxkit.loader.load(direct_io='on'): the explicit O_DIRECT option",
            "fxkit.loader:load",
            _fxkit_direct,
        ),
        Method("fio", "fio: a sweep of job layouts, depths and block sizes", "fio"),
        Method(
            "runai",
            "Run:ai Model Streamer at its defaults",
            "runai_model_streamer",
            _runai,
            peer=True,
        ),
        Method(
            "runai-tuned",
            f"Run:ai Model Streamer, {_settings(RUNAI_TUNED)}",
            "runai_model_streamer",
            _runai,
            env=RUNAI_TUNED,
            peer=True,
        ),
        Method(
            "fastsafetensors",
            "CPU, nogds, its defaults",
            "fastsafetensors",
            _fastsafetensors,
            peer=True,
        ),
        Method(
            "fastsafetensors-tuned",
            f"CPU, nogds, {_settings(FASTSAFETENSORS_TUNED)}",
            "fastsafetensors",
            _fastsafetensors,
            options=FASTSAFETENSORS_TUNED,
            peer=True,
        ),
    )
}

# fxkit's speed over each method's, within a round (median over rounds): issue 4's against the
# baseline, issue 10's against the storage limit (the round's best fio setting), vLLM's prefetch
# path and the best peer (``BEST_PEER``: the peer method, at its defaults or tuned, with the
# highest median speed in the report).
BEST_PEER = "best peer"
TARGETS = {
    "cold": {"fio-best": 0.9, "baseline": 1.3, "prefetch": 1.0, BEST_PEER: 1.2},
    "hot": {"baseline": 0.8},
}


# -- one run ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """One method's load of the whole checkpoint."""

    method: str
    round: int
    setting: str | None = None
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
        return f"round {self.round + 1:<2} {self.series:<22} {result}"

    @property
    def series(self) -> str:
        """What this run is one of: the method, and its setting for a fio run (a ``fio-best``
        run's setting names the winner)."""
        return f"fio {self.setting}" if self.method == "fio" else self.method


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


def measure(method: str, path: str, options: dict[str, Any]) -> dict[str, Any]:
    """Load the checkpoint with ``method`` in this process, timed; meant for a fresh process."""
    import torch  # noqa: F401  (imported before the clock starts, as every method needs it)

    spec = METHODS[method]
    if spec.read is None:
        raise LoaderError(f"{method} is not a loader: it runs as a tool, not in this process")
    if unset := [k for k, v in spec.env.items() if os.environ.get(k) != v]:
        raise LoaderError(
            f"{method} runs with {', '.join(unset)} set: start its process with "
            f"METHODS[{method!r}].environ()"
        )
    importlib.import_module(spec.needs.partition(":")[0])
    files = model_files(path).files
    tensors = spec.read(Path(path), files, {**spec.options, **options})
    return {**consume(tensors), "nbytes": _nbytes(files)}


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


def _run_loader(
    method: str, path: Path, options: dict[str, Any], run: Run, env: dict[str, str] | None = None
) -> None:
    """``method`` in a fresh process, with its own environment plus ``env``."""
    argv = [sys.executable, "-m", "fxkit.loadbench.bench", method, str(path), json.dumps(options)]
    environ = {**METHODS[method].environ(), **(env or {})}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=environ)
    if proc.returncode != 0:
        run.error = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return
    for key, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        setattr(run, key, value)


@dataclass(frozen=True)
class FioSetting:
    """One point of the fio sweep: how the files are split into jobs, reads in flight per job,
    block size. ``serial``: one job at a time, the files in turn; ``per-file``: a job per file, all
    at once; ``split``: every file cut into ``SPLIT_PARTS`` equal ranges, a job per range, all at
    once (what ``numjobs`` with ``offset_increment`` does, with the last range exact)."""

    layout: str
    iodepth: int
    block: int
    buffered: bool = False  # through the page cache (kernel readahead) instead of O_DIRECT

    @property
    def label(self) -> str:
        label = f"{self.layout} qd{self.iodepth} {self.block >> 20}M"
        return f"{label} buffered" if self.buffered else label


FIO_LAYOUTS = ("serial", "per-file", "split")
SPLIT_PARTS = 4
# The grid chosen from the full cross product (layouts x 1,4,16,32 x 1,4,16 MiB) measured on
# this machine; see docs/BENCHMARKS.md "The storage limit". ``fio_grid()`` builds the full one.
# The last two read through the page cache (kernel readahead), a stream per file or per range:
# on the VM's loop device the buffered loaders (prefetch, fxkit) outran every O_DIRECT setting
# (1.2-1.4 GB/s against 0.9-1.07), so a limit without buffered reads is no limit.
FIO_SWEEP = tuple(
    FioSetting(layout, depth, mib << 20, buffered)
    for layout, depth, mib, buffered in (
        ("serial", 1, 1, False),
        ("serial", 16, 4, False),
        ("serial", 32, 16, False),
        ("per-file", 4, 16, False),
        ("per-file", 16, 4, False),
        ("per-file", 32, 1, False),
        ("split", 4, 4, False),
        ("split", 16, 16, False),
        ("per-file", 1, 16, True),
        ("split", 1, 4, True),
    )
)


def fio_grid(
    depths: Sequence[int] = (1, 4, 16, 32), blocks_mib: Sequence[int] = (1, 4, 16)
) -> tuple[FioSetting, ...]:
    """The full cross product of the layouts, depths and block sizes."""
    return tuple(
        FioSetting(layout, d, b << 20) for layout in FIO_LAYOUTS for d in depths for b in blocks_mib
    )


def _ranges(size: int, setting: FioSetting) -> list[tuple[int, int]]:
    """``(offset, length)`` ranges that cover a file of ``size`` bytes once; all but the last are
    whole blocks."""
    parts = SPLIT_PARTS if setting.layout == "split" else 1
    step = max(1, -(-size // parts // setting.block)) * setting.block
    return [(o, min(step, size - o)) for o in range(0, size, step)]


def _pieces(offset: int, length: int, block: int) -> list[tuple[int, int, int, bool]]:
    """``(offset, length, bs, direct)`` reads of a range: whole blocks with O_DIRECT, then the
    rest in whole pages as one O_DIRECT read, then the last partial page buffered."""
    body = length // block * block
    pages = (length - body) // mmap.PAGESIZE * mmap.PAGESIZE
    tail = length - body - pages
    pieces = [(offset, body, block, True), (offset + body, pages, pages, True)]
    pieces.append((offset + body + pages, tail, tail, False))
    return [p for p in pieces if p[1]]


def fio_job(files: Sequence[Path], setting: FioSetting) -> str:
    """A fio job file that reads every byte of ``files`` exactly once, as ``setting`` says.

    fio reads whole blocks only, so a range that does not end on one is read in three jobs: its
    whole blocks, the rest in whole pages as one O_DIRECT read, and the last partial page (under
    4 KiB, the end of a file) buffered. ``serial`` puts a stonewall before every file, so fio
    reads one file after another."""
    head = f"[global]\nrw=read\nioengine=libaio\niodepth={setting.iodepth}\n"
    jobs = []
    for i, f in enumerate(files):
        for j, (offset, length) in enumerate(_ranges(f.stat().st_size, setting)):
            for k, (start, size, bs, direct) in enumerate(_pieces(offset, length, setting.block)):
                wall = "stonewall\n" if setting.layout == "serial" and j == k == 0 else ""
                once = "iodepth=1\n" if bs == size else ""  # one read: no buffers for more
                direct = direct and not setting.buffered
                jobs.append(
                    f"[f{i}r{j}p{k}]\n{wall}filename={f}\noffset={start}\nsize={size}\n"
                    f"bs={bs}\n{once}direct={int(direct)}\n"
                )
    return head + "".join(jobs)


def fio_read(report: str) -> tuple[int, float]:
    """Bytes read and seconds from ``fio --output-format=json``: the jobs' read totals; the time
    is each stonewall group's longest job, summed over the groups (they run one after another)."""
    jobs = json.loads(report[report.index("{") :])["jobs"]
    nbytes = sum(job["read"]["io_bytes"] for job in jobs)
    groups: dict[int, int] = {}
    for job in jobs:
        groups[job["groupid"]] = max(groups.get(job["groupid"], 0), job["read"]["runtime"])
    seconds = sum(groups.values()) / 1000
    if nbytes == 0 or seconds == 0 or any(job.get("error") for job in jobs):
        errors = [job.get("error") for job in jobs]
        raise LoaderError(f"fio read nothing or failed (job errors: {errors})")
    return nbytes, seconds


def _run_fio(files: list[Path], setting: FioSetting, run: Run) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".fio") as job:
        job.write(fio_job(files, setting))
        job.flush()
        proc = subprocess.run(
            ["fio", "--output-format=json", job.name], capture_output=True, text=True, check=False
        )
    try:
        run.nbytes, run.seconds = fio_read(proc.stdout)
    except (LoaderError, ValueError, KeyError) as exc:
        run.error = f"fio exit {proc.returncode}: {exc}; {proc.stderr.strip()[-200:]}"
        return
    if run.nbytes != _nbytes(files):
        run.error = f"fio read {run.nbytes} bytes, the checkpoint has {_nbytes(files)}"


# -- rounds and the report -------------------------------------------------------------------------


@dataclass
class Summary:
    """One method over all rounds; ratios are medians of within-round ratios."""

    method: str
    about: str
    setting: str | None = None
    gbps_median: float | None = None
    gbps_min: float | None = None
    gbps_max: float | None = None
    vs_baseline: float | None = None
    vs_fio_best: float | None = None
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
        """The method's summary (for fio, its first setting's; see ``fio-best``)."""
        return next((s for s in self.summaries if s.method == method), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def machine() -> dict[str, Any]:
    """What the numbers depend on: cores, memory, kernel, CPU, and whether the VM hands free
    memory back to its host (:func:`.balloon.reporting`; None: it does not)."""
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
        "free_page_reporting": balloon.reporting(),
    }


def _reporting(machine: dict[str, Any]) -> str:
    """``; free page reporting on (...)`` for a machine that has it, else nothing."""
    state = machine.get("free_page_reporting")
    return f"; free page reporting {state}" if state else ""


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
        left = evict_all([*files, *also_evict])
        run.resident_before = sum(left.values())
        return f"still resident after eviction: {left}" if left else None
    missing = warm(files)
    run.resident_before = _nbytes(files) - sum(missing.values())
    return f"not fully cached: {missing}" if missing else None


def ratio(runs: list[Run], method: str, other: str) -> float | None:
    """Median over rounds of ``method``'s speed over ``other``'s in the same round (a run's
    ``series``: the method, or ``fio SETTING``)."""
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        if not r.error and r.gbps:
            by_round.setdefault(r.round, {})[r.series] = r.gbps
    ratios = [g[method] / g[other] for g in by_round.values() if method in g and other in g]
    return statistics.median(ratios) if ratios else None


def fio_best(runs: list[Run], rnd: int) -> Run | None:
    """The round's fastest fio setting, as a run of the method ``fio-best`` (the storage limit)."""
    fio = [r for r in runs if r.method == "fio" and r.round == rnd and not r.error]
    if not fio:
        return None
    best = max(fio, key=lambda r: r.gbps)
    return Run("fio-best", rnd, best.setting, best.seconds, best.nbytes, best.gbps)


def _summarise(
    name: str, about: str, runs: list[Run], reference: int | None, setting: str | None = None
) -> Summary:
    series = f"{name} {setting}" if setting else name
    mine = [r for r in runs if r.series == series]
    good = [r for r in mine if not r.error]
    s = Summary(name, about, setting, errors=[r.error for r in mine if r.error])
    if good:
        speeds = [r.gbps for r in good]
        s.gbps_median, s.gbps_min, s.gbps_max = statistics.median(speeds), min(speeds), max(speeds)
        s.vs_baseline = ratio(runs, series, "baseline")
        s.vs_fio_best = ratio(runs, series, "fio-best")
        peaks = [r.peak_rss for r in good if r.peak_rss]
        s.peak_rss = max(peaks) if peaks else None
        s.rss_before = min((r.rss_before for r in good if r.rss_before), default=None)
        sums = {r.checksum for r in good if r.checksum is not None}
        if sums and reference is not None:
            s.checksum_ok = sums == {reference}
    return s


def _summaries(
    methods: Sequence[str], skipped: dict[str, str], runs: list[Run], fio: Sequence[FioSetting]
) -> list[Summary]:
    """A summary per method, per fio setting, and for ``fio-best`` (which settings won)."""
    reference = next((r.checksum for r in runs if r.method == "baseline" and not r.error), None)
    out = []
    for m in methods:
        about = METHODS[m].about
        if m in skipped:
            out.append(Summary(m, about, skipped=skipped[m]))
        elif m != "fio":
            out.append(_summarise(m, about, runs, reference))
        else:
            out.extend(_summarise(m, about, runs, reference, f.label) for f in fio)
            wins = [r.setting for r in runs if r.method == "fio-best"]
            tally = ", ".join(f"{w} x{wins.count(w)}" for w in dict.fromkeys(wins))
            about = f"the round's fastest fio setting (storage limit): {tally or 'none ran'}"
            out.append(_summarise("fio-best", about, runs, reference))
    return out


def bench(
    model: str | os.PathLike[str],
    methods: Sequence[str] = tuple(METHODS),
    runs: int = 5,
    cold: bool = True,
    fxkit_options: dict[str, Any] | None = None,
    also_evict: Sequence[Path] = (),
    on_run: Callable[[Run], None] | None = None,
    targets: dict[str, float] | None = None,
    fio: Sequence[FioSetting] = FIO_SWEEP,
) -> Report:
    """Run ``methods`` in ``runs`` interleaved rounds (order rotated each round).

    fio runs every setting of ``fio`` in its turn, each cold; the round's fastest is ``fio-best``.
    ``targets`` (fxkit's speed over a method's) defaults to ``TARGETS`` for local disk.
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
            for setting in fio if name == "fio" else (None,):
                run = Run(name, rnd, setting.label if setting else None)
                if problem := _prepare(files, cold, also_evict, run):
                    eviction_failures.append(f"round {rnd} {run.series}: {problem}")
                if setting:
                    _run_fio(files, setting, run)
                else:
                    _run_loader(name, path, options if name.startswith("fxkit") else {}, run)
                if not run.error:
                    run.gbps = run.nbytes / run.seconds / GB
                all_runs.append(run)
                if on_run:
                    on_run(run)
        if best := fio_best(all_runs, rnd):
            all_runs.append(best)
            if on_run:
                on_run(best)
    report = Report(
        model=str(path),
        files=len(files),
        nbytes=_nbytes(files),
        cold=cold,
        rounds=runs,
        machine={**machine(), "filesystem": filesystem(path)},
        options=options,
        summaries=_summaries(methods, skipped, all_runs, fio),
        runs=all_runs,
        eviction_failures=eviction_failures,
    )
    report.targets = check_targets(report, targets or TARGETS["cold" if cold else "hot"])
    return report


def best_peer(report: Report) -> str | None:
    """The peer method (at its defaults or tuned) with the highest median speed."""
    peers = [
        s
        for s in report.summaries
        if s.method in METHODS and METHODS[s.method].peer and s.gbps_median
    ]
    return max(peers, key=lambda s: s.gbps_median or 0).method if peers else None


def check_targets(report: Report, targets: dict[str, float]) -> dict[str, dict[str, Any]]:
    """fxkit's within-round ratio against each method a target is set for; ``BEST_PEER``'s
    entry names the peer it was measured against."""
    fx = [r for r in report.runs if r.method == "fxkit"]
    out = {}
    for other, target in targets.items():
        against = best_peer(report) if other == BEST_PEER else other
        if fx and against and any(r.method == against for r in report.runs):
            x = ratio(report.runs, "fxkit", against)
            out[other] = {
                "target": target,
                "against": against,
                "ratio": x,
                "met": x is not None and x >= target,
            }
    return out


class _Json(Protocol):
    def to_json(self) -> str: ...


def save_json(report: _Json, path: str | os.PathLike[str]) -> None:
    """Write the report as JSON, atomically (temp file in the same directory, then rename)."""
    write_whole(Path(path), report.to_json() + "\n")


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
    columns = (
        "method",
        "GB/s median",
        "min",
        "max",
        "x baseline",
        "x fio-best",
        "RSS GiB",
        "notes",
    )
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
        name = f"{s.method} {s.setting}" if s.setting else s.method
        table.add_row(name, *gbps, _x(s.vs_baseline), _x(s.vs_fio_best), _gib(s.peak_rss), notes)
    console.print(table)
    console.print(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_bytes'] / 2**30:.0f} GiB RAM, "
        f"Linux {m['kernel']}, {m['filesystem']}{_reporting(m)}"
    )
    for failure in report.eviction_failures:
        console.print(f"[yellow]page cache: {failure}[/]", highlight=False)
    for s in report.summaries:
        if s.method in ("fio-best", *(m for m in METHODS if METHODS[m].peer)) and s.about:
            console.print(f"{s.method}: {s.about}", highlight=False)
    for other, t in report.targets.items():
        mark = "[green]met[/]" if t["met"] else "[red]missed[/]"
        name = f"the {other} ({t['against']})" if other == BEST_PEER else other
        console.print(f"target fxkit >= {t['target']}x {name}: {_x(t['ratio'])} {mark}")


def _main(argv: list[str]) -> None:
    method, path, options = argv
    print(json.dumps(measure(method, path, json.loads(options))))


if __name__ == "__main__":
    _main(sys.argv[1:])
