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
- **Bad input** (missing or empty source, not enough space, a checksum mismatch) raises a
  :class:`StageError` with where and a hint, before anything is written where it can be.

Copying goes through user space rather than ``copy_file_range``/``sendfile``, since the hash
needs every byte there anyway: a local file is read with O_DIRECT into a page-aligned buffer
(no kernel copy, no page cache spent on the source), hashed and written with ``pwrite``; a
remote one is streamed by ``cat`` over the SSH connection. The hash is the CPU's main cost:
BLAKE3 runs at about 4 GB/s per core here, sha256 at 1.2-1.4, and both release the GIL while
they hash a chunk, so each of the ``jobs`` files copied at once hashes on a core of its own
(docs/BENCHMARKS.md, "Model staging").
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import blake3

from fxkit.errors import FxkitError

if TYPE_CHECKING:
    import paramiko

    from fxkit.connection import ConnectOptions
    from fxkit.connection.ssh import SSHConnection

MANIFEST = ".fxkit-stage.json"
PARTIAL_SUFFIX = ".fxkit-partial"
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


class StageError(FxkitError):
    """Staging cannot go on: a bad source or destination, or a copy that did not verify."""


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
    """Where a model directory is read from."""

    #: How messages name it: ``/mnt/nfs/llama`` or ``node1:/models/llama``.
    where: str

    @abstractmethod
    def files(self) -> list[SourceFile]:
        """Every file below the folder (symbolic links followed), checked to exist."""

    @abstractmethod
    def stat(self, path: str) -> SourceFile:
        """The file as it is now."""

    @abstractmethod
    def open(self, path: str) -> Any:
        """A context manager yielding a :class:`Reader` of the file from its start."""

    def close(self) -> None:  # noqa: B027  (a source with nothing to close)
        """Release what the source holds (connections)."""


def _skip_name(name: str) -> bool:
    """fxkit's own files (a staged folder as the source of another stage)."""
    return name == MANIFEST or name.endswith(PARTIAL_SUFFIX) or name == f"{MANIFEST}.tmp"


class LocalSource(Source):
    """A folder on this machine (an NFS, Lustre or local mount)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.where = str(root)

    def files(self) -> list[SourceFile]:
        if not self.root.exists():
            raise StageError(
                "the source does not exist", where=self.where, hint="check the path (mounted?)"
            )
        if not self.root.is_dir():
            raise StageError(
                "the source is not a directory",
                where=self.where,
                hint="give the model's folder (the one with config.json and *.safetensors)",
            )
        found = []
        for top, dirs, names in os.walk(self.root, onerror=self._walk_error, followlinks=True):
            dirs.sort()
            for name in sorted(names):
                if not _skip_name(name):
                    path = Path(top, name)
                    if path.is_file():
                        found.append(self.stat(path.relative_to(self.root).as_posix()))
        return found

    def _walk_error(self, exc: OSError) -> None:
        raise StageError(f"cannot list {exc.filename}: {exc.strerror}", where=self.where)

    def stat(self, path: str) -> SourceFile:
        try:
            st = os.stat(self.root / path)
        except OSError as exc:
            raise StageError(f"cannot read {path}: {exc.strerror}", where=self.where) from None
        return SourceFile(path, st.st_size, st.st_mtime_ns)

    @contextmanager
    def open(self, path: str) -> Iterator[Reader]:
        try:
            reader = _DirectReader(self.root / path)
        except OSError as exc:
            raise StageError(f"cannot read {path}: {exc.strerror}", where=self.where) from None
        try:
            yield reader
        finally:
            reader.close()


class _DirectReader:
    """A local file read with O_DIRECT where it can be: the bytes go from the disk straight
    into the copy's buffer, neither copied by the kernel nor kept in the page cache (the
    source is read once; the page cache is better spent on the staged copy). Reads that
    O_DIRECT cannot do (an offset or a length off the 4 KiB grid, a file system without it)
    go through a second, buffered descriptor."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.direct: int | None = None
        with suppress(OSError):
            self.direct = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self.offset = 0

    def readinto(self, buffer: memoryview) -> int:
        n = None
        if self.direct is not None and not (self.offset | len(buffer)) % _ALIGN:
            try:
                n = os.preadv(self.direct, [buffer], self.offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self.direct)  # the buffer or the file system will not do it
                self.direct = None
        if n is None:
            n = os.preadv(self.fd, [buffer], self.offset)
        self.offset += n
        return n

    def close(self) -> None:
        for fd in (self.fd, self.direct):
            if fd is not None:
                os.close(fd)


