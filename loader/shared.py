"""Node-shared loading: the processes of one node read each file once, into memory they all map.

With ``share=True`` a file's data region is read into a segment, a file in ``/dev/shm/fxkit-UID/``
(``$FXKIT_SHM_DIR`` overrides ``/dev/shm``), chunk by chunk by whichever process claims a chunk
first; every process maps the segment and its tensors are views of it. The processes need nothing
from each other and no rank numbers: vLLM's tensor-parallel ranks, several instances of one model,
or unrelated jobs share alike. The kernel keeps the books, so a process that dies leaves nothing
that can break the next start:

- each segment has a state file: byte ``1 + i`` is 1 once chunk ``i`` is complete; a process reads
  a chunk while it holds an open-file-description lock on that byte (``F_OFD_SETLK``: per open
  file, released by the kernel when the process dies), so a chunk half-read by a dead process is
  simply read again by the next one that wants it;
- every user holds a shared lock on byte 0 for as long as it loads; the last one out (its exclusive
  lock succeeds) removes the segment. Opening and removing happen under a lock on the directory,
  and each opener first removes the segments nobody holds (left by processes that died);
- a segment's name is a digest of the file's identity (path, device, inode, size, modification and
  change times) and of the chunk geometry, so two models, or two versions of one, never meet;
- the directory is the user's own (0700, checked), so no other user can put bytes in a tensor;
- a segment is a sparse file whose pages are allocated as chunks are read into it (in parallel,
  as a private buffer's would be); a ``/dev/shm`` without room for it is found before the first
  read (:class:`NoSpace`, which the loader falls back from). Only pages read into are ever
  touched: a process never faults on a hole (which would be a SIGBUS on a full tmpfs). The
  memory is one copy per node; it is freed when the last process has finished and dropped its
  tensors.

Tensors are views of a private (copy-on-write) mapping: a process that writes to one changes only
its own copy of that page.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import LoaderError
from .plan import FilePlan

if TYPE_CHECKING:
    import torch

    from .read import FileReader

#: ``struct flock`` on 64-bit Linux: l_type, l_whence, (pad), l_start, l_len, l_pid, (pad).
_FLOCK = "hhxxxxqqi4x"
USERS = 0  # the state file's byte that every user holds a shared lock on
DONE = b"\x01"


class NoSpace(LoaderError):
    """The shared-memory file system has no room for a segment."""


def directory() -> Path:
    """This user's segment directory, made if missing and checked: ours, a directory, 0700."""
    root = Path(os.environ.get("FXKIT_SHM_DIR", "/dev/shm"))
    path = root / f"fxkit-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise LoaderError(
            f"{path}: not a private directory of this user (owner uid {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)}); another user could change the tensors read there",
            hint="remove it, or set FXKIT_SHM_DIR to a directory of your own; or load with "
            "share=False",
        )
    return path


def segment_key(plan: FilePlan, chunk_size: int) -> str:
    """The segment name of a file read with ``plan``: its identity and the chunk geometry."""
    info = os.stat(plan.header.path)
    identity = [
        str(Path(plan.header.path).resolve()), info.st_dev, info.st_ino, info.st_size,
        info.st_mtime_ns, info.st_ctime_ns, plan.start, plan.buffer_size, chunk_size,
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]


def _lock(fd: int, kind: int, start: int, wait: bool) -> bool:
    """An open-file-description lock on one byte; False if another holds it and ``wait`` is off."""
    request = struct.pack(_FLOCK, kind, os.SEEK_SET, start, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, request)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES) and not wait:
            return False
        raise
    return True


