"""Node-shared loading: the processes of one node read each file once, into the page cache.

With ``share=True`` every process maps each file privately (its tensors are the page cache's
pages, copy on write, as for a file already cached) and the processes split the reading: a chunk
is brought into the page cache by whichever process claims it first (``FileReader.cache``); the
others map what it read.
They need nothing from each other and no rank numbers: vLLM's tensor-parallel ranks, several
instances of one model, or unrelated jobs share alike. The page cache holds one copy per node; the
kernel knows the file by its inode, so two models, or two versions of one, never meet.

The claims live in a small state file per file in ``/dev/shm/fxkit-UID/`` (``$FXKIT_SHM_DIR``
overrides ``/dev/shm``), and the kernel keeps the books, so a process that dies leaves nothing that
can break the next start:

- byte ``1 + i`` of the state file is 1 once chunk ``i`` is in the page cache; a process reads a
  chunk while it holds an open-file-description lock on that byte (``F_OFD_SETLK``: per open file,
  released by the kernel when the process dies), so a chunk whose reader died is simply read by
  the next process that wants it;
- every user holds a shared lock on byte 0 for as long as it loads; the last one out (its exclusive
  lock succeeds) removes the state file. Opening and removing happen under a lock on the
  directory, and each opener first removes the state files nobody holds (left by dead processes);
- a state file's name is a digest of the file's identity (path, device, inode, size, modification
  and change times) and of the chunk geometry; the directory is the user's own (0700, checked).

A chunk marked read is only a hint: were its pages evicted before a process maps them, the kernel
reads them again (more bytes from storage, never wrong ones).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

from .errors import LoaderError
from .plan import FilePlan
from .read import FileReader

#: ``struct flock`` on 64-bit Linux: l_type, l_whence, (pad), l_start, l_len, l_pid, (pad).
_FLOCK = "hhxxxxqqi4x"
USERS = 0  # the state file's byte that every user holds a shared lock on
DONE = b"\x01"


def directory() -> Path:
    """This user's state directory, made if missing and checked: ours, a directory, 0700."""
    root = Path(os.environ.get("FXKIT_SHM_DIR", "/dev/shm"))
    path = root / f"fxkit-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise LoaderError(
            f"{path}: not a private directory of this user (owner uid {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)}); another user could hold up or skip reads there",
            hint="remove it, or set FXKIT_SHM_DIR to a directory of your own; or load with "
            "share=False",
        )
    return path


def state_key(plan: FilePlan) -> str:
    """The state file's name for a file read with ``plan``: its identity and chunk geometry."""
    info = os.stat(plan.header.path)
    identity = [
        str(Path(plan.header.path).resolve()), info.st_dev, info.st_ino, info.st_size,
        info.st_mtime_ns, info.st_ctime_ns, plan.start, plan.buffer_size, plan.chunk_size,
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


def _unused(state: Path) -> bool:
    """Whether no process holds ``state`` (it can be removed)."""
    try:
        fd = os.open(state, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return _lock(fd, fcntl.F_WRLCK, USERS, wait=False)
    finally:
        os.close(fd)


class Share:
    """This process's part in reading one file once per node, for as long as it holds it.

    Made by :func:`open_shares`, under the directory lock."""

    def __init__(self, where: Path, plan: FilePlan, path: Path) -> None:
        self.where, self.plan, self.path = where, plan, path
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._state = os.open(path, flags, 0o600)
        _lock(self._state, fcntl.F_RDLCK, USERS, wait=True)
        if os.fstat(self._state).st_size != 1 + len(plan.chunks):
            os.ftruncate(self._state, 0)  # new (or not this geometry): nothing read yet
            os.ftruncate(self._state, 1 + len(plan.chunks))

    def done(self, index: int) -> bool:
        return os.pread(self._state, 1, 1 + index) == DONE

    def fetch(self, index: int, disk: FileReader, wait: bool) -> bool:
        """Chunk ``index`` into the page cache, read from ``disk`` by this process unless another
        did. False if another process is reading it now and ``wait`` is off."""
        if self.done(index):
            return True
        if not _lock(self._state, fcntl.F_WRLCK, 1 + index, wait):
            return False
        try:
            if not self.done(index):
                chunk = self.plan.chunks[index]
                disk.cache(chunk.file_offset, self.plan.needed_end(chunk))
                os.pwrite(self._state, DONE, 1 + index)
        finally:
            _lock(self._state, fcntl.F_UNLCK, 1 + index, wait=False)
        return True

    def close(self) -> None:
        """Let go of the file; the last process holding it removes its state file."""
        with _directory_lock(self.where):
            _lock(self._state, fcntl.F_UNLCK, USERS, wait=False)
            if _lock(self._state, fcntl.F_WRLCK, USERS, wait=False):
                self.path.unlink(missing_ok=True)
            os.close(self._state)


def open_shares(plans: list[FilePlan]) -> list[Share]:
    """This process's hold on the node-shared reading of each plan's file (one per plan), after
    removing the state files nobody holds (left by dead processes): all under one directory
    lock, once per load."""
    where = directory()
    paths = [where / f"{state_key(plan)}.state" for plan in plans]
    with _directory_lock(where):
        for stale in set(where.glob("*.state")) - set(paths):
            if _unused(stale):
                stale.unlink(missing_ok=True)
        return [Share(where, plan, path) for plan, path in zip(plans, paths, strict=True)]
