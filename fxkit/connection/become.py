"""How a command starts on a host, and ``become`` through sudo, shared by both connections.

Commands that may need killing (a timeout) start as ``sh -c 'echo MARKER $$; COMMAND'``: the
marker tells when the command itself runs and the PID names its process group. ``become`` runs
``sudo -S -p PROMPT -H -u USER -- sh -c 'echo MARKER $$; COMMAND'``. The password goes to sudo's
stdin only when sudo prints the (unique, quoted) prompt; the command's own stdin is sent only
once the marker arrives, so it never mixes with the password. Without a password sudo runs
with ``-n`` and fails at once where it would need one.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping
from typing import Any, Protocol

from fxkit.errors import ConnectionFailed


class Stream(Protocol):
    """A started command's output as it comes in, and its stdin."""

    out: bytearray
    err: bytearray

    def pump(self) -> bool:
        """Wait for more output and collect it; False once the output has ended."""

    def send(self, data: bytes) -> None:
        """Write to the command's stdin (without closing it)."""

    def exit_status(self) -> int:
        """Wait for the command to end; its exit status."""


def reveal(value: Any) -> str | None:
    """A secret's text, whether it is a plain string or wrapped (pydantic SecretStr and kin)."""
    if value is None or value == "":
        return None
    get = getattr(value, "get_secret_value", None)
    return str(get() if get else value)


def become_settings(
    name: str, hostvars: Mapping[str, Any], password: str | None
) -> tuple[str, str | None]:
    """The user ``become`` runs as and sudo's password (host variables win over ``password``,
    the run's); a become method other than sudo is refused."""
    method = hostvars.get("ansible_become_method") or "sudo"
    if method != "sudo":
        raise ConnectionFailed(
            f"become method {method!r} is not supported",
            where=f"host {name}, variable ansible_become_method",
            hint="fxkit becomes root with sudo: remove the variable or set it to sudo",
        )
    chosen = reveal(
        hostvars.get("ansible_become_password") or hostvars.get("ansible_become_pass") or password
    )
    return str(hostvars.get("ansible_become_user") or "root"), chosen


class Started:
    """A command whose shell first prints a unique marker and its PID (then :attr:`pid`).

    The command's last line is followed by ``exit $?``: the shell waits for it instead of
    replacing itself, so a command killed by signal N reports 128 + N (SSH would say -1)."""

    def __init__(self) -> None:
        self.marker = f"fxkit-start-{secrets.token_hex(8)}"
        self.pid: int | None = None

    def script(self, command: str) -> str:
        return f"echo {self.marker} $$\n{command}\nexit $?"

    def command(self, command: str) -> str:
        """The shell command line that runs ``command``."""
        return f"sh -c {shlex.quote(self.script(command))}"

    def start(self, stream: Stream) -> int | None:
        """Wait until the command runs (the marker is removed from the output).

        Returns None once it runs (the caller sends its stdin next), or an exit status when it
        ended before it started."""
        while not self._started(stream.out):
            if not stream.pump():
                return stream.exit_status()
            failed = self._answer(stream)
            if failed is not None:
                return failed
        return None

    def _started(self, out: bytearray) -> bool:
        at = out.find(self.marker.encode())
        end = out.find(b"\n", at)
        if at < 0 or end < 0:
            return False
        self.pid = int(out[at + len(self.marker) : end])
        del out[: end + 1]
        return True

    def _answer(self, stream: Stream) -> int | None:
        """Answer what the command line asks before the command runs; an exit status to stop."""
        return None


class Sudo(Started):
    """One ``become`` of one command: the command line, then the prompt answered on a stream."""

    def __init__(self, user: str, password: str | None):
        super().__init__()
        self.user, self.password = user, password
        self._prompt = f"[fxkit-sudo-{secrets.token_hex(8)}]"
        self._answered = False

    def command(self, command: str) -> str:
        """The shell command line that runs ``command`` as the user through sudo."""
        script = shlex.quote(self.script(command))
        user = shlex.quote(self.user)
        if self.password is None:
            return f"sudo -n -H -u {user} -- sh -c {script}"
        return f"sudo -S -p {shlex.quote(self._prompt)} -H -u {user} -- sh -c {script}"

    def _answer(self, stream: Stream) -> int | None:
        asked = self._prompt.encode()
        if self.password is None or not stream.err.endswith(asked):
            return None
        del stream.err[-len(asked) :]
        if self._answered:  # asked again: the password was wrong
            stream.err += b"sudo: the become password was refused\n"
            return 1
        stream.send(self.password.encode() + b"\n")
        self._answered = True
        return None
