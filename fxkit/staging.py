"""Model staging: copy a model directory to the fast store, verified and resumable.

:func:`stage` copies every file under a source (a local folder such as an NFS mount, or
``[user@]host:/path`` read over SSH) into ``dest``, several files at once in large chunks.

- **Never a partial file under a final name.** Each file is written as ``.NAME.fxkit-partial``
  beside its final name, fsynced, checked, and only then renamed into place (and its folder
  fsynced). Ctrl-C, a kill or a full disk leave at most a partial, under its temporary name.
- **The check.** A checksum of the bytes read from the source is computed as they are read
  (BLAKE3 by default, or sha256, the digest Hugging Face publishes for LFS files); the same
  buffers are then written, so the hash is that of the bytes handed to the store. The
  written file's size must equal the source's, and the source's size and mtime must be the same
  after the copy as before (otherwise the hash would describe a mix of two versions). With
  ``verify=True`` the written file is also read back from the store (its pages dropped from the
  page cache first) and hashed again: what the store holds must hash the same, or the partial
  is removed and :class:`ChecksumMismatch` raised. That second read costs a second pass of I/O
  and hashing, so it is an option; a re-run hashes files it cannot trust anyway (below).
- **Resume.** A partial left by an interrupted run is read back and compared with the source,
  chunk by chunk; the copy goes on from the first chunk that differs (a torn or corrupted tail is
  rewritten, never trusted). A file under its final name is skipped when the manifest
  (``.fxkit-stage.json`` in ``dest``) records its size, mtime and digest (of the algorithm
  asked for) for a source of the same size and mtime. When any of these differ it is not
  trusted: with the source unchanged its digest is computed again and compared with the
  recorded one; without a record, or with a digest of another algorithm (never compared across
  algorithms), it is compared with the source byte for byte and hashed anew. A file that
  differs is copied again.
- **One run per destination.** A run holds ``flock`` on ``.fxkit-stage.lock`` in ``dest``; a
  second one is refused, naming the first one's PID. The manifest records a digest only for bytes
  the run wrote and fsynced itself, or read back from the file under its final name and
  compared. A manifest that cannot be read (not a regular file, not JSON, records of the wrong
  shape) is a warning, and every file it cannot vouch for is checked against the source.
- **Nothing is written outside** ``dest``: it is reached only through descriptors, and a link
  planted in it is replaced, never followed (:mod:`fxkit.staging_dest`).
- **Only the model's files are read.** A source's names must be names of files inside it (a
  remote one is refused otherwise, naming the source). Links are followed as the loader follows
  them (to a regular file, never a FIFO or a device), and only where the model's own files are:
  inside the source folder or, for a Hugging Face cache snapshot (``REPO/snapshots/REV``), the
  blobs its files link to (``REPO/blobs``). A copy makes the file readable as the destination
  allows, so a link elsewhere (``/etc/shadow``) is skipped with a warning, never copied. A link
  to a folder is never followed (a folder inside is staged under its own name), so a link to
  ``/`` or a loop walks nothing. The check is made on each file as opened (its path read back
  from ``/proc/self/fd``: on the source host too), so swapping a file for a link after the
  listing gains nothing.
- **Bad input** (missing or empty source, not enough space, a checksum mismatch) raises a
  :class:`StageError` with where and a hint, before anything is written where it can be.

Copying goes through user space rather than ``copy_file_range``/``sendfile``, since the hash
needs every byte there anyway. Each file is a pipeline (double buffering): its next chunks are
read by threads of their own while the copy hashes the last one and writes it, so the disk is
never idle while the CPU hashes. A local file is read through the page cache with two reads in
flight (the kernel's readahead at work; each range dropped from the cache once copied out); a
remote one is streamed by ``cat``, the files copied at once over SSH connections of their own
(up to 4: one paramiko connection moves its packets on one thread). Whole 4 KiB blocks are
written with O_DIRECT where the store takes it (the buffer goes to the store without a copy
into the page cache, and no dirty pages pile up whose writeback would stall the copy), the
file's last bytes through the page cache. The hash is the CPU's main cost: BLAKE3 runs at
about 4 GB/s per core here, sha256 at 1.2-1.4, and both release the GIL while they hash a
chunk, so each of the ``jobs`` files copied at once hashes on a core of its own
(docs/BENCHMARKS.md, "Model staging").
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import queue
import shlex
import stat
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol, Self

import blake3

from fxkit.connection.parallel import Streams
from fxkit.staging_dest import (
    LOCK,
    PARTIAL_SUFFIX,
    Destination,
    StageError,
    name_problem,
    partial_path,
)
from fxkit.staging_report import PlanReport, Summary

if TYPE_CHECKING:
    import paramiko

    from fxkit.connection import ConnectOptions
    from fxkit.connection.ssh import SSHConnection

MANIFEST = ".fxkit-stage.json"
#: A manifest holds a few hundred bytes per file: one larger than this is not read.
MANIFEST_LIMIT = 64 << 20
#: Bytes per read and write: large enough that per-call costs vanish, small enough for many jobs.
CHUNK = 16 << 20
JOBS = 4
#: O_DIRECT's grid: offsets and lengths in whole 4 KiB blocks (buffers are page-aligned).
_ALIGN = 4096
#: Seconds a remote file's stream may go without data before the copy gives up.
_STREAM_TIMEOUT = 120.0


class Hasher(Protocol):
    def update(self, data: memoryview | bytes, /) -> object: ...
    def hexdigest(self) -> str: ...


#: The checksums a copy can be verified with: BLAKE3 (cryptographic, about three times
#: sha256's speed per core) by default; sha256 to get the digests Hugging Face publishes.
CHECKSUMS: dict[str, Callable[[], Hasher]] = {"blake3": blake3.blake3, "sha256": hashlib.sha256}
CHECKSUM = "blake3"


class DestinationFull(StageError):
    """The destination has no room for the files to copy."""


class ChecksumMismatch(StageError):
    """A written file does not hash as the bytes read from the source."""


# -- sources ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceFile:
    """A file of the source: its path relative to the source folder ('/'-separated)."""

    path: str
    size: int
    mtime_ns: int


class Reader(Protocol):
    def readinto(self, buffer: memoryview) -> int: ...


class Source(ABC):
    """Where a model directory is read from; closed at the end of a ``with`` block."""

    #: How messages name it: ``/mnt/nfs/llama`` or ``node1:/models/llama``.
    where: str

    def __init__(self) -> None:
        #: What the listing skipped, and why: "WHERE: NAME: a link to /etc/shadow, outside...".
        self.warnings: list[str] = []
        #: The real paths of the folders the model's files may be in (see the module's docstring).
        self.folders: tuple[str, ...] = ()

    @abstractmethod
    def files(self) -> list[SourceFile]:
        """Every file below the folder that is staged (the rule of the module's docstring),
        checked to exist; what is skipped is told in :attr:`warnings`."""

    @abstractmethod
    def stat(self, path: str) -> SourceFile:
        """The file as it is now."""

    @abstractmethod
    def open(self, path: str) -> Any:
        """A context manager yielding a :class:`Reader` of the file from its start; a file
        that is now outside the model's folders (a link swapped in) is refused."""

    def close(self) -> None:  # noqa: B027  (a source with nothing to close)
        """Release what the source holds (connections)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _find_folders(self, real: str, resolve: Callable[[str], str | None]) -> None:
        """Set :attr:`folders` for the source folder whose real path is ``real``; ``resolve``
        gives a folder's real path, or None where there is no such folder."""
        path = PurePosixPath(real)
        blobs = (
            resolve(str(path.parent.parent / "blobs")) if path.parent.name == "snapshots" else None
        )
        self.folders = (real, blobs) if blobs else (real,)

    def _inside(self, real: str) -> bool:
        return any(real == f or real.startswith(f.rstrip("/") + "/") for f in self.folders)

    def _judge(self, mode: int, link: bool, real: str) -> str | None:
        """Why an entry of the listing (its mode, links followed; whether it is a link; its real
        path) is not staged, or None: a regular file to copy, or a folder to list."""
        if not self._inside(real):
            return f"{'a link to ' if link else ''}{real}, outside the model folder: skipped"
        if stat.S_ISDIR(mode):
            return f"a link to a folder ({real}), not followed: skipped" if link else None
        if stat.S_ISREG(mode):
            return None
        kind = _KINDS.get(stat.S_IFMT(mode), "something else")
        return f"{'a link to ' if link else ''}{kind}, not a regular file: skipped"

    def _skip(self, path: str, why: str) -> None:
        self.warnings.append(f"{self.where}: {path}: {why}")

    def _outside(self, path: str, real: str) -> StageError:
        return StageError(
            f"{path}: {_OUTSIDE.format(real)}",
            where=self.where,
            hint="something is changing the model's folder: find out what, then run again",
        )


#: What is said of a file opened outside the model's folders ({}: where it is).
_OUTSIDE = "opened as {}, outside the model folder (a link put there since it was listed?): refused"
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _skip_name(name: str) -> bool:
    """fxkit's own files (a staged folder as the source of another stage)."""
    return name in (MANIFEST, f"{MANIFEST}.tmp", LOCK) or name.endswith(PARTIAL_SUFFIX)


def _opened_as(fd: int) -> str:
    """The path of the file open on ``fd``, as the kernel has it (links resolved)."""
    return os.readlink(f"/proc/self/fd/{fd}")


class LocalSource(Source):
    """A folder on this machine (an NFS, Lustre or local mount), read through descriptors: each
    file opened once (``O_PATH``, no effect even on a device), checked, then reopened to read."""

    def __init__(self, root: str | Path):
        super().__init__()
        self.root = Path(root)
        self.where = str(root)
        self._fd: int | None = None

    def _root(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise StageError(
                    "the source does not exist", where=self.where, hint="check the path (mounted?)"
                ) from None
            except NotADirectoryError:
                raise _not_a_directory(self.where) from None
            except OSError as exc:
                raise StageError(
                    f"cannot read the source: {exc.strerror}", where=self.where
                ) from None
            self._find_folders(_opened_as(self._fd), _local_folder)
        return self._fd

    def files(self) -> list[SourceFile]:
        found: list[SourceFile] = []
        self._walk(self._root(), "", found)
        return found

    def _walk(self, folder: int, at: str, found: list[SourceFile]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise StageError(f"cannot list {at or '.'}: {exc.strerror}", where=self.where) from None
        for entry in entries:
            path = f"{at}/{entry.name}" if at else entry.name
            if _skip_name(entry.name):
                continue
            link = entry.is_symlink()
            try:
                fd = os.open(entry.name, os.O_PATH | os.O_CLOEXEC, dir_fd=folder)
            except OSError as exc:
                if not link:
                    raise StageError(
                        f"cannot read {path}: {exc.strerror}", where=self.where
                    ) from None
                self._skip(path, _broken_link(exc, folder, entry.name))
                continue
            try:
                st, real = os.fstat(fd), _opened_as(fd)
                why = self._judge(st.st_mode, link, real)
                if why:
                    self._skip(path, why)
                elif stat.S_ISREG(st.st_mode):
                    found.append(SourceFile(path, st.st_size, st.st_mtime_ns))
                else:
                    self._walk_into(folder, entry.name, path, found)
            finally:
                os.close(fd)

    def _walk_into(self, folder: int, name: str, path: str, found: list[SourceFile]) -> None:
        try:
            sub = os.open(name, _LIST, dir_fd=folder)
        except OSError as exc:
            raise StageError(f"cannot list {path}: {exc.strerror}", where=self.where) from None
        try:
            self._walk(sub, path, found)
        finally:
            os.close(sub)

    def stat(self, path: str) -> SourceFile:
        try:
            st = os.stat(path, dir_fd=self._root())
        except OSError as exc:
            raise StageError(f"cannot read {path}: {exc.strerror}", where=self.where) from None
        return SourceFile(path, st.st_size, st.st_mtime_ns)

    @contextmanager
    def open(self, path: str) -> Iterator[Reader]:
        try:
            with _opened(path, os.O_PATH | os.O_CLOEXEC, self._root()) as fd:
                real = _opened_as(fd)
                if not self._inside(real) or not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise self._outside(path, real)
                reader = _FileReader(f"/proc/self/fd/{fd}")
        except OSError as exc:
            raise StageError(f"cannot read {path}: {exc.strerror}", where=self.where) from None
        try:
            yield reader
        finally:
            reader.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


#: How a folder of the listing is opened: not through a link (it was not one when listed).
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextmanager
def _opened(path: str, flags: int, dir_fd: int) -> Iterator[int]:
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _local_folder(path: str) -> str | None:
    return os.path.realpath(path) if os.path.isdir(path) else None


def _broken_link(exc: OSError, folder: int, name: str) -> str:
    """What is said of the link ``name`` in ``folder`` that cannot be opened (``exc``)."""
    target = "?"
    with suppress(OSError):
        target = os.readlink(name, dir_fd=folder)
    if exc.errno == errno.ELOOP:
        return f"a link loop (to {target}): skipped"
    return f"a dangling link (to {target}: {exc.strerror}): skipped"


def _not_a_directory(where: str) -> StageError:
    return StageError(
        "the source is not a directory",
        where=where,
        hint="give the model's folder (the one with config.json and *.safetensors)",
    )


class _FileReader:
    """A local file read through the page cache, so the kernel's readahead works for the copy
    (on this VM's loop disk, two buffered 16 MiB reads in flight per file went 1.6-2.1 GB/s,
    O_DIRECT at any depth 1.1-1.2: docs/BENCHMARKS.md, "Model staging"). Each range read is
    dropped from the page cache once copied out (the source is read once; the page cache is
    better spent on the staged copy). :meth:`readinto_at` reads at an offset, so several
    chunks of one file can be read at once (:class:`_ReadAhead`)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self.offset = 0

    def readinto_at(self, buffer: memoryview, offset: int) -> int:
        n = os.preadv(self.fd, [buffer], offset)
        if n:
            os.posix_fadvise(self.fd, offset, n, os.POSIX_FADV_DONTNEED)
        return n

    def readinto(self, buffer: memoryview) -> int:
        n = self.readinto_at(buffer, self.offset)
        self.offset += n
        return n

    def close(self) -> None:
        os.close(self.fd)


class SSHSource(Source):
    """A folder on another host, through fxkit's SSH connection (host keys verified as for
    every fxkit connection): listed and stat'ed over SFTP (a session per thread), each file
    streamed by ``cat`` on an exec channel of its own (160 MB/s from a lab host, against 65
    MB/s for paramiko's pipelined SFTP reads, which cost four times the CPU). The streams are
    spread over up to ``connections`` SSH connections (``more`` makes the further ones): one
    paramiko connection moves all its packets on one thread (:mod:`fxkit.connection.parallel`)."""

    def __init__(
        self,
        connection: SSHConnection,
        root: str,
        more: Callable[[], SSHConnection] | None = None,
        connections: int = JOBS,
    ):
        super().__init__()
        self.conn = connection
        self.streams = Streams(connection, more or (lambda: connection), connections if more else 1)
        self.root = root.rstrip("/") or "/"
        self.where = f"{connection.name}:{self.root}"
        self._local = threading.local()
        self._sessions: list[paramiko.SFTPClient] = []
        self._lock = threading.Lock()

    def _sftp(self) -> paramiko.SFTPClient:
        client: paramiko.SFTPClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self.conn.sftp()
            self._local.client = client
            with self._lock:
                self._sessions.append(client)
        return client

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def files(self) -> list[SourceFile]:
        sftp = self._sftp()
        try:
            top = sftp.stat(self.root)
            real = sftp.normalize(self.root)
        except FileNotFoundError:
            raise StageError(
                "the source does not exist", where=self.where, hint="check the path on that host"
            ) from None
        except OSError as exc:
            raise StageError(f"cannot read the source: {exc}", where=self.where) from None
        if not stat.S_ISDIR(top.st_mode or 0):
            raise _not_a_directory(self.where)
        self._find_folders(real, lambda path: _remote_folder(sftp, path))
        found: list[SourceFile] = []
        self._walk(sftp, "", real, found)
        return found

    def _walk(
        self, sftp: paramiko.SFTPClient, at: str, real_at: str, found: list[SourceFile]
    ) -> None:
        try:
            entries = sorted(sftp.listdir_attr(self._path(at)), key=lambda a: a.filename)
        except UnicodeDecodeError as exc:
            raise self._bad_name(
                at,
                f"{exc.object!r} (not UTF-8)",
                "rename the file on that host (fxkit stages files whose names are UTF-8)",
            ) from None
        except OSError as exc:
            raise StageError(f"cannot list {at or '.'}: {exc}", where=self.where) from None
        for attr in entries:
            problem = name_problem(attr.filename)
            if problem:
                raise self._bad_name(
                    at,
                    problem,
                    "no file in a folder has such a name: the SFTP server on that host is not "
                    "to be trusted",
                )
            if _skip_name(attr.filename):
                continue
            path = f"{at}/{attr.filename}" if at else attr.filename
            link, real = stat.S_ISLNK(attr.st_mode or 0), f"{real_at.rstrip('/')}/{attr.filename}"
            if link:
                try:
                    real = sftp.normalize(self._path(path))
                    attr = sftp.stat(real)
                except OSError:
                    target = "?"
                    with suppress(OSError):
                        target = sftp.readlink(self._path(path)) or "?"
                    self._skip(path, f"a dangling link or a link loop (to {target}): skipped")
                    continue
            why = self._judge(attr.st_mode or 0, link, real)
            if why:
                self._skip(path, why)
            elif stat.S_ISREG(attr.st_mode or 0):
                found.append(_remote_file(path, attr))
            else:
                self._walk(sftp, path, real, found)

    def _bad_name(self, at: str, named: str, hint: str) -> StageError:
        return StageError(
            f"the listing of {at or '.'} has a file named {named}: refused, nothing was staged",
            where=self.where,
            hint=hint,
        )

    def stat(self, path: str) -> SourceFile:
        try:
            attr = self._sftp().stat(self._path(path))
        except OSError as exc:
            raise StageError(f"cannot read {path}: {exc}", where=self.where) from None
        return _remote_file(path, attr)

    @contextmanager
    def open(self, path: str) -> Iterator[Reader]:
        with self.streams.stream(self._read_command(path)) as chan:
            chan.settimeout(_STREAM_TIMEOUT)
            yield _StreamReader(chan)

    def _read_command(self, path: str) -> str:
        """A shell command that opens the file, checks where the file opened is (its
        descriptor's path, links resolved), and only then streams it with ``cat``."""
        inside = "|".join(f"{shlex.quote(f.rstrip('/'))}/*" for f in self.folders)
        head, tail = _OUTSIDE.split("{}")
        return (
            f"exec 3< {shlex.quote(self._path(path))} || exit; "
            "r=$(readlink /proc/self/fd/3) || exit; "
            f"case $r in {inside or '/'}) exec cat <&3;; esac; "
            f"printf '%s%s%s\\n' {shlex.quote(f'{path}: {head}')} \"$r\" {shlex.quote(tail)} >&2; "
            "exit 3"
        )

    def close(self) -> None:
        for client in self._sessions:
            client.close()
        self._sessions.clear()
        self.streams.close()
        self.conn.close()


def _remote_file(path: str, attr: paramiko.SFTPAttributes) -> SourceFile:
    return SourceFile(path, attr.st_size or 0, int((attr.st_mtime or 0) * 1e9))


def _remote_folder(sftp: paramiko.SFTPClient, path: str) -> str | None:
    try:
        return sftp.normalize(path) if stat.S_ISDIR(sftp.stat(path).st_mode or 0) else None
    except OSError:
        return None


class _StreamReader:
    """A remote file's bytes as ``cat`` writes them on an exec channel; its exit status
    checked at the end (a file that cannot be read is an error, not a short file)."""

    def __init__(self, chan: paramiko.Channel):
        self.chan = chan

    def readinto(self, buffer: memoryview) -> int:
        got = 0
        while got < len(buffer):
            try:
                data = self.chan.recv(len(buffer) - got)
            except TimeoutError:
                raise OSError(f"no data for {_STREAM_TIMEOUT:g} s") from None
            if not data:
                self._check_exit()
                break
            buffer[got : got + len(data)] = data
            got += len(data)
        return got

    def _check_exit(self) -> None:
        status = self.chan.recv_exit_status()
        if status != 0:
            err = self.chan.recv_stderr(4096).decode(errors="replace").strip()
            raise OSError(err or f"cat exited {status} (the connection broke?)")


def parse_source(spec: str) -> tuple[str | None, str | None, str]:
    """``[user@]host:/path`` -> (user, host, path); a local path -> (None, None, path). As
    with scp and rsync, a colon before the first slash makes it remote."""
    head, colon, tail = spec.partition(":")
    if not colon or "/" in head or not head:
        return None, None, spec
    user, at, host = head.rpartition("@")
    return (user if at else None), host, tail or "."


def open_source(
    spec: str,
    options: ConnectOptions | None = None,
    key_file: str | None = None,
    connections: int = JOBS,
) -> Source:
    """The source named by ``spec`` (see :func:`parse_source`); remote hosts are resolved as
    fxkit resolves inventory hosts (ssh config, known_hosts; ``options`` as the CLI gives) and
    read over up to ``connections`` SSH connections."""
    user, host, path = parse_source(spec)
    if host is None:
        return LocalSource(path)
    from fxkit.connection import ConnectOptions
    from fxkit.connection.ssh import SSHConnection

    given = {"ansible_user": user, "ansible_ssh_private_key_file": key_file}
    hostvars = {k: v for k, v in given.items() if v}
    options = options or ConnectOptions()
    return SSHSource(
        SSHConnection(host, hostvars, options),
        path,
        more=lambda: SSHConnection(host, hostvars, options),
        connections=connections,
    )


# -- the manifest ------------------------------------------------------------------------------


#: A record's fields and their types (``bool`` is no ``int`` here).
_FIELDS = {
    "size": int,
    "mtime_ns": int,
    "digest": str,
    "algorithm": str,
    "source_size": int,
    "source_mtime_ns": int,
}


@dataclass
class Record:
    """What the manifest knows of a staged file: the file as staged, and its source then."""

    size: int
    mtime_ns: int
    digest: str
    algorithm: str
    source_size: int
    source_mtime_ns: int

    @classmethod
    def from_json(cls, data: object) -> Record:
        """A record as the manifest holds it (of version 1: sha256 only); ValueError saying
        what is wrong with one that is not."""
        if not isinstance(data, dict):
            raise ValueError(f"not an object but {type(data).__name__}")
        if "sha256" in data and "algorithm" not in data:  # a manifest of version 1
            data = {**data, "algorithm": "sha256", "digest": data["sha256"]}
            del data["sha256"]
        if data.keys() != _FIELDS.keys():
            raise ValueError(f"has the fields {sorted(data)}, not {sorted(_FIELDS)}")
        for key, kind in _FIELDS.items():
            if type(data[key]) is not kind:
                raise ValueError(f"{key} is {type(data[key]).__name__}, not {kind.__name__}")
        if data["algorithm"] not in CHECKSUMS:
            raise ValueError(f"algorithm {data['algorithm']!r} is none of {sorted(CHECKSUMS)}")
        return cls(**data)

    def same_source(self, src: SourceFile) -> bool:
        return (self.source_size, self.source_mtime_ns) == (src.size, src.mtime_ns)

    def trusts(self, st: os.stat_result, src: SourceFile, algorithm: str) -> bool:
        return (
            (self.size, self.mtime_ns) == (st.st_size, st.st_mtime_ns)
            and self.same_source(src)
            and self.algorithm == algorithm
        )


class Manifest:
    """``dest/.fxkit-stage.json``: a record per staged file, rewritten atomically after each.
    One that cannot be read, or records that are malformed, are told in :attr:`warnings`: the
    files they stood for are then checked against the source."""

    def __init__(self, dest: Destination):
        self.dest = dest
        self.where = str(dest.path / MANIFEST)
        self.records: dict[str, Record] = {}
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        try:
            self._read()
        except (ValueError, StageError) as exc:
            self.records.clear()
            self.warnings.append(
                f"{self.where}: {exc}; not trusted: every file is checked against the source"
            )

    def _read(self) -> None:
        data = self.dest.read(MANIFEST, MANIFEST_LIMIT)
        if data is None:
            return  # none yet
        try:
            doc = json.loads(data.decode())
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 (byte {exc.start})") from None
        except RecursionError:
            raise ValueError("not a manifest: nested too deeply") from None
        except ValueError as exc:
            raise ValueError(f"not valid JSON ({exc})") from None
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict):
            raise ValueError('it has no "files" object')
        bad = []
        for name, value in files.items():
            try:
                self.records[name] = Record.from_json(value)
            except ValueError as exc:
                bad.append(f"{name!r} {exc}")
        if bad:
            self.warnings.append(
                f"{self.where}: {len(bad)} malformed records ({'; '.join(bad[:3])}"
                f"{'; ...' if len(bad) > 3 else ''}): their files are checked against the source"
            )

    def get(self, path: str) -> Record | None:
        return self.records.get(path)

    def put(self, path: str, record: Record) -> None:
        with self._lock:
            self.records[path] = record
            text = json.dumps(
                {"version": 2, "files": {k: asdict(v) for k, v in self.records.items()}}
            )
            try:
                self.dest.replace(MANIFEST, text.encode())
            except OSError as exc:
                raise _write_error(exc, MANIFEST, self.dest.where) from None


# -- the plan ----------------------------------------------------------------------------------


class Action(StrEnum):
    COPY = "copy"  # not there (or a partial to resume, or the wrong size)
    CHECK = "check"  # there with the right size, not trusted: hashed, copied if it differs
    SKIP = "skip"  # there and recorded in the manifest as staged from this source


@dataclass
class Step:
    file: SourceFile
    action: Action
    #: Bytes of a partial already written (compared with the source before the copy goes on).
    partial: int = 0


@dataclass
class Plan:
    source: str
    dest: str
    steps: list[Step]
    #: What the source's listing skipped and what the manifest could not vouch for.
    warnings: list[str] = field(default_factory=list)

    def of(self, action: Action) -> list[Step]:
        return [s for s in self.steps if s.action is action]

    @property
    def bytes_to_copy(self) -> int:
        return sum(s.file.size for s in self.of(Action.COPY))

    @property
    def bytes_to_check(self) -> int:
        return sum(s.file.size for s in self.of(Action.CHECK))

    def report(self) -> PlanReport:
        """What ``fxkit stage --plan --json`` prints."""
        return PlanReport(
            source=self.source,
            dest=self.dest,
            files=len(self.steps),
            copy=[s.file.path for s in self.of(Action.COPY)],
            check=[s.file.path for s in self.of(Action.CHECK)],
            skip=len(self.of(Action.SKIP)),
            bytes_to_copy=self.bytes_to_copy,
            bytes_to_check=self.bytes_to_check,
            warnings=self.warnings,
        )


def source_files(source: Source) -> list[SourceFile]:
    """The files to stage (reads only): :class:`StageError` when there are none."""
    files = source.files()
    if not files:
        raise StageError(
            "the source has no files", where=source.where, hint="is it the model's folder?"
        )
    return files


def make_plan(
    source: Source,
    files: list[SourceFile],
    dest: Destination,
    manifest: Manifest,
    verify: bool = False,
    checksum: str = CHECKSUM,
) -> Plan:
    """What staging ``files`` of ``source`` into ``dest`` would do, file by file (reads only)."""
    steps = []
    for src in sorted(files, key=lambda f: -f.size):
        st = dest.stat(src.path)
        record = manifest.get(src.path)
        if st is None:
            have = dest.partial_size(src.path)
            steps.append(Step(src, Action.COPY, partial=have if have <= src.size else 0))
        elif st.st_size != src.size or not stat.S_ISREG(st.st_mode):
            steps.append(Step(src, Action.COPY))
        elif record and record.trusts(st, src, checksum) and not verify:
            steps.append(Step(src, Action.SKIP))
        else:
            steps.append(Step(src, Action.CHECK))
    return Plan(source.where, dest.where, steps, source.warnings + manifest.warnings)


def plan(source: Source, dest: str | Path, verify: bool = False, checksum: str = CHECKSUM) -> Plan:
    """What staging would do, the destination only read (``--plan``)."""
    files = source_files(source)
    with Destination(dest, create=False) as folder:
        return make_plan(source, files, folder, Manifest(folder), verify, checksum)


def check_space(plan: Plan, dest: Destination) -> None:
    """Fail before writing anything when the files to copy do not fit."""
    needed = sum(s.file.size - s.partial for s in plan.of(Action.COPY))
    free = dest.free_bytes()
    if needed > free:
        raise DestinationFull(
            f"not enough space: {_gb(needed)} GB to copy, {_gb(free)} GB free",
            where=dest.where,
            hint="free space on the fast store, or stage to another folder",
        )


# -- copying -----------------------------------------------------------------------------------


class _Stopped(Exception):
    """Another file failed, or Ctrl-C: this copy stops, its partial kept for a resume."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def _buffer(size: int) -> memoryview:
    """A page-aligned buffer (O_DIRECT reads need one)."""
    return memoryview(mmap.mmap(-1, size))


def _read_full(reader: Reader, buffer: memoryview, where: str, at: int | None = None) -> int:
    """Fill ``buffer`` from ``reader`` (at the offset ``at`` of a local file, else where it
    is), short only at the end."""
    got = 0
    while got < len(buffer):
        try:
            if at is not None and isinstance(reader, _FileReader):
                n = reader.readinto_at(buffer[got:], at + got)
            else:
                n = reader.readinto(buffer[got:])
        except OSError as exc:
            raise StageError(f"cannot read: {exc.strerror or exc}", where=where) from None
        if not n:
            break
        got += n
    return got


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _pread_full(fd: int, buffer: memoryview, offset: int) -> int:
    got = 0
    while got < len(buffer):
        n = os.preadv(fd, [buffer[got:]], offset + got)
        if not n:
            break
        got += n
    return got


def _starts_with(ours: bytearray, theirs: memoryview) -> bool:
    """Whether ``ours`` begins with ``theirs``. A bytearray compares with ``memcmp`` (10 GB/s
    here); a memoryview's ``==`` goes item by item (0.25 GB/s)."""
    n = len(theirs)
    return (ours if n == len(ours) else ours[:n]) == theirs


def hash_file(
    fd: int, size: int, checksum: str, chunk: int = CHUNK, drop_cache: bool = False
) -> str:
    """The digest (``checksum``: a key of :data:`CHECKSUMS`) of an open file's first ``size``
    bytes, read from the store when ``drop_cache`` (its clean pages dropped first)."""
    if drop_cache:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    hasher, buffer = CHECKSUMS[checksum](), _buffer(min(chunk, max(size, 1)))
    offset = 0
    while offset < size:
        n = _pread_full(fd, buffer[: min(len(buffer), size - offset)], offset)
        if not n:
            break
        hasher.update(buffer[:n])
        offset += n
    return hasher.hexdigest()


class Stager:
    """One staging run: copies the plan's files with ``jobs`` threads."""

    def __init__(
        self,
        source: Source,
        manifest: Manifest,
        *,
        jobs: int = JOBS,
        chunk: int = CHUNK,
        verify: bool = False,
        checksum: str = CHECKSUM,
        progress: Callable[[int], None] | None = None,
    ):
        self.source, self.dest = source, manifest.dest
        self.jobs, self.chunk, self.verify = jobs, chunk, verify
        self.checksum, self.new_hash = checksum, CHECKSUMS[checksum]
        self.progress = progress or (lambda n: None)
        self.manifest = manifest
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def run(self, plan: Plan) -> Summary:
        summary = Summary(
            source=plan.source, dest=plan.dest, files=len(plan.steps), verify=self.verify,
            checksum=self.checksum, warnings=plan.warnings,
        )  # fmt: skip
        start = time.perf_counter()
        for step in plan.of(Action.SKIP):
            summary.skipped += 1
            summary.bytes_skipped += step.file.size
        work = [s for s in plan.steps if s.action is not Action.SKIP]
        with ThreadPoolExecutor(max(1, self.jobs), thread_name_prefix="fxkit-stage") as pool:
            futures = [pool.submit(self._step, step, summary) for step in work]
            try:
                pending = set(futures)
                while pending:
                    # In slices: a Ctrl-C that lands in a worker thread still reaches this one.
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                    for future in done:
                        future.result()
            except BaseException:
                self.stop.set()
                for future in futures:
                    future.cancel()
                raise
        summary.seconds = time.perf_counter() - start
        return summary

    def _step(self, step: Step, summary: Summary) -> None:
        if self.stop.is_set():
            raise _Stopped
        src = step.file
        if step.action is Action.CHECK and self._matches(src):
            self.progress(src.size)
            with self._lock:
                summary.checked += 1
                summary.skipped += 1
                summary.bytes_skipped += src.size
            return
        resumed = self._copy(src)
        with self._lock:
            summary.copied += 1
            summary.resumed += resumed
            summary.bytes_copied += src.size
            summary.copied_files.append(src.path)

    def _matches(self, src: SourceFile) -> bool:
        """Whether an untrusted file under its final name (a regular file, not a link) holds
        the source's bytes: hashed again against the manifest's digest (same source, same
        algorithm), else compared with the source; fsynced before it is recorded."""
        record = self.manifest.get(src.path)
        fd = self.dest.open_final(src.path)
        if fd is None:
            return False
        with os.fdopen(fd, "rb"):
            if record and record.same_source(src) and record.algorithm == self.checksum:
                digest = record.digest
                same = hash_file(fd, src.size, self.checksum, self.chunk, self.verify) == digest
            else:
                with self.source.open(src.path) as reader:
                    hasher, matched, _ = self._compare(reader, fd, src.size, count=False)
                same, digest = matched == src.size, hasher.hexdigest()
            if same:
                os.fsync(fd)
            st = os.fstat(fd)
        if same and self.source.stat(src.path) == src:
            self.manifest.put(src.path, self._record(st, digest, src))
            return True
        return False

    def _compare(
        self, reader: Reader, fd: int, length: int, count: bool = True
    ) -> tuple[Hasher, int, bytes]:
        """Read the source and ``fd`` side by side up to ``length``. Returns the hash of the
        source bytes that matched, the offset where they stop matching (``length`` if they all
        do) and the source bytes already read from there (to be written, not read again)."""
        hasher = self.new_hash()
        ours, theirs = bytearray(self.chunk), _buffer(self.chunk)
        offset = 0
        while offset < length:
            if self.stop.is_set():
                raise _Stopped
            want = min(self.chunk, length - offset)
            n = _read_full(reader, theirs[:want], self.source.where)
            if (
                n != want
                or _pread_full(fd, memoryview(ours)[:n], offset) != n
                or not _starts_with(ours, theirs[:n])
            ):
                return hasher, offset, bytes(theirs[:n])
            hasher.update(theirs[:n])
            offset += n
            if count:
                self.progress(n)
        return hasher, offset, b""

    def _copy(self, src: SourceFile) -> int:
        """Copy one file through its partial, verified, renamed into place and recorded;
        1 if it resumed a partial, else 0."""
        partial = f"{self.dest.where}/{partial_path(src.path)}"  # as messages name it
        try:
            fd = self.dest.open_partial(src.path)
        except OSError as exc:
            raise _write_error(exc, src.path, self.dest.where) from None
        try:
            digest, resumed = self._fill(src, fd)
            os.fsync(fd)
            st = os.fstat(fd)
            if st.st_size != src.size:  # never: _fill wrote exactly the source's size
                raise ChecksumMismatch(
                    f"{src.path}: wrote {st.st_size} bytes, the source has {src.size}",
                    where=partial,
                )
            if self.verify and hash_file(fd, src.size, self.checksum, self.chunk, True) != digest:
                raise ChecksumMismatch(
                    f"{src.path}: the written file does not hash as the bytes read from the "
                    f"source ({self.checksum} differs); the partial was removed",
                    where=self.dest.where,
                    hint="the fast store returned other bytes than were written, or something "
                    "else wrote to the file: check the device (dmesg), then run again",
                )
            self.dest.install(src.path)
        except _Stopped:  # kept for a resume, unless there is nothing in it
            if not os.fstat(fd).st_size:
                self.dest.remove_partial(src.path)
            os.close(fd)
            raise
        except BaseException as exc:
            os.close(fd)
            self.dest.remove_partial(src.path)
            if isinstance(exc, OSError):
                raise _write_error(exc, src.path, self.dest.where) from None
            raise
        os.close(fd)
        self.manifest.put(src.path, self._record(st, digest, src))
        return resumed

    def _record(self, st: os.stat_result, digest: str, src: SourceFile) -> Record:
        return Record(st.st_size, st.st_mtime_ns, digest, self.checksum, src.size, src.mtime_ns)

    def _fill(self, src: SourceFile, fd: int) -> tuple[str, int]:
        """Write the source's bytes into the partial ``fd``, going on after the part of it that
        matches the source: its digest, and 1 if some of a partial was kept. The source is read
        ahead by threads of their own (:class:`_ReadAhead`) while the last chunk is hashed and
        written (:class:`_Writer`: O_DIRECT where the store takes it)."""
        have = os.fstat(fd).st_size
        where = f"{self.source.where}/{src.path}"
        with self.source.open(src.path) as reader, _Writer(fd) as writer:
            hasher, offset, pending = self.new_hash(), 0, b""
            # Whole chunks of it are compared (the rest is rewritten), so reads stay on the grid.
            have = have if have == src.size else min(have, src.size) // self.chunk * self.chunk
            if have:
                hasher, offset, pending = self._compare(reader, fd, have)
            kept = offset
            os.ftruncate(fd, offset)  # a tail that did not match (or a longer file) is dropped
            if pending:
                hasher.update(pending)
                _pwrite_all(fd, memoryview(pending), offset)
                offset += len(pending)
                self.progress(len(pending))
            n = 0
            with _ReadAhead(reader, self.chunk, where, offset) as chunks:
                for data in chunks:
                    n = len(data)
                    if self.stop.is_set():
                        raise _Stopped
                    if offset + n > src.size:
                        break
                    hasher.update(data)
                    self._write(writer, data, offset)
                    offset += n
                    self.progress(n)
        if offset != src.size or n or self.source.stat(src.path) != src:
            raise StageError(
                f"{src.path} changed while it was copied; the partial was removed",
                where=self.source.where,
                hint="stage a model that is no longer being written, then run again",
            )
        return hasher.hexdigest(), int(kept > 0)

    def _write(self, writer: _Writer, data: memoryview, offset: int) -> None:
        """``data`` written at ``offset``: the whole 4 KiB blocks of it with O_DIRECT (where the
        store takes it), the rest (the file's last bytes) through the page cache."""
        direct = writer.direct
        whole = len(data) // _ALIGN * _ALIGN if direct is not None else 0
        if direct is not None and whole and not offset % _ALIGN:
            try:
                _pwrite_all(direct, data[:whole], offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                writer.no_direct()  # the store will not do it: buffered from here on
                whole = 0
            data, offset = data[whole:], offset + whole
        if data:
            _pwrite_all(writer.fd, data, offset)


class _Writer:
    """The partial ``fd`` and, where the store takes it, a second descriptor of the same file
    with O_DIRECT (reopened through ``/proc/self/fd``: the file already opened): whole blocks go
    from the copy's buffer to the store without a copy into the page cache and without dirty
    pages whose writeback stalls the next write (and with it the reads)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.direct: int | None = None
        with suppress(OSError):
            self.direct = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC | os.O_DIRECT)

    def no_direct(self) -> None:
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.no_direct()


#: Reads in flight per local file (a stream from another host is read by one thread).
READERS = 2


class _ReadAhead:
    """Double buffering: the source read in chunks of ``chunk`` bytes from ``start`` by threads
    of their own, while the copy hashes and writes the chunk before. A local file is read by
    :data:`READERS` threads, chunk ``i`` by thread ``i % READERS`` at its offset; a stream by one.
    Each thread has two page-aligned buffers: one read into while the copy has the other.

    Iterating yields each chunk in order (a short one, then an empty one, at the end); a
    chunk's buffer is read into again only once the next chunk is asked for. A read's error is
    raised where its chunk would have come. Leaving the block stops the threads and waits for
    them (a read under way ends first), so the reader may be closed after."""

    def __init__(self, reader: Reader, chunk: int, where: str, start: int = 0):
        self.reader, self.chunk, self.where, self.start = reader, chunk, where, start
        count = READERS if isinstance(reader, _FileReader) else 1
        self.free: list[queue.SimpleQueue[memoryview | None]] = []
        self.full: list[queue.SimpleQueue[tuple[memoryview, int] | BaseException]] = []
        self.threads = []
        for k in range(count):
            self.free.append(queue.SimpleQueue())
            self.full.append(queue.SimpleQueue())
            for _ in range(2):
                self.free[k].put(_buffer(chunk))
            self.threads.append(
                threading.Thread(target=self._read, args=(k,), name="fxkit-stage-read", daemon=True)
            )

    def _read(self, k: int) -> None:
        count, free, full = len(self.threads), self.free[k], self.full[k]
        i = k
        while (buffer := free.get()) is not None:
            try:
                n = _read_full(self.reader, buffer, self.where, self.start + i * self.chunk)
            except BaseException as exc:  # handed to the copy, raised there
                full.put(exc)
                return
            full.put((buffer, n))
            if not n:
                return
            i += count

    def __enter__(self) -> Iterator[memoryview]:
        for thread in self.threads:
            thread.start()
        return self._chunks()

    def _chunks(self) -> Iterator[memoryview]:
        i = 0
        while True:
            k = i % len(self.threads)
            got = self.full[k].get()
            if isinstance(got, BaseException):
                raise got
            buffer, n = got
            yield buffer[:n]
            if not n:
                return
            self.free[k].put(buffer)
            i += 1

    def __exit__(self, *exc: object) -> None:
        for free in self.free:
            free.put(None)
        for thread in self.threads:
            thread.join()


def _write_error(exc: OSError, path: str, dest: str) -> StageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DestinationFull(
            f"the destination filled up while copying {path}; the partial was removed",
            where=dest,
            hint="free space on the fast store (or stage to another folder), then run again",
        )
    return StageError(f"cannot write {path}: {exc.strerror or exc}", where=dest)


@contextmanager
def prepare(
    source: Source, dest: str | Path, verify: bool = False, checksum: str = CHECKSUM
) -> Iterator[tuple[Plan, Manifest]]:
    """The run's plan and manifest: the source listed first (reads only), then, for the
    block, the destination made and locked, and checked to have the space (nothing else is
    written)."""
    files = source_files(source)
    with Destination(dest, create=True) as folder, folder.locked():
        manifest = Manifest(folder)
        plan = make_plan(source, files, folder, manifest, verify, checksum)
        check_space(plan, folder)
        yield plan, manifest


def stage(
    source: Source,
    dest: str | Path,
    *,
    jobs: int = JOBS,
    chunk: int = CHUNK,
    verify: bool = False,
    checksum: str = CHECKSUM,
    progress: Callable[[int], None] | None = None,
) -> Summary:
    """Stage ``source`` into ``dest`` (see :mod:`fxkit.staging`); ``progress`` is told of
    every byte copied or checked."""
    with prepare(source, dest, verify, checksum) as (plan, manifest):
        stager = Stager(
            source, manifest, jobs=jobs, chunk=chunk, verify=verify, checksum=checksum,
            progress=progress,
        )  # fmt: skip
        return stager.run(plan)
