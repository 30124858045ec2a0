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
  the next process that wants it; one whose reader holds it longer than ``claim_timeout`` (a
  stopped or hung process) is read by the waiter itself, with a warning;
- every user holds a shared lock on byte 0 for as long as it loads the file; the last one out (its
  exclusive lock succeeds) removes the state file. Opening and removing happen under a lock on the
  directory, and each load first removes the state files nobody holds (left by dead processes);
- a state file's name is a digest of the file's identity (path, device, inode, size, modification
  and change times) and of the chunk geometry.

The directory must be the user's own (0700, checked on the opened directory, never through a
symlink). One another user has put at that name is never used: the state goes to
``$XDG_RUNTIME_DIR/fxkit`` where that is set, or the load reads without sharing, with a warning.

A chunk marked read is only a hint: were its pages evicted before a process maps them, the kernel
reads them again (more bytes from storage, never wrong ones).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import stat
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import LoaderError
from .plan import FilePlan
from .read import FileReader

logger = logging.getLogger(__name__)

#: ``struct flock`` on 64-bit Linux: l_type, l_whence, (pad), l_start, l_len, l_pid, (pad).
_FLOCK = "hhxxxxqqi4x"
USERS = 0  # the state file's byte that every user holds a shared lock on
DONE = b"\x01"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def candidates() -> list[Path]:
    """Where the state directory may be, in order: ``$FXKIT_SHM_DIR`` (or /dev/shm), then the
    user's runtime directory."""
    paths = [Path(os.environ.get("FXKIT_SHM_DIR", "/dev/shm")) / f"fxkit-{os.getuid()}"]
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        paths.append(Path(runtime) / "fxkit")
    return paths


def _private(path: Path) -> int:
    """A descriptor of ``path``, made if missing; a ``LoaderError`` unless it is this user's own
    directory, 0700 (checked on the descriptor: a symlink at ``path`` is never followed)."""
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        fd = os.open(path, _DIRECTORY)
    except OSError as exc:
        what = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise LoaderError(f"{path}: not a private directory of this user ({what})") from None
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        os.close(fd)
        raise LoaderError(
            f"{path}: not a private directory of this user (owner uid {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)})"
        )
    return fd


def open_shares(claim_timeout: float) -> Shares | None:
    """This load's hold on the state directory (the first of :func:`candidates` that is this
    user's own), after removing the state files nobody holds; None, with a warning, where there
    is none: each process then reads every chunk itself."""
    refused: list[str] = []
    for path in candidates():
        try:
            shares = Shares(path, claim_timeout)
        except LoaderError as exc:
            refused.append(exc.message)
            continue
        if refused:
            logger.warning("fxkit: %s: share state goes to %s instead", "; ".join(refused), path)
        return shares
    logger.warning(
        "fxkit: %s: loading without sharing reads (each process reads every chunk itself)\n"
        "  hint: remove it (another user could hold up or skip reads there), or set "
        "FXKIT_SHM_DIR to a directory of your own",
        "; ".join(refused),
    )
    return None


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


