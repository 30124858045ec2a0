"""The local connection: commands run through ``sh -c`` on this machine, files are read directly.

Privileged steps (``become``) run through sudo unless fxkit already runs as root, the same way
as over SSH (:mod:`fxkit.connection.become`): the password goes to sudo's stdin only when sudo
asks for it, never into argv, logs or the command's own input.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import time
from pathlib import Path

from fxkit.connection.base import Connection, RunResult
from fxkit.connection.become import Sudo
from fxkit.errors import ConnectionFailed, FxkitError

#: Exit status reported for a command that ran past its timeout (as coreutils' ``timeout``).
TIMEOUT_RC = 124


class LocalConnection(Connection):
    """Run commands on the machine fxkit runs on."""

    def __init__(self, name: str, *, become_password: str | None = None):
        self.name = name
        self._become_password = become_password

    def open(self) -> None:
        """Nothing to open: the local machine is always reachable."""

    def close(self) -> None:
        """Nothing to close."""

    def _sudo(self, become: bool) -> Sudo | None:
        return Sudo("root", self._become_password) if become and os.geteuid() != 0 else None

    def run(
        self,
        command: str,
        *,
        become: bool = False,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> RunResult:
        sudo = self._sudo(become)
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
            raise ConnectionFailed(f"cannot run sh: {exc}", where=f"host {self.name}") from exc
        deadline = None if timeout is None else time.monotonic() + timeout
        with proc, _Process(proc, deadline) as stream:
            try:
                rc = sudo.start(stream) if sudo else None
                if rc is None:
                    stream.collect(*proc.communicate(stdin, timeout=stream.time_left()))
                    rc = proc.returncode
                else:
                    _kill(proc)  # sudo refused the password and may wait for another
            except (subprocess.TimeoutExpired, _Timeout):
                _kill(proc)
                stream.collect(*proc.communicate())
                stream.err += f"\nfxkit: timed out after {timeout:g}s".encode()
                rc = TIMEOUT_RC
        return RunResult(command, rc, _text(stream.out), _text(stream.err))

    def get(self, path: str, *, become: bool = False) -> bytes | None:
        if become and os.geteuid() != 0:
            q = shlex.quote(path)
            result = self.run(f"test -e {q} || exit 3; cat -- {q}", become=True)
            if result.rc == 3:
                return None
            self._check(result, f"cannot read {path}")
            return result.stdout.encode("utf-8", "surrogateescape")
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FxkitError(
                f"cannot read {path}: {exc.strerror}", where=f"host {self.name}"
            ) from None

    def put(self, path: str, data: bytes, *, become: bool = False) -> None:
        if become and os.geteuid() != 0:
            self._check(
                self.run(f"cat > {shlex.quote(path)}", become=True, stdin=data),
                f"cannot write {path}",
            )
            return
        Path(path).write_bytes(data)

    def _check(self, result: RunResult, what: str) -> None:
        if not result.ok:
            raise ConnectionFailed(f"{what}: {result.stderr.strip()}", where=f"host {self.name}")


class _Timeout(Exception):
    """The command ran past its timeout."""


class _Process:
    """A local process's output read as it comes (for sudo's prompt), and its stdin."""

    def __init__(self, proc: subprocess.Popen, deadline: float | None):
        self.proc, self.deadline = proc, deadline
        self.out, self.err = bytearray(), bytearray()
        self._selector = selectors.DefaultSelector()
        self._selector.register(proc.stdout, selectors.EVENT_READ, self.out)
        self._selector.register(proc.stderr, selectors.EVENT_READ, self.err)

    def __enter__(self) -> _Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self._selector.close()

    def collect(self, out: bytes, err: bytes) -> None:
        self.out += out
        self.err += err

    def time_left(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        return left

    def pump(self) -> bool:
        while self._selector.get_map():
            ready = self._selector.select(self.time_left())
            if not ready:
                raise _Timeout
            for key, _ in ready:
                data = os.read(key.fd, 65536)
                if data:
                    key.data.extend(data)
                    return True
                self._selector.unregister(key.fileobj)
        return False

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def exit_status(self) -> int:
        return self.proc.wait(self.time_left())


def _kill(proc: subprocess.Popen) -> None:
    """Kill the command's whole process group (it runs in a session of its own), children that
    outlived the shell included."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _text(data: bytes) -> str:
    # surrogateescape keeps undecodable bytes recoverable (get() of binary files through sudo).
    return data.decode("utf-8", "surrogateescape")
