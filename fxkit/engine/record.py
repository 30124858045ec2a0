"""What a run did, host by host: the object :func:`fxkit.engine.runner.run_playbook` returns.

The reporter records every operation's outcome into a :class:`PlaybookResult` as host threads
report, redacted the way everything it prints is (:mod:`fxkit.engine.redaction`), so the
recap, the JSON log's summary events, the demo, and whatever writes reports from it never see
a secret value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from fxkit.ops.base import Status


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
