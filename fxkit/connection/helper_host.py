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

Each command runs in a session of its own, so that fxkit can kill its process group (past its
timeout, on a Ctrl-C) over another SSH session, as it does any command's. When the helper's
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
import threading

FRAME = struct.Struct(">cI")
ANSWER = struct.Struct(">iI")


def read_exact(size: int) -> "bytes | None":
    data = bytearray()
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class Helper:
    def __init__(self) -> None:
        self.out_lock = threading.Lock()
        self.proc = None  # type: subprocess.Popen[bytes] | None

    def send(self, kind: bytes, payload: bytes) -> None:
        with self.out_lock:
            data = memoryview(FRAME.pack(kind, len(payload)) + payload)
            while data:
                data = data[os.write(1, data) :]

    def serve(self) -> None:
        self.send(b"h", str(os.getpid()).encode())
        while True:
            head = read_exact(FRAME.size)
            if head is None:
                break
            kind, size = FRAME.unpack(head)
            payload = read_exact(size)
            if payload is None:
                break
            if kind == b"x":
                self.start(json.loads(payload.decode()))
            elif kind == b"i":
                self.feed(payload)
            elif kind == b"e":
                self.end_stdin()
        self.hang_up()

    def start(self, request: dict) -> None:
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", request["command"]],
            stdin=subprocess.PIPE if request["stdin"] else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )
        self.send(b"p", str(self.proc.pid).encode())
        worker = threading.Thread(target=self.collect, args=(self.proc,))
        worker.daemon = True
        worker.start()

    def feed(self, data: bytes) -> None:
        stdin = self.proc.stdin if self.proc else None
        if stdin is None or stdin.closed:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[stdin.write(view) :]
        except OSError:  # it ended before reading it all: its exit status says why
            stdin.close()

    def end_stdin(self) -> None:
        stdin = self.proc.stdin if self.proc else None
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.close()

    def collect(self, proc: "subprocess.Popen[bytes]") -> None:
        pipes = (proc.stdout, proc.stderr)
        output = {pipe.fileno(): bytearray() for pipe in pipes if pipe is not None}
        out, err = output.values()
        selector = selectors.DefaultSelector()
        for fd in output:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                chunk = os.read(key.fd, 65536)
                if chunk:
                    output[key.fd] += chunk
                else:
                    selector.unregister(key.fd)
        rc = proc.wait()
        for pipe in pipes:
            if pipe is not None:
                pipe.close()
        rc = 128 - rc if rc < 0 else rc
        self.send(b"r", ANSWER.pack(rc, len(out)) + bytes(out) + bytes(err))

    def hang_up(self) -> None:
        """fxkit is gone: the running command's stdin ends and its process group gets SIGHUP,
        so that it ends as its traps say (a write removes its temp file)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self.end_stdin()
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGHUP)


if __name__ == "__main__":
    Helper().serve()
    os._exit(0)