class Shares:
    """The state directory ``path``, held open for one load: :meth:`share` gives each file's
    part. A ``LoaderError`` if it is not this user's own, or cannot be used."""

    def __init__(self, path: Path, claim_timeout: float) -> None:
        self.path, self.claim_timeout = path, claim_timeout
        self.stalled = False  # a claim has outlasted the timeout: wait for none from now on
        with contextlib.ExitStack() as opened:
            self.fd = _private(path)
            opened.callback(os.close, self.fd)
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                self._lock = os.open(".lock", flags, 0o600, dir_fd=self.fd)
                opened.callback(os.close, self._lock)
                self._remove_unused()
            except OSError as exc:
                raise LoaderError(f"{path}: cannot be used ({exc.strerror or exc})") from None
            opened.pop_all()

    def _remove_unused(self) -> None:
        """Remove the state files nobody holds (left by dead processes)."""
        with self.locked():
            for name in os.listdir(self.fd):
                if name.endswith(".state") and self._unused(name):
                    os.unlink(name, dir_fd=self.fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The directory lock, under which state files are opened and removed."""
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def _unused(self, name: str) -> bool:
        """Whether no process holds state file ``name`` (it can be removed)."""
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        try:
            return _lock(fd, fcntl.F_WRLCK, USERS, wait=False)
        finally:
            os.close(fd)

    def share(self, plan: FilePlan) -> Share:
        """This process's part in reading ``plan``'s file, until :meth:`Share.close`."""
        name = f"{state_key(plan)}.state"
        try:
            with self.locked():
                return Share(self, plan, name)
        except OSError as exc:
            raise LoaderError(
                f"{self.path / name}: cannot open the share state of {plan.header.path}: "
                f"{exc.strerror or exc}",
                hint="free file descriptors or space there, or load with share=False",
            ) from None

    def stall(self, plan: FilePlan, index: int) -> None:
        """Chunk ``index`` of ``plan`` is read here despite another's claim; say so, once."""
        if self.stalled:
            return
        self.stalled = True
        chunk = plan.chunks[index]
        logger.warning(
            "fxkit: %s: chunk %d (bytes %d-%d) is claimed by another process that has not read "
            "it in %g s (claim_timeout): reading it here, and for the rest of this load any "
            "chunk another process holds",
            plan.header.path, index, chunk.file_offset, chunk.file_offset + chunk.length,
            self.claim_timeout,
        )  # fmt: skip

    def close(self) -> None:
        os.close(self._lock)
        os.close(self.fd)


class Share:
    """This process's part in reading one file once per node, for as long as it holds it.

    Made by :meth:`Shares.share`, under the directory lock."""

    def __init__(self, shares: Shares, plan: FilePlan, name: str) -> None:
        self.shares, self.plan, self.name = shares, plan, name
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._state = os.open(name, flags, 0o600, dir_fd=shares.fd)
        try:
            _lock(self._state, fcntl.F_RDLCK, USERS, wait=True)
            if os.fstat(self._state).st_size != 1 + len(plan.chunks):
                os.ftruncate(self._state, 0)  # new (or not this geometry): nothing read yet
                os.ftruncate(self._state, 1 + len(plan.chunks))
        except BaseException:
            self._let_go()
            raise

    def done(self, index: int) -> bool:
        return os.pread(self._state, 1, 1 + index) == DONE

    def fetch(self, index: int, disk: FileReader, wait: bool) -> bool:
        """Chunk ``index`` into the page cache, read from ``disk`` by this process unless another
        did. False if another process is reading it now and ``wait`` is off."""
        if self.done(index):
            return True
        claimed = _lock(self._state, fcntl.F_WRLCK, 1 + index, wait=False)
        if not claimed:
            if not wait:
                return False
            claimed = self._wait(index)
        try:
            if not self.done(index):
                chunk = self.plan.chunks[index]
                disk.cache(chunk.file_offset, self.plan.needed_end(chunk))
                os.pwrite(self._state, DONE, 1 + index)
        finally:
            if claimed:
                _lock(self._state, fcntl.F_UNLCK, 1 + index, wait=False)
        return True

    def _wait(self, index: int) -> bool:
        """Wait for another process's claim on chunk ``index``: True once this process holds it;
        False once the claim has outlasted the claim timeout (this process then reads the chunk
        unclaimed) or, after one has, at once."""
        if not self.shares.stalled:
            logger.debug("fxkit: %s: waiting for chunk %d", self.plan.header.path, index)
            if _Claim(self._state, 1 + index).granted(self.shares.claim_timeout):
                return True
        self.shares.stall(self.plan, index)
        return False

    def close(self) -> None:
        """Let go of the file; the last process holding it removes its state file."""
        with self.shares.locked():
            self._let_go()

    def _let_go(self) -> None:
        """Give up this process's hold on the state file (under the directory lock)."""
        try:
            _lock(self._state, fcntl.F_UNLCK, USERS, wait=False)
            if _lock(self._state, fcntl.F_WRLCK, USERS, wait=False):
                os.unlink(self.name, dir_fd=self.shares.fd)
        finally:
            os.close(self._state)


class _Claim:
    """A blocking claim of one byte of a state file, made by a thread of its own on a duplicate of
    the descriptor (the same open file, so the claim is the caller's), that the caller waits for
    no longer than it wants: one granted after the caller has given up is let go of at once."""

    def __init__(self, fd: int, start: int) -> None:
        self.fd, self.start = os.dup(fd), start
        self.mutex = threading.Lock()
        self.got = threading.Event()
        self.wanted = True
        threading.Thread(target=self._claim, name="fxkit-claim", daemon=True).start()

    def _claim(self) -> None:
        try:
            _lock(self.fd, fcntl.F_WRLCK, self.start, wait=True)
            with self.mutex:
                if self.wanted:
                    self.got.set()
                    return
            _lock(self.fd, fcntl.F_UNLCK, self.start, wait=False)
        finally:
            os.close(self.fd)

    def granted(self, timeout: float) -> bool:
        """Whether the claim is granted within ``timeout`` seconds (if not, it never is)."""
        try:
            self.got.wait(timeout)
        finally:
            with self.mutex:
                self.wanted = self.got.is_set()
        return self.wanted
