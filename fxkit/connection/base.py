"""The interface every connection (SSH, local) provides to operations and facts.

A connection runs shell commands and moves file contents; it knows nothing about operations.
Commands are strings for a POSIX shell: callers quote every value with :func:`shlex.quote`.
Both connections report the same outcome the same way: the exit statuses below, a
:class:`fxkit.errors.ConnectionFailed` (the host is unreachable) only when the host cannot be
reached or the link breaks, and an :class:`fxkit.errors.FxkitError` (the step failed) for a file
that cannot be read or written.
"""

from __future__ import annotations

import shlex
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from fxkit.connection.atomic import content_stream, replace_command
from fxkit.errors import ConnectionFailed, FxkitError
from fxkit.redaction import redact

#: Exit status of a command that ran past its timeout and was killed (as coreutils' ``timeout``).
TIMEOUT_RC = 124
#: Exit status of the command that reads a file through sudo when the file does not exist.
MISSING_RC = 107

#: What a command reads on its stdin: one buffer (bytes, a mapped file), or buffers made while
#: they are sent (an upload's content and then its sha256, :mod:`fxkit.connection.atomic`).
Stdin = bytes | Iterator[bytes | memoryview] | None


@dataclass(frozen=True)
class PathStat:
    """A path's ``st_mode``, owner, size and mtime, as a connection learns them without a
    command."""

    st_mode: int
    uid: int
    gid: int
    size: int
    mtime: float


@dataclass(frozen=True)
class PathState:
    """What :meth:`Connection.inspect` learns of a path in one step."""

    stat: PathStat
    #: The names of its owner and group as the host's ``stat`` shows them ("" when none).
    owner: str
    group: str
    #: The sha256 of a regular file's content, in hex; "" for anything else; None for a file
    #: larger than asked.
    sha256: str | None


@dataclass(frozen=True)
class RunResult:
    """The outcome of one remote command."""

    command: str
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def buffers(stdin: Stdin) -> Iterable[memoryview]:
    """``stdin`` as the buffers to send, one after the other."""
    if stdin is None:
        return ()
    if isinstance(stdin, Iterator):
        return map(memoryview, stdin)
    return (memoryview(stdin),)


def timed_out(timeout: float, killed: bool) -> bytes:
    """The line added to stderr of a command that ran past its timeout."""
    fate = "it was killed" if killed else "it may still run on the host"
    return f"\nfxkit: timed out after {timeout:g} s; {fate}".encode()


class Held(Protocol):
    """A command that runs on the host while the caller holds it (:meth:`Connection.hold`)."""

    def readline(self) -> str | None:
        """Its next line of output (secrets masked); None once its output has ended."""

    def stderr(self) -> str:
        """What it wrote on stderr so far (secrets masked)."""

    def ended(self) -> bool:
        """Whether it ended (a reboot, the connection closed)."""

    def release(self) -> None:
        """End its stdin, let it end (a few seconds at most) and close it."""


T = TypeVar("T")


class Running(Generic[T]):
    """The commands a connection is running, each as ``kill`` takes it, for
    :meth:`Connection.cancel`: once cancelled, no command starts, and one that was starting is
    killed as soon as it is recorded."""

    def __init__(self, kill: Callable[[T], object]) -> None:
        self._kill = kill
        self._lock = threading.Lock()
        self._commands: list[T] = []
        self.cancelled = False

    def refuse(self, where: str) -> None:
        """Raise :class:`ConnectionFailed` once cancelled: nothing more runs."""
        if self.cancelled:
            raise ConnectionFailed("the run was interrupted: no more commands", where=where)

    @contextmanager
    def recorded(self, command: T) -> Iterator[None]:
        """``command`` recorded while the block runs (killed now if cancelled meanwhile)."""
        with self._lock:
            self._commands.append(command)
            cancelled = self.cancelled
        if cancelled:
            self._kill(command)
        try:
            yield
        finally:
            with self._lock:
                self._commands.remove(command)

    def cancel(self) -> None:
        """Kill every recorded command; none starts from now on."""
        with self._lock:
            self.cancelled = True
            commands = list(self._commands)
        for command in commands:
            self._kill(command)


