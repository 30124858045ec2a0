"""The loader's API: ``load``, ``iter_tensors`` and ``open_checkpoint``.

Files are read one after another, each by a pool of threads in chunks, with the next file's reads
queued behind the current one's; tensors are handed out in file order as soon as their bytes are in.
"""

from __future__ import annotations

import os
import resource
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cache import resident_fraction
from .errors import LoaderError
from .files import ModelPath
from .format import DTYPES, Checkpoint, FileHeader, TensorInfo, open_checkpoint
from .fstype import remote_fs, slow_storage
from .options import DirectIO, LoadOptions
from .plan import FilePlan, normalise_chunk_size, plan_file
from .read import FileReader, MappedFile
from .shared import Share, Shares, open_shares
from .sinks import HostSink, StagedSink, make_sink

if TYPE_CHECKING:
    import torch

#: ``direct_io="auto"``: a CPU load (without ``drop_cache``) maps a file from this fraction in the
#: page cache and reads the rest through it; for a device, O_DIRECT below ``DIRECT_BELOW``,
#: buffered reads above.
DIRECT_BELOW = 0.5
MAP_FROM = 0.99
#: How many spread-out windows of a file mincore() is asked about to choose its read mode.
RESIDENCY_WINDOWS = 64
#: With ``share``, the files in flight at once (their chunks all queued, so that the readers run
#: ahead of the consumer): each holds two descriptors (the file, its state file), together at most
#: a quarter of RLIMIT_NOFILE, whatever the number of files.
SHARED_IN_FLIGHT = 64
#: Buffered reads on slow network or FUSE storage (``share``, or several local ranks), at least
#: this many reader threads: each waits a round trip per readahead window (128 KiB on FUSE), so
#: the depth is the threads.
REMOTE_SHARED_THREADS = 32

__all__ = ["LoadOptions", "iter_tensors", "load", "open_checkpoint"]


def several_local_ranks() -> bool:
    """Whether this process is one of several on this node loading the same model: torchrun's
    (and vLLM's launchers') ``LOCAL_WORLD_SIZE`` above 1."""
    try:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _read_mode(direct_io: DirectIO, path: Path, can_map: bool, remote: bool = False) -> str:
    """How to read a file: "direct" (O_DIRECT), "buffered", "map" (already cached: nothing to
    read) or "cache" (read into the page cache and mapped; both for CPU loads only).

    The ``auto`` rule, from measurements on the 2-core development VM (docs/BENCHMARKS.md). CPU,
    cold, one process (1 Dec 2026): reading into the page cache through a small scratch buffer
    and mapping the file ran 1.12x the baseline, O_DIRECT into fresh buffers 1.00x (a fresh 4 KiB
    page costs a fault; the page cache takes large folios), and processes loading one file share
    its pages. Hot, mapping the cached pages ran 9-12 GB/s without copying a byte. For a device
    (29 Nov 2026): cold, O_DIRECT into the pinned staging ran 1.5-1.9 GB/s against 0.5-1.3 for
    buffered reads; hot, buffered reads ran 10-12 GB/s against 1-3 for O_DIRECT.
    On network and FUSE storage whose requests are slow (``remote``: a request measured at
    :data:`.fstype.SLOW_REQUEST_MS` or more, :func:`.fstype.slow_storage`) an uncached file is
    read with O_DIRECT whatever the device: buffered reads there wait for one readahead window
    (128 KiB on FUSE) per round trip, while each O_DIRECT read goes out as many requests at once
    (docs/BENCHMARKS.md, "Results for issue 26 §3-4"). Where such storage answers as fast as a
    local disk the local rule holds: through FUSE with no added delay, O_DIRECT ran 0.40x
    ``load_file`` where the page cache and a mapping beat both (the "second pass" results).
    Where several ranks of this node load at once (:func:`several_local_ranks`), a CPU load
    reads slow storage through the page cache too, so that the node reads each byte once:
    4 ranks with private O_DIRECT reads ran 0.49x ``load_file`` at 2 ms, reading through the
    page cache at 32 streams 1.54x. On a local disk, several ranks map an uncached file and let
    their page faults read it (the kernel's readahead, as ``load_file``): N ranks fault in
    parallel already, and N pools of readers on top ran 0.73-0.82x ``load_file`` at N = 2, 4
    and 8, mapping 0.91-1.79x (3 Dec 2026, the "second pass" results).
    """
    if direct_io in ("on", True):
        return "direct"
    if direct_io in ("off", False):
        return "buffered"
    try:
        cached = resident_fraction(path, windows=RESIDENCY_WINDOWS)
    except OSError:
        cached = 0.0
    if can_map and cached >= MAP_FROM:
        return "map"
    if can_map and several_local_ranks():
        return "cache" if remote else "map"
    if remote:
        return "direct" if cached < DIRECT_BELOW else "buffered"
    if can_map:
        return "cache"
    return "direct" if cached < DIRECT_BELOW else "buffered"


