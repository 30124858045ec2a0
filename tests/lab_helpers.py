"""Helpers of the tests on lab hosts: commands that must succeed, a host's file trees before and
after (test_play_lab's snapshot: ctime too, except of files hard-linked from this machine), and
the task events of a play."""

from __future__ import annotations

from fxkit.connection.base import Connection
from tests.test_play_lab import Run, snapshot

__all__ = ["Run", "changes", "events_of", "sh", "snapshot"]


def sh(conn: Connection, command: str) -> str:
    """Run a command that must succeed on the host; its stdout."""
    result = conn.run(command)
    assert result.ok, result
    return result.stdout


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