class SSHSource(Source):
    """A folder on another host, through fxkit's SSH connection (host keys verified as for
    every fxkit connection): listed and stat'ed over SFTP (a session per thread), each file
    streamed by ``cat`` on an exec channel of its own (160 MB/s from a lab host, against 65
    MB/s for paramiko's pipelined SFTP reads, which cost four times the CPU)."""

    def __init__(self, connection: SSHConnection, root: str):
        self.conn = connection
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
        except FileNotFoundError:
            raise StageError(
                "the source does not exist", where=self.where, hint="check the path on that host"
            ) from None
        except OSError as exc:
            raise StageError(f"cannot read the source: {exc}", where=self.where) from None
        if not stat.S_ISDIR(top.st_mode or 0):
            raise StageError(
                "the source is not a directory",
                where=self.where,
                hint="give the model's folder (the one with config.json and *.safetensors)",
            )
        found: list[SourceFile] = []
        self._walk(sftp, "", found)
        return found

    def _walk(self, sftp: paramiko.SFTPClient, folder: str, found: list[SourceFile]) -> None:
        try:
            entries = sorted(sftp.listdir_attr(self._path(folder)), key=lambda a: a.filename)
        except OSError as exc:
            raise StageError(f"cannot list {folder or '.'}: {exc}", where=self.where) from None
        for attr in entries:
            rel = f"{folder}/{attr.filename}" if folder else attr.filename
            mode = attr.st_mode or 0
            if stat.S_ISLNK(mode):  # followed, as the local source follows them
                mode = sftp.stat(self._path(rel)).st_mode or 0
            if stat.S_ISDIR(mode):
                self._walk(sftp, rel, found)
            elif stat.S_ISREG(mode) and not _skip_name(attr.filename):
                found.append(self.stat(rel))

    def stat(self, path: str) -> SourceFile:
        try:
            attr = self._sftp().stat(self._path(path))
        except OSError as exc:
            raise StageError(f"cannot read {path}: {exc}", where=self.where) from None
        return SourceFile(path, attr.st_size or 0, int((attr.st_mtime or 0) * 1e9))

    @contextmanager
    def open(self, path: str) -> Iterator[Reader]:
        chan = self.conn.stream(f"exec cat -- {shlex.quote(self._path(path))}")
        chan.settimeout(_STREAM_TIMEOUT)
        try:
            yield _StreamReader(chan)
        finally:
            chan.close()

    def close(self) -> None:
        for client in self._sessions:
            client.close()
        self._sessions.clear()
        self.conn.close()


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
    spec: str, options: ConnectOptions | None = None, key_file: str | None = None
) -> Source:
    """The source named by ``spec`` (see :func:`parse_source`); remote hosts are resolved as
    fxkit resolves inventory hosts (ssh config, known_hosts; ``options`` as the CLI gives)."""
    user, host, path = parse_source(spec)
    if host is None:
        return LocalSource(path)
    from fxkit.connection import ConnectOptions
    from fxkit.connection.ssh import SSHConnection

    hostvars = {"ansible_user": user, "ansible_ssh_private_key_file": key_file}
    conn = SSHConnection(
        host, {k: v for k, v in hostvars.items() if v}, options or ConnectOptions()
    )
    return SSHSource(conn, path)


# -- the manifest ------------------------------------------------------------------------------


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
    def from_json(cls, data: dict[str, Any]) -> Record:
        if "sha256" in data:  # a manifest of version 1: sha256 only
            data = dict(data, algorithm="sha256")
            data["digest"] = data.pop("sha256")
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
    """``dest/.fxkit-stage.json``: a record per staged file, rewritten atomically after each."""

    def __init__(self, dest: Path):
        self.path = dest / MANIFEST
        self.records: dict[str, Record] = {}
        self._lock = threading.Lock()
        try:
            data = json.loads(self.path.read_text())
            self.records = {k: Record.from_json(v) for k, v in data["files"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or unreadable: every file is checked against the source

    def get(self, path: str) -> Record | None:
        return self.records.get(path)

    def put(self, path: str, record: Record) -> None:
        with self._lock:
            self.records[path] = record
            tmp = self.path.with_name(f"{MANIFEST}.tmp")
            text = json.dumps(
                {"version": 2, "files": {k: asdict(v) for k, v in self.records.items()}}
            )
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)


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

    def of(self, action: Action) -> list[Step]:
        return [s for s in self.steps if s.action is action]

    @property
    def bytes_to_copy(self) -> int:
        return sum(s.file.size for s in self.of(Action.COPY))

    @property
    def bytes_to_check(self) -> int:
        return sum(s.file.size for s in self.of(Action.CHECK))

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": True,
            "source": self.source,
            "dest": self.dest,
            "files": len(self.steps),
            "copy": [s.file.path for s in self.of(Action.COPY)],
            "check": [s.file.path for s in self.of(Action.CHECK)],
            "skip": len(self.of(Action.SKIP)),
            "bytes_to_copy": self.bytes_to_copy,
            "bytes_to_check": self.bytes_to_check,
        }


