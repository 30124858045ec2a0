"""fxkit's host-side helper: one python3 per host per run that runs the run's commands.

fxkit starts it over the connection's open SSH transport (``python3 -I -S -c SOURCE``, this
file's text) the first time a command runs; every command after that is a request on its one
session instead of a new SSH session, a login shell and ``sh``: the host forks ``/bin/sh -c`` and
nothing else. Only the standard library, Python 3.6 or later (what a host's python3 may be).

Frames both ways: a kind byte, the payload's length (4 bytes, big-endian), the payload.

- to the helper: ``x`` a command (``1`` when its stdin follows, else ``0``, then the command),
  then ``i`` its stdin in pieces and ``e`` the end of its stdin;
- from the helper: ``h`` its PID once started; per command ``p`` the PID of its shell, then
  ``r``: its exit status (signed 4 bytes, 128 + N when killed by signal N), the length of its
  stdout (4 bytes), its stdout, its stderr.

A path's state and a file's content are read by the helper itself, no process started: ``l``
(:data:`LOOK`: whether to follow a last symbolic link, whether to look up the names of its
owner and group, the largest regular file to hash, then the path) answers ``f`` (:data:`STAT`,
the owner's and the group's names, each ended by a NUL byte, then the sha256 in hex: empty for
what is not a regular file, ``-`` for a file larger than asked); ``g`` (the path) answers
``c``, the content. Either answers ``o`` when the path cannot be read: its errno (4 bytes) and
the reason.

One thread, a ``poll`` loop over the helper's stdin and the command's pipes, and ``fork`` and
``exec`` of ``/bin/sh`` itself: the host starts nothing but the command's ``sh`` (a thread would
take a PID too), and the helper imports only small modules of the standard library, so that it
starts as fast as a bare ``python3`` (``subprocess`` and ``json`` took more CPU to import than
the helper then spends on a run's commands). Each command runs in a session of its own, so that
fxkit can kill its process group (past its timeout, on a Ctrl-C) over another SSH session, as
it does any command's. When the helper's stdin ends (fxkit closed the session, was killed, the
link dropped), the running command's stdin ends, its process group gets SIGHUP (a terminal's
hangup), and the helper exits.
"""

import errno
import os
import select
import struct

try:
    import _signal as signals  # type: ignore[import-not-found]  # built in; signal imports enum
except ImportError:  # pragma: no cover - every CPython 3 has it
    import signal as signals

FRAME = struct.Struct(">cI")
ANSWER = struct.Struct(">iI")
#: Bytes of stdin held for a command that has not read them, before frames are left waiting.
HELD = 4 << 20
READ = select.POLLIN | select.POLLHUP | select.POLLERR
#: A path's ``l`` request: follow a last symbolic link, look up the names, the largest file
#: hashed (-1: none).
LOOK = struct.Struct(">??q")
#: A path's mode, owner's and group's ids, size and modification time.
STAT = struct.Struct(">IIIQd")
ERROR = struct.Struct(">I")
S_IFMT, S_IFREG = 0o170000, 0o100000
#: The largest content the helper reads into its memory for one answer: a larger file's read
#: answers EFBIG, and fxkit reads it over SFTP. fxkit's own bound (no vendor figure): it keeps
#: the helper's memory small on the host.
LARGEST = 64 << 20
CHUNK = 1 << 20


def send(kind: bytes, *parts: "bytes | bytearray") -> None:
    """One frame whose payload is ``parts`` one after the other (written as they are: a
    command's output is not copied again)."""
    for part in (FRAME.pack(kind, sum(map(len, parts))), *parts):
        data = memoryview(part)
        while data:
            data = data[os.write(1, data) :]


def spawn(command: bytes, stdin: bool) -> "tuple[int, int | None, int, int]":
    """Fork ``/bin/sh -c command`` in a session of its own: its PID, then the ends of its
    stdin (None: /dev/null), stdout and stderr pipes (not inherited by later commands)."""
    child_in, feed = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), None)
    out, child_out = os.pipe()
    err, child_err = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setsid()
            for fd, target in ((child_in, 0), (child_out, 1), (child_err, 2)):
                os.dup2(fd, target)
            # Python ignores SIGPIPE, and an ignored signal stays ignored across exec.
            signals.signal(signals.SIGPIPE, signals.SIG_DFL)
            os.execv(b"/bin/sh", [b"/bin/sh", b"-c", command])
        finally:
            os._exit(127)
    for fd in (child_in, child_out, child_err):
        os.close(fd)
    return pid, feed, out, err


