"""``fxkit bench load --ranks N``: N processes on one node load one checkpoint at the same time.

The deployment shape of tensor parallelism (or several instances of a model): every rank is a
fresh Python process that does its imports (and joins its process group, for the peers that have
one) first, then says ``ready`` and waits for ``go`` on stdin. The checkpoint is evicted from the
page cache (mincore-verified) once all are ready; the node time runs from the go to the end of the
last rank (CLOCK_MONOTONIC is one clock for every process). Each rank reports its own seconds,
tensor count, checksum (``fxkit.loader.touch``) and peak RSS. The bytes the node read from storage
are the delta of the sectors read of the checkpoint's block device in /proc/diskstats: the whole
device's, so other processes on the machine add to them; a file system without a block device
(tmpfs, overlay, NFS) has no such number and the report says so. Rounds are interleaved, the order
of the methods rotated each round; ratios are medians of within-round ratios, as in ``bench``.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from fxkit.loadbench import balloon, bench
from fxkit.loader import LoaderError, evict_all, model_files

SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size
VLLM_PREFETCH_THREADS = 8  # vLLM's DEFAULT_SAFETENSORS_PREFETCH_NUM_THREADS
VLLM_PREFETCH_BLOCK = 16 << 20  # and DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE
RANK_TIMEOUT = 900.0

# -- the methods: (model path, its files, options, rank, world size) -> tensors -------------------

Read = Callable[[Path, list[Path], dict[str, Any], int, int], Iterator[Any]]


def _independent(method: str) -> Read:
    """``bench``'s method, run by every rank on its own."""
    read = bench.METHODS[method].read
    assert read is not None
    return lambda path, files, options, rank, world: read(path, files, options)


_load_files = _independent("baseline")


def _vllm_prefetch_file(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(VLLM_PREFETCH_BLOCK):
            pass


def _prefetch(
    path: Path, files: list[Path], options: dict[str, Any], rank: int, world: int
) -> Iterator[Any]:
    """vLLM's ``--safetensors-load-strategy prefetch`` per rank (weight_utils.py, 0.20 to 0.33):
    a background thread reads this rank's share of the files, ``sorted_files[rank::world_size]``,
    into the page cache with 8 threads in 16 MiB blocks, while the rank loads every file."""

    def prefetch_share() -> None:
        with ThreadPoolExecutor(VLLM_PREFETCH_THREADS) as pool:
            list(pool.map(_vllm_prefetch_file, files[rank::world]))

    threading.Thread(target=prefetch_share, daemon=True).start()
    yield from _load_files(path, files, options, rank, world)


def _runai(
    path: Path, files: list[Path], options: dict[str, Any], rank: int, world: int
) -> Iterator[Any]:
    """Run:ai's distributed streaming: each rank reads a part and broadcasts it to the others."""
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_files([str(f) for f in files], device="cpu", is_distributed=True)
        if world > 1 and not streamer.file_streamer.is_distributed:
            raise LoaderError("Run:ai fell back to non-distributed streaming (see its log)")
        for _, tensor in streamer.get_tensors():
            yield tensor


def _fastsafetensors(
    path: Path, files: list[Path], options: dict[str, Any], rank: int, world: int
) -> Iterator[Any]:
    """fastsafetensors' process-group loading: rank r reads files[r::world], get_tensor
    broadcasts each tensor from the rank that read it."""
    import torch.distributed as dist
    from fastsafetensors import fastsafe_open

    shares = {r: [str(f) for f in files[r::world]] for r in range(world)}
    with fastsafe_open(shares, pg=dist.group.WORLD, device="cpu", nogds=True) as st:
        names = st.keys()  # a method of fastsafe_open, not a dict
        for name in names:
            yield st.get_tensor(name)


@dataclass(frozen=True)
class RankMethod:
    """A way for N ranks to load a checkpoint; ``group``: the ranks join a torch.distributed
    process group (gloo, on CPU) before they say ready; ``env``: set in every rank."""

    name: str
    about: str
    needs: str
    read: Read
    group: bool = False
    env: tuple[tuple[str, str], ...] = ()

    def missing(self) -> str | None:
        """Why this method cannot run here, or None."""
        if why := bench.missing_module(self.needs):
            return why
        if self.group:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_gloo_available()):
                return "its process group needs torch.distributed with gloo (CPU)"
        return None


