"""Running the batches: each one run of the playbook with the role's ``SELECT`` variable naming
its instances, how each instance went read from the run's results, and the rollout's stop rule."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from fxkit.engine.playbook import Playbook
from fxkit.engine.record import Outcome, PlaybookResult, Recorder, TaskResult
from fxkit.engine.runner import Runner, RunOptions
from fxkit.inventory import Inventory
from fxkit.ops.base import Status
from fxkit.ops.instances import InstanceReady, InstanceReport, InstanceStarted
from fxkit.rollout.report import FAILURES, Instance, InstanceStatus
from fxkit.rollout.surge import Surge
from fxkit.rollout.swap import Swap
from fxkit.varfiles import Variables

R = TypeVar("R", bound=InstanceReport)


@dataclass
class Batches:
    """Runs the batches in turn, each with the role's ``select`` variable naming its
    instances. With ``prepare`` (the role's variable for it), a batch's run prepares its
    revision only, before any of its instances is drained, and each instance is then switched to
    it by :meth:`Swap.switch`: out of service for the drain, the switch and its start alone."""

    book: Playbook
    hosts: Inventory
    options: RunOptions
    recorder: Recorder
    limit: float
    select: str
    drain: Swap | None = None
    surge: Surge | None = None
    prepare: str | None = None

    def all(self, groups: list[list[Instance]]) -> str | None:
        """Why the rollout stopped (None: it did not)."""
        order = [i.host for group in groups for i in group]
        for number, group in enumerate(groups, 1):
            try:
                stopped = self.batch(number, len(groups), group, order)
            finally:
                error = self.surge.retire(self.surge.running()) if self.surge else None
                if self.drain:
                    self.drain.close()
            if error and not stopped:
                stopped = f"batch {number}/{len(groups)}: retiring its surge copies: {error}"
            if stopped:
                return stopped
        return None

    def batch(self, number: int, count: int, group: list[Instance], order: list[str]) -> str | None:
        """Run one batch; why the rollout stopped (None: it goes on)."""
        where = f"batch {number}/{count}"
        if self.prepare:
            try:
                group, stopped = self.prepared(number, count, group, order)
            except KeyboardInterrupt:
                return f"interrupted during batch {number}'s preparation (nothing replaced)"
            if stopped:
                return stopped
        if self.surge:
            try:
                group, stopped = self.beside(number, count, group)
            except KeyboardInterrupt:
                return f"interrupted during batch {number}'s surge (nothing replaced)"
            if stopped:
                return stopped
        if not group:
            return None
        try:
            stopped = self.drain.out(group) if self.drain else None
        except KeyboardInterrupt:
            told = self.drain.reregister(group) if self.drain else ""
            return f"interrupted before batch {number} started (nothing replaced){told}"
        if stopped:
            return f"{where}: {stopped}; the batch did not start"
        try:
            interrupted = self.step(number, count, group, order)
        except KeyboardInterrupt:
            interrupted = True
            if self.drain:  # a command may have been cut short: roll back over fresh connections
                self.drain.close()
            for item in group:
                if item.status is InstanceStatus.NOT_RUN:
                    item.status, item.msg = InstanceStatus.FAILED, "interrupted"
        if interrupted:
            return f"interrupted during batch {number}" + self.undo(group, True)
        stopped = self.drain.back(group) if self.drain else None
        if stopped:
            return f"{where}: {stopped}"
        stopped = self.judge(number, count, group)
        if stopped:
            return stopped + self.undo(group, False)
        return None

    def prepared(
        self, number: int, count: int, group: list[Instance], order: list[str]
    ) -> tuple[list[Instance], str | None]:
        """Prepare the group's revision on its hosts: one run of the playbook with the role's
        ``prepare`` variable set (venv, model, files; nothing started or stopped). The
        instances to switch (those of a host whose preparation failed fail, untouched), and
        why the rollout stopped (None: it goes on)."""
        assert self.drain is not None and self.prepare
        results = self.one(number, count, group, order, {self.prepare: True}, " (its revision)")
        if results.interrupted:
            return group, f"interrupted during batch {number}'s preparation (nothing replaced)"
        for item in group:
            host = results.hosts.get(item.host)
            if host is None or host.outcome is not Outcome.OK:
                why = _last_failure(host.tasks) if host else "its host did not run"
                bad = host is not None and host.outcome is Outcome.UNREACHABLE
                item.status = InstanceStatus.UNREACHABLE if bad else InstanceStatus.FAILED
                item.msg = f"preparing its revision: {why}; it was not touched"
        rest = [i for i in group if i.status is InstanceStatus.NOT_RUN]
        self.drain.prepared(list(dict.fromkeys(i.host for i in rest)))
        return rest, self.judge(number, count, group) if len(rest) < len(group) else None

    def beside(
        self, number: int, count: int, group: list[Instance]
    ) -> tuple[list[Instance], str | None]:
        """Start and register the group's surge copies on the prepared revision
        (:mod:`fxkit.rollout.surge`); the instances to replace next (those whose copy failed
        are left), and why the rollout stopped (None: it goes on)."""
        assert self.surge is not None and self.drain is not None
        copies = self.surge.plan(group)
        for item in group:
            if item.no_surge:
                self.recorder.note(f"batch {number}/{count}: no surge copy for {item.key}: "
                                   f"{item.no_surge}; it is drained first")  # fmt: skip
        if not copies:
            return group, None
        self.recorder.note(f"batch {number}/{count}: surge copies {_names(copies)}")
        self.start_copies(copies)
        self.tell(copies)
        rest = self.surge.failed(group, copies)
        error = self.surge.register([c for c in copies if c.status is InstanceStatus.READY])
        if error:
            return rest, f"batch {number}/{count}: {error}; the batch did not start"
        return rest, self.judge(number, count, group) if len(rest) < len(group) else None

    def start_copies(self, copies: list[Instance]) -> None:
        """Start the surge copies on the revision the batch prepared, and await them."""
        assert self.surge is not None and self.drain is not None
        self.drain.switch(copies, self.surge.specs)

    def undo(self, group: list[Instance], interrupted: bool) -> str:
        """Roll the group back; the report's words for it."""
        told = self.drain.roll_back(group, interrupted) if self.drain else []
        return f"; rolled back: {', '.join(told)}" if told else ""

    def step(self, number: int, count: int, group: list[Instance], order: list[str]) -> bool:
        """Start the group's instances on the new revision and read how each went: switched
        to the prepared one, or the batch's run of the playbook; whether it was interrupted."""
        if self.prepare and self.drain:
            self.recorder.note(f"batch {number}/{count}: switching {_names(group)}")
            self.drain.switch(group)
            self.tell(group)
            return False
        results = self.one(number, count, group, order)
        _read(results, group)
        return results.interrupted

    def tell(self, group: list[Instance]) -> None:
        """A line per switched instance: how it went."""
        for item in group:
            bad = item.status in FAILURES
            self.recorder.note(f"{item.key}: {item.status}: {item.msg}", "red" if bad else "")

    def one(
        self,
        number: int,
        count: int,
        group: list[Instance],
        order: list[str],
        more: dict[str, object] | None = None,
        what: str = "",
    ) -> PlaybookResult:
        chosen = sorted({i.host for i in group}, key=order.index)
        options = self.options
        extra = Variables(options.extra_vars, getattr(options.extra_vars, "origins", {}))
        batch_vars = {self.select: [i.key for i in group], **(more or {})}
        extra.merge(Variables(batch_vars, dict.fromkeys(batch_vars, "fxkit rollout's batch")))
        batch_options = replace(options, limit=":".join(chosen), extra_vars=extra)
        batch = self.recorder.fresh()
        batch.note(f"batch {number}/{count}{what}: {_names(group)}", style="bold")
        with batch:
            return Runner(self.book, self.hosts, batch_options, batch).run()

    def judge(self, number: int, count: int, group: list[Instance]) -> str | None:
        failed = [i for i in group if i.status in FAILURES]
        percent = 100.0 * len(failed) / len(group)
        if percent <= self.limit:
            return None
        names = ", ".join(f"{i.key} ({i.status})" for i in failed)
        after = [
            "later batches did not start" if number < count else "",
            "earlier ones were left running" if number > 1 else "",
        ]
        return (
            f"batch {number}/{count}: {len(failed)} of {len(group)} instances failed "
            f"({percent:.0f}% > max_fail_percentage {self.limit:g}%): {names}"
            + "".join(f"; {part}" for part in after if part)
        )


def _names(group: list[Instance]) -> str:
    return ", ".join(i.key for i in group)


def _read(results: PlaybookResult, group: Iterable[Instance]) -> None:
    """Each instance's status, load time and time to ready, from the reports of its instance
    operations among its host's tasks."""
    for item in group:
        host = results.hosts.get(item.host)
        if host is None:
            item.status, item.msg = InstanceStatus.FAILED, "its host did not run"
            continue
        mine = [t for t in host.tasks if _unit(t) == item.unit]
        started, ready = _first(mine, InstanceStarted), _first(mine, InstanceReady)
        failure = next((t for t in mine if t.status is Status.FAILED), None)
        item.restarted = started is not None and started[0].status is Status.CHANGED
        if host.outcome is Outcome.UNREACHABLE:
            item.status, item.msg = InstanceStatus.UNREACHABLE, _last_failure(host.tasks)
        elif failure is not None:
            item.status, item.msg = InstanceStatus.FAILED, failure.msg
        elif results.check and started is not None:
            item.status = InstanceStatus.WOULD_START if item.restarted else InstanceStatus.UNCHANGED
            item.msg = started[0].msg
        elif ready is not None:
            task, report = ready
            item.status = InstanceStatus.READY if item.restarted else InstanceStatus.UNCHANGED
            item.load_s = report.load_s
            item.time_to_ready_s = report.time_to_ready_s if item.restarted else None
            item.msg = task.msg
        else:
            item.status, item.msg = InstanceStatus.FAILED, _last_failure(host.tasks)


def _unit(task: TaskResult) -> str | None:
    """The instance a task's result reports on (None: not an instance operation's)."""
    report = InstanceReport.read(task.data)
    return report.unit if report else None


def _first(tasks: Iterable[TaskResult], kind: type[R]) -> tuple[TaskResult, R] | None:
    """The first task whose result is a ``kind`` report, with that report."""
    for task in tasks:
        report = kind.read(task.data)
        if report is not None:
            return task, report
    return None


def _last_failure(tasks: list[TaskResult]) -> str:
    failures = [t for t in tasks if t.status in (Status.FAILED, Status.UNREACHABLE)]
    if not failures:
        return "the host stopped before this instance"
    last = failures[-1]
    return f"{last.operation}: {last.msg}"
