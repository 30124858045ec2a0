"""Two ``fxkit play`` runs on one lab host (issue 27, item 7): the second waits for the first's
run lock, or is refused with the first run's PID and start time; exit codes say so; check mode
takes no lock; a host without flock still runs, with a warning.

The first run stops itself at a fixed point, holding the lock: its role writes to a pipe the test
reads (the run is there), then reads from a pipe the test writes to (go on). Nothing depends on
timing: the test goes on only when a process said where it is.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fxkit.lab import SUDO_USER, Fleet
from tests.test_play_lab import FXKIT, fxkit_play, task_events, write_inventory, write_role

pytestmark = pytest.mark.lab

LINES = "/srv/fxkit-lock/limits.conf"
#: Adds 30 lines ``TAG 0`` ... ``TAG 29``, one operation each; with ``ready_fd``/``go_fd`` it
#: stops after the first: says so on one pipe, waits on the other.
ADDER = """\
import os


def apply(host, v):
    host.directory("/srv/fxkit-lock")
    for i in range(30):
        host.line(v.lines_file, f"{v.tag} {i}")
        if i == 0 and "ready_fd" in v:
            os.write(int(v.ready_fd), b"paused\\n")
            os.read(int(v.go_fd), 1)
"""


@dataclass
class Paused:
    """A run stopped after its first line, holding the lock; :meth:`go` lets it finish."""

    proc: subprocess.Popen[str]
    go_fd: int

    def go(self) -> str:
        """Let it go on; its output once it ended."""
        with contextlib.suppress(OSError):  # it ended already (or was let go)
            os.write(self.go_fd, b"x")
            os.close(self.go_fd)
        out, _ = self.proc.communicate(timeout=300)
        return out


def write_book(folder: Path) -> Path:
    write_role(folder, "adder", ADDER)
    path = folder / "adder.yml"
    path.write_text(f"- hosts: lab01\n  vars: {{lines_file: {LINES}}}\n  roles: [adder]\n")
    return path


@pytest.fixture
def book(tmp_path: Path, fleet: Fleet) -> Path:
    with fleet.connect("lab01") as conn:
        assert conn.run("rm -rf /srv/fxkit-lock").ok
    return write_book(tmp_path)


def start(book: Path, inventory: Path, log: Path, *args: str, **kwargs) -> subprocess.Popen[str]:
    """``fxkit play`` in its own process, its output (stdout and stderr) read as it comes."""
    return subprocess.Popen(
        [str(FXKIT), "play", str(book), "-i", str(inventory), "--log-json", str(log), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        **kwargs,
    )


@contextlib.contextmanager
def start_paused(book: Path, inventory: Path, log: Path, *args: str) -> Iterator[Paused]:
    """Start a run with tag ``a`` and wait until it stopped after its first line."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    fds = f"ready_fd={ready_w} go_fd={go_r}"
    proc = start(book, inventory, log, "-e", f"tag=a {fds}", *args, pass_fds=(ready_w, go_r))
    os.close(ready_w)
    os.close(go_r)
    paused = Paused(proc, go_w)
    try:
        with os.fdopen(ready_r, "rb") as ready:
            said = ready.readline()  # b"" when the run ended before it got there
        assert said == b"paused\n", paused.go()
        yield paused
    finally:
        if proc.poll() is None:
            paused.go()


