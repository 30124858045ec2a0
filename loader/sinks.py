"""Where read bytes go: straight into host buffers, or through staging buffers to a device.

A sink allocates one destination buffer per file and fills one chunk of it per call (from many
threads at once). ``HostSink`` reads into the destination itself. ``StagedSink`` reads into a
bounded pool of staging buffers (pinned for CUDA/ROCm) and copies each to the destination with an
asynchronous copy on its own stream; a staging buffer is reused once its copy's event has fired,
so host memory stays at ``slots x chunk_size`` whatever the checkpoint's size.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any

from .errors import LoaderError
from .plan import ALIGN, Chunk
from .read import FileReader, MappedFile, host_buffer, writable_view

if TYPE_CHECKING:
    import torch


class HostSink:
    """CPU loads: chunks are read into the file's host buffer; tensors are views of it."""

    aligned = True

    def allocate(self, size: int) -> torch.Tensor:
        return host_buffer(size)

    def fill(
        self, reader: FileReader | MappedFile, dest: torch.Tensor, chunk: Chunk, need: int
    ) -> None:
        end = chunk.buffer_offset + chunk.length
        reader.read(writable_view(dest)[chunk.buffer_offset : end], chunk.file_offset, need)

    def publish(self) -> None:
        """Nothing to wait for: the bytes are in place when ``fill`` returns."""


class StagedSink:
    """Device loads: read into a bounded pool of staging buffers, copy asynchronously to the device.

    With a CPU ``device`` the same pipeline runs with synchronous copies (used by the tests).
    """

    def __init__(self, device: Any, slots: int, chunk_size: int) -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.pool: queue.Queue = queue.Queue()
        for _ in range(slots):
            staging = (
                torch.empty(chunk_size, dtype=torch.uint8, pin_memory=True)
                if self.cuda
                else host_buffer(chunk_size)
            )
            self.pool.put((staging, None))
        self.aligned = all(s.data_ptr() % ALIGN == 0 for s, _ in self.pool.queue)

    def allocate(self, size: int) -> torch.Tensor:
        import torch

        return torch.empty(size, dtype=torch.uint8, device=self.device)

    def fill(
        self, reader: FileReader | MappedFile, dest: torch.Tensor, chunk: Chunk, need: int
    ) -> None:
        staging, event = self.pool.get()
        try:
            if event is not None:
                event.synchronize()
                event = None
            reader.read(writable_view(staging)[: chunk.length], chunk.file_offset, need)
            target = dest[chunk.buffer_offset : chunk.buffer_offset + need]
            event = self._copy(staging[:need], target)
        finally:
            self.pool.put((staging, event))

    def _copy(self, source: torch.Tensor, target: torch.Tensor) -> torch.cuda.Event | None:
        import torch

        if not self.cuda:
            target.copy_(source)
            return None
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            target.copy_(source, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return event

    def publish(self) -> None:
        """Make the consumer's stream wait for the copies issued so far."""
        if self.stream is not None:
            import torch

            torch.cuda.current_stream(self.device).wait_stream(self.stream)


def make_sink(
    device: Any, threads: int, chunk_size: int, staged: bool | None = None
) -> HostSink | StagedSink:
    """The sink for ``device``: host buffers for the CPU, staging for accelerators.

    ``staged=True`` forces the staging pipeline even on the CPU (for tests).
    """
    import torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise LoaderError(f"device {device!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LoaderError(
            f"device {str(device)!r} asked for, but this torch {torch.__version__} sees no "
            "CUDA/ROCm device; load to device='cpu' or install a GPU build of torch"
        )
    if device.type not in ("cpu", "cuda"):
        raise LoaderError(f"device {str(device)!r} is not supported (cpu, cuda, cuda:N)")
    if staged is None:
        staged = device.type != "cpu"
    if not staged:
        return HostSink()
    return StagedSink(device, slots=threads + 2, chunk_size=chunk_size)
