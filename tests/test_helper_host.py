"""The host-side helper's program (fxkit/connection/helper_host.py) run here, as a host would
run it (`python3 -I -S -c SOURCE`), driven by fxkit's client over its pipes; the SSH side is in
tests/test_ssh_helper.py."""

from __future__ import annotations

import ast
import errno
import grp
import hashlib
import os
import pwd
import select
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fxkit.connection.helper import (
    SOURCE,
    HelperClient,
    HelperEnded,
    failure,
    interpreter,
    look_request,
    looked,
    start_command,
)
from fxkit.connection.local import LocalConnection


class Pipes:
    """The helper's stdin and stdout as :class:`fxkit.connection.helper.Channel` reads them."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.out, self.err = bytearray(), bytearray()

    def write(self, data: memoryview) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            return False
        return True

    def pump(self) -> bool:
        assert self.proc.stdout is not None
        select.select([self.proc.stdout], [], [], 30)
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        self.out += chunk
        return bool(chunk)


@pytest.fixture
def helper() -> Iterator[HelperClient]:
    proc = subprocess.Popen(
        ["sh", "-c", start_command(sys.executable)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    yield HelperClient(Pipes(proc))
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(30) == 0  # its stdin ended: it exits


def _run(helper: HelperClient, command: str, stdin: bytes | None = None) -> tuple:
    helper.send(command, stdin)
    return helper.answer()  # type: ignore[return-value]


def test_commands_statuses_and_output(helper):
    assert _run(helper, "echo out; echo err >&2; exit 3") == (3, b"out\n", b"err\n")
    assert _run(helper, "kill -s TERM $$")[0] == 128 + 15
    assert _run(helper, "cat") == (0, b"", b"")  # no stdin given: it is at its end
    big = os.urandom(5 << 20)  # more than a pipe and a frame hold, both ways
    rc, out, err = _run(helper, "cat; cat >&2 < /dev/null; head -c 3000000 /dev/zero >&2", big)
    assert (rc, out, len(err)) == (0, big, 3000000)
    assert helper.child is not None and helper.child != helper.pid


def test_stdin_beyond_what_the_helper_holds_waits_for_a_slow_reader(helper):
    big = os.urandom(12 << 20)  # three times helper_host.HELD
    rc, out, _ = _run(helper, "sleep 0.5; sha256sum", big)
    assert (rc, out.split()[0].decode()) == (0, hashlib.sha256(big).hexdigest())
    assert _run(helper, "wc -c", b"") == (0, b"0\n", b"")


def test_a_command_that_leaves_its_stdin_unread(helper):
    assert _run(helper, "exit 7", os.urandom(3 << 20)) == (7, b"", b"")
    assert _run(helper, "echo next") == (0, b"next\n", b"")  # the frames stayed in step


def test_paths_are_read_by_the_helper_itself(helper, tmp_path):
    """``l`` and ``g`` start no process (the answers carry no shell's PID) and agree with what
    fxkit's own process finds (LocalConnection.inspect runs the same code) and with os and
    hashlib; odd names and errors come back as answers, and commands go on in step."""
    data = os.urandom(3000)
    odd = tmp_path / "odd \udcff name\n"
    odd.write_bytes(data)
    odd.chmod(0o640)
    (tmp_path / "link").symlink_to(odd)
    (tmp_path / "big").write_bytes(b"x" * 101)
    local = LocalConnection("localhost")
    for name, follow, limit in [
        (odd.name, False, 4096), ("link", False, 4096), ("link", True, 4096),
        (".", False, 0), ("big", False, 100),
    ]:  # fmt: skip
        path = str(tmp_path / name)
        kind, payload = helper.ask(b"l", look_request(path, follow, limit))
        state = looked(payload)
        st = os.stat(path) if follow else os.lstat(path)
        assert (kind, state.stat.st_mode, state.stat.size) == (b"f", st.st_mode, st.st_size)
        assert (state.owner, state.group) == (
            pwd.getpwuid(st.st_uid)[0],
            grp.getgrgid(st.st_gid)[0],
        )
        if not follow:
            assert local.inspect(path, hash_limit=limit) == state
        nameless = looked(helper.ask(b"l", look_request(path, follow, -1, names=False))[1])
        assert (nameless.stat, nameless.owner, nameless.group) == (state.stat, "", "")
    assert looked(helper.ask(b"l", look_request(str(odd), False, 4096))[1]).sha256 == (
        hashlib.sha256(data).hexdigest()
    )
    assert looked(helper.ask(b"l", look_request(str(tmp_path / "link"), False, 9))[1]).sha256 == ""
    assert (
        looked(helper.ask(b"l", look_request(str(tmp_path / "big"), False, 100))[1]).sha256 is None
    )
    assert helper.ask(b"g", os.fsencode(odd)) == (b"c", data)
    kind, payload = helper.ask(b"g", os.fsencode(tmp_path / "none"))
    assert (kind, failure(payload)[0]) == (b"o", errno.ENOENT)
    kind, payload = helper.ask(b"g", os.fsencode(tmp_path))
    assert (kind, failure(payload)) == (b"o", (errno.EISDIR, "Is a directory"))
    nul = look_request("x\0y", False, -1)  # a NUL in the path: no errno, still an answer
    assert failure(helper.ask(b"l", nul)[1])[0] == 0
    assert helper.child is None  # no command was started
    assert _run(helper, "echo next") == (0, b"next\n", b"")


def test_a_helper_that_ends_is_reported():
    proc = subprocess.Popen(
        ["sh", "-c", start_command("/nonexistent/python3")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    with pytest.raises(HelperEnded):
        HelperClient(Pipes(proc))
    assert proc.wait(30) == 127


def test_the_program_runs_on_python_3_6_with_the_standard_library_only():
    """A host's python3 may be old (3.6 on EL8's platform-python) and has no fxkit."""
    tree = ast.parse(SOURCE, feature_version=(3, 6))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    later = {"_sha2"}  # sha256's module from Python 3.12 (earlier: _sha256)
    assert imported <= set(sys.stdlib_module_names) | later, imported
    assert "__future__" not in imported  # `from __future__ import annotations` needs 3.7


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "python3"), ("auto_silent", "python3"), ("/usr/libexec/platform-python", None)],
)
def test_the_interpreter_follows_ansible_python_interpreter(value, expected):
    assert interpreter(value) == (expected or value)