RANK_METHODS = {
    m.name: m
    for m in (
        RankMethod("baseline", "N x load_file (mmap), the page cache shared", "safetensors",
                   _independent("baseline")),
        RankMethod("prefetch", "vLLM prefetch per rank: its files[rank::N] read ahead, 8 threads",
                   "safetensors", _prefetch),
        RankMethod("fxkit", "N x fxkit.loader.load, the -o options passed through",
                   "fxkit.loader:load", _independent("fxkit")),
        RankMethod("runai", "Run:ai distributed streaming (gloo, RUNAI_STREAMER_DIST=1)",
                   "runai_model_streamer", _runai, group=True,
                   env=(("RUNAI_STREAMER_DIST", "1"),)),
        RankMethod("fastsafetensors", "process-group loading (gloo): a share of files per rank",
                   "fastsafetensors", _fastsafetensors, group=True),
    )
}  # fmt: skip

# Issue 10's targets for fxkit at N ranks.
DISK_TARGET = 1.1  # bytes read from storage / checkpoint bytes, at most
SPEED_TARGETS = {"baseline": 1.3, "prefetch": 1.0, "runai": 1.0, "fastsafetensors": 1.0}


# -- the disk --------------------------------------------------------------------------------------


def disk_of(major: int, minor: int) -> str | None:
    """The whole disk (its /proc/diskstats name) of a block device number, or None when the number
    is no block device (tmpfs, overlay, NFS: their st_dev is an anonymous device)."""
    node = Path(f"/sys/dev/block/{major}:{minor}")
    if not node.exists():
        return None
    node = node.resolve()
    return node.parent.name if (node / "partition").exists() else node.name


def block_device(path: Path) -> str | None:
    """The whole disk holding ``path``, or None (see ``disk_of``)."""
    dev = path.stat().st_dev
    return disk_of(os.major(dev), os.minor(dev))


def sectors_read(disk: str, diskstats: str | None = None) -> int:
    """Sectors read from ``disk`` since boot: the 6th field of its /proc/diskstats line."""
    text = Path("/proc/diskstats").read_text() if diskstats is None else diskstats
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[2] == disk:
            return int(fields[5])
    raise LoaderError(f"{disk} is not in /proc/diskstats")