def status(wait_status: int) -> int:
    """An exit status as a shell reports it (128 + N when killed by signal N)."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def name(table: str, number: int) -> bytes:
    """The user's (``pwd``) or group's (``grp``) name of an id, as ``stat -c %U`` looks it up
    (the host's NSS); empty when it has none."""
    try:
        module = __import__(table)
        entry = module.getpwuid(number) if table == "pwd" else module.getgrgid(number)
    except (KeyError, ImportError):
        return b""
    return entry[0].encode("utf-8", "surrogateescape")


def look(
    path: bytes, follow: bool, names: bool, limit: int
) -> "tuple[os.stat_result, bytes, bytes, bytes]":
    """``path``'s stat (``lstat`` unless ``follow``), its owner's and group's names, and the
    sha256 of a regular file up to ``limit`` bytes (empty for anything else, ``-`` when
    larger). Raises :class:`OSError` as ``os.lstat`` or reading the file does."""
    found = os.stat(path) if follow else os.lstat(path)
    digest = b""
    if found.st_mode & S_IFMT == S_IFREG:
        digest = b"-"
        if found.st_size <= limit:
            hashed, found = hashed_file(path, follow)
            digest = hashed if found.st_size <= limit else b"-"
    if not names:
        return found, b"", b"", digest
    return found, name("pwd", found.st_uid), name("grp", found.st_gid), digest


def hashed_file(path: bytes, follow: bool) -> "tuple[bytes, os.stat_result]":
    """The sha256 of the file's content, in hex, and its stat as opened (what was hashed)."""
    try:  # the module of sha256 alone: hashlib would load OpenSSL
        from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]  # <= 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:  # pragma: no cover - a build without them
            from hashlib import sha256  # type: ignore[assignment,unused-ignore]
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    try:
        found, digest = os.fstat(fd), sha256()
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                return digest.hexdigest().encode(), found
            digest.update(chunk)
    finally:
        os.close(fd)


