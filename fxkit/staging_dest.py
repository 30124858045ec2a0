"""The destination of ``fxkit stage``: a folder written only through descriptors, never through
a link that someone planted in it.

The folder the user names is resolved once, when it is opened (it may itself be a link the user
chose). Everything inside it is reached from that descriptor, one name at a time, with
``O_NOFOLLOW``; no name inside can lead out:

- **Folders** are opened with ``O_NOFOLLOW | O_DIRECTORY`` and made with ``mkdir`` relative to
  their parent's descriptor. A link where a folder belongs (``original -> /etc``) is removed (the
  link itself: its target is never touched) and a real folder made in its place; anything else
  there that is not a folder is an error.
- **fxkit's temporary files** (a partial, ``.NAME.fxkit-partial``, and the manifest's temporary
  file) are opened with ``O_NOFOLLOW``. What has such a name and is not a regular file of one link
  (a link, a hard link to a file elsewhere, a FIFO) is removed the same way, and the file made
  anew with ``O_EXCL``.
- A file is put under its **final name** with ``rename`` between descriptors, which replaces a
  link there, never what it points to; a final name is read with ``O_NOFOLLOW`` (a link there is
  not a staged file: it is copied over).
- The **lock** (``.fxkit-stage.lock``: ``flock``, one run at a time per destination) is opened
  with ``O_NOFOLLOW``; a link at its name is an error, never removed (only the run that holds
  the lock removes its file). A file the run reads back (the manifest) is opened the same way,
  and must be a regular file of bounded size.
- Names come from the source, so each must be a path inside the folder: relative, with no
  empty, ``.`` or ``..`` part and no NUL.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType

from fxkit.errors import FxkitError

PARTIAL_SUFFIX = ".fxkit-partial"
LOCK = ".fxkit-stage.lock"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RW = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class StageError(FxkitError):
    """Staging cannot go on: a bad source or destination, or a copy that did not verify."""


def name_problem(name: str) -> str | None:
    """``name`` and what makes it unfit as a file's name in a folder (``'../x' (a name with a
    slash)``), or None."""
    if name in ("", ".", ".."):
        return f"{name!r} (no file's name)"
    if "/" in name or "\0" in name:
        return f"{name!r} (a name with {'a slash' if '/' in name else 'a NUL byte'})"
    return None


def partial_name(name: str) -> str:
    return f".{name}{PARTIAL_SUFFIX}"


def partial_path(path: str) -> str:
    """Where the partial of the file ``path`` ('/'-separated) is: beside it."""
    folder, _, name = path.rpartition("/")
    return f"{folder}/{partial_name(name)}" if folder else partial_name(name)


class Destination:
    """The destination folder, opened (made, with ``create``) and reached through descriptors;
    a missing folder (``--plan`` before the first run) reads as empty."""

    def __init__(self, path: str | Path, create: bool):
        self.path = Path(path)
        self.where = str(self.path)
        self._dirs: dict[str, int] = {}
        self._lock = threading.Lock()
        if create:
            self._make()
        try:
            self._dirs[""] = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if create:
                raise self._error("cannot open the destination: it went away") from None
        except NotADirectoryError:
            raise StageError("the destination is not a directory", where=self.where) from None
        except OSError as exc:
            raise self._error(f"cannot open the destination: {exc.strerror}") from None

    def _make(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StageError("the destination is not a directory", where=self.where) from None
        except OSError as exc:
            raise self._error(f"cannot create the destination: {exc.strerror}") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise self._error("the destination is not writable")

    def _error(self, message: str) -> StageError:
        return StageError(
            message, where=self.where, hint="is the fast store mounted, and writable by this user?"
        )

    def __enter__(self) -> Destination:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()

    # -- names and folders -----------------------------------------------------------------

    def _parts(self, path: str) -> tuple[list[str], str]:
        """``path``'s folders and its name, each checked to be a name inside a folder."""
        parts = path.split("/")
        if any(name_problem(part) for part in parts):
            raise StageError(
                f"{path!r} is not a name inside the destination",
                where=self.where,
                hint="a source named a file outside its folder: check the source",
            )
        return parts[:-1], parts[-1]

    def _folder(self, folders: list[str], create: bool) -> int | None:
        """The descriptor of the folder reached by ``folders`` from the destination, opened one
        name at a time without following links; made (a link in the way replaced) with
        ``create``, else None where it is missing or is not a real folder."""
        with self._lock:
            fd, done = self._dirs.get(""), ""
            for name in folders:
                if fd is None:
                    return None
                done = f"{done}/{name}" if done else name
                if done not in self._dirs:
                    sub = self._open_folder(fd, name, done, create)
                    if sub is None:
                        return None
                    self._dirs[done] = sub
                fd = self._dirs[done]
            return fd

    def _open_folder(self, parent: int, name: str, path: str, create: bool) -> int | None:
        for _ in range(4):  # made, or a link in its place removed, then opened
            try:
                return os.open(name, _DIR, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return None
                with suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=parent)
            except OSError as exc:  # ELOOP: a link; ENOTDIR: a file (or a link, some kernels)
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if not create:
                    return None
                if not stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise StageError(
                        f"{path} is not a folder, and the source has a folder of that name",
                        where=self.where,
                        hint="move it out of the way, then run again",
                    ) from None
                os.unlink(name, dir_fd=parent)  # the link itself, never its target
        raise StageError(
            f"{path} keeps changing while fxkit makes it a folder",
            where=self.where,
            hint="something else writes into the destination: stop it, then run again",
        )

    # -- files -----------------------------------------------------------------------------

    def stat(self, path: str) -> os.stat_result | None:
        """What is at ``path`` (a link not followed); None where nothing is, or where a folder
        on the way is missing or not a real folder."""
        folders, name = self._parts(path)
        fd = self._folder(folders, create=False)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def partial_size(self, path: str) -> int:
        """The bytes of ``path``'s partial that a resume can use (0 for none, or for anything
        that is not a regular file of one link: that is replaced)."""
        st = self.stat(partial_path(path))
        return st.st_size if st and stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else 0

    def open_partial(self, path: str) -> int:
        """``path``'s partial, opened read-write: the one there, if it is a regular file of one
        link, else a new one (its folders made)."""
        folders, name = self._parts(path)
        fd = self._folder(folders, create=True)
        assert fd is not None  # made
        return _own(fd, partial_name(name), keep=True)

    def remove_partial(self, path: str) -> None:
        folders, name = self._parts(path)
        fd = self._folder(folders, create=False)
        if fd is not None:
            with suppress(FileNotFoundError):
                os.unlink(partial_name(name), dir_fd=fd)

    def install(self, path: str) -> None:
        """Rename ``path``'s partial to ``path`` (whatever had that name replaced, a link not
        followed), then fsync their folder."""
        folders, name = self._parts(path)
        fd = self._folder(folders, create=True)
        assert fd is not None  # made when the partial was
        os.rename(partial_name(name), name, src_dir_fd=fd, dst_dir_fd=fd)
        os.fsync(fd)

    def _open_to_read(self, path: str) -> int | None:
        """``path`` opened to read, not through a link (and not waiting on a FIFO); None
        where there is nothing."""
        folders, name = self._parts(path)
        folder = self._folder(folders, create=False)
        if folder is None:
            return None
        try:
            return os.open(name, _READ, dir_fd=folder)
        except FileNotFoundError:
            return None

    def open_final(self, path: str) -> int | None:
        """``path`` opened to read, if it is a regular file (not a link, nor a FIFO), else None."""
        try:
            fd = self._open_to_read(path)
        except OSError:
            return None
        if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def read(self, name: str, limit: int) -> bytes | None:
        """The bytes of the file ``name``; None where there is none. :class:`StageError` when
        it is a link, not a regular file, or over ``limit`` bytes."""
        try:
            fd = self._open_to_read(name)
        except OSError as exc:
            why = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise StageError(f"{why}: not read") from None
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StageError("is not a regular file: not read")
            if st.st_size > limit:
                raise StageError(f"has {st.st_size} bytes, more than {limit}: not read")
            return f.read(limit + 1)[:limit]

    def replace(self, name: str, data: bytes) -> None:
        """Put ``data`` under ``name`` in the destination's top folder at once: written to
        ``name.tmp`` (made anew), fsynced, renamed over ``name``."""
        folder = self._folder([], create=True)
        assert folder is not None  # opened with create
        tmp = f"{name}.tmp"
        fd = _own(folder, tmp, keep=False)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)

    def free_bytes(self) -> int:
        fs = os.statvfs(self._dirs[""])
        return fs.f_bavail * fs.f_frsize

    # -- the lock --------------------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the destination's lock for the block: ``flock`` on ``.fxkit-stage.lock``, which
        holds the PID of the run that has it. A second run is refused, naming that PID. The run
        that holds the lock removes its file at the end."""
        folder = self._dirs[""]
        fd = self._take_lock(folder)
        try:
            yield
        finally:
            with suppress(OSError):
                os.unlink(LOCK, dir_fd=folder)
            os.close(fd)

    def _take_lock(self, folder: int) -> int:
        while True:  # until the file locked is the one under the name (a run ending removes it)
            fd = self._open_lock(folder)
            try:
                self._flock(fd)
                named = _inode_at(LOCK, folder)
            except BaseException:
                os.close(fd)
                raise
            if named == _inode(fd):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd
            os.close(fd)

    def _flock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise StageError(
                f"another fxkit stage{f' (PID {pid})' if pid.isdigit() else ''} is staging into it",
                where=self.where,
                hint="wait for it to end (or stop it), then run again",
            ) from None

    def _open_lock(self, folder: int) -> int:
        try:
            fd = os.open(LOCK, _RW | os.O_CREAT | os.O_NONBLOCK, 0o644, dir_fd=folder)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise self._error(f"cannot make {LOCK}: {exc.strerror}") from None
            target = "?"
            with suppress(OSError):
                target = os.readlink(LOCK, dir_fd=folder)
            raise StageError(
                f"{LOCK} is a symbolic link (to {target}); fxkit never follows a link in the "
                "destination",
                where=self.where,
                hint=f"remove the link ({self.path / LOCK}), then run again",
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StageError(
                f"{LOCK} is not a regular file",
                where=self.where,
                hint=f"remove it ({self.path / LOCK}), then run again",
            )
        return fd


def _inode(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _inode_at(name: str, folder: int) -> tuple[int, int] | None:
    """The device and inode of ``name`` in ``folder`` (a link not followed), or None."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _own(folder: int, name: str, keep: bool) -> int:
    """fxkit's temporary file ``name`` in ``folder``, opened read-write: with ``keep``, the one
    there if it is a regular file of one link; else a new one, made with ``O_EXCL`` once
    whatever had the name is removed (a link itself, never its target)."""
    if keep:
        with suppress(OSError):
            fd = os.open(name, _RW | os.O_NONBLOCK, dir_fd=folder)
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                return fd
            os.close(fd)
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=folder)
    return os.open(name, _RW | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=folder)