def read_bytes() -> int:
    """The bytes this process (all its threads) had read from storage: /proc/self/io."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise LoaderError("no read_bytes in /proc/self/io (a kernel without task I/O accounting)")


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# -- one node run ----------------------------------------------------------------------------------


@dataclass
class RankRun(bench.Run):
    """One method's load at N ranks: ``seconds`` and ``gbps`` are the node's; ``peak_rss`` the
    largest rank's; ``disk_bytes`` the device's reads, ``read_bytes`` the ranks' own (their
    /proc/self/io, which other processes cannot add to); ``per_rank`` what each rank reported;
    ``handed_back`` the free memory the VM reported to its host from the start of the ranks to
    the end: mostly what the last run's ranks freed when they exited, which this run's
    allocations then find gone (:func:`.balloon.reported_bytes`; None where not counted)."""

    ranks: int = 1
    disk_bytes: int | None = None
    read_bytes: int | None = None
    handed_back: int | None = None
    per_rank: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        """``N=4 round 2  fxkit  1.93 GB/s (3.3 s), disk 1.02x``: one line of progress."""
        disk = f", disk {self.disk_bytes / self.nbytes:.2f}x" if self.disk_bytes else ""
        if self.read_bytes is not None:
            disk += f", ranks read {self.read_bytes / self.nbytes:.2f}x"
        if self.handed_back is not None:
            disk += f", {self.handed_back / 2**30:.2f} GiB handed back"
        result = self.error or f"{self.gbps:.3f} GB/s ({self.seconds:.1f} s){disk}"
        return f"N={self.ranks:<3} round {self.round + 1:<2} {self.method:<16} {result}"


class _Rank:
    """One rank's process: the lines it prints, its stderr kept in a file."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.errors: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, env=env
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.pending = b""

    def feed(self) -> bool:
        """Take what it printed (its stdout is readable); False at its end."""
        chunk = os.read(self.fd, 1 << 16)
        self.pending += chunk
        return bool(chunk)

    def take_line(self) -> str | None:
        """The next whole line it printed, if there is one."""
        if b"\n" not in self.pending:
            return None
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def go(self) -> None:
        """Let it start; one that has died already is reported by ``_collect``."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def why(self) -> str:
        """Why it gave no answer: its stderr's last line, or how it ended."""
        self.stop()
        self.errors.seek(0)
        lines = self.errors.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit {self.proc.returncode} (no answer)"

    def stop(self, grace: float = 0.0) -> None:
        """Wait ``grace`` seconds for it to end, then kill it (our own child, by its PID)."""
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.stop(10.0)
        for stream in (self.proc.stdin, self.proc.stdout, self.errors):
            if stream:
                stream.close()


def run_node(
    method: str,
    path: Path,
    options: dict[str, Any],
    world: int,
    run: RankRun,
    disk: str | None = None,
    timeout: float = RANK_TIMEOUT,
    also_evict: Sequence[Path] = (),
    settle: float = 0.0,
) -> str | None:
    """``world`` ranks load ``path`` with ``method``, cold (``also_evict`` too: the server's
    copies behind a network mount), ``settle`` seconds after the eviction; fills ``run``;
    returns an eviction problem, if any (the run still goes ahead)."""
    spec = RANK_METHODS[method]
    files = model_files(path).files
    run.nbytes = sum(f.stat().st_size for f in files)
    problem = None
    reported = balloon.reported_bytes()
    with tempfile.TemporaryDirectory(prefix="fxkit-ranks-") as tmp:
        argv = [sys.executable, "-m", "fxkit.loadbench.bench_ranks", method, str(path)]
        argv += [json.dumps(options), str(world), str(Path(tmp) / "store")]
        ranks = [_Rank([*argv, str(r)], _rank_env(spec, r, world)) for r in range(world)]
        try:
            deadline = time.monotonic() + timeout
            ready = _collect(ranks, deadline)
            if isinstance(ready, str) or set(ready) != {"ready"}:
                run.error = ready if isinstance(ready, str) else f"not ready: {ready}"
                return None
            left = evict_all([*files, *also_evict])
            run.resident_before = sum(left.values())
            problem = f"still resident after eviction: {left}" if left else None
            time.sleep(settle)
            before = sectors_read(disk) if disk else 0
            start = time.monotonic()
            for rank in ranks:
                rank.go()
            answers = _collect(ranks, deadline)
            if disk:
                run.disk_bytes = (sectors_read(disk) - before) * SECTOR
            if reported is not None:
                run.handed_back = (balloon.reported_bytes() or reported) - reported
            if isinstance(answers, str):
                run.error = answers
                return problem
        finally:
            for rank in ranks:
                rank.close()
    run.per_rank = [json.loads(a) for a in answers]
    run.seconds = max(r["end"] for r in run.per_rank) - start
    run.gbps = run.nbytes / run.seconds / bench.GB
    run.tensors = run.per_rank[0]["tensors"]
    sums = {r["checksum"] for r in run.per_rank}
    run.checksum = sums.pop() if len(sums) == 1 else None
    run.peak_rss = max(r["peak_rss"] for r in run.per_rank)
    run.rss_before = min(r["rss_before"] for r in run.per_rank)
    run.read_bytes = sum(r["read_bytes"] for r in run.per_rank)
    return problem


