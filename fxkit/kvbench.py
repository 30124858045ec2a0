"""``fxkit bench kv``: LMCache's disk tier measured where it runs, by LMCache's own code.

LMCache's ``LocalDiskBackend`` (the installed release; the role pins 0.5.6) writes N chunks shaped
like one GPU worker's share of the chosen model's KV cache: ``[2, layers, chunk_size, KV heads
per rank x head_dim]`` (LMCache's ``KV_2LTD``; an MLA model ``[1, layers, chunk_size, latent +
rope]``), from ``fxkit estimate``'s model shapes. For every setting of the sweep
(``disk_io_threads``, ``use_odirect``, one folder or several by LMCache's ``by_gpu`` sharding),
fresh backends index those files (``insert_key``, what the backend itself calls once a write is
done), the files are evicted from the page cache (``posix_fadvise(DONTNEED)``, checked with
mincore: a filesystem that keeps its files in memory, tmpfs, cannot drop them, and the report
says so), and each worker reads its chunks back with one ``batched_get_blocking`` call, as vLLM's
connector retrieves a request's chunks. fio reads the same files every byte once (the loader
benchmarks' sweep): its fastest setting is the storage limit. Settings run in interleaved
rounds, the order rotated each round.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import math
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fxkit.estimate.inputs import Inputs
from fxkit.estimate.kv import KVLayout
from fxkit.estimate.summary import estimate, kv_bytes, shape_from
from fxkit.loadbench.bench import filesystem, fio_read
from fxkit.loader import evict_all

GB = 1e9
THREADS = (1, 2, 4, 8, 16, 32)
INSTALL = (
    "LMCache is not installed here: pip install 'fxkit[kv]' (lmcache==0.5.6) beside a pinned "
    "torch (torch==2.13.0 on a CPU machine, so pip keeps it), or run fxkit bench kv in the "
    "role's venv on a node (roles/vllm_lmcache installs LMCache there)"
)
#: torch dtypes by bytes per cached value (fxkit estimate's kv_cache_dtype).
DTYPES = {4.0: "float32", 2.0: "bfloat16", 1.0: "float8_e4m3fn"}


class KVBenchError(Exception):
    """What stops the benchmark, with what to do."""


def missing() -> str | None:
    """Why LMCache cannot run here (None: it can)."""
    if importlib.util.find_spec("lmcache") is None:
        return INSTALL
    return None


# -- what is written ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkShape:
    """One LMCache chunk of one GPU worker (one tensor-parallel rank)."""

    model: str
    tp: int
    dims: tuple[int, ...]
    dtype: str
    fmt: str  # LMCache's MemoryFormat name
    per_token: float  # KV bytes per token over the TP group (the estimator's)

    @property
    def tokens(self) -> int:
        return self.dims[2]

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * int(next(k for k, v in DTYPES.items() if v == self.dtype))


def chunk_shape(inputs: Inputs, chunk_tokens: int) -> ChunkShape:
    """The chunk of ``inputs``' model (its config.json) at its tensor-parallel size."""
    shape = shape_from(inputs)
    tp = inputs.whole("gpu.tensor_parallel")
    size = kv_bytes(inputs, shape)
    if size not in DTYPES:
        raise KVBenchError(f"a KV cache of {size:g} bytes per value has no torch dtype here")
    layout = KVLayout(shape, tp, size)
    if shape.mla:
        dims = (1, shape.layers, chunk_tokens, shape.mla.kv_lora_rank + shape.mla.qk_rope_head_dim)
        fmt = "KV_MLA_FMT"
    else:
        dims = (2, shape.layers, chunk_tokens, math.ceil(shape.kv_heads / tp) * shape.head_dim)
        fmt = "KV_2LTD"
    return ChunkShape(shape.name, tp, dims, DTYPES[size], fmt, layout.per_token)


# -- the settings and their runs ---------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One point of the sweep."""

    threads: int
    odirect: bool
    sharded: bool  # each worker its folder (by_gpu), or every worker in the first

    @property
    def label(self) -> str:
        where = "sharded" if self.sharded else "one folder"
        return f"threads={self.threads} odirect={'on' if self.odirect else 'off'} {where}"