def line_with(proc: subprocess.Popen[str], text: str) -> str:
    """The first line of the run's output that holds ``text`` (it fails when the run ends
    without one): what the run says as it starts waiting."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        if text in line:
            return line
        seen.append(line)
    raise AssertionError(f"the run ended without saying {text!r}:\n{''.join(seen)}")


def lines_on(fleet: Fleet) -> list[str]:
    with fleet.connect("lab01") as conn:
        return (conn.get(LINES) or b"").decode().splitlines()


def owner_of(paused: Paused) -> str:
    return f"fxkit PID {paused.proc.pid} on {socket.gethostname()}, started "


def test_a_second_run_waits_for_the_first_and_check_mode_does_not(
    fleet: Fleet, book: Path, tmp_path: Path
) -> None:
    logs = [tmp_path / f"events{i}.json" for i in range(3)]
    with start_paused(book, fleet.inventory, logs[0]) as first:
        second = start(book, fleet.inventory, logs[1], "-e", "tag=b")
        waiting = line_with(second, "waiting up to 600 s for the run lock")
        assert owner_of(first) in waiting, waiting
        # Check mode takes no lock: it reports while both runs are on the host.
        check = fxkit_play(book, fleet.inventory, logs[2], "--check", "-e", "tag=c")
        assert check.code == 0 and check.counts("changed") == {"lab01": 30}, check.output
        assert lines_on(fleet) == ["a 0"]  # the second run has not started to change the host
        first_out = first.go()
        second_out, _ = second.communicate(timeout=300)
        assert first.proc.returncode == 0, first_out
        assert second.returncode == 0, second_out
    # One run after the other: none of the 60 lines lost, and in the order they ran.
    assert lines_on(fleet) == [f"a {i}" for i in range(30)] + [f"b {i}" for i in range(30)]
    lines = [e["status"] for e in task_events(logs[1]) if e["operation"].startswith("line ")]
    assert lines == ["changed"] * 30


def test_a_second_run_that_does_not_wait_is_refused_and_exits_1(
    fleet: Fleet, book: Path, tmp_path: Path
) -> None:
    inventory = write_inventory(
        fleet,
        tmp_path / "inventory.yml",
        ansible_user=SUDO_USER,
        ansible_become=True,
        ansible_become_password=fleet.become_password(),
    ) if fleet.become_password() else fleet.inventory  # fmt: skip
    log = tmp_path / "second.json"
    with start_paused(book, inventory, tmp_path / "first.json") as first:
        refused = fxkit_play(book, fleet.inventory, log, "-e", "tag=b", "--lock-wait", "0")
        assert refused.code == 1, refused.output
        [event] = refused.events
        assert (event["operation"], event["status"]) == ("run lock", "failed")
        assert "another run holds this host's run lock: " + owner_of(first) in event["msg"]
        assert "/run/fxkit/run.lock" in event["msg"] and "--lock-wait" in event["msg"]
        first_out = first.go()
        assert first.proc.returncode == 0, first_out
    assert lines_on(fleet) == [f"a {i}" for i in range(30)]  # the refused run changed nothing


def test_a_host_without_flock_runs_with_a_warning(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="noflock")  # a host of its own: flock goes away
    with fleet.connect("lab01") as conn:
        assert conn.run('rm -- "$(command -v flock)" && ! command -v flock').ok
    run = fxkit_play(write_book(tmp_path), fleet.inventory, tmp_path / "events.json", "-e", "tag=a")
    assert run.code == 0, run.output
    assert "lab01: no run lock: the host has no flock (util-linux)" in run.output
    assert lines_on(fleet) == [f"a {i}" for i in range(30)]


def test_a_user_who_does_not_become_runs_without_the_lock_with_a_warning(
    fleet: Fleet, sudo_user: str, tmp_path: Path
) -> None:
    inventory = write_inventory(fleet, tmp_path / "inventory.yml", ansible_user=sudo_user)
    book = tmp_path / "user.yml"
    book.write_text("- hosts: lab01\n  roles: [mine]\n")
    mine = f"/tmp/fxkit-{tmp_path.name}"
    write_role(tmp_path, "mine", f"def apply(host, v):\n    host.line({mine!r}, 'x')\n")
    run = fxkit_play(book, inventory, tmp_path / "events.json")
    assert run.code == 0 and run.counts("changed") == {"lab01": 1}, run.output
    assert (
        f"lab01: no run lock: {sudo_user} cannot write /run/fxkit/run.lock (not root, no become)"
        in run.output
    )


#: Each play records who holds the lock (the lock file, the processes that have it open); play 1
#: then reconnects, as ``host.reboot()`` does: the holder on the host reads EOF and lets go.
RECONNECT = """\
from pathlib import Path

OPEN = "ls -l /proc/$p/fd 2>/dev/null | grep -q ' /run/fxkit/run.lock$'"
PIDS = "$(ls /proc | grep '^[0-9]')"
HOLDERS = f"cat /run/fxkit/run.lock; for p in {PIDS}; do {OPEN} && echo $p; done"


def apply(host, v):
    found = host.command(f"{HOLDERS}; true").data["stdout"]
    Path(f"{v.record}.{v.step}").write_text(found)
    if v.step == 1:
        host.ctx.conn.close()
        host.ctx.conn.open()
"""


def test_a_lock_the_host_let_go_of_is_taken_again_by_the_next_play(
    fleet: Fleet, tmp_path: Path
) -> None:
    write_role(tmp_path, "reconnect", RECONNECT)
    book = tmp_path / "reconnect.yml"
    record = tmp_path / "holder"
    plays = [f"- hosts: lab01\n  vars: {{step: {step}, record: {record}}}\n  roles: [reconnect]\n"
             for step in (1, 2)]  # fmt: skip
    book.write_text("".join(plays))
    run = fxkit_play(book, fleet.inventory, tmp_path / "events.json")
    assert run.code == 0, run.output
    before = Path(f"{record}.1").read_text().splitlines()
    after = Path(f"{record}.2").read_text().splitlines()
    assert len(before) == len(after) == 2, (before, after)  # the lock file, and one holder
    for owner, holder in (before, after):
        assert owner.endswith(f", held by PID {holder} on the host"), (owner, holder)
    assert before != after