def _rank_env(spec: RankMethod, rank: int, world: int) -> dict[str, str]:
    """torchrun's variables (what a loader can learn its rank from), gloo on loopback."""
    return {
        **os.environ,
        **dict(spec.env),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GLOO_SOCKET_IFNAME": "lo",
    }


def _collect(ranks: list[_Rank], deadline: float) -> list[str] | str:
    """The next line of every rank, or ``rank R: why`` for the first rank that ended without one
    (or had none by the deadline): a failed rank ends the run, its peers may wait for it forever."""
    lines: dict[int, str] = {}
    while True:
        for r, rank in enumerate(ranks):
            if r not in lines and (line := rank.take_line()) is not None:
                lines[r] = line
        waiting = {rank.fd: r for r, rank in enumerate(ranks) if r not in lines}
        if not waiting:
            return [lines[r] for r in range(len(ranks))]
        left = deadline - time.monotonic()
        readable = select.select(list(waiting), [], [], left)[0] if left > 0 else []
        if not readable:
            r = min(waiting.values())
            return f"rank {r}: no answer before the time-out; {ranks[r].why()}"
        for fd in readable:
            if not ranks[waiting[fd]].feed():
                return f"rank {waiting[fd]}: {ranks[waiting[fd]].why()}"


# -- rounds and the report -------------------------------------------------------------------------