@dataclass
class Run:
    """One timed read: a setting of LMCache's, or a fio setting (``method`` fio)."""

    method: str  # lmcache, fio
    label: str
    round: int
    nbytes: int = 0
    seconds: float = 0.0
    cpu_cores: float = 0.0  # process CPU seconds / wall seconds (LMCache runs)
    resident_before: int = 0  # bytes still in the page cache when the read began
    error: str | None = None

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / GB if self.seconds and not self.error else 0.0


@dataclass
class Report:
    folders: list[str]  # where LMCache writes (as given)
    read_via: list[str]  # where it reads the same files (a mount of each folder), or []
    filesystems: list[str]  # of the folders it reads
    chunk: ChunkShape
    chunks_per_worker: int
    workers: int
    lmcache: str
    settings: list[Setting]
    runs: list[Run] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    scratch: list[str] = field(default_factory=list)  # the folders written, in ``folders``

    @property
    def reading(self) -> list[str]:
        """The scratch folders as the readers see them (through ``read_via``)."""
        if not self.read_via:
            return self.scratch
        return [
            str(Path(v) / Path(s).name) for v, s in zip(self.read_via, self.scratch, strict=True)
        ]

    def through(self, files: list[str]) -> list[str]:
        """Written files as the readers see them."""
        seen = dict(zip(self.scratch, self.reading, strict=True))
        return [str(Path(seen[str(Path(f).parent)]) / Path(f).name) for f in files]


# -- LMCache's backend, driven as vLLM's connector drives it ------------------------------------


class _Loop:
    """An asyncio loop in a thread: LocalDiskBackend submits its writes to one."""

    def __enter__(self) -> asyncio.AbstractEventLoop:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self.loop

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.wait(pending))
        self.loop.close()


@dataclass
class _Worker:
    """One GPU worker's LMCache engine parts: its CPU pool and its disk backend."""

    index: int
    cpu: Any
    disk: Any
    keys: list[Any]