class Connection(ABC):
    """One host's connection, opened once and reused for every operation of a run."""

    #: The inventory name of the host (not necessarily its address).
    name: str
    #: The user commands run as, and the one ``become`` runs them as (through sudo).
    user: str
    become_user: str = "root"
    #: The host's Python (the inventory's ``ansible_python_interpreter``), where fxkit runs any.
    python: str = "python3"
    #: Values masked in every result and error (passwords), longest first.
    secrets: Sequence[str] = ()
    #: Whether a run takes the host's run lock (:mod:`fxkit.engine.runlock`) over this connection.
    run_lock: bool = False

    @abstractmethod
    def open(self) -> None:
        """Connect (idempotent). Raises :class:`fxkit.errors.ConnectionFailed` when unreachable."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection (idempotent)."""

    def cancel(self) -> None:
        """A run was interrupted: kill the commands running on the host, each with its process
        group (all it started), and close the connection for good (safe from any thread)."""
        self.close()

    def execute(
        self, command: str, *, become: bool, timeout: float | None, stdin: Stdin
    ) -> tuple[int, bytes, bytes]:
        """Run ``command`` with ``sh -c`` (via sudo when ``become`` needs it): rc, out, err.

        A command that runs past ``timeout`` is killed, with all it started, and reports
        :data:`TIMEOUT_RC`. Raises :class:`fxkit.errors.ConnectionFailed` when the link is lost.
        Every real connection implements it; a test double may override :meth:`run` instead.
        """
        raise NotImplementedError

    def hold(self, command: str, *, become: bool) -> Held:
        """Start ``command`` (as :meth:`execute` would) and return at once: it runs until it ends
        or is released, its stdin open (it reads EOF when the caller or the connection goes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot hold a command")

    def run(
        self,
        command: str,
        *,
        become: bool = False,
        timeout: float | None = None,
        stdin: Stdin = None,
    ) -> RunResult:
        """Run ``command`` (see :meth:`execute`); never raises on rc != 0; secrets masked."""
        rc, out, err = self.execute(command, become=become, timeout=timeout, stdin=stdin)
        return RunResult(
            self.redact(command),
            rc,
            self.redact(out.decode(errors="replace")),
            self.redact(err.decode(errors="replace")),
        )

    @abstractmethod
    def get(self, path: str, *, become: bool = False) -> bytes | None:
        """Return the contents of the file ``path``, or None when it does not exist."""

    def stat(self, path: str, *, become: bool = False, follow: bool = False) -> PathStat | None:
        """``path``'s :class:`PathStat` read without starting a process on the host (the
        host-side helper, SFTP, ``os.stat``); None when it does not exist; ``follow`` follows a
        symbolic link.

        Raises :class:`NotImplementedError` where the connection cannot (``become`` through sudo
        without a helper): callers then use a command. Other errors as :meth:`get`."""
        raise NotImplementedError(f"{type(self).__name__} has no stat without a command")

    def inspect(self, path: str, *, become: bool = False, hash_limit: int) -> PathState | None:
        """``path``'s :class:`PathState` (not following a symbolic link) in one step, without
        a process on the host, its content hashed when it is a regular file of up to
        ``hash_limit`` bytes; None when it does not exist.

        Raises :class:`NotImplementedError` where the connection cannot: callers then compose
        :meth:`stat` and :meth:`get`, or run a command. Other errors as :meth:`get`."""
        raise NotImplementedError(f"{type(self).__name__} has no inspect")

    def put(self, path: str, data: bytes, *, become: bool = False) -> None:
        """Replace ``path`` with ``data`` atomically: the old file or the new one, whole, even
        when the transfer breaks off (see :mod:`fxkit.connection.atomic`)."""
        command = replace_command(path, len(data), python=self.python)
        rc, _, err = self.execute(command, become=become, timeout=None, stdin=content_stream(data))
        if rc != 0:
            raise self.file_error("write", path, err)

    def needs_sudo(self, become: bool) -> bool:
        return become and self.user != self.become_user

    def read_as_root(self, path: str) -> bytes | None:
        """``get`` through sudo: ``cat`` as the become user."""
        quoted = shlex.quote(path)
        rc, out, err = self.execute(
            f"[ -e {quoted} ] || exit {MISSING_RC}; exec cat -- {quoted}",
            become=True,
            timeout=None,
            stdin=None,
        )
        if rc == MISSING_RC:
            return None
        if rc != 0:
            raise self.file_error("read", path, err)
        return out

    def file_error(self, verb: str, path: str, reason: bytes | str) -> FxkitError:
        """A file that cannot be read or written: the step fails, the host stays reachable."""
        text = reason.decode(errors="replace") if isinstance(reason, bytes) else reason
        return FxkitError(
            f"cannot {verb} {path}: {self.redact(text.strip()) or 'failed'}",
            where=f"host {self.name}",
        )

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)

    def __enter__(self) -> Connection:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