@dataclass
class RankSummary:
    """One method at N ranks over all rounds."""

    method: str
    about: str
    ranks: int
    seconds_median: float | None = None
    seconds_min: float | None = None
    seconds_max: float | None = None
    gbps: float | None = None
    disk_ratio: float | None = None
    read_ratio: float | None = None
    vs_baseline: float | None = None
    checksum_ok: bool | None = None
    rss_per_rank: int | None = None
    rss_sum: int | None = None
    handed_back: int | None = None
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class RanksReport:
    model: str
    files: int
    nbytes: int
    rounds: int
    ranks: list[int]
    machine: dict[str, Any]
    disk: str | None
    options: dict[str, Any]
    summaries: list[RankSummary]
    runs: list[RankRun]
    eviction_failures: list[str]
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def summary(self, method: str, ranks: int) -> RankSummary | None:
        return next((s for s in self.summaries if (s.method, s.ranks) == (method, ranks)), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _summarise(spec: RankMethod, world: int, runs: list[RankRun], nbytes: int) -> RankSummary:
    mine = [r for r in runs if r.method == spec.name]
    good = [r for r in mine if not r.error]
    s = RankSummary(spec.name, spec.about, world, errors=[r.error for r in mine if r.error])
    if not good:
        return s
    seconds = [r.seconds for r in good]
    s.seconds_median, s.seconds_min, s.seconds_max = (
        statistics.median(seconds), min(seconds), max(seconds),
    )  # fmt: skip
    s.gbps = nbytes / s.seconds_median / bench.GB
    disk = [r.disk_bytes / nbytes for r in good if r.disk_bytes is not None]
    s.disk_ratio = statistics.median(disk) if disk else None
    s.read_ratio = statistics.median((r.read_bytes or 0) / nbytes for r in good)
    s.vs_baseline = bench.ratio(list(runs), spec.name, "baseline")
    reference = next(
        (r.per_rank[0]["checksum"] for r in runs if r.method == "baseline" and r.per_rank), None
    )
    if reference is not None:
        s.checksum_ok = all(p["checksum"] == reference for r in good for p in r.per_rank)
    s.rss_per_rank = max(r.peak_rss or 0 for r in good)
    s.rss_sum = max(sum(p["peak_rss"] for p in r.per_rank) for r in good)
    back = [r.handed_back for r in good if r.handed_back is not None]
    s.handed_back = int(statistics.median(back)) if back else None
    return s


def _targets(summaries: list[RankSummary], runs: list[RankRun]) -> dict[str, Any]:
    """fxkit's disk ratio and its node speed over the baseline's and every peer's, at one N."""
    fx = next((s for s in summaries if s.method == "fxkit" and s.seconds_median), None)
    if fx is None:
        return {}
    out: dict[str, Any] = {}
    if fx.disk_ratio is not None:
        out["disk"] = {"target": DISK_TARGET, "ratio": fx.disk_ratio,
                       "met": fx.disk_ratio <= DISK_TARGET}  # fmt: skip
    for other, target in SPEED_TARGETS.items():
        if any(r.method == other and not r.error for r in runs):
            x = bench.ratio(list(runs), "fxkit", other)
            met = x is not None and (x >= target if other == "baseline" else x > target)
            out[other] = {"target": target, "ratio": x, "met": met}
    return out


def bench_ranks(
    model: str | os.PathLike[str],
    ranks: Sequence[int] = (2, 4, 8),
    methods: Sequence[str] = tuple(RANK_METHODS),
    runs: int = 3,
    fxkit_options: dict[str, Any] | None = None,
    on_run: Callable[[RankRun], None] | None = None,
    timeout: float = RANK_TIMEOUT,
    also_evict: Sequence[Path] = (),
) -> RanksReport:
    """For each N in ``ranks``: ``runs`` rounds of every method, interleaved and rotated; cold.

    ``also_evict``: files behind a network mount (the server's copies), evicted before every run
    too; the disk bytes are then counted on their device."""
    if unknown := [m for m in methods if m not in RANK_METHODS]:
        known = ", ".join(RANK_METHODS)
        raise LoaderError(f"no multi-rank method {', '.join(unknown)}; at N ranks: {known}")
    if bad := [n for n in ranks if n < 1]:
        raise LoaderError(f"--ranks must be whole numbers >= 1, not {bad}")
    path, files = Path(model), model_files(model).files
    nbytes = sum(f.stat().st_size for f in files)
    if max(ranks) * nbytes > 0.8 * _mem_available():
        raise LoaderError(
            f"{max(ranks)} ranks x {nbytes / bench.GB:.1f} GB would not fit in memory "
            f"({_mem_available() / bench.GB:.1f} GB available): the peers keep a copy per rank",
            hint="use a smaller checkpoint (fxkit make-checkpoint DIR --size 1GB) or fewer ranks",
        )
    options = dict(fxkit_options or {})
    disk = block_device(also_evict[0] if also_evict else files[0])
    skipped = {m: why for m in methods if (why := RANK_METHODS[m].missing())}
    active = [m for m in methods if m not in skipped]
    report = RanksReport(
        model=str(path), files=len(files), nbytes=nbytes, rounds=runs, ranks=list(ranks),
        machine={**bench.machine(), "filesystem": bench.filesystem(path)}, disk=disk,
        options=options, summaries=[], runs=[], eviction_failures=[],
    )  # fmt: skip
    for world in ranks:
        at_n: list[RankRun] = []
        for rnd in range(runs):
            shift = rnd % len(active) if active else 0
            for name in active[shift:] + active[:shift]:
                run = RankRun(name, rnd, ranks=world)
                opts = options if name == "fxkit" else {}
                problem = run_node(name, path, opts, world, run, disk, timeout, also_evict)
                if problem:
                    report.eviction_failures.append(f"N={world} round {rnd} {name}: {problem}")
                at_n.append(run)
                if on_run:
                    on_run(run)
        summaries = [
            RankSummary(m, RANK_METHODS[m].about, world, skipped=skipped[m])
            if m in skipped
            else _summarise(RANK_METHODS[m], world, at_n, nbytes)
            for m in methods
        ]
        report.summaries += summaries
        report.runs += at_n
        report.targets[str(world)] = _targets(summaries, at_n)
    return report


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.2f}" if n is not None else "-"