def partial_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{PARTIAL_SUFFIX}")


def make_plan(
    source: Source,
    dest: Path,
    manifest: Manifest,
    verify: bool = False,
    checksum: str = CHECKSUM,
) -> Plan:
    """What staging ``source`` into ``dest`` would do, file by file (reads only)."""
    files = source.files()
    if not files:
        raise StageError(
            "the source has no files", where=source.where, hint="is it the model's folder?"
        )
    steps = []
    for src in sorted(files, key=lambda f: -f.size):
        final = dest / src.path
        try:
            st = os.stat(final)
        except FileNotFoundError:
            try:
                have = os.stat(partial_path(final)).st_size
            except FileNotFoundError:
                have = 0
            steps.append(Step(src, Action.COPY, partial=have if have <= src.size else 0))
            continue
        except NotADirectoryError:
            steps.append(Step(src, Action.COPY))
            continue
        record = manifest.get(src.path)
        if st.st_size != src.size or not stat.S_ISREG(st.st_mode):
            steps.append(Step(src, Action.COPY))
        elif record and record.trusts(st, src, checksum) and not verify:
            steps.append(Step(src, Action.SKIP))
        else:
            steps.append(Step(src, Action.CHECK))
    return Plan(source.where, str(dest), steps)


def check_destination(dest: Path) -> None:
    """``dest`` is, or can be, a writable directory."""
    if dest.exists() and not dest.is_dir():
        raise StageError("the destination is not a directory", where=str(dest))
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StageError(
            f"cannot create the destination: {exc.strerror}",
            where=str(dest),
            hint="is the fast store mounted, and writable by this user?",
        ) from None
    if not os.access(dest, os.W_OK | os.X_OK):
        raise StageError("the destination is not writable", where=str(dest))


def check_space(plan: Plan, dest: Path) -> None:
    """Fail before writing anything when the files to copy do not fit."""
    needed = sum(s.file.size - s.partial for s in plan.of(Action.COPY))
    fs = os.statvfs(dest)
    free = fs.f_bavail * fs.f_frsize
    if needed > free:
        raise DestinationFull(
            f"not enough space: {_gb(needed)} GB to copy, {_gb(free)} GB free",
            where=str(dest),
            hint="free space on the fast store, or stage to another folder",
        )


# -- copying -----------------------------------------------------------------------------------


@dataclass
class Summary:
    source: str
    dest: str
    files: int
    copied: int = 0
    skipped: int = 0
    resumed: int = 0
    checked: int = 0
    bytes_copied: int = 0
    bytes_skipped: int = 0
    seconds: float = 0.0
    verify: bool = False
    checksum: str = CHECKSUM
    copied_files: list[str] = field(default_factory=list)

    @property
    def rate_gbps(self) -> float:
        return self.bytes_copied / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gb_copied"] = round(self.bytes_copied / 1e9, 3)
        data["gb_skipped"] = round(self.bytes_skipped / 1e9, 3)
        data["rate_gbps"] = round(self.rate_gbps, 3)
        return data