def content(path: bytes) -> bytes:
    """The whole content of the file ``path`` (EFBIG when it is larger than :data:`LARGEST`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if os.fstat(fd).st_size > LARGEST:
            raise OSError(errno.EFBIG, "larger than one answer of the helper")
        chunks, read = [], 0  # type: list[bytes], int
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                return b"".join(chunks)
            read += len(chunk)
            if read > LARGEST:  # it grew while read
                raise OSError(errno.EFBIG, "larger than one answer of the helper")
            chunks.append(chunk)
    finally:
        os.close(fd)


def answer_path(kind: bytes, payload: memoryview) -> None:
    """Answer an ``l`` or ``g`` request (see the module's docstring)."""
    try:
        if kind == b"g":
            answer = [content(bytes(payload))]  # type: list[bytes]
        else:
            follow, names, limit = LOOK.unpack_from(payload)
            found, owner, group, digest = look(bytes(payload[LOOK.size :]), follow, names, limit)
            head = STAT.pack(
                found.st_mode, found.st_uid, found.st_gid, found.st_size, found.st_mtime
            )
            answer = [head, owner, b"\0", group, b"\0", digest]
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        number = getattr(exc, "errno", 0) or 0
        send(b"o", ERROR.pack(number), (getattr(exc, "strerror", "") or str(exc)).encode())
        return
    send(b"c" if kind == b"g" else b"f", *answer)


class Command:
    """A running command: its shell, the stdin it has yet to read, its output so far."""

    def __init__(self, request: memoryview) -> None:
        self.pid, self.feed, out, err = spawn(bytes(request[1:]), request[:1] == b"1")
        self.pending = []  # type: list[memoryview]
        self.held = 0
        self.ending = False
        #: What its stdout and stderr wrote, by pipe, and the pipes still open.
        self.output = {out: bytearray(), err: bytearray()}
        self.open = {out, err}
        for fd in self.open:  # an event polled before a pipe was closed and its number reused
            os.set_blocking(fd, False)


class Helper:
    def __init__(self) -> None:
        self.poll = select.poll()
        self.inbox = bytearray()
        self.command = None  # type: Command | None
        self.reading = True

    def serve(self) -> None:
        send(b"h", str(os.getpid()).encode())
        self.poll.register(0, READ)
        while True:
            for fd, _ in self.poll.poll():
                if fd == 0:
                    if not self.read_frames():
                        return
                elif self.command is not None and fd == self.command.feed:
                    self.feed(self.command)
                elif self.command is not None and fd in self.command.open:
                    self.read_output(self.command, fd)

    # -- from fxkit

    def read_frames(self) -> bool:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            self.hang_up()
            return False
        self.inbox += chunk
        while len(self.inbox) >= FRAME.size:
            kind, size = FRAME.unpack_from(self.inbox)
            if len(self.inbox) < FRAME.size + size:
                break
            payload = memoryview(self.inbox[FRAME.size : FRAME.size + size])
            del self.inbox[: FRAME.size + size]
            self.handle(kind, payload)
        return True

    def handle(self, kind: bytes, payload: memoryview) -> None:
        command = self.command
        if kind in (b"l", b"g"):
            answer_path(kind, payload)
        elif kind == b"x":
            command = self.command = Command(payload)
            send(b"p", str(command.pid).encode())
            for fd in command.open:
                self.poll.register(fd, READ)
        elif command is None or command.feed is None:
            return  # stdin of a command that ended or stopped reading it
        elif kind == b"i" and payload:
            if not command.pending:
                os.set_blocking(command.feed, False)
                self.poll.register(command.feed, select.POLLOUT)
            command.pending.append(payload)
            command.held += len(payload)
            self.pause(command.held > HELD)
        elif kind == b"e":
            command.ending = True
            if not command.pending:
                self.close_stdin(command)

    def pause(self, paused: bool) -> None:
        """Stop reading frames while a command has too much stdin unread (or go on again)."""
        if paused == self.reading:
            self.reading = not paused
            if paused:
                self.poll.unregister(0)
            else:
                self.poll.register(0, READ)

    # -- to and from the command

    def feed(self, command: Command) -> None:
        assert command.feed is not None
        try:
            sent = os.write(command.feed, command.pending[0])
        except BlockingIOError:
            return
        except OSError:  # it ended before reading it all: its exit status says why
            self.close_stdin(command)
            return
        command.held -= sent
        command.pending[0] = command.pending[0][sent:]
        if not command.pending[0]:
            command.pending.pop(0)
        if not command.pending:
            self.poll.unregister(command.feed)
            if command.ending:
                self.close_stdin(command)
        self.pause(command.held > HELD)

    def close_stdin(self, command: Command) -> None:
        if command.feed is not None:
            if command.pending:
                self.poll.unregister(command.feed)
            os.close(command.feed)
        command.feed, command.pending, command.held = None, [], 0
        self.pause(False)

    def read_output(self, command: Command, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if chunk:
            command.output[fd] += chunk
            return
        self.poll.unregister(fd)
        os.close(fd)
        command.open.discard(fd)
        if not command.open:
            self.finish(command)

    def finish(self, command: Command) -> None:
        rc = status(os.waitpid(command.pid, 0)[1])
        self.close_stdin(command)
        self.command = None
        out, err = command.output.values()
        send(b"r", ANSWER.pack(rc, len(out)), out, err)

    def hang_up(self) -> None:
        """fxkit is gone: the running command's stdin ends and its process group gets SIGHUP,
        so that it ends as its traps say (a write removes its temp file)."""
        command = self.command
        if command is not None:
            self.close_stdin(command)
            try:  # noqa: SIM105 - contextlib would cost an import
                os.killpg(command.pid, signals.SIGHUP)
            except OSError:
                pass


if __name__ == "__main__":
    Helper().serve()