def render(report: RanksReport, console: Any) -> None:
    """Print the report as a rich table, with the machine, the disk and the targets."""
    from rich.table import Table

    title = (
        f"{report.model}: {report.files} files, {report.nbytes / bench.GB:.2f} GB, cold "
        f"(evicted, mincore-verified), N ranks at once, {report.rounds} interleaved rounds"
    )
    caption = (
        "node s: go to the last rank's end; disk: bytes read from the device / checkpoint bytes "
        "(the whole device: other processes add to it); ranks read: the same from the ranks' own "
        "/proc/self/io; ratios: median of within-round ratios"
    )
    counted = any(s.handed_back is not None for s in report.summaries)
    if counted:
        caption += (
            "; handed back: free memory the VM reported to its host per run, from the start of "
            "its ranks (median): the host must back it again when it is next used"
        )
    table = Table(title=title, caption=caption)
    columns = ("N", "method", "node s", "min", "max", "GB/s", "x baseline", "disk", "ranks read",
               "RSS/rank GiB", "RSS sum GiB", *(["handed back GiB"] if counted else []),
               "notes")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col in ("method", "notes") else "right")
    for s in report.summaries:
        notes = s.skipped or ("; ".join(s.errors[:1]) if s.errors else "")
        if s.checksum_ok is False:
            notes = f"CHECKSUM DIFFERS from baseline {notes}"
        if s.disk_ratio and s.read_ratio is not None and s.disk_ratio > 1.1 * s.read_ratio + 0.05:
            notes = f"{notes} device read more than the ranks: other processes".strip()
        secs = [f"{v:.2f}" if v is not None else "-" for v in (s.seconds_median, s.seconds_min,
                                                                s.seconds_max)]  # fmt: skip
        table.add_row(
            str(s.ranks), s.method, *secs, f"{s.gbps:.2f}" if s.gbps else "-",
            bench._x(s.vs_baseline), bench._x(s.disk_ratio), bench._x(s.read_ratio),
            _gib(s.rss_per_rank), _gib(s.rss_sum),
            *([_gib(s.handed_back)] if counted else []), notes,
        )  # fmt: skip
    console.print(table)
    m = report.machine
    device = (
        f"disk: {report.disk} (/proc/diskstats)"
        if report.disk
        else "disk: the file system has no block device, so no bytes-read count"
    )
    console.print(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_bytes'] / 2**30:.0f} GiB RAM, "
        f"Linux {m['kernel']}, {m['filesystem']}; {device}{bench._reporting(m)}"
    )
    for failure in report.eviction_failures:
        console.print(f"[yellow]page cache: {failure}[/]", highlight=False)
    for world, targets in report.targets.items():
        for other, t in targets.items():
            mark = "[green]met[/]" if t["met"] else "[red]missed[/]"
            what = (
                f"fxkit disk <= {t['target']}x checkpoint"
                if other == "disk"
                else f"fxkit {'>=' if other == 'baseline' else '>'} {t['target']}x {other}"
            )
            console.print(f"N={world} target {what}: {bench._x(t['ratio'])} {mark}")


# -- a rank ----------------------------------------------------------------------------------------


def _rank_main(argv: list[str]) -> None:
    """One rank: imports (and its process group) first, ``ready``, wait for ``go``, load, report.

    Its answers go to the stdout it was given; anything else printed there (a library's C code,
    say) goes to stderr instead."""
    method, path, options, world, store, rank = argv
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch

    spec = RANK_METHODS[method]
    importlib.import_module(spec.needs.partition(":")[0])
    if spec.group:
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{store}", rank=int(rank), world_size=int(world)
        )
    files = model_files(path).files
    print("ready", file=answers, flush=True)
    sys.stdin.readline()
    before = read_bytes()
    result = bench.consume(spec.read(Path(path), files, json.loads(options), int(rank), int(world)))
    result["end"] = time.monotonic()
    result["read_bytes"] = read_bytes() - before
    print(json.dumps(result), file=answers, flush=True)
    if spec.group:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
