"""Reading files: positional reads (the GIL is released in them) into caller-given memory.

O_DIRECT is tried when asked and dropped, for that file, where the filesystem refuses it (tmpfs
refuses the open, some FUSE filesystems refuse the read): the read is then repeated buffered.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import LoaderError
from .files import open_regular

if TYPE_CHECKING:
    import torch

HUGE_PAGE = 2 * 2**20
SCRATCH = 4 << 20  # bytes per read into the page cache (each reader thread has one such buffer)
_scratch = threading.local()
THP_DEFRAG = Path("/sys/kernel/mm/transparent_hugepage/defrag")
#: The kernel's readahead window where sysfs does not say (VM_READAHEAD_PAGES, 128 KiB).
DEFAULT_READAHEAD = 128 << 10
_READAHEAD: dict[int, int] = {}


def readahead_window(st_dev: int) -> int:
    """Bytes the kernel reads ahead at most per request on device ``st_dev``: a block device's
    ``queue/read_ahead_kb`` (its whole disk's, for a partition), or the bdi's (FUSE, NFS: an
    anonymous device); :data:`DEFAULT_READAHEAD` where neither is there. Asked once per device.

    ``posix_fadvise(POSIX_FADV_WILLNEED)`` reads no more than this per call (the kernel caps
    it: 8 MiB asked for 64 MiB on the development VM's virtio disk, whose window is 8 MiB)."""
    if st_dev not in _READAHEAD:
        node = f"{os.major(st_dev)}:{os.minor(st_dev)}"
        _READAHEAD[st_dev] = DEFAULT_READAHEAD
        for where in (
            f"/sys/dev/block/{node}/queue/read_ahead_kb",
            f"/sys/dev/block/{node}/../queue/read_ahead_kb",
            f"/sys/class/bdi/{node}/read_ahead_kb",
        ):
            try:
                kib = int(Path(where).read_text())
            except (OSError, ValueError):
                continue
            _READAHEAD[st_dev] = max(kib << 10, mmap.PAGESIZE)
            break
    return _READAHEAD[st_dev]


def huge_pages_pay() -> bool:
    """Whether asking for transparent huge pages makes the first write to fresh memory faster.

    Where the kernel compacts memory synchronously for a region that asked for huge pages
    (THP defrag ``always``, ``madvise`` or ``defer+madvise``: the usual default), every first
    fault may stall on compaction: on the VM in docs/BENCHMARKS.md the first write ran at
    0.15 GB/s with huge pages against 0.74 with 4 KiB pages (``bench/first_touch.py``). With
    ``defer`` or ``never`` the kernel hands out huge pages only when it has them free.
    """
    try:
        selected = THP_DEFRAG.read_text().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return False
    return selected in ("defer", "never") and hasattr(mmap, "MADV_HUGEPAGE")


def host_buffer(size: int) -> torch.Tensor:
    """A page-aligned host uint8 tensor of ``size`` bytes, backed by an anonymous mapping.

    Page alignment lets O_DIRECT read straight into it; transparent huge pages are asked for
    only where they make the first write faster (:func:`huge_pages_pay`).
    """
    import torch

    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    if size < HUGE_PAGE or not huge_pages_pay():
        return torch.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE), dtype=torch.uint8)
    # Huge pages need a 2 MiB-aligned address: map 2 MiB more and start at the boundary.
    mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)
    shift = -whole.data_ptr() % HUGE_PAGE
    mapping.madvise(mmap.MADV_HUGEPAGE, shift, size - size % HUGE_PAGE)
    return whole[shift : shift + size]


