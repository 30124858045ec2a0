"""The controller's side of the host-side helper (:mod:`fxkit.connection.helper_host`).

An SSH connection starts a helper on its first command or read, and one through sudo on its
first as the become user, and sends the commands through them: one request on a session that
stays open, where a command of its own costs a new SSH session, the login shell, ``sh`` (and
sudo). Reads (a file's content, a path's state) are requests the helper answers itself,
without a process, where SFTP took several round trips each. A host without the interpreter
(``python3``, or the inventory's ``ansible_python_interpreter``) keeps the plain commands and
SFTP, as does a host whose ``fxkit_host_helper`` is false, and so does a request that arrives
while the helper is busy with another thread's, or a command given :data:`BULK` stdin.
"""

from __future__ import annotations

import errno
import itertools
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from fxkit.connection import helper_host
from fxkit.connection.base import PathStat, PathState, Stdin, buffers

#: The helper's program, sent as its command line.
SOURCE = Path(helper_host.__file__).read_text(encoding="utf-8")
#: Largest piece of a command's stdin in one frame.
PIECE = 1 << 20
#: Stdin from which a command runs in a session of its own (an upload): sshd hands it to the
#: command directly, where the helper would copy every byte once more on the host.
BULK = 1 << 20
#: Interpreters of ``ansible_python_interpreter`` that mean "find it" (Ansible's discovery).
DISCOVER = frozenset({"auto", "auto_silent", "auto_legacy", "auto_legacy_silent"})
#: The errors of a path that does not exist, as OpenSSH's sftp-server maps them to "no such
#: file" (sftp-server.c, ``errno_to_portable``): ENOENT, ENOTDIR, ELOOP.
MISSING = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def encoded(path: str) -> bytes:
    """A path as the host's system calls take it (SFTP's UTF-8; odd bytes kept)."""
    return path.encode("utf-8", "surrogateescape")


def look_request(path: str, follow: bool, hash_limit: int, names: bool = True) -> bytes:
    """The payload of an ``l`` request (:data:`helper_host.LOOK`)."""
    return helper_host.LOOK.pack(follow, names, hash_limit) + encoded(path)


def path_state(
    fields: tuple[int, int, int, int, float], owner: bytes, group: bytes, digest: bytes
) -> PathState:
    """A :class:`PathState` from :func:`helper_host.look`'s values (the stat's mode, ids, size
    and mtime)."""
    text = [n.decode("utf-8", "surrogateescape") for n in (owner, group)]
    sha256 = None if digest == b"-" else digest.decode()
    return PathState(PathStat(*fields), text[0], text[1], sha256)


def looked(payload: bytes) -> PathState:
    """The :class:`PathState` of an ``f`` answer."""
    fields = helper_host.STAT.unpack_from(payload)
    owner, group, digest = payload[helper_host.STAT.size :].split(b"\0", 2)
    return path_state(fields, owner, group, digest)


def failure(payload: bytes) -> tuple[int, str]:
    """The errno and reason of an ``o`` answer."""
    (number,) = helper_host.ERROR.unpack_from(payload)
    return number, payload[helper_host.ERROR.size :].decode(errors="replace")


def oversized(answer: tuple[bytes, bytes]) -> bool:
    """Whether a ``g`` answer says the file is larger than the helper reads for one answer."""
    kind, payload = answer
    return kind == b"o" and failure(payload)[0] == errno.EFBIG


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

    def ask(self, kind: bytes, payload: bytes) -> tuple[bytes, bytes]:
        """A request the helper answers itself (a path's state ``l``, a file's content ``g``):
        the kind of its answer and its payload. Raises :class:`HelperEnded` as :meth:`answer`."""
        self._send(kind, memoryview(payload))
        frame = self._frame()
        assert frame is not None
        if frame[0] not in (b"f", b"c", b"o"):
            raise HelperEnded(f"it answered {frame[0]!r} to a request of {kind!r}")
        return frame

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
