"""The run lock: one ``fxkit play`` (or rollout) at a time changes a host.

A run takes the lock of each host it reaches over SSH before its first operation there: a shell
on the host opens :data:`LOCK_FILE`, takes a ``flock`` on it and stays, reading its stdin, for
as long as the run holds the connection. The lock goes with that shell: at the end of the run,
and also when the run dies (killed, the link dropped: the shell reads EOF). While it holds the
lock the file names the run (fxkit's PID on the controller, the controller, the start time) and
the shell that holds it.

A second run waits for the lock, saying whose it is, up to ``--lock-wait`` seconds (0: it does
not wait), then fails on that host with the first run's name. A host that let go of the lock (a
reboot) gives it again to the run's next play. Check mode takes no lock (it changes nothing).
Where no lock can be had the run goes on with a warning: a host without ``flock``
(util-linux), a user who is not root and does not become (the lock file is root's). The local
connection takes none: it is the machine fxkit itself runs on. Whatever the lock, every edit of a
file is also a compare-and-swap (:mod:`fxkit.connection.atomic`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import datetime
from shlex import quote

from fxkit.connection.base import Connection, Held
from fxkit.errors import FxkitError

#: The lock file on every host (``/run``: gone at the next boot).
LOCK_FILE = "/run/fxkit/run.lock"
#: Seconds a run waits for another run's lock (``--lock-wait``).
LOCK_WAIT = 600.0
#: How the shell on the host answers, each on a line of its own.
_MARK = "fxkit-lock"


class RunLockError(FxkitError):
    """The run lock of a host cannot be had: another run keeps it, or sudo refused."""


def holder() -> str:
    """How this run names itself in the lock file."""
    started = datetime.now().astimezone().isoformat(timespec="seconds")
    return f"fxkit PID {os.getpid()} on {socket.gethostname()}, started {started}"


def lock_command(wait: float, owner: str) -> str:
    """The shell that takes the lock (waiting ``wait`` seconds), writes ``owner`` into the file
    and holds the lock until its stdin ends. It answers ``none: WHY``, ``busy: OWNER``,
    ``refused`` or ``held``."""
    waiting = f"flock -w {wait:.3f} 9" if wait > 0 else "false"
    return "\n".join(
        [
            f"f={quote(LOCK_FILE)}",
            "command -v flock >/dev/null || "
            f'{{ echo "{_MARK} none: the host has no flock (util-linux)"; exit 0; }}',
            '[ -d "${f%/*}" ] || mkdir -p -- "${f%/*}" 2>/dev/null',
            'if [ -w "$f" ] || { [ ! -e "$f" ] && [ -w "${f%/*}" ]; }; then exec 9>>"$f"; else '
            f'echo "{_MARK} none: $(id -un) cannot write $f (not root, no become)"; exit 0; fi',
            f'if ! flock -n 9; then echo "{_MARK} busy: $(head -c 300 "$f" | tr -cd "[:print:]")"; '
            f'{waiting} || {{ echo "{_MARK} refused"; exit 0; }}; fi',
            f'printf "%s, held by PID %s on the host\\n" {quote(owner)} "$$" > "$f"',
            f'echo "{_MARK} held"',
            "while read -r _; do :; done",
        ]
    )


class RunLock:
    """One host's run lock, taken by :meth:`take` and held until :meth:`release`."""

    def __init__(self, conn: Connection, *, wait: float, owner: str):
        self.conn, self.wait, self.owner = conn, wait, owner
        self._held: Held | None = None
        #: ``become`` of the last try (None: not tried).
        self._tried: bool | None = None

    def take(self, *, become: bool, note: Callable[[str], None]) -> bool:
        """Take the lock, waiting for another run's (``note`` says whose). True once held; False
        when this host can have none (``note`` says why). Raises :class:`RunLockError` when
        another run kept it past the wait. A lock held, or tried, is not tried again, except
        with ``become`` after a try without it (a later play becomes root), and when the host
        let go of it (it rebooted)."""
        if self._held is not None and self._held.ended():
            self._held, self._tried = None, None
        if self._held is not None or (self._tried is not None and (self._tried or not become)):
            return self._held is not None
        self._tried = become
        where = f"host {self.conn.name}, {LOCK_FILE}"
        command = self.conn.hold(lock_command(self.wait, self.owner), become=become)
        owner = "another fxkit run"
        while (line := command.readline()) is not None:
            answer = line.removeprefix(f"{_MARK} ")
            if answer == "held":
                self._held = command
                return True
            if answer.startswith("busy: "):
                owner = answer.removeprefix("busy: ") or owner
                if self.wait > 0:
                    note(f"waiting up to {self.wait:g} s for the run lock ({owner})")
            elif answer.startswith("none: "):
                command.release()
                note(
                    f"no run lock: {answer.removeprefix('none: ')}; another run may change "
                    "this host at the same time (edits of files are still compare-and-swap)"
                )
                return False
            elif answer == "refused":
                command.release()
                raise RunLockError(
                    f"another run holds this host's run lock: {owner}",
                    where=where,
                    hint=f"let it finish, or wait longer (--lock-wait, now {self.wait:g} s); a "
                    "run that died lets go of it as its connection closes",
                )
        command.release()
        raise RunLockError(
            f"cannot take the run lock: {command.stderr().strip() or 'its command ended'}",
            where=where,
        )

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None
