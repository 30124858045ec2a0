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
ready (:mod:`fxkit.rollout.drain`). A role that can (roles/vllm_lmcache) has each batch's
run prepare the new revision first (venv, model, files; nothing stopped), before any instance
is drained; each drained instance is then only switched to it and started
(:meth:`fxkit.rollout.swap.Swap.switch`). With ``max_surge``, where its node has room, a copy of it
on the new revision serves beside it meanwhile (:mod:`fxkit.rollout.surge`). A batch that
fails (or is interrupted) is rolled back: its replaced instances start again as they ran before
(:mod:`fxkit.rollout.rollback`), the rollout stops, and later batches are not touched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from fxkit import paths
from fxkit.engine.playbook import Play, Playbook
from fxkit.engine.record import Recorder
from fxkit.engine.rolevars import RoleVars
from fxkit.engine.runner import Runner, RunOptions, interruptible, load_inventory
from fxkit.engine.serving import ServingRole
from fxkit.engine.variables import HostVars
from fxkit.errors import PlaybookError, masked_errors
from fxkit.inventory import Inventory
from fxkit.rollout.batches import Batches, _read
from fxkit.rollout.report import FAILURES, Hooks, Instance, InstanceStatus, Rollout, table
from fxkit.rollout.state import InstanceState, gather, revisions_of
from fxkit.rollout.surge import Surge
from fxkit.rollout.swap import Swap

#: What a serving role defines so that a batch's run prepares its revision before any instance
#: is drained, and the rollout switches each instance itself (:class:`Batches`).
SWITCH = ("PREPARE", "switch_instance", "switch_ready")

__all__ = [
    "FAILURES",
    "Hooks",
    "Instance",
    "InstanceStatus",
    "Rollout",
    "_read",
    "batches",
    "plan",
    "planner",
    "rollout",
    "serving_hosts",
    "table",
]


def plan(runner: Runner) -> tuple[Play, ServingRole[RoleVars], list[Instance]]:
    """The play that rolls instances out, its serving role, and its instances, round-robin
    across its hosts."""
    play, role, hosts = serving_hosts(runner)
    return play, role, instances_of(role, hosts.values())


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


def instances_of(role: ServingRole[RoleVars], hosts: Iterable[HostVars]) -> list[Instance]:
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


def batches(
    play: Play, instances: Sequence[Instance], canary: bool, per_node: int | None = None
) -> list[list[Instance]]:
    """``serial`` batches of instances; with ``canary`` the first is one instance; with
    ``per_node`` a batch that would take more instances of one host is cut, in order, into
    batches that take at most that many (a node's unavailable instances at once)."""
    if not canary:
        groups = play.batches(instances)
    else:
        first, rest = list(instances[:1]), instances[1:]
        groups = [first, *play.batches(rest)] if first else []
    return [part for group in groups for part in _per_node(group, per_node)]


def _per_node(group: list[Instance], limit: int | None) -> list[list[Instance]]:
    if limit is None:
        return [group]
    parts: list[list[Instance]] = []
    for item in group:
        fits = next((p for p in parts if sum(i.host == item.host for i in p) < limit), None)
        if fits is None:
            parts.append([item])
        else:
            fits.append(item)
    return parts


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
    max_unavailable_per_node: int | None = None,
    max_surge: int = 0,
    surge_memory_reserve: int = 0,
) -> Rollout:
    """Roll the playbook's instances out (see :mod:`fxkit.rollout`). Each batch's run records
    with a :meth:`~Recorder.fresh` copy of ``recorder``: its listeners show and log it (see
    :func:`fxkit.engine.console.console_recorder`), its masker masks the secrets of them all."""
    book, hosts, runner = planner(playbook, inventory, options, recorder)
    with masked_errors(runner.recorder.redact):  # a role's instance_specs() may quote one
        play, role, hostvars = serving_hosts(runner)
        instances = instances_of(role, hostvars.values())
        hooks = hooks or Hooks()
        kept = getattr(role, "revision_plan", None) is not None
        if (hooks.register or hooks.deregister) and not kept:
            raise PlaybookError(
                "hooks need a serving role that keeps revisions (to know which instances change)",
                hint="roles/vllm_lmcache keeps them; or leave out --register-hook and "
                "--deregister-hook",
            )
        switches = kept and all(hasattr(role, a) for a in SWITCH)
        if max_surge and not (switches and hasattr(role, "surge_copies")):
            raise PlaybookError(
                "--max-surge needs a serving role that keeps revisions and defines "
                f"surge_copies(v, specs), {', '.join(SWITCH)}",
                hint="roles/vllm_lmcache does; or leave out --max-surge",
            )
        before = _states(runner, role, hostvars) if kept and not options.check else {}
    if serial is not None:
        play = play.model_copy(update={"serial": serial})
    limit = max_fail_percentage if max_fail_percentage is not None else play.max_fail_percentage
    result = Rollout(instances, check=options.check, started=datetime.now(UTC))
    start = time.monotonic()
    groups = batches(play, instances, canary, max_unavailable_per_node)
    result.batches = [[i.key for i in group] for group in groups]
    for number, group in enumerate(groups, 1):
        for item in group:
            item.batch = number
            item.previous = before[item.key].running if item.key in before else ""
    run = Batches(book, hosts, options, recorder, limit or 0.0, role.SELECT)
    run.drain = Swap(runner, hostvars, before, hooks, folders(role, hostvars) if kept else {})
    if switches and not options.check:  # check mode: the batch's whole run shows what changes
        run.prepare, run.drain.role = str(role.PREPARE), role  # type: ignore[attr-defined]
    if max_surge:
        run.surge = Surge(runner, role, hostvars, before, hooks, max_surge, surge_memory_reserve)
    try:
        with interruptible():
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


def folders(role: ServingRole[RoleVars], hostvars: dict[str, HostVars]) -> dict[str, str]:
    """Each host's folder of revision records."""
    return {h: revisions_of(role, role.Vars.of(v)).folder for h, v in hostvars.items()}


def _states(
    runner: Runner, role: ServingRole[RoleVars], hostvars: dict[str, HostVars]
) -> dict[str, InstanceState]:
    """Each instance's revision and health before the rollout."""
    states, _ = gather(runner, role, hostvars)
    return {f"{s.host}/{s.name}": s for s in states}
