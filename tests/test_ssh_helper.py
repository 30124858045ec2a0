"""The host-side helper (fxkit/connection/helper.py) against real sshd and python3 (lab hosts):
one session for the run's commands, the plain commands where it cannot run, and nothing it
started left running."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import paramiko
import pytest
from sync_helpers import SAFETY, Meeting, run_past_timeout, when

from fxkit.connection import helper
from fxkit.connection.base import PathStat
from fxkit.connection.helper import BULK, HelperClient
from fxkit.errors import ConnectionFailed, FxkitError
from fxkit.facts.base import FactCache
from fxkit.facts.files import FileStat
from fxkit.lab import SUDO_USER

pytestmark = pytest.mark.lab


def _parent(conn) -> int:
    return int(conn.run("echo $PPID").stdout)


def _sessions(monkeypatch) -> list[object]:
    """Every SSH session the controller opens from now on."""
    opened: list[object] = []
    original = paramiko.Transport.open_session

    def spy(transport, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(args)
        return original(transport, *args, **kwargs)

    monkeypatch.setattr(paramiko.Transport, "open_session", spy)
    return opened


def test_commands_after_the_first_need_no_session_of_their_own(lab_fleet, monkeypatch):
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        opened = _sessions(monkeypatch)
        parents = {_parent(conn) for _ in range(10)}
        assert len(opened) == 1  # the helper's
        helper = conn._helpers[False].client
        assert isinstance(helper, HelperClient) and parents == {helper.pid}
        cmdline = conn.run(f"tr '\\0' ' ' < /proc/{helper.pid}/cmdline").stdout
        assert cmdline.startswith("python3 -I -S -c ")
        # What a command sees is what it saw in a session of its own.
        result = conn.run("echo out; echo err >&2; cat; exit 3", stdin=b"in")
        assert (result.rc, result.stdout, result.stderr) == (3, "out\nin", "err\n")
        assert conn.run("kill -s TERM $$").rc == 128 + 15
        assert len(opened) == 1
    # Closing the connection ends the helper on the host.
    with fleet.connect("lab01") as other:
        when(lambda: not other.run(f"kill -0 {helper.pid}").ok, "the helper ended")


@pytest.mark.parametrize(
    "hostvars",
    [{"ansible_python_interpreter": "/nonexistent/python3"}, {"fxkit_host_helper": "false"}],
)
def test_without_the_helper_every_command_has_a_session(lab_fleet, monkeypatch, hostvars):
    """A host without the interpreter (here: the inventory names one that is not there), or
    with the helper switched off, runs plain commands."""
    fleet = lab_fleet(1)
    with fleet.connect("lab01", **hostvars) as conn:
        opened = _sessions(monkeypatch)
        assert [conn.run(f"echo {i}").stdout for i in range(3)] == ["0\n", "1\n", "2\n"]
        assert not conn._helpers[False].wanted
        started = 1 if "ansible_python_interpreter" in hostvars else 0  # the try
        assert len(opened) == 3 + started


def test_an_upload_goes_in_a_session_of_its_own(lab_fleet, monkeypatch):
    """sshd hands a big stdin to the command directly; through the helper every byte would be
    copied once more on the host."""
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        helper = _parent(conn)
        opened = _sessions(monkeypatch)
        big = bytes(BULK)
        assert conn.run("wc -c; echo $PPID", stdin=big).stdout.split()[0] == str(BULK)
        assert len(opened) == 1
        conn.put("/tmp/bulk", big)  # content_stream: its first chunk tells
        assert len(opened) == 2
        conn.put("/tmp/small", bytes(BULK - 1))
        assert conn.run("wc -c < /tmp/small; echo $PPID", stdin=b"x").stdout.split() == [
            str(BULK - 1),
            str(helper),
        ]
        assert len(opened) == 2


_PATHS = ("/srv/t/file", "/srv/t/dir", "/srv/t/link", "/srv/t/none", "/srv/t/file/x")


def _reads(conn) -> list[object]:
    """What the connection's reads find of :data:`_PATHS`, and the FileStat fact of each (the
    mtimes in whole seconds, as SFTP has them; the helper has the fraction too)."""

    def stat(path: str, follow: bool) -> PathStat | None:
        found = conn.stat(path, follow=follow)
        return found and dataclasses.replace(found, mtime=int(found.mtime))

    found: list[object] = []
    for path in _PATHS:
        found += [conn.get(path) if path.endswith(("file", "none")) else None,
                  stat(path, False), stat(path, True),
                  FactCache(conn).get(FileStat, path)]  # fmt: skip
    return found


def test_reads_are_requests_to_the_helper(lab_fleet, monkeypatch):
    """A file's content, a path's stat and the FileStat fact come from the helper itself, one
    request each, with no SFTP session and no process; they equal what SFTP and the fact's
    command find. A failure is the file's error, as SFTP's is."""
    fleet = lab_fleet(1)
    with fleet.connect("lab01", fxkit_host_helper="false") as plain:
        plain.run(
            "mkdir -p /srv/t/dir && printf 'a\\nb' > /srv/t/file && chmod 640 /srv/t/file && "
            "chown 1:2 /srv/t/file && ln -sfn file /srv/t/link"
        )
        over_sftp = _reads(plain)
        by_command = [FileStat().parse(plain.run(FileStat().command(p)), p) for p in _PATHS]
    with fleet.connect("lab01") as conn:
        conn.run("true")  # the helper runs
        opened, asked = _sessions(monkeypatch), []
        original = HelperClient.ask
        monkeypatch.setattr(HelperClient, "ask", lambda h, *a: asked.append(a) or original(h, *a))
        assert _reads(conn) == over_sftp
        assert over_sftp[3::4] == by_command and over_sftp[3].owner == "daemon"
        assert len(asked) == 2 * 4 + 3 * 3 and opened == []  # one request per read
        with pytest.raises(FxkitError, match="cannot read /srv/t/dir: Is a directory"):
            conn.get("/srv/t/dir")
        assert conn.run("echo $PPID").stdout.strip() == str(conn._helpers[False].client.pid)


def test_a_file_larger_than_one_answer_is_read_over_sftp(lab_fleet, monkeypatch):
    """The helper answers EFBIG for a file larger than it reads into its memory (64 MiB; here
    it is told 10 bytes) and the read goes over SFTP, whole."""
    source = helper.SOURCE.replace("LARGEST = 64 << 20", "LARGEST = 10")
    assert source != helper.SOURCE
    monkeypatch.setattr(helper, "SOURCE", source)
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        conn.run("printf 0123456789 > /tmp/ten && printf 0123456789a > /tmp/eleven")
        opened = _sessions(monkeypatch)
        assert conn.get("/tmp/ten") == b"0123456789" and opened == []
        assert conn.get("/tmp/eleven") == b"0123456789a" and len(opened) == 1  # SFTP's
        assert conn._helpers[False].wanted  # the helper goes on


def test_a_read_interrupted_before_its_answer_leaves_no_answer_behind(lab_fleet, monkeypatch):
    """A Ctrl-C (KeyboardInterrupt) between a request and its answer stops that helper: the
    next read gets its own answer, from a new helper, never the interrupted one's."""
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        conn.run("echo first > /tmp/first && echo second > /tmp/second")
        first = conn._helpers[False].client
        original = HelperClient._frame

        def interrupted(self, wait=True):  # type: ignore[no-untyped-def]
            monkeypatch.setattr(HelperClient, "_frame", original)
            raise KeyboardInterrupt

        monkeypatch.setattr(HelperClient, "_frame", interrupted)
        with pytest.raises(KeyboardInterrupt):
            conn.get("/tmp/first")
        assert conn.get("/tmp/second") == b"second\n"
        assert conn._helpers[False].client is not first
        assert conn.run("echo $PPID").stdout.strip() == str(conn._helpers[False].client.pid)