def _torch_dtype(header_path: Path, tensor: TensorInfo) -> torch.dtype:
    import torch

    name = DTYPES[tensor.dtype][1]
    if name is None or not hasattr(torch, name):
        raise LoaderError(
            f"{header_path}: tensor {tensor.name!r}: dtype {tensor.dtype} has no torch equivalent "
            f"in torch {torch.__version__}; read it with open_checkpoint() and your own decoder"
        )
    return getattr(torch, name)


def _tensor(
    plan: FilePlan, buffer: torch.Tensor, tensor: TensorInfo, dtype: torch.dtype | None
) -> torch.Tensor:
    """A view of ``tensor`` in its file's buffer (a copy only where its offset is misaligned)."""
    import torch

    target = _torch_dtype(plan.header.path, tensor)
    if tensor.nbytes == 0:
        result = torch.empty(tensor.shape, dtype=target, device=buffer.device)
    else:
        start = plan.head + tensor.begin
        raw = buffer[start : start + tensor.nbytes]
        if start % target.itemsize:
            raw = raw.clone()
        result = raw.view(target).reshape(tensor.shape)
    if dtype is not None and result.is_floating_point() and result.dtype != dtype:
        result = result.to(dtype)
    return result


class _CachedFile:
    """A file read through the page cache, whose pages its mapping shows (its tensors, for the
    CPU; a device gets copies): chunk by chunk by this process, or, with a ``share``, by
    whichever process of the node claims the chunk first."""

    def __init__(
        self,
        plan: FilePlan,
        share: Share | None,
        disk: FileReader,
        mapped: MappedFile,
        sink: HostSink | StagedSink,
    ) -> None:
        self.plan, self.share, self.disk, self.mapped, self.sink = plan, share, disk, mapped, sink
        host = isinstance(sink, HostSink)
        self.buffer = mapped.buffer if host else sink.allocate(plan.buffer_size)

    def fetch(self, index: int, wait: bool) -> bool:
        """Chunk ``index`` in place; False if another process reads it and ``wait`` is off."""
        chunk = self.plan.chunks[index]
        if self.share is None:
            self.disk.cache(chunk.file_offset, self.plan.needed_end(chunk))
        elif not self.share.fetch(index, self.disk, wait):
            return False
        if isinstance(self.sink, StagedSink):
            self.sink.fill(self.mapped, self.buffer, chunk, self.plan.needed_end(chunk))
        return True


class _Progress:
    """A rich progress bar in GB and GB/s, or nothing."""

    def __init__(self, stack: ExitStack, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TimeElapsedColumn,
                TransferSpeedColumn,
            )

            self.bar = stack.enter_context(
                Progress(
                    "[progress.description]{task.description}",
                    BarColumn(),
                    DownloadColumn(binary_units=False),
                    TransferSpeedColumn(),
                    TimeElapsedColumn(),
                    transient=False,
                )
            )
            self.task = self.bar.add_task("loading", total=total)

    def advance(self, nbytes: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, nbytes)


@dataclass
class _File:
    """A file being read: its plan and buffer, the chunks read for it (``needed``, with one future
    each), the tensors to hand out, and what closes what it holds (its reader, its share)."""

    plan: FilePlan
    buffer: Any
    tensors: list[TensorInfo]
    needed: list[int]
    futures: list[Future]
    opened: ExitStack
    cached: _CachedFile | None = None


def _close_all(in_flight: deque[_File]) -> None:
    with ExitStack() as closing:
        for file in in_flight:
            closing.push(file.opened)