class _LMCache:
    """LMCache's modules, imported once (they print their device at import)."""

    def __init__(self) -> None:
        os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
        load = importlib.import_module  # (LMCache ships no type information)
        backends = "lmcache.v1.storage_backend"
        self.torch = load("torch")
        self.key = load("lmcache.utils").CacheEngineKey
        self.config = load("lmcache.v1.config").LMCacheEngineConfig
        self.formats = load("lmcache.v1.memory_management").MemoryFormat
        self.metadata = load("lmcache.v1.metadata").LMCacheMetadata
        self.cpu_backend = load(f"{backends}.local_cpu_backend").LocalCPUBackend
        self.disk_backend = load(f"{backends}.local_disk_backend").LocalDiskBackend

    def _config(self, chunk: ChunkShape, per_worker: int, **values: Any) -> Any:
        pool = (per_worker + 2) * chunk.nbytes / 1024**3  # the batch, staged at once
        return self.config.from_defaults(
            chunk_size=chunk.tokens,
            local_cpu=False,
            max_local_cpu_size=pool,
            max_local_disk_size=pool * 2,
            **values,
        )

    def _metadata(self, chunk: ChunkShape, count: int, i: int) -> Any:
        kv_shape = (chunk.dims[1], chunk.dims[0], chunk.tokens, 1, chunk.dims[3])
        return self.metadata(chunk.model, count, count, i, i, getattr(self.torch, chunk.dtype),
                             kv_shape)  # fmt: skip

    def pools(self, chunk: ChunkShape, count: int, per_worker: int) -> list[Any]:
        """Each worker's CPU pool (``LocalCPUBackend``), where its reads land: made once, then
        used by every setting."""
        config = self._config(chunk, per_worker)
        return [
            self.cpu_backend(config, self._metadata(chunk, count, i), dst_device="cpu")
            for i in range(count)
        ]

    def clear(self, pools: list[Any], chunk: ChunkShape, per_worker: int) -> None:
        """Every buffer of the pools zeroed: a read that left a buffer unfilled cannot pass the
        check with an earlier run's bytes (and the pool is warm, as a serving engine's is)."""
        for cpu in pools:
            held = [self.allocate(cpu, chunk) for _ in range(per_worker)]
            for obj in held:
                obj.tensor.view(self.torch.uint8).fill_(0)
                obj.ref_count_down()

    def workers(
        self,
        chunk: ChunkShape,
        folders: Sequence[str],
        pools: list[Any],
        per_worker: int,
        setting: Setting,
        loop: asyncio.AbstractEventLoop,
    ) -> list[_Worker]:
        """A disk backend per worker as LMCache makes them in that many GPU processes: worker
        *i* on device *i*, so ``by_gpu`` gives it folder *i* mod the number of folders."""
        config = self._config(
            chunk,
            per_worker,
            local_disk=",".join(folders if setting.sharded else folders[:1]),
            local_disk_path_sharding="by_gpu",
            extra_config={"disk_io_threads": setting.threads, "use_odirect": setting.odirect},
        )
        dtype, count = getattr(self.torch, chunk.dtype), len(pools)
        made = []
        for i, cpu in enumerate(pools):
            disk = self.disk_backend(config, loop, cpu, dst_device=f"cpu:{i}")
            keys = [self.key(chunk.model, count, i, n, dtype) for n in range(per_worker)]
            made.append(_Worker(i, cpu, disk, keys))
        return made

    def allocate(self, cpu: Any, chunk: ChunkShape) -> Any:
        fmt = getattr(self.formats, chunk.fmt)
        shape = self.torch.Size(chunk.dims)
        return cpu.allocate(shape, getattr(self.torch, chunk.dtype), fmt)

    def write(self, worker: _Worker, chunk: ChunkShape) -> list[str]:
        """The worker's chunks written by its backend (``submit_put_task``); their files."""
        for key in worker.keys:
            obj = self.allocate(worker.cpu, chunk)
            obj.tensor.view(self.torch.uint8).fill_(_pattern(worker.index, key.chunk_hash))
            worker.disk.submit_put_task(key, obj)
            obj.ref_count_down()
        deadline = time.monotonic() + 600
        while not all(worker.disk.contains(k) for k in worker.keys):
            if time.monotonic() > deadline:
                raise KVBenchError("LMCache's backend did not finish its writes in 10 minutes")
            time.sleep(0.01)
        return [worker.disk._key_to_path(k) for k in worker.keys]

    def index(self, worker: _Worker, chunk: ChunkShape) -> None:
        """The files already on disk made known to a fresh backend."""
        dtype, fmt = getattr(self.torch, chunk.dtype), getattr(self.formats, chunk.fmt)
        for key in worker.keys:
            size = os.path.getsize(worker.disk._key_to_path(key))
            worker.disk.insert_key(key, size, self.torch.Size(chunk.dims), dtype, fmt)

    def read(self, worker: _Worker) -> str | None:
        """The worker's chunks through ``batched_get_blocking``; what was wrong, if anything."""
        objs = worker.disk.batched_get_blocking(worker.keys)
        wrong = None
        for key, obj in zip(worker.keys, objs, strict=True):
            if obj is None:
                wrong = wrong or f"worker {worker.index}: LMCache returned no data for a chunk"
                continue
            flat = obj.tensor.view(self.torch.uint8).view(-1)
            want = _pattern(worker.index, key.chunk_hash)
            if int(flat[0]) != want or int(flat[-1]) != want:
                wrong = wrong or f"worker {worker.index}: chunk {key.chunk_hash} read back wrong"
            obj.ref_count_down()
        return wrong