def test_a_command_that_ends_the_helper_fails_and_the_next_runs_alone(lab_fleet):
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        helper = _parent(conn)
        result = conn.run("kill -s KILL $PPID; sleep 5")
        assert result.rc == 255
        assert "the host-side helper ended during the command" in result.stderr
        assert conn.run("echo $PPID").stdout.strip() != str(helper)
        assert not conn._helpers[False].wanted


def test_commands_from_two_threads_at_once(lab_fleet):
    """One command holds the helper; another thread's runs in a session of its own meanwhile."""
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        helper = _parent(conn)
        meeting = Meeting(conn)
        results: list[str] = []
        first = threading.Thread(
            target=lambda: results.append(conn.run(f"{meeting.reach}; echo $PPID").stdout)
        )
        first.start()
        meeting.wait()  # holds the helper's lock until it ends: this ran beside it
        first.join(SAFETY)
        assert results == [f"{helper}\n"]


def test_a_cancel_kills_the_helpers_command_with_its_children(lab_fleet):
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as watcher:
        conn = fleet.connect("lab01")
        conn.open()
        meeting = Meeting(conn)
        outcome: list[object] = []

        def long_command() -> None:
            try:
                command = f"sleep 300 & echo $! > /tmp/helped-child; {meeting.reach}; wait"
                outcome.append(conn.run(command).rc)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=long_command)
        thread.start()
        meeting.wait()
        child = watcher.run("cat /tmp/helped-child").stdout.strip()
        conn.cancel()
        thread.join(SAFETY)
        # Killed (as a command in a session of its own: its status), or the link closed first.
        assert outcome and (isinstance(outcome[0], ConnectionFailed) or outcome[0] == 137)
        with pytest.raises(ConnectionFailed, match="interrupted"):
            conn.run("true")
        when(
            lambda: (
                watcher.run(
                    f"[ ! -e /proc/{child} ] || grep -q '^[^ ]* ([^)]*) [ZX]' /proc/{child}/stat"
                ).ok
            ),
            "the command's child was killed",
        )


