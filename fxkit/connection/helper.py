"""The controller's side of the host-side helper (:mod:`fxkit.connection.helper_host`).

An SSH connection starts a helper on its first command, and one through sudo on its first
command as the become user, and sends the commands through them: one request on a session that
stays open, where a command of its own costs a new SSH session, the login shell, ``sh`` (and
sudo). A host without the interpreter (``python3``, or the inventory's
``ansible_python_interpreter``) keeps the plain commands, as does a host whose
``fxkit_host_helper`` is false, and so does a command that arrives while the helper is busy
with another thread's, or one given :data:`BULK` stdin.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from fxkit.connection import helper_host
from fxkit.connection.base import Stdin, buffers

#: The helper's program, sent as its command line.
SOURCE = Path(helper_host.__file__).read_text(encoding="utf-8")
#: Largest piece of a command's stdin in one frame.
PIECE = 1 << 20
#: Stdin from which a command runs in a session of its own (an upload): sshd hands it to the
#: command directly, where the helper would copy every byte once more on the host.
BULK = 1 << 20
#: Interpreters of ``ansible_python_interpreter`` that mean "find it" (Ansible's discovery).
DISCOVER = frozenset({"auto", "auto_silent", "auto_legacy", "auto_legacy_silent"})


class HelperEnded(Exception):
    """The helper's session ended (the helper exited, was killed, or never started)."""


class Channel(Protocol):
    """The helper's session as the SSH connection reads and writes it."""

    out: bytearray
    err: bytearray

    def write(self, data: memoryview) -> bool:
        """Send ``data``; False when the helper ended before reading it."""

    def pump(self) -> bool:
        """Wait for output and collect it; False when the output has ended."""


def bulk(stdin: Stdin) -> tuple[Stdin, bool]:
    """``stdin`` (the same bytes, whole) and whether it is :data:`BULK`: a buffer by its length,
    an iterator (:func:`fxkit.connection.atomic.content_stream`) by its first chunk."""
    if stdin is None:
        return None, False
    if not isinstance(stdin, Iterator):
        return stdin, len(stdin) >= BULK
    first = next(stdin, None)
    if first is None:
        return iter(()), False
    return itertools.chain((first,), stdin), len(first) >= BULK


def interpreter(value: object) -> str:
    """The helper's interpreter for a host's ``ansible_python_interpreter`` (python3 unless
    it names one)."""
    text = str(value or "").strip()
    return "python3" if not text or text in DISCOVER else text


def start_command(python: str) -> str:
    """The shell command that replaces itself with the helper (exit 127 without ``python``)."""
    return f"exec {shlex.quote(python)} -I -S -c {shlex.quote(SOURCE)}"


class HelperClient:
    """One helper, one command at a time (the connection holds its lock from :meth:`send` to
    :meth:`answer`)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        kind, payload = self._frame() or (b"", b"")
        if kind != b"h":
            raise HelperEnded(f"it answered {kind!r} before its hello")
        self.pid = int(payload)
        #: The PID of the running command's shell, once the helper has said it.
        self.child: int | None = None
        #: Whether the last command and all its stdin went out (else the frames are cut).
        self.sent = True

    def send(self, command: str, stdin: Stdin) -> None:
        """Start ``command`` on the host and send its stdin."""
        self.child, self.sent = None, False
        request = (b"0" if stdin is None else b"1") + command.encode()
        self._send(b"x", memoryview(request))
        if stdin is not None:
            for view in buffers(stdin):
                for start in range(0, len(view), PIECE):
                    self._send(b"i", view[start : start + PIECE])
            self._send(b"e", memoryview(b""))
        self.sent = True

    def answer(self, wait: bool = True) -> tuple[int, bytes, bytes] | None:
        """The command's exit status, stdout and stderr (None when it has not ended and not
        ``wait``). Raises :class:`HelperEnded` when the helper ends first."""
        while (frame := self._frame(wait)) is not None:
            kind, payload = frame
            if kind == b"p":
                self.child = int(payload)
            elif kind == b"r":
                rc, size = helper_host.ANSWER.unpack_from(payload)
                body = payload[helper_host.ANSWER.size :]
                return rc, body[:size], body[size:]
            else:
                raise HelperEnded(f"it answered {kind!r} to a command")
        return None

    def _send(self, kind: bytes, payload: memoryview) -> None:
        head = memoryview(helper_host.FRAME.pack(kind, len(payload)))
        if not (self.channel.write(head) and (not payload or self.channel.write(payload))):
            raise HelperEnded("it stopped reading")

    def _frame(self, wait: bool = True) -> tuple[bytes, bytes] | None:
        """The next frame from the helper, its kind and payload (None when it has not all
        arrived and not ``wait``)."""
        out, size = self.channel.out, helper_host.FRAME.size
        while len(out) < size or len(out) < size + helper_host.FRAME.unpack_from(out)[1]:
            if not wait:
                return None
            if not self.channel.pump():
                raise HelperEnded(self.channel.err.decode(errors="replace").strip())
        kind, length = helper_host.FRAME.unpack_from(out)
        payload = bytes(out[size : size + length])
        del out[: size + length]
        return kind, payload