def writable_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview of a contiguous CPU uint8 tensor (no copy)."""
    return tensor.numpy().data.cast("B")


class FileReader:
    """One open file, read with ``pread`` from many threads, O_DIRECT where asked and allowed.

    ``random`` turns the kernel's readahead off for it (``POSIX_FADV_RANDOM``): buffered reads
    then fetch exactly the bytes asked for, nothing past them. ``advise`` makes :meth:`cache`
    ask the kernel to read ahead rather than read through a scratch buffer."""

    def __init__(
        self, path: Path, direct: bool, random: bool = False, advise: bool = False
    ) -> None:
        self.path = path
        self.direct = False
        self._fd_direct: int | None = None
        self._window = 0
        try:
            self._fd = open_regular(path)
            if advise:
                self._window = readahead_window(os.fstat(self._fd).st_dev)
            if random:
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
            if direct and hasattr(os, "O_DIRECT"):
                try:
                    self._fd_direct = open_regular(path, os.O_DIRECT)
                    self.direct = True
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
        except OSError as exc:
            raise LoaderError(f"{path}: cannot open: {exc.strerror or exc}") from None

    def read(self, view: memoryview, offset: int, need: int) -> None:
        """Fill ``view`` from ``offset``; ``need`` bytes must arrive (the rest is past EOF)."""
        got = 0
        while got < need:
            direct = self.direct
            fd = self._fd_direct if direct and self._fd_direct is not None else self._fd
            try:
                n = os.preadv(fd, [view[got:]], offset + got)
            except OSError as exc:
                if direct and exc.errno == errno.EINVAL:
                    self.direct = False  # refused: read this file buffered from now on
                    continue
                raise LoaderError(f"{self.path}: read failed at {offset + got}: {exc}") from None
            if n == 0:
                raise LoaderError(
                    f"{self.path}: file ended at {offset + got}, expected data up to "
                    f"{offset + need} (was it truncated while loading?)"
                )
            got += n

    def cache(self, offset: int, length: int) -> None:
        """Bring ``length`` bytes at ``offset`` into the page cache: buffered reads through this
        thread's scratch buffer (dropped), so the kernel's readahead streams them; with
        ``advise``, ``POSIX_FADV_WILLNEED`` per readahead window instead, which copies nothing
        and costs nothing for pages already cached (another rank's): the reads are queued and a
        page still in flight is waited for when the mapping touches it."""
        if self._window:
            for start in range(offset, offset + length, self._window):
                size = min(self._window, offset + length - start)
                os.posix_fadvise(self._fd, start, size, os.POSIX_FADV_WILLNEED)
            return
        scratch = getattr(_scratch, "buffer", None)
        if scratch is None:
            scratch = _scratch.buffer = memoryview(bytearray(SCRATCH))
        for start in range(offset, offset + length, SCRATCH):
            size = min(SCRATCH, offset + length - start)
            self.read(scratch[:size], start, size)

    def close(self, drop_cache: bool = False) -> None:
        """Close the file; with ``drop_cache``, evict its pages from the page cache first."""
        if drop_cache:
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(self._fd)
        if self._fd_direct is not None:
            os.close(self._fd_direct)


class MappedFile:
    """A file mapped privately: its tensors are the page cache's pages.

    Nothing is copied: the tensors' pages are the page cache's, faulted in on first access (as
    with ``safetensors.torch.load_file``); a write to a tensor copies only that page (copy on
    write).
    Like any mapping, it shows later changes to the file, and truncating the file under it makes
    access fail (SIGBUS): use ``direct_io="off"`` for files that may change while in use.
    The mapping holds no file descriptor (Python's ``mmap`` keeps one per mapping, so a loaded
    model of many files would hold as many): torch maps the opened file again through
    ``/proc/self/fd``, the very file checked, and closes what it opened.
    """

    direct = False

    def __init__(self, path: Path, size: int) -> None:
        import torch

        self.path = path
        try:
            fd = open_regular(path)
            try:
                if os.fstat(fd).st_size < size:
                    raise LoaderError(
                        f"{path}: file is {os.fstat(fd).st_size} bytes, expected {size} "
                        "(was it truncated while loading?)"
                    )
                self.buffer = torch.from_file(
                    f"/proc/self/fd/{fd}", shared=False, size=size, dtype=torch.uint8
                )
            finally:
                os.close(fd)
        except OSError as exc:
            raise LoaderError(f"{path}: cannot map: {exc.strerror or exc}") from None
        except RuntimeError as exc:  # torch's own open or mmap
            raise LoaderError(f"{path}: cannot map: {exc}") from None

    def read(self, view: memoryview, offset: int, need: int) -> None:
        """Copy ``need`` bytes at file ``offset`` out of the mapping (for staged sinks)."""
        view[:need] = writable_view(self.buffer[offset : offset + need])

    def close(self, drop_cache: bool = False) -> None:
        """Nothing to close: the mapping lives as long as its tensors."""
