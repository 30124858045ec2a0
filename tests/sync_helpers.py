"""Synchronisation points for tests, so that no test races the clock (docs/TESTING.md).

- :class:`Meeting`: a FIFO on a host; a command writes to it when it reaches the point the test
  waits for, and :meth:`Meeting.wait` returns once it has (the test then acts, e.g. presses
  Ctrl-C); at a :class:`Pause` the command also waits there until the test lets it go.
- :func:`run_past_timeout`: a command whose timeout runs out only once it has reached its
  meeting point (the connection's clock is held until then).
- :class:`Transcript`: what a process or a Console prints, with a wait for a piece of it (the
  state a program announces, e.g. "interrupted: hosts stop...").
- :func:`stopped`: a process that stopped itself at a fixed point (tests/upload_paused.py);
  :func:`when`: a state to reach where nothing announces it (polled).

Deadlines here (:data:`SAFETY`) are safety nets that end a broken test, never the thing waited for.
"""

from __future__ import annotations

import io
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import pytest

from fxkit.connection import local, ssh
from fxkit.connection.base import Connection, RunResult

#: Seconds a test waits for a state before it gives up: far more than a loaded machine needs.
SAFETY = 120.0


class Meeting:
    """A FIFO on the host of ``conn``: a command runs :attr:`reach` at the point the test waits
    for (it blocks there until the test is waiting too); :meth:`wait` returns once it has."""

    def __init__(self, conn: Connection):
        self.conn = conn
        # In a folder of its own: a FIFO of another user in sticky /tmp is not root's to open
        # for writing (fs.protected_fifos).
        made = conn.run("d=$(mktemp -d) && chmod 755 $d && mkfifo -m 666 $d/meet $d/go && echo $d")
        assert made.ok, made
        self.folder = made.stdout.strip()

    @property
    def reach(self) -> str:
        """The shell command that announces the point (it blocks until :meth:`wait` reads)."""
        return f"echo reached > {self.folder}/meet"

    def wait(self) -> None:
        result = self.conn.run(f"timeout {SAFETY:g} cat {self.folder}/meet")
        assert result.stdout == "reached\n", f"the command never reached {self.folder}: {result}"


class Pause(Meeting):
    """A :class:`Meeting` where the command then waits until the test calls :meth:`release`."""

    @property
    def reach(self) -> str:
        """Announce the point, then wait there. The command holds the FIFO it waits on open
        before it announces: what :meth:`release` writes once it has waited is never lost."""
        return f"exec 7<> {self.folder}/go; {super().reach}; read -r _ <&7"

    def release(self) -> None:
        """Let the command go on (never blocks, also where nothing waits any more)."""
        assert self.conn.run(f"exec 7<> {self.folder}/go; echo go >&7").ok


class HeldClock:
    """``time`` as a connection module sees it, whose ``monotonic`` stands still for the thread
    that called :meth:`hold` until :meth:`release` (other threads see the real clock)."""

    def __init__(self) -> None:
        self._held_at = time.monotonic()
        self._thread: int | None = None
        self._released = threading.Event()

    def hold(self) -> None:
        self._thread = threading.get_ident()

    def release(self) -> None:
        self._released.set()

    def monotonic(self) -> float:
        if self._released.is_set() or threading.get_ident() != self._thread:
            return time.monotonic()
        return self._held_at

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def run_past_timeout(
    conn: Connection, command: str, meeting: Meeting, timeout: float, **kwargs: Any
) -> RunResult:
    """``conn.run(command, timeout=timeout)``, whose timeout starts to run out only once the
    command has reached ``meeting`` (the command runs ``meeting.reach``, then blocks)."""
    clock = HeldClock()

    def run() -> RunResult:
        clock.hold()
        return conn.run(command, timeout=timeout, **kwargs)

    with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(1) as pool:
        for module in (local, ssh):
            patch.setattr(module, "time", clock)
        running = pool.submit(run)
        try:
            meeting.wait()
        finally:
            clock.release()
        return running.result(SAFETY)


class Transcript(io.StringIO):
    """Text as it is written (a Console's file, or a process's output: :meth:`follow`), and a
    wait for a piece of it."""

    def __init__(self) -> None:
        super().__init__()
        self._written = threading.Condition()
        self._reader: threading.Thread | None = None

    def write(self, text: str) -> int:
        with self._written:
            count = super().write(text)
            self._written.notify_all()
        return count

    def wait_for(self, text: str) -> None:
        """Return once ``text`` was written (fail after :data:`SAFETY` seconds)."""
        with self._written:
            if not self._written.wait_for(lambda: text in self.getvalue(), SAFETY):
                pytest.fail(f"{text!r} never came; what did:\n{self.getvalue()}")

    def follow(self, stream: IO[str]) -> Transcript:
        """Copy ``stream`` (a process's output) here as it comes, in a thread of its own."""
        self._reader = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._reader.start()
        return self

    def _copy(self, stream: IO[str]) -> None:
        for line in stream:
            self.write(line)

    def text(self) -> str:
        """All of it, once the followed stream has ended."""
        if self._reader is not None:
            self._reader.join(SAFETY)
        return self.getvalue()


def when(predicate: Callable[[], bool], what: str) -> None:
    """Wait until ``predicate()`` holds (a state to reach, polled; fail after :data:`SAFETY`)."""
    deadline = time.monotonic() + SAFETY
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.05)


def stopped(proc: subprocess.Popen) -> None:
    """Wait until ``proc`` has stopped itself (SIGSTOP, at a fixed point of its work)."""
    stat = Path(f"/proc/{proc.pid}/stat")

    def state() -> str:
        assert proc.poll() is None, f"it ended before it stopped: {proc.communicate()}"
        return stat.read_text().rpartition(")")[2].split()[0]

    when(lambda: state() == "T", "stopped")
