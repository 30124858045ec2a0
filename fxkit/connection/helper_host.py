"""fxkit's host-side helper: one python3 per host per run that runs the run's commands.

fxkit starts it over the connection's open SSH transport (``python3 -I -S -c SOURCE``, this
file's text) the first time a command runs; every command after that is a request on its one
session instead of a new SSH session, a login shell and ``sh``: the host forks ``/bin/sh -c`` and
nothing else. Only the standard library, Python 3.6 or later (what a host's python3 may be).

Frames both ways: a kind byte, the payload's length (4 bytes, big-endian), the payload.

- to the helper: ``x`` a command (JSON ``{"command", "stdin"}``), then ``i`` its stdin in
  pieces and ``e`` the end of its stdin (when ``stdin`` is true);
- from the helper: ``h`` its PID once started; per command ``p`` the PID of its shell, then
  ``r``: its exit status (signed 4 bytes, 128 + N when killed by signal N), the length of its
  stdout (4 bytes), its stdout, its stderr.

One thread: a loop over the helper's stdin and the command's pipes, so that the host starts
nothing but the command's ``sh`` (a thread would take a PID too). Each command runs in a
session of its own, so that fxkit can kill its process group (past its timeout, on a Ctrl-C)
over another SSH session, as it does any command's. When the helper's
stdin ends (fxkit closed the session, was killed, the link dropped), the running command's
stdin ends, its process group gets SIGHUP (a terminal's hangup), and the helper exits.
"""

import contextlib
import json
import os
import selectors
import signal
import struct
import subprocess

FRAME = struct.Struct(">cI")
ANSWER = struct.Struct(">iI")
#: Bytes of stdin held for a command that has not read them, before frames are left waiting.
HELD = 4 << 20


def send(kind: bytes, payload: bytes) -> None:
    data = memoryview(FRAME.pack(kind, len(payload)) + payload)
    while data:
        data = data[os.write(1, data) :]


class Command:
    """A running command: its shell, the stdin it has yet to read, its output so far."""

    def __init__(self, request: dict) -> None:
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", request["command"]],
            stdin=pipe if request["stdin"] else subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            bufsize=0,
            start_new_session=True,
        )
        self.pending = []  # type: list[memoryview]
        self.held = 0
        self.ending = False
        #: Its stdout and stderr: what each has written, and the pipes still open.
        pipes = (self.proc.stdout, self.proc.stderr)
        self.open = {pipe.fileno(): pipe for pipe in pipes if pipe is not None}
        self.output = {fd: bytearray() for fd in self.open}


class Helper:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.inbox = bytearray()
        self.command = None  # type: Command | None
        self.reading = True

    def serve(self) -> None:
        send(b"h", str(os.getpid()).encode())
        self.selector.register(0, selectors.EVENT_READ, self.read_frames)
        while True:
            for key, _ in self.selector.select():
                if key.data(key.fd) is False:
                    return

    # -- from fxkit

    def read_frames(self, fd: int) -> bool:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            self.hang_up()
            return False
        self.inbox += chunk
        while len(self.inbox) >= FRAME.size:
            kind, size = FRAME.unpack_from(self.inbox)
            if len(self.inbox) < FRAME.size + size:
                break
            payload = memoryview(bytes(self.inbox[FRAME.size : FRAME.size + size]))
            del self.inbox[: FRAME.size + size]
            self.handle(kind, payload)
        return True

    def handle(self, kind: bytes, payload: memoryview) -> None:
        command = self.command
        if kind == b"x":
            command = self.command = Command(json.loads(bytes(payload).decode()))
            send(b"p", str(command.proc.pid).encode())
            for pipe in command.open.values():
                self.selector.register(pipe, selectors.EVENT_READ, self.read_output)
        elif command is None or command.proc.stdin is None or command.proc.stdin.closed:
            return  # stdin of a command that ended or stopped reading it
        elif kind == b"i" and payload:
            if not command.pending:
                os.set_blocking(command.proc.stdin.fileno(), False)
                self.selector.register(command.proc.stdin, selectors.EVENT_WRITE, self.feed)
            command.pending.append(payload)
            command.held += len(payload)
            self.pause(command.held > HELD)
        elif kind == b"e":
            command.ending = True
            if not command.pending:
                command.proc.stdin.close()

    def pause(self, paused: bool) -> None:
        """Stop reading frames while a command has too much stdin unread (or go on again)."""
        if paused == self.reading:
            self.reading = not paused
            if paused:
                self.selector.unregister(0)
            else:
                self.selector.register(0, selectors.EVENT_READ, self.read_frames)

    # -- to and from the command

    def feed(self, fd: int) -> bool:
        command = self.command
        assert command is not None and command.proc.stdin is not None
        try:
            sent = os.write(fd, command.pending[0])
        except BlockingIOError:
            return True
        except OSError:  # it ended before reading it all: its exit status says why
            self.close_stdin(command)
            return True
        command.held -= sent
        command.pending[0] = command.pending[0][sent:]
        if not command.pending[0]:
            command.pending.pop(0)
        if not command.pending:
            self.selector.unregister(fd)
            if command.ending:
                command.proc.stdin.close()
        self.pause(command.held > HELD)
        return True

    def close_stdin(self, command: Command) -> None:
        stdin = command.proc.stdin
        if stdin is not None and not stdin.closed:
            if command.pending:
                self.selector.unregister(stdin)
            stdin.close()
        command.pending, command.held = [], 0
        self.pause(False)

    def read_output(self, fd: int) -> bool:
        command = self.command
        assert command is not None
        chunk = os.read(fd, 1 << 16)
        if chunk:
            command.output[fd] += chunk
            return True
        self.selector.unregister(fd)
        command.open.pop(fd).close()
        if not command.open:
            self.finish(command)
        return True

    def finish(self, command: Command) -> None:
        rc = command.proc.wait()
        self.close_stdin(command)
        self.command = None
        out, err = command.output.values()
        rc = 128 - rc if rc < 0 else rc
        send(b"r", ANSWER.pack(rc, len(out)) + bytes(out) + bytes(err))

    def hang_up(self) -> None:
        """fxkit is gone: the running command's stdin ends and its process group gets SIGHUP,
        so that it ends as its traps say (a write removes its temp file)."""
        command = self.command
        if command is not None and command.proc.poll() is None:
            self.close_stdin(command)
            with contextlib.suppress(OSError):
                os.killpg(command.proc.pid, signal.SIGHUP)


if __name__ == "__main__":
    Helper().serve()
