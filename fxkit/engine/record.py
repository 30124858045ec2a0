"""What a run did, host by host: the :class:`Recorder` the runner and the hosts report to, and
the :class:`PlaybookResult` it records, which :func:`fxkit.engine.runner.run_playbook` returns.

The recorder records every operation's outcome as host threads report, redacted by its
:class:`~fxkit.redaction.Masker`, then tells its listeners: the console
(:class:`fxkit.engine.console.Reporter`), the JSON event log
(:class:`fxkit.engine.jsonlog.JsonLog`), or none (a run that only plans). So the results, the
recap, the log, the demo, and whatever writes reports from them never see a secret value.
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Self

from fxkit.ops.base import Result, Status
from fxkit.redaction import Masker


class Outcome(StrEnum):
    """How a host's part in the run ended."""

    NOT_RUN = "not_run"  # listed in a play, but the run stopped before its batch
    OK = "ok"  # ran every role it was given
    FAILED = "failed"  # an operation or a role failed: the host stopped there
    UNREACHABLE = "unreachable"  # its connection could not be opened, or broke
    INTERRUPTED = "interrupted"  # Ctrl-C stopped it before it finished


@dataclass(frozen=True)
class TaskResult:
    """One operation's outcome on one host (also host-level ones: unreachable, a role's error).

    ``data`` is the operation's own (e.g. a command's ``rc``, ``stdout``, ``stderr``)."""

    play: str
    role: str | None
    operation: str
    status: Status
    msg: str = ""
    diff: str | None = None
    duration_s: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Counts:
    """Tasks by status, a field per :class:`~fxkit.ops.base.Status` (the recap's columns;
    Ansible's stats less ``rescued`` and ``ignored``: a failure that ``ignore_errors`` let
    pass counts as failed, and the host goes on)."""

    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0

    @classmethod
    def of(cls, tasks: Iterable[TaskResult]) -> Counts:
        counted = Counter(task.status for task in tasks)
        return cls(**{status.value: counted[status] for status in Status})


@dataclass
class HostResult:
    name: str
    outcome: Outcome = Outcome.NOT_RUN
    tasks: list[TaskResult] = field(default_factory=list)

    @property
    def counts(self) -> Counts:
        return Counts.of(self.tasks)

    def summary(self) -> dict[str, Any]:
        """Its name, outcome and tasks by status (what Ansible's stats say of a host)."""
        return {"host": self.name, "outcome": str(self.outcome), **asdict(self.counts)}

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "tasks": [asdict(task) for task in self.tasks]}


