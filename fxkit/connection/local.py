"""The local connection: commands run through ``sh -c`` on this machine, files are read directly.

Privileged steps (``become``) run through ``sudo -S`` unless fxkit already runs as root; the
password goes to sudo's stdin, never into argv or logs.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

from fxkit.connection.base import Connection, RunResult
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

    def _argv(self, command: str, become: bool) -> list[str]:
        if not become or os.geteuid() == 0:
            return ["sh", "-c", command]
        if self._become_password is None:
            return ["sudo", "-n", "--", "sh", "-c", command]
        return ["sudo", "-S", "-p", "", "--", "sh", "-c", command]

    def run(
        self,
        command: str,
        *,
        become: bool = False,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> RunResult:
        argv = self._argv(command, become)
        if argv[1] == "-S":
            stdin = (self._become_password or "").encode() + b"\n" + (stdin or b"")
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConnectionFailed(
                f"cannot run {argv[0]}: {exc}", where=f"host {self.name}"
            ) from exc
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\nfxkit: timed out after {timeout:g}s".encode()
            return RunResult(command, TIMEOUT_RC, _text(out), _text(err))
        return RunResult(command, proc.returncode, _text(out), _text(err))

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


def _text(data: bytes) -> str:
    # surrogateescape keeps undecodable bytes recoverable (get() of binary files through sudo).
    return data.decode("utf-8", "surrogateescape")
