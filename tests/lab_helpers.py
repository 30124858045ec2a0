"""Helpers of the tests on lab hosts: commands that must succeed, a host's file trees before and
after, and the task events of a play."""

from __future__ import annotations

from fxkit.connection.base import Connection
from fxkit.lab import Fleet
from tests.test_play_lab import Run


def sh(conn: Connection, command: str) -> str:
    """Run a command that must succeed on the host; its stdout."""
    result = conn.run(command)
    assert result.ok, result
    return result.stdout


def snapshot(fleet: Fleet, host: str) -> str:
    """A host's file trees: every entry's metadata (no ctime: the fleet's base layer holds hard
    links to this machine's /etc, so every fleet another session starts moves their ctime) and a
    sha256 of each small file."""
    with fleet.connect(host) as conn:
        return sh(
            conn,
            "find /etc /opt /srv /var/lib -xdev -printf '%p %y %m %u %g %s %T@ %l\\n' | "
            "LC_ALL=C sort; find /etc /srv -xdev -type f -exec sha256sum {} + | LC_ALL=C sort",
        )


def changes(before: str, after: str) -> list[str]:
    """The lines of two host snapshots that differ."""
    old, new = set(before.splitlines()), set(after.splitlines())
    return sorted(f"- {line}" for line in old - new) + sorted(f"+ {line}" for line in new - old)


def events_of(run: Run, host: str, status: str) -> list[tuple[str, str]]:
    """(operation, message) of each of ``host``'s tasks with ``status``, in order."""
    return [
        (e["operation"], e["msg"])
        for e in run.events
        if e["host"] == host and e["status"] == status
    ]
