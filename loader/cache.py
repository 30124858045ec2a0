"""The page cache, for cold benchmarks: evict a file's pages, count the ones still resident, and
touch every page of a loaded tensor (:func:`touch`: a load timed to its last byte).

``resident_bytes`` asks the kernel with ``mincore(2)`` on a fresh read-only mapping of the file,
which reads nothing from storage; ``evict`` writes back and drops a file's cached pages with
``posix_fadvise(POSIX_FADV_DONTNEED)``. Linux only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy

from .files import open_regular

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_WARM_READ = 16 << 20
_WINDOW_PAGES = 16

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _oserror(call: str, path: Path) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}", str(path))


def _resident_pages(path: Path, windows: int | None) -> tuple[int, int]:
    """(resident, examined) pages of ``path``: every page, or ``windows`` spread-out windows."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        pages = (size + PAGE_SIZE - 1) // PAGE_SIZE
        if windows is None or windows * _WINDOW_PAGES >= pages:
            spans = [(0, pages)]
        else:
            step = pages // windows
            spans = [(i * step, _WINDOW_PAGES) for i in range(windows)]
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr == _MAP_FAILED:
            raise _oserror("mmap", path)
        try:
            resident = examined = 0
            for first, count in spans:
                vec = (ctypes.c_ubyte * count)()
                length = min(count * PAGE_SIZE, size - first * PAGE_SIZE)
                if _libc.mincore(addr + first * PAGE_SIZE, length, vec) != 0:
                    raise _oserror("mincore", path)
                # Bit 0 of each byte says whether the page is resident; the others are reserved.
                flags = numpy.frombuffer(memoryview(vec), numpy.uint8)
                resident += int(numpy.count_nonzero(flags & 1))
                examined += count
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return resident, examined


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of ``path`` in the page cache now (whole pages, capped at the file size)."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return 0
    resident, _ = _resident_pages(path, None)
    return min(resident * PAGE_SIZE, size)


def resident_fraction(path: str | os.PathLike[str], windows: int | None = None) -> float:
    """The fraction of ``path``'s pages in the page cache now (1.0 for an empty file).

    With ``windows``, only that many windows of 16 pages spread over the file are asked about: an
    estimate that costs microseconds where asking about every page of a large file costs tens of
    milliseconds (the loader's choice of read mode needs no more).
    """
    path = Path(path)
    if path.stat().st_size == 0:
        return 1.0
    resident, examined = _resident_pages(path, windows)
    return resident / examined


def evict(path: str | os.PathLike[str]) -> None:
    """Write back and drop the cached pages of ``path`` (a hint the kernel may partly ignore)."""
    fd = open_regular(Path(path))
    try:
        try:
            os.fsync(fd)
        except OSError as exc:  # some FUSE file systems lack fsync; clean pages need none
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EROFS):
                raise
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict_all(paths: Iterable[str | os.PathLike[str]], tries: int = 3) -> dict[str, int]:
    """Evict every file and verify with mincore; returns the bytes still resident per file.

    A file whose pages are mapped or being read by another process can keep some pages: those
    files are tried again, up to ``tries`` times. An empty result means every page is gone.
    """
    left = {str(p): 0 for p in paths}
    for _ in range(tries):
        for path in left:
            evict(path)
        left = {p: n for p in left if (n := resident_bytes(p))}
        if not left:
            break
    return left


def warm(paths: Iterable[str | os.PathLike[str]]) -> dict[str, int]:
    """Read every file into the page cache; returns the bytes per file that did not stay."""
    buf = bytearray(_WARM_READ)
    missing = {}
    for path in paths:
        with open(open_regular(Path(path)), "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
        size = os.path.getsize(path)
        if (held := resident_bytes(path)) < size:
            missing[str(path)] = size - held
    return missing


def touch(tensor: Any) -> int:
    """Read one byte in every page of the tensor's bytes, and its last byte; return their sum.

    A loader may hand back tensors whose pages are not read yet (a mapping of the file); this
    faults every page in, as a copy to a GPU would (``fxkit bench load`` runs it on every
    method's tensors, ``fxkit serve-probe`` on what it serves)."""
    import torch

    if tensor.numel() == 0:
        return 0
    flat = tensor.reshape(-1).view(torch.uint8)
    return int(flat[::PAGE_SIZE].sum(dtype=torch.int64)) + int(flat[-1])