def _shared_in_flight() -> int:
    """How many files a ``share`` load has in flight: :data:`SHARED_IN_FLIGHT`, or fewer under a
    low RLIMIT_NOFILE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return SHARED_IN_FLIGHT
    return max(2, min(SHARED_IN_FLIGHT, soft // 8))


def iter_tensors(
    path: ModelPath | Checkpoint,
    device: Any = "cpu",
    *,
    dtype: Any = None,
    options: LoadOptions | None = None,
    keep: Callable[[str], bool] | None = None,
    _staged: bool | None = None,
    **overrides: Any,
) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, tensor)`` in file order, each as soon as its bytes are in.

    ``path`` is a safetensors file, a list of files, a model directory, or an opened checkpoint.
    ``dtype`` casts floating-point tensors. ``keep``, when given, names the tensors wanted (a
    rank's own experts, say): the others are neither yielded nor read, beyond the chunks they
    share with kept ones. How the files are read is ``options``, with keyword arguments
    (``threads=16``...) set over it: see :class:`fxkit.loader.options.LoadOptions`.
    At most two files' buffers are in flight at a time (with ``share``, the files are the page
    cache's and up to :data:`SHARED_IN_FLIGHT` are queued at once).
    """
    opts = LoadOptions.from_mapping(overrides, options, where="iter_tensors")
    checkpoint = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    threads, direct_io, drop_cache = opts.threads, opts.direct_io, opts.drop_cache
    chunk = normalise_chunk_size(opts.chunk_size)
    sink = make_sink(device, threads, chunk, staged=_staged)
    wanted = {
        h.path: [t for t in h.tensors if keep is None or keep(t.name)] for h in checkpoint.files
    }
    files = [h for h in checkpoint.files if wanted[h.path]]
    with ExitStack() as stack:
        bar = _Progress(stack, sum(t.nbytes for h in files for t in wanted[h.path]), opts.progress)
        # With ``share``, a file's share is held while the file is in flight (closed with it).
        shared: Shares | None = None
        if opts.share and any(h.data_size for h in files):
            shared = open_shares(opts.claim_timeout)
        if shared is not None:
            stack.callback(shared.close)
        in_flight: deque[_File] = deque()
        stack.callback(_close_all, in_flight)  # runs after the pool has stopped
        # Also when the caller stops early: no buffer goes back to the allocator while the side
        # stream may still copy into it (the consumer's stream waits for every issued copy).
        stack.callback(sink.publish)
        depth = shared is not None or (several_local_ranks() and direct_io == "auto")
        if depth and any(slow_storage(h.path) for h in files):
            threads = max(threads, REMOTE_SHARED_THREADS)
        pool = ThreadPoolExecutor(threads, thread_name_prefix="fxkit-load")
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)

        can_map = isinstance(sink, HostSink) and not drop_cache

        def start(header: FileHeader) -> _File:
            """Open ``header``'s file and queue its reads; on failure, close what it opened."""
            sharing = opts.share and header.data_size > 0
            remote = slow_storage(header.path) is not None
            mode = "cache" if sharing else _read_mode(direct_io, header.path, can_map, remote)
            plan = plan_file(header, chunk, mode in ("map", "cache"))
            tensors = wanted[header.path]
            needed = plan.holding(tensors) if keep else list(range(len(plan.chunks)))
            with ExitStack() as opened:
                if mode == "cache":  # a process that keeps a part reads no more than that part
                    share = shared.share(plan) if sharing and shared is not None else None
                    if share is not None:
                        opened.callback(share.close)
                    disk = FileReader(
                        header.path,
                        direct=False,
                        random=keep is not None,
                        # read ahead on fast network/FUSE storage only: on a local disk it
                        # lost to the scratch reads (docs/BENCHMARKS.md, bench/loader_ab.py)
                        advise=not (remote or keep) and remote_fs(header.path) is not None,
                    )
                    opened.callback(disk.close, drop_cache)
                    mapped = MappedFile(header.path, header.file_size)
                    cached = _CachedFile(plan, share, disk, mapped, sink)
                    fetches = [pool.submit(cached.fetch, k, False) for k in needed]
                    return _File(
                        plan, cached.buffer, tensors, needed, fetches, opened.pop_all(), cached
                    )
                if mode == "map":  # nothing to read: no thread needs to wake up for it
                    mapped = MappedFile(header.path, header.file_size)
                    futures = [_ready() for _ in needed]
                    return _File(plan, mapped.buffer, tensors, needed, futures, opened.pop_all())
                reader = FileReader(header.path, direct=mode == "direct" and sink.aligned)
                opened.callback(reader.close, drop_cache)
                buffer = sink.allocate(plan.buffer_size)
                futures = [
                    pool.submit(sink.fill, reader, buffer, c, plan.needed_end(c))
                    for c in map(plan.chunks.__getitem__, needed)
                ]
                return _File(plan, buffer, tensors, needed, futures, opened.pop_all())

        # Two files in flight bound the memory of private buffers; with ``share`` more are
        # queued (their buffers are the page cache's), so the readers run ahead of the consumer,
        # and the descriptors they hold stay bounded, however many files the model has.
        waiting = iter(files)
        in_flight.extend(map(start, islice(waiting, _shared_in_flight() if opts.share else 2)))
        while in_flight:
            file = in_flight[0]
            plan, buffer = file.plan, file.buffer
            pending = deque(file.tensors)
            for k, future in zip(file.needed, file.futures, strict=True):
                if file.cached is None:
                    future.result()
                elif future.cancel() or future.result() is False:
                    # Not begun by this process's readers (they are busy with other chunks: it
                    # need not wait for them), or another process is reading it: wait for that.
                    file.cached.fetch(k, wait=True)
                c = plan.chunks[k]
                done = c.buffer_offset + c.length - plan.head
                if pending and pending[0].end <= done:
                    sink.publish()
                while pending and pending[0].end <= done:
                    tensor = pending.popleft()
                    bar.advance(tensor.nbytes)
                    yield tensor.name, _tensor(plan, buffer, tensor, dtype)
            sink.publish()
            for tensor in pending:  # empty tensors at the very end of a file
                yield tensor.name, _tensor(plan, buffer, tensor, dtype)
            in_flight.popleft()
            file.opened.close()
            following = next(waiting, None)
            if following is not None:
                in_flight.append(start(following))


def _ready() -> Future:
    """A finished future (the chunks of a mapped file: nothing to read)."""
    future: Future = Future()
    future.set_result(None)
    return future


def load(
    path: ModelPath | Checkpoint,
    device: Any = "cpu",
    *,
    dtype: Any = None,
    options: LoadOptions | None = None,
    keep: Callable[[str], bool] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Load every tensor of a model into a ``{name: tensor}`` dict (CPU tensors share buffers).

    The arguments are those of :func:`iter_tensors`.
    """
    return dict(iter_tensors(path, device, dtype=dtype, options=options, keep=keep, **overrides))
