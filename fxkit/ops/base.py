"""What every operation receives and returns.

An operation is a plain function ``op(ctx, ...) -> Result``. It reads the current state (through
facts or the connection), compares it with the desired state, and changes only what differs. In
check mode (``ctx.check``) it changes nothing and reports what it would change. When ``ctx.diff``
is set it fills ``Result.diff`` (a unified diff for file contents, ``before -> after`` lines for
attributes). Operations never print; they return results and the runner reports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fxkit.connection.base import Connection
from fxkit.facts.base import FactCache


class Status(StrEnum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class Result:
    """The outcome of one operation. Truthy when it changed something (``restart_if=changed``)."""

    status: Status
    msg: str = ""
    diff: str | None = None
    #: Filled by the caller: the operation's name and its main argument (e.g. ``file /etc/x``).
    name: str = ""
    #: Operation-specific data for the caller (e.g. ``reboot_required``, a command's output).
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.status is Status.CHANGED

    @property
    def failed(self) -> bool:
        return self.status is Status.FAILED

    def __bool__(self) -> bool:
        return self.changed


def ok(msg: str = "", **data: Any) -> Result:
    return Result(Status.OK, msg, data=data)


def changed(msg: str = "", diff: str | None = None, **data: Any) -> Result:
    return Result(Status.CHANGED, msg, diff, data=data)


def failed(msg: str, **data: Any) -> Result:
    return Result(Status.FAILED, msg, data=data)


def skipped(msg: str) -> Result:
    return Result(Status.SKIPPED, msg)


@dataclass
class OpContext:
    """One host's view for operations: its connection, its facts and the run's modes."""

    conn: Connection
    facts: FactCache
    check: bool = False
    diff: bool = False
    #: Run privileged steps through sudo (``ansible_become``).
    become: bool = False


Operation = Callable[..., Result]
