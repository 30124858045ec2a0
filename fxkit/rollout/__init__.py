"""Rolling server instances out across nodes: batch by batch of instances, each batch started
and awaited by the playbook's role, stopped when too many of a batch fail; a report per instance
and for the whole fleet, read from the engine's results.

The playbook's first serving role (:mod:`fxkit.engine.serving`; role vllm_lmcache) lists the
instances: its ``instance_specs(v)``, for every host of its play. They are ordered round-robin
across hosts (the first instance of every host, then the second, ...), so a batch spreads over
the nodes, and cut into batches by the play's ``serial`` (or ``--serial``); ``canary`` makes the
first batch one instance. Each batch is one run of the playbook on the batch's hosts with the
role's ``SELECT`` variable (vllm_lmcache_rollout_instances) naming the batch's instances
(``host/name``): the role touches only those; earlier batches' instances are left as they run.
How each instance went is read from the reports of its instance operations
(:class:`~fxkit.ops.instances.InstanceStarted`, :class:`~fxkit.ops.instances.InstanceReady`).
A batch in which more than ``max_fail_percentage`` of the instances failed (default 0: any)
stops the rollout; the instances of later batches are reported ``not_run``.

With a role that keeps revisions (:mod:`fxkit.rollout.revision`), each host is read first
(:mod:`fxkit.rollout.state`): an instance whose running revision differs from the wanted one is
deregistered and drained before its batch runs, and registered again once its new revision is
ready (:mod:`fxkit.rollout.drain`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from rich.table import Table

from fxkit import paths
from fxkit.engine.playbook import Play, Playbook
from fxkit.engine.record import Outcome, PlaybookResult, Recorder, TaskResult
from fxkit.engine.rolevars import RoleVars
from fxkit.engine.runner import Runner, RunOptions, load_inventory
from fxkit.engine.serving import ServingRole
from fxkit.engine.variables import HostVars
from fxkit.errors import PlaybookError, masked_errors
from fxkit.inventory import Inventory
from fxkit.ops.base import Status
from fxkit.ops.instances import InstanceReady, InstanceReport, InstanceStarted
from fxkit.rollout.drain import Hook, Target, metrics_url, wait_drained
from fxkit.rollout.state import InstanceState, gather, opened
from fxkit.varfiles import Variables

R = TypeVar("R", bound=InstanceReport)


class InstanceStatus(StrEnum):
    """How an instance's part in the rollout went."""

    READY = "ready"  # started or restarted, and ready
    UNCHANGED = "unchanged"  # ran as configured: left as it was, ready
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    NOT_RUN = "not_run"  # the rollout stopped before its batch
    WOULD_START = "would_start"  # check mode: it would be started or restarted


#: The statuses of an instance that failed: they count against ``max_fail_percentage``.
FAILURES = (InstanceStatus.FAILED, InstanceStatus.UNREACHABLE)


@dataclass
class Instance:
    """One instance of the rollout and how it went."""

    host: str
    name: str
    unit: str
    gpus: list[int]
    port: int
    served_name: str
    batch: int = 0
    status: InstanceStatus = InstanceStatus.NOT_RUN
    restarted: bool = False
    load_s: float | None = None
    time_to_ready_s: float | None = None
    msg: str = ""
    #: Where clients reach it (the host's ansible_host), and its readiness URL.
    address: str = ""
    ready_url: str = ""
    #: The revision it ran before the rollout and the one it runs after ("": none, or unknown).
    previous: str = ""
    revision: str = ""
    #: Seconds it took to drain once deregistered (None: not drained), and whether it did.
    drain_s: float | None = None
    drained: bool | None = None

    @property
    def key(self) -> str:
        return f"{self.host}/{self.name}"


@dataclass(frozen=True)
class Hooks:
    """The load balancer's hooks and how long a drain may take."""

    deregister: Hook | None = None
    register: Hook | None = None
    drain_timeout: float = 60.0


@dataclass
class Rollout:
    """The whole rollout: every instance, the batches, why it stopped, the fleet's timing."""

    instances: list[Instance]
    batches: list[list[str]] = field(default_factory=list)
    check: bool = False
    stopped: str | None = None
    interrupted: bool = False
    started: datetime | None = None
    #: Seconds from the rollout's start until its last instance was ready; None unless all were.
    fleet_time_to_ready_s: float | None = None

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        ready = InstanceStatus.READY
        return 1 if self.stopped or any(i.status is not ready for i in self._acted()) else 0

    def _acted(self) -> list[Instance]:
        left = (InstanceStatus.UNCHANGED, InstanceStatus.WOULD_START)
        return [i for i in self.instances if i.status not in left]

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "started": self.started.isoformat() if self.started else None,
            "stopped": self.stopped,
            "interrupted": self.interrupted,
            "exit_code": self.exit_code,
            "fleet_time_to_ready_s": self.fleet_time_to_ready_s,
            "batches": self.batches,
            "instances": [asdict(i) for i in self.instances],
        }


