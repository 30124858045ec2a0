"""The local connection: commands run through ``sh -c`` on this machine, files are read directly.

Privileged steps (``become``) run through sudo unless fxkit already runs as the become user, the
same way as over SSH (:mod:`fxkit.connection.become`): the password goes to sudo's stdin only
when sudo asks for it, never into argv, logs or the command's own input. Every command runs in
a session of its own (a Ctrl-C at the terminal does not reach it): a timeout, or
:meth:`LocalConnection.cancel`, kills it with everything it started.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from fxkit.connection.base import (
    TIMEOUT_RC,
    Connection,
    PathStat,
    PathState,
    Running,
    Stdin,
    buffers,
    timed_out,
)
from fxkit.connection.become import Sudo
from fxkit.connection.helper import MISSING, path_state
from fxkit.connection.helper_host import look
from fxkit.errors import ConnectionFailed
from fxkit.redaction import maskable


class LocalConnection(Connection):
    """Run commands on the machine fxkit runs on."""

    def __init__(self, name: str, *, become_user: str = "root", become_password: str | None = None):
        self.name = name
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.become_user = become_user
        self._become_password = become_password
        self.secrets = maskable([become_password] if become_password else [])
        self._running: Running[subprocess.Popen] = Running(_kill)

    def open(self) -> None:
        """Nothing to open: the local machine is always reachable."""

    def close(self) -> None:
        """Nothing to close."""

    def cancel(self) -> None:
        self._running.cancel()

    def execute(
        self, command: str, *, become: bool, timeout: float | None, stdin: Stdin
    ) -> tuple[int, bytes, bytes]:
        self._running.refuse(f"host {self.name}")
        sudo = Sudo(self.become_user, self._become_password) if self.needs_sudo(become) else None
        line = sudo.command(command) if sudo else command
        try:
            proc = subprocess.Popen(
                ["sh", "-c", line],
                stdin=subprocess.PIPE if stdin is not None or sudo else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConnectionFailed(
                f"cannot run sh: {exc.strerror}", where=f"host {self.name}"
            ) from None
        deadline = None if timeout is None else time.monotonic() + timeout
        with proc, _Process(proc, deadline) as stream, self._running.recorded(proc):
            try:
                rc = sudo.start(stream) if sudo else None
                if rc is None:
                    stream.feed(stdin)
                    stream.drain()
                    rc = _status(stream.exit_status())
                else:
                    _kill(proc)  # sudo refused the password and may wait for another
            except (subprocess.TimeoutExpired, _Timeout):
                _kill(proc)
                stream.deadline = None
                stream.drain()  # the output it wrote before it was killed
                stream.err += timed_out(timeout or 0, killed=True)
                rc = TIMEOUT_RC
        return rc, bytes(stream.out), bytes(stream.err)

    def get(self, path: str, *, become: bool = False) -> bytes | None:
        if self.needs_sudo(become):
            return self.read_as_root(path)
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.file_error("read", path, exc.strerror or str(exc)) from None

    def stat(self, path: str, *, become: bool = False, follow: bool = False) -> PathStat | None:
        if self.needs_sudo(become):
            raise NotImplementedError("os.stat runs as fxkit's user, not the become user")
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.file_error("stat", path, exc.strerror or str(exc)) from None
        return PathStat(st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime)

    def inspect(self, path: str, *, become: bool = False, hash_limit: int) -> PathState | None:
        """What the host-side helper does, here in fxkit's process."""
        if self.needs_sudo(become):
            raise NotImplementedError("os.lstat runs as fxkit's user, not the become user")
        try:
            st, owner, group, digest = look(os.fsencode(path), False, True, hash_limit)
        except OSError as exc:
            if exc.errno in MISSING:
                return None
            raise self.file_error("stat", path, exc.strerror or str(exc)) from None
        except ValueError as exc:  # a NUL byte in the path
            raise self.file_error("stat", path, str(exc)) from None
        fields = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime)
        return path_state(fields, owner, group, digest)


class _Timeout(Exception):
    """The command ran past its timeout."""


class _Process:
    """A local process's output read as it comes (sudo's prompt, then all of it), and its stdin
    (written by a thread of its own meanwhile, so that neither side waits on a full pipe)."""

    def __init__(self, proc: subprocess.Popen, deadline: float | None):
        self.proc, self.deadline = proc, deadline
        self.out, self.err = bytearray(), bytearray()
        assert proc.stdout is not None and proc.stderr is not None
        self._selector = selectors.DefaultSelector()
        self._selector.register(proc.stdout, selectors.EVENT_READ, self.out)
        self._selector.register(proc.stderr, selectors.EVENT_READ, self.err)
        self._feeder: threading.Thread | None = None

    def __enter__(self) -> _Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self._selector.close()
        if self._feeder is not None:
            self._feeder.join()  # the process is gone: its last write failed or was read

    def feed(self, stdin: Stdin) -> None:
        """Start writing ``stdin`` to the process, then close its stdin."""
        if self.proc.stdin is not None:
            self._feeder = threading.Thread(target=_write, args=(self.proc.stdin, stdin))
            self._feeder.start()

    def drain(self) -> None:
        while self.pump():
            pass

    def time_left(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        return left

    def pump(self) -> bool:
        while self._selector.get_map():
            # Nothing ready: time_left() decides, at the top of the loop, whether time is up.
            for key, _ in self._selector.select(self.time_left()):
                data = os.read(key.fd, 65536)
                if data:
                    key.data.extend(data)
                    return True
                self._selector.unregister(key.fileobj)
        return False

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None  # sudo's commands always get a pipe
        with contextlib.suppress(BrokenPipeError):  # it ended: its exit status says why
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def exit_status(self) -> int:
        return self.proc.wait(self.time_left())


def _write(pipe: IO[bytes], stdin: Stdin) -> None:
    with contextlib.suppress(BrokenPipeError), pipe:  # it ended: its exit status says why
        for view in buffers(stdin):
            pipe.write(view)


def _kill(proc: subprocess.Popen) -> None:
    """Kill the command's whole process group (it runs in a session of its own), children that
    outlived the shell included."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or sudo's own
        os.killpg(proc.pid, signal.SIGKILL)


def _status(returncode: int) -> int:
    """A process killed by signal N reports 128 + N, as a shell (and the SSH connection) does."""
    return 128 - returncode if returncode < 0 else returncode