@contextlib.contextmanager
def _directory_lock(path: Path) -> Iterator[None]:
    fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _unused(state: Path) -> bool:
    """Whether no process holds the segment of ``state`` (it can be removed)."""
    try:
        fd = os.open(state, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return _lock(fd, fcntl.F_WRLCK, USERS, wait=False)
    finally:
        os.close(fd)


def _remove(state: Path) -> None:
    for path in (state.with_suffix(".data"), state):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class Segment:
    """One file's data region in shared memory, for as long as this process holds it."""

    def __init__(self, where: Path, key: str, plan: FilePlan) -> None:
        self.where, self.key, self.plan = where, key, plan
        self.state_path = where / f"{key}.state"
        self._data: mmap.mmap | None = None
        self._private: mmap.mmap | None = None
        with _directory_lock(where):
            for stale in where.glob("*.state"):
                if stale != self.state_path and _unused(stale):
                    _remove(stale)
            for orphan in where.glob("*.data"):  # its state file removed by someone else
                if not orphan.with_suffix(".state").exists():
                    orphan.unlink(missing_ok=True)
            self._state = _open(self.state_path)
            _lock(self._state, fcntl.F_RDLCK, USERS, wait=True)
            if os.fstat(self._state).st_size != 1 + len(plan.chunks):
                os.ftruncate(self._state, 0)  # new, or not this geometry: nothing done yet
                os.ftruncate(self._state, 1 + len(plan.chunks))

    def _mapped(self) -> mmap.mmap:
        """The shared, writable mapping chunks are read into (made on first use)."""
        if self._data is None:
            size = self.plan.buffer_size
            fd = _open(self.state_path.with_suffix(".data"))
            try:
                info, fs = os.fstat(fd), os.fstatvfs(fd)
                if fs.f_bavail * fs.f_frsize + info.st_blocks * 512 < size:
                    raise NoSpace(
                        f"{self.where}: no room for {size / 1e9:.2f} GB of "
                        f"{self.plan.header.path.name} in shared memory "
                        f"({fs.f_bavail * fs.f_frsize / 1e9:.2f} GB free)",
                        hint="enlarge /dev/shm (docker: --shm-size), or load with share=False",
                    )
                if info.st_size != size:
                    os.ftruncate(fd, size)  # sparse: a page is allocated when read into
                self._data = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
                self._private = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE)
            finally:
                os.close(fd)
        return self._data

    def tensor(self) -> torch.Tensor:
        """The whole region as a uint8 tensor: a private, copy-on-write view of the segment."""
        import torch

        self._mapped()
        return torch.frombuffer(self._private, dtype=torch.uint8)

    def done(self, index: int) -> bool:
        return os.pread(self._state, 1, 1 + index) == DONE

    def fetch(self, index: int, disk: FileReader, wait: bool) -> bool:
        """Make chunk ``index`` complete in the segment, reading it from ``disk`` unless another
        process did. False if another process is reading it now and ``wait`` is off."""
        if self.done(index):
            return True
        if not _lock(self._state, fcntl.F_WRLCK, 1 + index, wait):
            return False
        try:
            if not self.done(index):
                chunk = self.plan.chunks[index]
                end = chunk.buffer_offset + chunk.length
                view = memoryview(self._mapped())[chunk.buffer_offset : end]
                try:
                    disk.read(view, chunk.file_offset, self.plan.needed_end(chunk))
                finally:
                    view.release()
                os.pwrite(self._state, DONE, 1 + index)
        finally:
            _lock(self._state, fcntl.F_UNLCK, 1 + index, wait=False)
        return True

    def read(self, view: memoryview, offset: int, need: int) -> None:
        """Copy ``need`` bytes at file ``offset`` out of the segment (a reader for staged sinks)."""
        start = offset - self.plan.start
        view[:need] = memoryview(self._mapped())[start : start + need]

    def close(self) -> None:
        """Let go of the segment; the last process holding it removes it (mappings stay valid)."""
        with _directory_lock(self.where):
            _lock(self._state, fcntl.F_UNLCK, USERS, wait=False)
            if _lock(self._state, fcntl.F_WRLCK, USERS, wait=False):
                _remove(self.state_path)
            os.close(self._state)
        if self._data is not None:
            self._data.close()  # the private mapping lives on with the tensors viewing it


def open_segment(plan: FilePlan, chunk_size: int) -> Segment:
    """This process's hold on the node-shared segment of ``plan``'s file."""
    where = directory()
    return Segment(where, segment_key(plan, chunk_size), plan)