def plan(runner: Runner) -> tuple[Play, ServingRole[RoleVars], list[Instance]]:
    """The play that rolls instances out, its serving role, and its instances, round-robin
    across its hosts."""
    play, role, hosts = serving_hosts(runner)
    return play, role, _instances(role, hosts.values())


def serving_hosts(runner: Runner) -> tuple[Play, ServingRole[RoleVars], dict[str, HostVars]]:
    """The first play with a serving role, that role, and each of its hosts' variables."""
    seen = []
    for play in runner.playbook.plays:
        for ref in play.roles:
            role = runner.roles.load(ref.role, ref.where)
            if role.serving is not None:
                return play, role.serving, runner.role_vars(play, ref, role)
            seen.append(role.name)
    raise PlaybookError(
        f"no play of {runner.playbook.path} has a serving role (roles: "
        f"{', '.join(dict.fromkeys(seen)) or 'none'})",
        hint="fxkit rollout needs a role whose role.py defines instance_specs(v), SELECT and "
        "Vars (fxkit.engine.serving), such as vllm_lmcache",
    )


def planner(
    playbook: str | Path,
    inventory: str | Path | Sequence[str | Path],
    options: RunOptions,
    recorder: Recorder,
) -> tuple[Playbook, Inventory, Runner]:
    """The playbook, the inventory and a runner that plans (validated; it runs nothing)."""
    book = Playbook.load(paths.resolve(playbook, "playbooks"))
    hosts = load_inventory(inventory)
    runner = Runner(book, hosts, options, Recorder(masker=recorder.masker))
    runner.validate()
    return book, hosts, runner


def _instances(role: ServingRole[RoleVars], hosts: Iterable[HostVars]) -> list[Instance]:
    per_host = []
    for v in hosts:
        specs = role.instance_specs(role.Vars.of(v))
        address = str(v.get("ansible_host") or v.host)
        per_host.append(
            [
                Instance(
                    v.host, s.name, s.unit, list(s.gpus), s.port, s.served_name,
                    address=address,
                    ready_url=getattr(s, "ready_url", f"http://127.0.0.1:{s.port}/v1/models"),
                )
                for s in specs
            ]
        )  # fmt: skip
    depth = max((len(h) for h in per_host), default=0)
    return [h[i] for i in range(depth) for h in per_host if i < len(h)]


def batches(play: Play, instances: Sequence[Instance], canary: bool) -> list[list[Instance]]:
    """``serial`` batches of instances; with ``canary`` the first is one instance."""
    if not canary:
        return play.batches(instances)
    first, rest = list(instances[:1]), instances[1:]
    return [first, *play.batches(rest)] if first else []


def rollout(
    playbook: str | Path,
    inventory: str | Path | Sequence[str | Path],
    options: RunOptions,
    recorder: Recorder,
    *,
    serial: list[int | str] | None = None,
    max_fail_percentage: float | None = None,
    canary: bool = False,
    hooks: Hooks | None = None,
) -> Rollout:
    """Roll the playbook's instances out (see :mod:`fxkit.rollout`). Each batch's run records
    with a :meth:`~Recorder.fresh` copy of ``recorder``: its listeners show and log it (see
    :func:`fxkit.engine.console.console_recorder`), its masker masks the secrets of them all."""
    book, hosts, runner = planner(playbook, inventory, options, recorder)
    with masked_errors(runner.recorder.redact):  # a role's instance_specs() may quote one
        play, role, hostvars = serving_hosts(runner)
        instances = _instances(role, hostvars.values())
        hooks = hooks or Hooks()
        kept = getattr(role, "revision_plan", None) is not None
        if (hooks.register or hooks.deregister) and not kept:
            raise PlaybookError(
                "hooks need a serving role that keeps revisions (to know which instances change)",
                hint="roles/vllm_lmcache keeps them; or leave out --register-hook and "
                "--deregister-hook",
            )
        before = _states(runner, role, hostvars) if kept and not options.check else {}
    if serial is not None:
        play = play.model_copy(update={"serial": serial})
    limit = max_fail_percentage if max_fail_percentage is not None else play.max_fail_percentage
    result = Rollout(instances, check=options.check, started=datetime.now(UTC))
    start = time.monotonic()
    groups = batches(play, instances, canary)
    result.batches = [[i.key for i in group] for group in groups]
    for number, group in enumerate(groups, 1):
        for item in group:
            item.batch = number
            item.previous = before[item.key].running if item.key in before else ""
    run = _Batches(book, hosts, options, recorder, limit or 0.0, role.SELECT)
    run.drain = _Drain(runner, hostvars, before, hooks)
    try:
        result.stopped = run.all(groups)
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    result.interrupted = (result.stopped or "").startswith("interrupted")
    if (
        not result.stopped
        and not options.check
        and all(i.status in (InstanceStatus.READY, InstanceStatus.UNCHANGED) for i in instances)
    ):
        result.fleet_time_to_ready_s = round(time.monotonic() - start, 3)
    return result


