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
from typing import Any, TypeVar

from fxkit.connection.base import Connection, RunResult
from fxkit.errors import FxkitError
from fxkit.facts.base import Fact, FactCache

T = TypeVar("T")


class OpError(FxkitError):
    """An operation was called with arguments it cannot work with (a bad mode, an unknown state)."""


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


def skipped(msg: str, **data: Any) -> Result:
    return Result(Status.SKIPPED, msg, data=data)


def failed_run(what: str, result: RunResult) -> Result:
    """A FAILED result for a command that exited non-zero: its rc and the tail of stderr."""
    tail = (result.stderr.strip() or result.stdout.strip())[-500:]
    return failed(
        f"{what} failed (rc={result.rc}): {tail}",
        rc=result.rc,
        stdout=result.stdout,
        stderr=result.stderr,
    )


def combine(*results: Result) -> Result:
    """One result for an operation made of steps: failed > changed > skipped > ok; messages,
    diffs and data joined."""
    order = (Status.FAILED, Status.CHANGED, Status.SKIPPED, Status.OK)
    status = next(s for s in order if any(r.status is s for r in results))
    diffs = [r.diff for r in results if r.diff]
    data = {k: v for r in results for k, v in r.data.items()}
    msg = "; ".join(r.msg for r in results if r.msg)
    return Result(status, msg, "".join(diffs) if diffs else None, data=data)


@dataclass
class OpContext:
    """One host's view for operations: its connection, its facts and the run's modes."""

    conn: Connection
    facts: FactCache
    check: bool = False
    diff: bool = False
    #: Run privileged steps through sudo (``ansible_become``).
    become: bool = False

    def run(self, command: str, **kwargs: Any) -> RunResult:
        """Run ``command`` on the host, as root when the run uses ``become``."""
        return self.conn.run(command, become=self.become, **kwargs)

    def probe(self, fact: type[Fact[T]], *args: Any) -> T:
        """Gather ``fact`` now, uncached: for state that operations change (a file, a service)."""
        instance = fact()
        result = self.conn.run(instance.command(*args), become=self.become or instance.become)
        return instance.parse(result, *args)


def check_state(state: str | None, allowed: tuple[str | None, ...]) -> None:
    if state not in allowed:
        choices = ", ".join(str(a) for a in allowed)
        raise OpError(f"unknown state {state!r}", hint=f"use one of: {choices}")


Operation = Callable[..., Result]
