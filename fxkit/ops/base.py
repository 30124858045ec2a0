"""What every operation receives and returns.

An operation is a plain function ``op(ctx, ...) -> Result``. It reads the current state, compares
it with the desired state, and changes only what differs. The context keeps the two apart:

- reads always run, in check mode too: :meth:`OpContext.read` (a command that changes nothing),
  :meth:`OpContext.get` (a file's content), :meth:`OpContext.fact` and :meth:`OpContext.fresh`;
- every change goes through :meth:`OpContext.change`, the one path that check mode skips: there it
  runs nothing and reports the change it would make (``would ...``), with its diff and command.

So check mode holds by construction, not by each operation remembering it. When ``ctx.diff`` is
set operations fill ``Result.diff`` (a unified diff for file contents, ``before -> after`` lines
for attributes). Operations never print; they return results and the runner reports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from fxkit.connection.base import Connection, RunResult, Stdin
from fxkit.errors import ConnectionFailed, FxkitError
from fxkit.facts.base import Fact, FactCache

T = TypeVar("T")


class OpError(FxkitError):
    """An operation was called with arguments it cannot work with (a bad mode, an unknown state)."""


class Status(StrEnum):
    """An operation's status, and a task's in the run's results (the recap's columns)."""

    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    SKIPPED = "skipped"
    #: Recorded by the engine for a task that found its host unreachable; never an operation's.
    UNREACHABLE = "unreachable"


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
    diffs and data joined (the commands check mode would have run, of every step)."""
    order = (Status.FAILED, Status.CHANGED, Status.SKIPPED, Status.OK)
    status = next(s for s in order if any(r.status is s for r in results))
    diffs = [r.diff for r in results if r.diff]
    data = {k: v for r in results for k, v in r.data.items()}
    commands = [c for r in results for c in r.data.get("commands", ())]
    if commands:
        data["commands"] = commands
    msg = "; ".join(r.msg for r in results if r.msg)
    return Result(status, msg, "".join(diffs) if diffs else None, data=data)


@dataclass
class OpContext:
    """One host's view for operations: its connection, its facts and the run's modes.

    Operations use its methods, never ``conn`` directly: reads through :meth:`read`, :meth:`get`,
    :meth:`fact` and :meth:`fresh`; changes through :meth:`change` only.
    """

    conn: Connection
    facts: FactCache
    check: bool = False
    diff: bool = False
    #: Run privileged steps through sudo (``ansible_become``).
    become: bool = False
    #: Host-wide steps an operation left for a later one (``"daemon-reload"`` after a unit file
    #: changed with ``daemon_reload=False``); one set, shared by the views ``Host.task`` makes.
    pending: set[str] = field(default_factory=set)

    # -- reads: they run in check mode too ------------------------------------------------

    def read(self, command: str, *, timeout: float | None = None) -> RunResult:
        """Run a command that changes nothing on the host (a probe, a guard, a status)."""
        return self.conn.run(command, become=self.become, timeout=timeout)

    def get(self, path: str) -> bytes | None:
        """The content of a file on the host, None when it does not exist."""
        return self.conn.get(path, become=self.become)

    def exists(self, path: str) -> bool | None:
        """Whether ``path`` exists (a link: its target), learnt without a command
        (:meth:`Connection.stat`); None where the connection cannot tell without one."""
        try:
            return self.conn.stat(path, become=self.become, follow=True) is not None
        except ConnectionFailed:
            raise
        except (FxkitError, NotImplementedError):
            return None

    def fact(self, fact: type[Fact[T]], *args: Any) -> T:
        """A fact, gathered once per run and kept until the next change to the host."""
        return self.facts.get(fact, *args, become=self.become)

    def fresh(self, fact: type[Fact[T]], *args: Any) -> T:
        """Gather ``fact`` now, uncached: for state that operations change (a file, a service)."""
        return self.facts.gather(fact, *args, become=self.become)

    # -- the one path for changes ---------------------------------------------------------

    def change(
        self,
        command: str,
        *,
        would: str,
        done: str,
        diff: str | None = None,
        stdin: Stdin = None,
        timeout: float | None = None,
    ) -> Result:
        """Change the host by running ``command``, or in check mode only say so.

        ``would`` says what the change does ("install curl"), ``done`` what it did ("installed
        curl"); ``diff`` is shown when the run asks for diffs. In check mode nothing runs: the
        result is ``changed("would install curl")`` with the diff and, in ``data["commands"]``,
        the command it would have run. Otherwise the command runs: ``changed(done)`` with its
        ``rc``, ``stdout`` and ``stderr`` in ``data``, or ``failed`` with the tail of its output.
        After a change the host's cached facts are dropped (they may describe the old state).
        """
        shown = diff if self.diff else None
        if self.check:
            return changed(f"would {would}", shown, commands=[command])
        result = self.conn.run(command, become=self.become, stdin=stdin, timeout=timeout)
        self.facts.changed()
        if not result.ok:
            return failed_run(would, result)
        return changed(done, shown, rc=result.rc, stdout=result.stdout, stderr=result.stderr)


def check_state(state: str | None, allowed: tuple[str | None, ...]) -> None:
    if state not in allowed:
        choices = ", ".join(str(a) for a in allowed)
        raise OpError(f"unknown state {state!r}", hint=f"use one of: {choices}")


Operation = Callable[..., Result]