def test_a_timeout_while_the_command_leaves_its_stdin_unread(lab_fleet):
    """The helper blocks feeding a command that does not read its stdin: the kill comes over
    another session, the output written so far comes back, and the next command runs."""
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        meeting = Meeting(conn)
        # Far more than the pipe, the helper (4 MiB) and the SSH window hold; a first chunk
        # under BULK, so that it goes through the helper.
        payload = iter([b"x", b"x" * (32 << 20)])
        result = run_past_timeout(
            conn, f"echo started; {meeting.reach}; sleep 300", meeting, 0.5, stdin=payload
        )
        assert result.rc == 124 and result.stdout == "started\n", result
        assert "timed out after 0.5 s; it was killed" in result.stderr
        assert conn.run("echo still usable").stdout == "still usable\n"


def test_become_commands_share_one_helper_started_through_sudo(lab_fleet, monkeypatch):
    fleet = lab_fleet(1)
    password = fleet.become_password()
    if password is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user (apt-get install sudo)")
    with fleet.connect("lab01", ansible_user=SUDO_USER, ansible_become_password=password) as conn:
        opened = _sessions(monkeypatch)
        runs = [conn.run("echo $(id -un) $PPID", become=True) for _ in range(5)]
        assert len({r.stdout for r in runs}) == 1, runs
        user, parent = runs[0].stdout.split()
        helper = conn._helpers[True].client
        assert user == "root" and helper is not None and int(parent) == helper.pid
        assert conn.run("id -un").stdout == f"{SUDO_USER}\n"  # the login user's own helper
        assert len(opened) == 2
        # Root's files are read and stat'ed by the root helper itself (no sudo of their own).
        conn.run("umask 077 && echo s > /root/.fxkit-secret", become=True)
        assert conn.get("/root/.fxkit-secret", become=True) == b"s\n"
        found = conn.stat("/root/.fxkit-secret", become=True)
        assert found is not None and (found.size, found.st_mode & 0o777) == (2, 0o600)
        assert len(opened) == 2
        # Past its timeout a root command is killed through sudo (it is not the login user's).
        meeting = Meeting(conn)
        result = run_past_timeout(
            conn, f"echo started; {meeting.reach}; sleep 300", meeting, 0.5, become=True
        )
        assert result.rc == 124 and "it was killed" in result.stderr, result
        assert conn.run("id -u", become=True).stdout == "0\n"


def test_a_big_upload_follows_ansible_python_interpreter(lab_fleet):
    """The one-pass writer is the inventory's interpreter: one that is not on the host gets dd
    and the hash after it (python3 is on the lab host's PATH, and is not used)."""
    from fxkit.connection.atomic import ONE_PASS_FROM

    fleet = lab_fleet(1)
    content = bytes(range(256)) * ((ONE_PASS_FROM + 256) // 256)
    with fleet.connect("lab01", ansible_python_interpreter="/nonexistent/python3") as conn:
        assert conn.python == "/nonexistent/python3" and conn.run("command -v python3").ok
        conn.put("/tmp/one-pass.bin", content)
        digest = conn.run("sha256sum < /tmp/one-pass.bin").stdout.split()[0]
    assert digest == hashlib.sha256(content).hexdigest()
