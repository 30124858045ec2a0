"""The loader's API: ``load``, ``iter_tensors`` and ``open_checkpoint``.

Files are read one after another, each by a pool of threads in chunks, with the next file's reads
queued behind the current one's; tensors are handed out in file order as soon as their bytes are in.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cache import resident_fraction
from .errors import LoaderError
from .files import ModelPath
from .format import DTYPES, Checkpoint, FileHeader, TensorInfo, open_checkpoint
from .options import DirectIO, LoadOptions
from .plan import FilePlan, normalise_chunk_size, plan_file
from .read import FileReader, MappedFile
from .shared import NoSpace, Segment, open_segment
from .sinks import HostSink, StagedSink, make_sink

if TYPE_CHECKING:
    import torch

#: ``direct_io="auto"``: O_DIRECT below this fraction of a file in the page cache, mapping from
#: the second (CPU loads without ``drop_cache``), buffered reads between.
DIRECT_BELOW = 0.5
MAP_FROM = 0.99
#: How many spread-out windows of a file mincore() is asked about to choose its read mode.
RESIDENCY_WINDOWS = 64

__all__ = ["LoadOptions", "iter_tensors", "load", "open_checkpoint"]

logger = logging.getLogger(__name__)


def _read_mode(direct_io: DirectIO, path: Path, can_map: bool) -> str:
    """How to read a file: "direct" (O_DIRECT), "buffered", or "map" (already cached, CPU only).

    The ``auto`` rule, from measurements on the 2-core development VM (2 GB checkpoint, noisy):
    cold, O_DIRECT ran 1.5-1.9 GB/s against 0.5-1.3 for buffered reads (and leaves no second
    copy in the page cache); hot, buffered reads ran 10-12 GB/s against 1-3 for O_DIRECT, and
    mapping the cached pages 9-12 GB/s without copying a byte. So: a file fully in the page
    cache is mapped, a file mostly not cached is read with O_DIRECT, anything between buffered.
    """
    if direct_io in ("on", True):
        return "direct"
    if direct_io in ("off", False):
        return "buffered"
    try:
        cached = resident_fraction(path, windows=RESIDENCY_WINDOWS)
    except OSError:
        cached = 0.0
    if cached >= MAP_FROM and can_map:
        return "map"
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


def _close_all(in_flight: deque) -> None:
    for _, _, reader, _, _ in in_flight:
        reader.close()


class _SharedFile:
    """A file read through its node-shared segment: chunk by chunk into the segment (by this
    process or another), then, for a device, from the segment into the device's buffer."""

    def __init__(self, segment: Segment, disk: FileReader, sink: HostSink | StagedSink) -> None:
        self.segment, self.disk, self.sink = segment, disk, sink
        view = segment.tensor()  # reserves the segment's memory (NoSpace if there is none)
        host = isinstance(sink, HostSink)
        self.buffer = view if host else sink.allocate(segment.plan.buffer_size)

    def fetch(self, index: int, wait: bool) -> bool:
        """Chunk ``index`` in place; False if another process reads it and ``wait`` is off."""
        if not self.segment.fetch(index, self.disk, wait):
            return False
        if isinstance(self.sink, StagedSink):
            plan = self.segment.plan
            chunk = plan.chunks[index]
            self.sink.fill(self.segment, self.buffer, chunk, plan.needed_end(chunk))
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


