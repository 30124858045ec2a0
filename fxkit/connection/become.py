"""``become`` through sudo, shared by the SSH and the local connection.

The command runs as ``sudo -S -p PROMPT -H -u USER -- sh -c 'echo MARKER; COMMAND'``. The password
goes to sudo's stdin only when sudo prints the (unique, quoted) prompt; the marker tells when the
command itself starts, so its own stdin is sent only then and never mixed with the password.
Without a password sudo runs with ``-n`` and fails at once where it would need one.
"""

from __future__ import annotations

import secrets
import shlex
from typing import Protocol


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


class Sudo:
    """One ``become`` of one command: the command line, then the prompt answered on a stream."""

    def __init__(self, user: str, password: str | None):
        token = secrets.token_hex(8)
        self.user, self.password = user, password
        self._marker = f"fxkit-become-{token}"
        self._prompt = f"[fxkit-sudo-{token}]"

    def command(self, command: str) -> str:
        """The shell command line that runs ``command`` as the user through sudo."""
        script = shlex.quote(f"echo {self._marker}\n{command}")
        user = shlex.quote(self.user)
        if self.password is None:
            return f"sudo -n -H -u {user} -- sh -c {script}"
        return f"sudo -S -p {shlex.quote(self._prompt)} -H -u {user} -- sh -c {script}"

    def start(self, stream: Stream) -> int | None:
        """Answer sudo's prompt until the command starts (its marker is removed from the output).

        Returns None once the command runs (the caller sends its stdin next), or an exit status
        when sudo failed before it started."""
        started, asked = f"{self._marker}\n".encode(), self._prompt.encode()
        answered = False
        while started not in stream.out:
            if not stream.pump():
                return stream.exit_status()
            if self.password is not None and stream.err.endswith(asked):
                del stream.err[-len(asked) :]
                if answered:  # asked again: the password was wrong
                    stream.err += b"sudo: the become password was refused\n"
                    return 1
                stream.send(self.password.encode() + b"\n")
                answered = True
        del stream.out[: stream.out.index(started) + len(started)]
        return None