@dataclass
class PlaybookResult:
    """Hosts in the order the plays listed them, with their tasks; the run's timing."""

    check: bool = False
    hosts: dict[str, HostResult] = field(default_factory=dict)
    #: Ctrl-C stopped the run.
    interrupted: bool = False
    started: datetime | None = None
    ended: datetime | None = None

    def host(self, name: str) -> HostResult:
        """The host's result, added on first use."""
        return self.hosts.setdefault(name, HostResult(name))

    def start(self) -> None:
        self.started = datetime.now(UTC)

    def end(self) -> None:
        self.ended = datetime.now(UTC)

    @property
    def duration_s(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return (self.ended - self.started).total_seconds()

    @property
    def counts(self) -> Counts:
        """Tasks by status, over every host."""
        return Counts.of(task for host in self.hosts.values() for task in host.tasks)

    def hosts_with(self, outcome: Outcome) -> list[str]:
        """The hosts whose part ended so: ``results.hosts_with(Outcome.FAILED)``."""
        return [name for name, host in self.hosts.items() if host.outcome is outcome]

    @property
    def exit_code(self) -> int:
        """``fxkit play``'s: 130 when interrupted, 1 when a host failed or was unreachable,
        else 0 (2, a mistake in the command line or the files, never gets a result)."""
        if self.interrupted:
            return 130
        if self.hosts_with(Outcome.FAILED) or self.hosts_with(Outcome.UNREACHABLE):
            return 1
        return 0

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``json.dumps``: timestamps in ISO 8601 (UTC)."""
        return {
            "check": self.check,
            "interrupted": self.interrupted,
            "exit_code": self.exit_code,
            "started": self.started.isoformat() if self.started else None,
            "ended": self.ended.isoformat() if self.ended else None,
            "duration_s": self.duration_s,
            "counts": asdict(self.counts),
            "hosts": {name: host.to_json() for name, host in self.hosts.items()},
        }


class Listener:
    """What a :class:`Recorder` tells each of its listeners as a run goes, every text in it
    redacted; each method does nothing here. The recorder calls them one at a time, in the
    order things happened (so a listener needs no lock of its own)."""

    def __enter__(self) -> Self:
        """The run starts (e.g. the console's live view)."""
        return self

    def __exit__(self, *exc: object) -> None:
        """The run is over, every host thread has reported."""

    def play_started(self, name: str, hosts: list[str]) -> None:
        """A play starts on these hosts."""

    def op_started(self, host: str, doing: str) -> None:
        """The host starts ``doing`` (``role / operation``, or a step of the runner's own)."""

    def task(self, host: str, task: TaskResult) -> None:
        """A task's result, as recorded."""

    def host_done(self, host: str, outcome: Outcome) -> None:
        """The host's thread is done with a play: how its part ended, so far."""

    def run_done(self, results: PlaybookResult) -> None:
        """Every host thread has reported: the run's results are final."""

    def note(self, msg: str, style: str) -> None:
        """A line for the reader (``style``: a rich style, e.g. ``bold red``)."""

    def traceback(self, text: str) -> None:
        """The traceback of a bug (in fxkit or an operation)."""

    def recap(self, results: PlaybookResult) -> None:
        """The summary of a run that is over (``fxkit play`` shows its table)."""


class Recorder:
    """A run's record: host threads report to one instance (thread-safe), which records into
    :attr:`results`, masking the secrets of :attr:`masker`, and tells its :attr:`listeners`."""

    def __init__(self, listeners: Iterable[Listener] = (), *, masker: Masker | None = None):
        """``masker``: the secrets to mask (a new one by default)."""
        self.listeners = list(listeners)
        self.masker = masker or Masker()
        self.results = PlaybookResult()
        self._lock = threading.RLock()
        self._entered = ExitStack()

    def fresh(self) -> Recorder:
        """A recorder for another run, with these listeners and secrets, and results of its
        own."""
        return Recorder(self.listeners, masker=self.masker)

    def __enter__(self) -> Recorder:
        with ExitStack() as stack:
            for listener in self.listeners:
                stack.enter_context(listener)
            self._entered = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered.close()

    # -- secrets ---------------------------------------------------------------------------

    def add_secrets(self, values: Iterable[str]) -> None:
        """Secret values to redact from now on (with their variants:
        :mod:`fxkit.redaction`)."""
        self.masker.add(values)

    def redact(self, text: str) -> str:
        return self.masker.text(text)

    # -- what the runner and host threads report -------------------------------------------

    def run_started(self, *, check: bool) -> None:
        with self._lock:
            self.results.check = check
            self.results.start()

    def play_started(self, name: str, hosts: list[str]) -> None:
        with self._lock:
            names = [self._host(host).name for host in hosts]
            for listener in self.listeners:
                listener.play_started(self.redact(name), names)

    def op_started(self, host: str, role: str | None, operation: str) -> None:
        doing = self.redact(f"{role} / {operation}" if role else operation)
        with self._lock:
            for listener in self.listeners:
                listener.op_started(self.redact(host), doing)

    def op_done(
        self, host: str, play: str, role: str | None, result: Result, duration_s: float
    ) -> None:
        """Record one operation's result."""
        task = TaskResult(
            play=play,
            role=role,
            operation=result.name,
            status=result.status,
            msg=result.msg,
            diff=result.diff,
            duration_s=round(duration_s, 6),
            data=result.data,
        )
        self._record(host, task)

    def host_unreachable(
        self,
        host: str,
        play: str,
        msg: str,
        role: str | None = None,
        operation: str = "connect",
    ) -> None:
        """The host could not be reached, or its link broke during ``role``'s ``operation``."""
        self._record(host, TaskResult(play, role, operation, Status.UNREACHABLE, msg))

    def host_error(self, host: str, play: str, role: str | None, msg: str) -> None:
        """A role or template error stopped the host (not an operation's result)."""
        self._record(host, TaskResult(play, role, "role", Status.FAILED, msg))

    def host_done(self, host: str, outcome: Outcome) -> None:
        """The host's thread is done with a play: how its part ended, so far."""
        with self._lock:
            record = self._host(host)
            record.outcome = outcome
            for listener in self.listeners:
                listener.host_done(record.name, outcome)

    def run_done(self, *, interrupted: bool) -> None:
        """Every host thread has reported: the run's end."""
        with self._lock:
            self.results.interrupted = interrupted
            self.results.end()
            for listener in self.listeners:
                listener.run_done(self.results)

    def note(self, msg: str, style: str = "bold") -> None:
        text = self.redact(msg)
        with self._lock:
            for listener in self.listeners:
                listener.note(text, style)

    def traceback(self, exc: BaseException) -> None:
        """The traceback of a bug (in fxkit or an operation), redacted like the rest."""
        text = self.redact("".join(traceback.format_exception(exc)))
        with self._lock:
            for listener in self.listeners:
                listener.traceback(text)

    def recap(self) -> None:
        """The run is over: its summary (the console's recap table)."""
        with self._lock:
            for listener in self.listeners:
                listener.recap(self.results)

    def _record(self, host: str, task: TaskResult) -> None:
        task = self._redacted(task)
        with self._lock:
            record = self._host(host)
            record.tasks.append(task)
            for listener in self.listeners:
                listener.task(record.name, task)

    def _host(self, name: str) -> HostResult:
        return self.results.host(self.redact(name))

    def _redacted(self, task: TaskResult) -> TaskResult:
        return replace(
            task,
            play=self.redact(task.play),
            role=task.role and self.redact(task.role),
            operation=self.redact(task.operation),
            msg=self.redact(task.msg),
            diff=task.diff and self.redact(task.diff),
            data=self.masker.data(task.data),
        )