def iter_tensors(
    path: ModelPath | Checkpoint,
    device: Any = "cpu",
    *,
    dtype: Any = None,
    options: LoadOptions | None = None,
    _staged: bool | None = None,
    **overrides: Any,
) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, tensor)`` in file order, each as soon as its bytes are in.

    ``path`` is a safetensors file, a list of files, a model directory, or an opened checkpoint.
    ``dtype`` casts floating-point tensors. How the files are read is ``options``, with keyword
    arguments (``threads=16``...) set over it: see :class:`fxkit.loader.options.LoadOptions`.
    At most two files' buffers are in flight at a time.
    """
    opts = LoadOptions.from_mapping(overrides, options, where="iter_tensors")
    checkpoint = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    threads, direct_io, drop_cache = opts.threads, opts.direct_io, opts.drop_cache
    chunk = normalise_chunk_size(opts.chunk_size)
    sink = make_sink(device, threads, chunk, staged=_staged)
    with ExitStack() as stack:
        bar = _Progress(stack, checkpoint.total_bytes, opts.progress)
        in_flight: deque[
            tuple[FilePlan, Any, FileReader | MappedFile, list[Future], _SharedFile | None]
        ] = deque()
        stack.callback(_close_all, in_flight)  # runs after the pool has stopped
        # Also when the caller stops early: no buffer goes back to the allocator while the side
        # stream may still copy into it (the consumer's stream waits for every issued copy).
        stack.callback(sink.publish)
        # With ``share``, this process holds every file's node-shared segment from the start to
        # the end (a process still on an early file keeps the later ones for itself); they are
        # let go after the pool has stopped.
        segments: dict[Path, Segment] = {}
        for header in checkpoint.files if opts.share else ():
            if header.data_size:
                segments[header.path] = segment = open_segment(plan_file(header, chunk), chunk)
                stack.callback(segment.close)
        pool = ThreadPoolExecutor(threads, thread_name_prefix="fxkit-load")
        stack.callback(pool.shutdown, wait=True, cancel_futures=True)

        def start(header: FileHeader) -> None:
            can_map = isinstance(sink, HostSink) and not drop_cache
            mode = _read_mode(direct_io, header.path, can_map)
            plan = plan_file(header, chunk, whole_file=mode == "map")
            reader: FileReader | MappedFile
            if mode == "map":
                reader = mapped = MappedFile(header.path, header.file_size)
                buffer = mapped.buffer
            elif (segment := segments.get(header.path)) is not None:
                reader = FileReader(header.path, direct=mode == "direct")
                try:
                    shared = _SharedFile(segment, reader, sink)
                except NoSpace as exc:
                    logger.warning("fxkit: %s; reading this file without sharing", exc)
                    segments.pop(header.path)
                    reader.close()
                    return start(header)
                fetches = [pool.submit(shared.fetch, k, False) for k in range(len(plan.chunks))]
                in_flight.append((plan, shared.buffer, reader, fetches, shared))
                return
            else:
                reader = FileReader(header.path, direct=mode == "direct" and sink.aligned)
                buffer = sink.allocate(plan.buffer_size)
            # A mapped file has nothing to read: no thread needs to wake up for it.
            submit = _done if mode == "map" else pool.submit
            futures = [
                submit(sink.fill, reader, buffer, c, plan.needed_end(c)) for c in plan.chunks
            ]
            in_flight.append((plan, buffer, reader, futures, None))

        waiting = iter(checkpoint.files)
        for header in islice(waiting, 2):
            start(header)
        while in_flight:
            plan, buffer, reader, futures, shared = in_flight[0]
            pending = deque(plan.header.tensors)
            for k, (c, future) in enumerate(zip(plan.chunks, futures, strict=True)):
                if future.result() is False and shared is not None:
                    shared.fetch(k, wait=True)  # another process was reading it: wait for it
                bar.advance(plan.needed_end(c))
                done = c.buffer_offset + c.length - plan.head
                if pending and pending[0].end <= done:
                    sink.publish()
                while pending and pending[0].end <= done:
                    tensor = pending.popleft()
                    yield tensor.name, _tensor(plan, buffer, tensor, dtype)
            sink.publish()
            for tensor in pending:  # empty tensors at the very end of a file
                yield tensor.name, _tensor(plan, buffer, tensor, dtype)
            in_flight.popleft()
            reader.close(drop_cache=drop_cache)
            following = next(waiting, None)
            if following is not None:
                start(following)


def _done(fn: Any, *args: Any) -> Future:
    """Run ``fn`` now; its result as a finished future (what the pool's submit returns)."""
    future: Future = Future()
    future.set_result(fn(*args))
    return future


def load(
    path: ModelPath | Checkpoint,
    device: Any = "cpu",
    *,
    dtype: Any = None,
    options: LoadOptions | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Load every tensor of a model into a ``{name: tensor}`` dict (CPU tensors share buffers).

    The arguments are those of :func:`iter_tensors`.
    """
    return dict(iter_tensors(path, device, dtype=dtype, options=options, **overrides))