class _Stopped(Exception):
    """Another file failed, or Ctrl-C: this copy stops, its partial kept for a resume."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def _buffer(size: int) -> memoryview:
    """A page-aligned buffer (O_DIRECT reads need one)."""
    return memoryview(mmap.mmap(-1, size))


def _read_full(reader: Reader, buffer: memoryview, where: str) -> int:
    got = 0
    while got < len(buffer):
        try:
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
        dest: Path,
        manifest: Manifest,
        *,
        jobs: int = JOBS,
        chunk: int = CHUNK,
        verify: bool = False,
        checksum: str = CHECKSUM,
        progress: Callable[[int], None] | None = None,
    ):
        self.source, self.dest = source, dest
        self.jobs, self.chunk, self.verify = jobs, chunk, verify
        self.checksum, self.new_hash = checksum, CHECKSUMS[checksum]
        self.progress = progress or (lambda n: None)
        self.manifest = manifest
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def run(self, plan: Plan) -> Summary:
        summary = Summary(
            plan.source, plan.dest, len(plan.steps), verify=self.verify, checksum=self.checksum
        )
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
        src, final = step.file, self.dest / step.file.path
        if step.action is Action.CHECK and self._matches(src, final):
            self.progress(src.size)
            with self._lock:
                summary.checked += 1
                summary.skipped += 1
                summary.bytes_skipped += src.size
            return
        resumed = self._copy(src, final)
        with self._lock:
            summary.copied += 1
            summary.resumed += resumed
            summary.bytes_copied += src.size
            summary.copied_files.append(src.path)

    def _matches(self, src: SourceFile, final: Path) -> bool:
        """Whether an untrusted file under its final name holds the source's bytes: hashed
        again against the manifest's digest (same source, same algorithm), else compared with
        the source."""
        record = self.manifest.get(src.path)
        with open(final, "rb") as f:
            if record and record.same_source(src) and record.algorithm == self.checksum:
                digest = record.digest
                fd = f.fileno()
                same = hash_file(fd, src.size, self.checksum, self.chunk, self.verify) == digest
            else:
                with self.source.open(src.path) as reader:
                    hasher, matched, _ = self._compare(reader, f.fileno(), src.size, count=False)
                same, digest = matched == src.size, hasher.hexdigest()
            st = os.fstat(f.fileno())
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

    def _copy(self, src: SourceFile, final: Path) -> int:
        """Copy one file through its partial, verified, renamed into place and recorded;
        1 if it resumed a partial, else 0."""
        partial = partial_path(final)
        try:
            partial.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _write_error(exc, partial) from None
        try:
            digest, resumed = self._fill(src, fd)
            os.fsync(fd)
            st = os.fstat(fd)
            if st.st_size != src.size:  # never: _fill wrote exactly the source's size
                raise ChecksumMismatch(
                    f"{src.path}: wrote {st.st_size} bytes, the source has {src.size}",
                    where=str(partial),
                )
            if self.verify and hash_file(fd, src.size, self.checksum, self.chunk, True) != digest:
                raise ChecksumMismatch(
                    f"{src.path}: the written file does not hash as the bytes read from the "
                    f"source ({self.checksum} differs); the partial was removed",
                    where=str(self.dest),
                    hint="the fast store returned other bytes than were written, or something "
                    "else wrote to the file: check the device (dmesg), then run again",
                )
            os.rename(partial, final)
            _fsync_dir(final.parent)
        except _Stopped:  # kept for a resume, unless there is nothing in it
            if not os.fstat(fd).st_size:
                partial.unlink()
            os.close(fd)
            raise
        except BaseException as exc:
            os.close(fd)
            with suppress(FileNotFoundError):
                partial.unlink()
            if isinstance(exc, OSError):
                raise _write_error(exc, partial) from None
            raise
        os.close(fd)
        self.manifest.put(src.path, self._record(st, digest, src))
        return resumed

    def _record(self, st: os.stat_result, digest: str, src: SourceFile) -> Record:
        return Record(st.st_size, st.st_mtime_ns, digest, self.checksum, src.size, src.mtime_ns)

    def _fill(self, src: SourceFile, fd: int) -> tuple[str, int]:
        """Write the source's bytes into the partial ``fd``, going on after the part of it that
        matches the source: its digest, and 1 if some of a partial was kept."""
        have = os.fstat(fd).st_size
        where = f"{self.source.where}/{src.path}"
        with self.source.open(src.path) as reader:
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
            buffer = _buffer(self.chunk)
            while True:
                if self.stop.is_set():
                    raise _Stopped
                # Whole chunks (O_DIRECT's grid); the last read comes back short, at the end.
                n = _read_full(reader, buffer, where)
                if not n or offset + n > src.size:
                    break
                hasher.update(buffer[:n])
                _pwrite_all(fd, buffer[:n], offset)
                offset += n
                self.progress(n)
        if offset != src.size or n or self.source.stat(src.path) != src:
            raise StageError(
                f"{src.path} changed while it was copied; the partial was removed",
                where=self.source.where,
                hint="stage a model that is no longer being written, then run again",
            )
        return hasher.hexdigest(), int(kept > 0)


def _write_error(exc: OSError, path: Path) -> StageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DestinationFull(
            f"the destination filled up while copying {path.name}; the partial was removed",
            where=str(path.parent),
            hint="free space on the fast store (or stage to another folder), then run again",
        )
    return StageError(f"cannot write {path}: {exc.strerror or exc}", where=str(path.parent))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare(
    source: Source, dest: str | Path, verify: bool = False, checksum: str = CHECKSUM
) -> tuple[Plan, Manifest]:
    """Plan the run (reads only), then make the destination folder and check it has the space
    (nothing else is written)."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise StageError("the destination is not a directory", where=str(dest))
    manifest = Manifest(dest)
    plan = make_plan(source, dest, manifest, verify, checksum)
    check_destination(dest)
    check_space(plan, dest)
    return plan, manifest


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
    """Stage ``source`` into ``dest`` (see the module's docstring); ``progress`` is told of
    every byte copied or checked."""
    plan, manifest = prepare(source, dest, verify, checksum)
    stager = Stager(
        source, Path(dest), manifest, jobs=jobs, chunk=chunk, verify=verify,
        checksum=checksum, progress=progress,
    )  # fmt: skip
    return stager.run(plan)