def _states(
    runner: Runner, role: ServingRole[RoleVars], hostvars: dict[str, HostVars]
) -> dict[str, InstanceState]:
    """Each instance's revision and health before the rollout."""
    states, _ = gather(runner, role, hostvars)
    return {f"{s.host}/{s.name}": s for s in states}


@dataclass
class _Drain:
    """Deregisters and drains the instances of a batch that change revision; registers them
    again once ready."""

    runner: Runner
    hostvars: dict[str, HostVars]
    before: dict[str, InstanceState]
    hooks: Hooks

    def changing(self, item: Instance) -> bool:
        """It serves now, and the batch gives it another revision."""
        state = self.before.get(item.key)
        return state is not None and bool(state.pid) and state.running != state.wanted

    def out(self, group: list[Instance]) -> str | None:
        """Deregister and drain the group's changing instances; why not (None: done)."""
        for item in filter(self.changing, group):
            if self.hooks.deregister:
                error = self.hooks.deregister.run("deregister", _target(item))
                if error:
                    return f"{item.key}: {error}"
            with opened(self.runner, item.host, self.hostvars[item.host]) as (conn, become):
                url = metrics_url(item.ready_url)
                item.drained, item.drain_s = wait_drained(
                    conn, become, url, self.hooks.drain_timeout
                )
        return None

    def back(self, group: list[Instance]) -> str | None:
        """Register the group's instances that are ready on their new revision."""
        for item in group:
            state = self.before.get(item.key)
            if item.status is not InstanceStatus.READY:
                continue
            item.revision = state.wanted if state else ""
            if self.hooks.register:
                error = self.hooks.register.run("register", _target(item))
                if error:
                    return f"{item.key}: {error}"
        for item in group:
            state = self.before.get(item.key)
            if item.status is InstanceStatus.UNCHANGED and state is not None:
                item.revision = state.running
        return None


def _target(item: Instance) -> Target:
    return Target(item.host, item.name, item.address, item.port)


@dataclass
class _Batches:
    """Runs the batches in turn, each with the role's ``select`` variable naming its
    instances."""

    book: Playbook
    hosts: Inventory
    options: RunOptions
    recorder: Recorder
    limit: float
    select: str
    drain: _Drain | None = None

    def all(self, groups: list[list[Instance]]) -> str | None:
        """Why the rollout stopped (None: it did not)."""
        order = [i.host for group in groups for i in group]
        for number, group in enumerate(groups, 1):
            where = f"batch {number}/{len(groups)}"
            stopped = self.drain.out(group) if self.drain else None
            if stopped:
                return f"{where}: {stopped}; the batch did not start"
            results = self.one(number, len(groups), group, order)
            _read(results, group)
            if results.interrupted:
                return f"interrupted during batch {number}"
            stopped = self.drain.back(group) if self.drain else None
            if stopped:
                return f"{where}: {stopped}"
            stopped = self.judge(number, len(groups), group)
            if stopped:
                return stopped
        return None

    def one(
        self, number: int, count: int, group: list[Instance], order: list[str]
    ) -> PlaybookResult:
        chosen = sorted({i.host for i in group}, key=order.index)
        options = self.options
        extra = Variables(options.extra_vars, getattr(options.extra_vars, "origins", {}))
        batch_vars = {self.select: [i.key for i in group]}
        extra.merge(Variables(batch_vars, {self.select: "fxkit rollout's batch"}))
        batch_options = replace(options, limit=":".join(chosen), extra_vars=extra)
        batch = self.recorder.fresh()
        batch.note(f"batch {number}/{count}: {', '.join(i.key for i in group)}", style="bold")
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


def table(result: Rollout) -> Table:
    """The report as a rich table: one row per instance, then the fleet's time to ready."""
    grid = Table(title="rollout", title_justify="left")
    for column in ("batch", "host", "instance", "GPUs", "port", "status", "load s", "ready s"):
        grid.add_column(column, justify="right" if column.endswith(" s") else "left")
    style = {
        InstanceStatus.READY: "green",
        InstanceStatus.UNCHANGED: "cyan",
        InstanceStatus.FAILED: "red",
        InstanceStatus.UNREACHABLE: "red",
    }
    for i in result.instances:
        grid.add_row(
            str(i.batch),
            i.host,
            i.name,
            ",".join(map(str, i.gpus)),
            str(i.port),
            f"[{style.get(i.status, 'yellow')}]{i.status}[/]",
            f"{i.load_s:.1f}" if i.load_s is not None else "-",
            f"{i.time_to_ready_s:.1f}" if i.time_to_ready_s is not None else "-",
        )
    if result.fleet_time_to_ready_s is not None:
        grid.caption = f"fleet time to ready: {result.fleet_time_to_ready_s:.1f} s"
        grid.caption_justify = "left"
    return grid