def _pattern(worker: int, chunk: int) -> int:
    return 1 + (worker * 31 + chunk) % 251


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _read_all(lmc: _LMCache, workers: list[_Worker], run: Run) -> None:
    """Every worker's batch at once, one thread per worker (the GPU processes)."""
    errors: list[str | None] = [None] * len(workers)
    start = threading.Barrier(len(workers) + 1)

    def one(i: int) -> None:
        start.wait()
        errors[i] = lmc.read(workers[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    cpu, wall = _cpu_seconds(), time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    run.seconds = time.perf_counter() - wall
    run.cpu_cores = (_cpu_seconds() - cpu) / run.seconds
    run.error = next((e for e in errors if e), None)


def _run_lmcache(
    lmc: _LMCache, report: Report, pools: list[Any], setting: Setting, files: list[str], rnd: int
) -> Run:
    run = Run("lmcache", setting.label, rnd)
    with _Loop() as loop:
        workers = lmc.workers(
            report.chunk, report.reading, pools, report.chunks_per_worker, setting, loop
        )
        try:
            for worker in workers:
                lmc.index(worker, report.chunk)
            lmc.clear(pools, report.chunk, report.chunks_per_worker)
            run.resident_before = sum(evict_all({*files, *report.through(files)}).values())
            _read_all(lmc, workers, run)
            run.nbytes = report.chunk.nbytes * report.chunks_per_worker * report.workers
        finally:
            for worker in workers:
                worker.disk.close()
    return run


@dataclass(frozen=True)
class FioSetting:
    """fio reading the chunk files as LMCache does, one whole-file read each: ``jobs`` jobs at
    once, each a share of the files in turn (``psync``: a blocking read, as ``readinto``), or
    ``depth`` reads in flight per job (``libaio``); O_DIRECT or through the page cache."""

    jobs: int
    direct: bool
    depth: int = 1

    @property
    def label(self) -> str:
        engine = f"libaio qd{self.depth}" if self.depth > 1 else "psync"
        return f"fio {self.jobs} jobs {engine} {'direct' if self.direct else 'buffered'}"


#: The sweep: LMCache's thread counts, both ways, and a deep queue.
FIO_SWEEP = (
    *(FioSetting(jobs, direct) for direct in (True, False) for jobs in (1, 4, 16, 32)),
    FioSetting(4, True, 8),
)


def fio_job(folder: str, count: int, size: int, setting: FioSetting) -> str:
    """A fio job file that reads ``count`` files of ``size`` bytes named ``0``, ``1``, ... in
    ``folder`` every byte once, a whole file per read (short names: fio limits the length of
    a job's list of files)."""
    engine = "libaio" if setting.depth > 1 else "psync"
    head = (
        f"[global]\ndirectory={folder}\nrw=read\nioengine={engine}\niodepth={setting.depth}\n"
        f"bs={size}\ndirect={int(setting.direct)}\nfile_service_type=sequential\n"
    )
    jobs = []
    for j in range(min(setting.jobs, count)):
        share = range(j, count, setting.jobs)
        jobs.append(f"[j{j}]\nfilename={':'.join(map(str, share))}\nsize={size * len(share)}\n")
    return head + "".join(jobs)


def _run_fio(report: Report, files: list[str], setting: FioSetting, rnd: int) -> Run:
    paths = report.through(files)
    run = Run("fio", setting.label, rnd)
    run.resident_before = sum(evict_all({*files, *paths}).values())
    size = os.path.getsize(files[0])
    with tempfile.TemporaryDirectory() as links, tempfile.NamedTemporaryFile("w") as job:
        for i, path in enumerate(paths):
            os.symlink(path, os.path.join(links, str(i)))
        job.write(fio_job(links, len(paths), size, setting))
        job.flush()
        proc = subprocess.run(
            ["fio", "--output-format=json", job.name], capture_output=True, text=True, check=False
        )
    try:
        run.nbytes, run.seconds = fio_read(proc.stdout)
    except Exception as exc:  # fio's own failure, shown in the report
        run.error = f"fio exit {proc.returncode}: {exc}; {proc.stderr.strip()[-200:]}"
        return run
    total = len(files) * size
    if run.nbytes != total:
        run.error = f"fio read {run.nbytes} bytes of {total}"
    return run


# -- the sweep ---------------------------------------------------------------------------------


def sweep(threads: Sequence[int], odirect: Sequence[bool], folders: int) -> list[Setting]:
    """Every combination; several folders add the sharded layout."""
    layouts = (False, True) if folders > 1 else (False,)
    return [Setting(t, o, s) for s in layouts for o in odirect for t in threads]


def bench(
    folders: Sequence[str],
    chunk: ChunkShape,
    total_bytes: int,
    settings: Sequence[Setting],
    *,
    workers: int = 1,
    rounds: int = 3,
    fio: Sequence[FioSetting] = FIO_SWEEP,
    read_via: Sequence[str] = (),
    on_run: Callable[[Run], None] = lambda run: None,
) -> Report:
    """Write the chunks once per layout, then every setting and fio, ``rounds`` times.
    ``read_via``: a mount of each folder (a remote filesystem), through which it is read."""
    why = missing()
    if why:
        raise KVBenchError(why)
    if read_via and len(read_via) != len(folders):
        raise KVBenchError(f"{len(read_via)} --read-via for {len(folders)} folders: one each")
    if shutil.which("fio") is None:
        raise KVBenchError("fio is not installed: apt-get install fio")
    lmc = _LMCache()
    from importlib.metadata import version

    per_worker = max(2, total_bytes // workers // chunk.nbytes)
    report = Report(
        folders=[os.path.abspath(f) for f in folders],
        read_via=[os.path.abspath(f) for f in read_via],
        filesystems=[filesystem(Path(f)) for f in read_via or folders],
        chunk=chunk,
        chunks_per_worker=per_worker,
        workers=workers,
        lmcache=version("lmcache"),
        settings=list(settings),
    )
    with _scratch(report.folders) as scratch, _pools(lmc, report) as pools:
        report.scratch = scratch
        layouts = {s.sharded for s in settings}
        files = {layout: _write(lmc, report, pools, layout) for layout in layouts}
        for rnd in range(rounds):
            todo: list[Any] = [*settings, *fio]
            shift = rnd % len(todo)
            for item in todo[shift:] + todo[:shift]:
                if isinstance(item, Setting):
                    run = _run_lmcache(lmc, report, pools, item, files[item.sharded], rnd)
                else:
                    run = _run_fio(
                        report, files[max(files)], item, rnd
                    )  # every folder's, if sharded
                report.runs.append(run)
                on_run(run)
    report.summary = summarise(report)
    report.notes = _notes(report)
    return report


@contextlib.contextmanager
def _pools(lmc: _LMCache, report: Report) -> Iterator[list[Any]]:
    """The workers' CPU pools, freed at the end."""
    pools = lmc.pools(report.chunk, report.workers, report.chunks_per_worker)
    try:
        yield pools
    finally:
        for pool in pools:
            pool.close()


@contextlib.contextmanager
def _scratch(folders: list[str]) -> Iterator[list[str]]:
    """A fresh folder in each given one, removed at the end."""
    made = []
    try:
        for folder in folders:
            made.append(tempfile.mkdtemp(prefix="fxkit-bench-kv-", dir=folder))
        yield made
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def _write(lmc: _LMCache, report: Report, pools: list[Any], sharded: bool) -> list[str]:
    """The chunks of every worker written by LMCache at its defaults, in the layout's folders
    (worker 0's files are the same in both layouts: its folder is the first in each)."""
    setting = Setting(4, False, sharded)
    with _Loop() as loop:
        workers = lmc.workers(
            report.chunk, report.scratch, pools, report.chunks_per_worker, setting, loop
        )
        try:
            files = [f for worker in workers for f in lmc.write(worker, report.chunk)]
        finally:
            for worker in workers:
                worker.disk.close()
    return files


# -- the report --------------------------------------------------------------------------------


def _medians(runs: list[Run]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for run in runs:
        if not run.error:
            by.setdefault(run.label, []).append(run.gbps)
    return {label: statistics.median(values) for label, values in by.items()}


def _fio_best(runs: list[Run]) -> dict[int, Run]:
    best: dict[int, Run] = {}
    for run in runs:
        if run.method != "fio" or run.error:
            continue
        if run.round not in best or run.gbps > best[run.round].gbps:
            best[run.round] = run
    return best


def _ratio(runs: list[Run], label: str, other: Callable[[int], float | None]) -> float | None:
    """Median over rounds of ``label``'s speed over ``other(round)``'s."""
    values = []
    for run in runs:
        base = other(run.round)
        if run.label == label and not run.error and base:
            values.append(run.gbps / base)
    return statistics.median(values) if values else None


def summarise(report: Report) -> dict[str, Any]:
    """GB/s per setting (median over rounds), the best, fio-best and the ratios."""
    lm = [r for r in report.runs if r.method == "lmcache"]
    medians = _medians(lm)
    if not medians:
        return {"error": "no LMCache run succeeded", "errors": sorted({str(r.error) for r in lm})}
    by_label = {s.label: s for s in report.settings}
    best = by_label[max(medians, key=lambda label: medians[label])]
    single = Setting(1, best.odirect, best.sharded)
    fio = _fio_best(report.runs)
    by_round = {(r.label, r.round): r.gbps for r in lm if not r.error}
    given = report.read_via or report.folders
    folders = given if best.sharded else given[:1]
    return {
        "gbps": medians,
        "best": best.label,
        "best_gbps": medians[best.label],
        "threads1": single.label if single.label in medians else None,
        "threads1_gbps": medians.get(single.label),
        "fio_best_gbps": statistics.median([r.gbps for r in fio.values()]) if fio else None,
        "fio_best_settings": sorted({r.label for r in fio.values()}),
        "x_fio_best": _ratio(lm, best.label, lambda n: fio[n].gbps if n in fio else None),
        "x_threads1": _ratio(lm, best.label, lambda n: by_round.get((single.label, n))),
        "cpu_cores_best": statistics.median(
            [r.cpu_cores for r in lm if r.label == best.label and not r.error]
        ),
        "cpu_count": os.cpu_count(),
        "cold": all(r.resident_before == 0 for r in report.runs),
        "role_vars": {
            "vllm_lmcache_disk_io_threads": best.threads,
            "vllm_lmcache_use_odirect": best.odirect,
            **({"vllm_lmcache_local_disk": folders} if best.sharded else {}),
        },
    }


def _notes(report: Report) -> list[str]:
    notes = []
    if not report.summary.get("cold", True):
        kept = [f for f in report.filesystems if f.startswith("tmpfs")]
        why = (
            f"{', '.join(kept)} keeps its files in memory: posix_fadvise(DONTNEED) cannot drop "
            "them, so these reads are from memory, not a disk"
            if kept
            else "some pages stayed in the page cache after eviction (resident_before)"
        )
        notes.append(why)
    errors = sorted({f"{r.label}: {r.error}" for r in report.runs if r.error})
    notes += errors[:5]
    return notes


def implied_ttft(inputs: Inputs, report: Report) -> dict[str, Any]:
    """What the estimator makes of the measured bandwidths: the reload of a context of
    ``workload.context_tokens`` and the TTFT with offload (docs/ESTIMATOR.md), at the best
    setting and at threads=1. The bandwidth is the node's, all workers together."""
    summary = report.summary
    out: dict[str, Any] = {"context_tokens": inputs.whole("workload.context_tokens")}
    for name, gbps, threads in (
        ("best", summary.get("best_gbps"), summary.get("role_vars", {}).get(
            "vllm_lmcache_disk_io_threads"
        )),
        ("threads1", summary.get("threads1_gbps"), 1),
    ):  # fmt: skip
        if not gbps:
            continue
        inputs.set("store.read_bandwidth", f"{gbps} GB/s", "fxkit bench kv")
        inputs.set("store.chunk_tokens", str(report.chunk.tokens), "fxkit bench kv")
        inputs.set("store.reads_in_flight", str(threads), "fxkit bench kv")
        result = estimate(inputs)
        out[name] = {
            "gbps": gbps,
            "reload_s": result.value("offload", "reload"),
            "ttft_with_offload_s": result.value("offload", "ttft_with"),
            "ttft_without_offload_s": result.value("offload", "ttft_without"),
        }
    return out


def as_json(report: Report, ttft: dict[str, Any]) -> dict[str, Any]:
    data = asdict(report)
    data["chunk"]["nbytes"] = report.chunk.nbytes
    for run, raw in zip(report.runs, data["runs"], strict=True):
        raw["gbps"] = run.gbps
    data["ttft"] = ttft
    data["kind"] = "fxkit-bench-kv"
    return data
