"""Surge (``--max-surge N``): a new revision started beside the old one before the old stops.

For each instance of a batch that changes revision, while its node has room (the serving role's
``surge_copies(v, specs)``: GPUs its layout leaves free, ports after the layout's) and fewer
than N of the batch's copies run there, the batch first starts a *surge copy* of it on the
revision the batch prepared (:meth:`fxkit.rollout.swap.Swap.switch`: the same preparation
serves the copy and the instance, one playbook run per batch). Once the copy is ready the
register hook puts it in the load balancer; then the old instance is deregistered, drained and
replaced in its own slot as without surge (:mod:`fxkit.rollout.swap`), so that the
fleet ends on its layout; once that is ready and registered, the copy is deregistered, drained
and stopped, and its GPUs are free for the next batch. The instance is served all along: by the
old one, by both, by the copy, by both again, by the new one.

A copy needs memory too: what its instance's processes hold now (resident anonymous memory,
:class:`fxkit.facts.system.SessionMemory`) plus what the role's ``surge_memory(v, spec)`` says
its variables take (LMCache's CPU buffer, allocated whole at start, which a GPU driver's
mapping may hide from the first), must fit in the node's ``MemAvailable`` less the reserve
(``--surge-memory-reserve``), the copies accepted before it counted. An instance with no room
(GPUs or memory) falls back to draining first (max unavailable), and the report says why
(``no_surge``). A copy that does not become ready fails its instance: the copy is stopped, the
old instance was never touched and serves on, and the rollout stops as for any failed batch.

``fxkit rollout undo --max-surge N`` starts its copies as the target revision ran (``runs``:
the kept run of each instance, :mod:`fxkit.rollout.undo`), on the copy's GPUs and port.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from shlex import quote
from typing import Any

from fxkit.engine.rolevars import RoleVars
from fxkit.engine.runner import Runner
from fxkit.engine.serving import ServingRole
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache, FactError
from fxkit.facts.system import Memory, SessionMemory
from fxkit.ops.base import OpContext
from fxkit.ops.instances import instance
from fxkit.ops.systemd import UNIT_DIR, systemd_missing
from fxkit.rollout.drain import metrics_url, wait_drained
from fxkit.rollout.report import Hooks, Instance, InstanceStatus
from fxkit.rollout.rollback import Previous
from fxkit.rollout.state import InstanceState, opened
from fxkit.rollout.swap import target


@dataclass
class Surge:
    """Plans, starts, registers and retires the surge copies of a rollout's batches."""

    runner: Runner
    role: ServingRole[RoleVars]
    hostvars: dict[str, HostVars]
    before: dict[str, InstanceState]
    hooks: Hooks
    #: Copies that may run at once per node.
    per_node: int
    #: Bytes of memory each node keeps available beside its copies.
    reserve: int = 0
    #: Each instance's copy (by the instance's key), while it runs.
    copies: dict[str, Instance] = field(default_factory=dict)
    #: Each copy's spec (by its unit): its command line, environment and environment file.
    specs: dict[str, Any] = field(default_factory=dict)
    #: The run each instance's copy starts as (by the instance's key; undo's); else the role's
    #: spec of the wanted revision.
    runs: dict[str, Previous] = field(default_factory=dict)

    def plan(self, group: list[Instance]) -> list[Instance]:
        """The copies the group's changing instances get (as :class:`Instance`, ``batch``
        and ``previous`` those of the instance they stand beside); each instance that gets
        none is told why (``no_surge``)."""
        changing = [i for i in group if _changing(self.before.get(i.key))]
        planned = []
        for host in dict.fromkeys(i.host for i in changing):
            v = self.role.Vars.of(self.hostvars[host])
            by_name = {s.name: s for s in self.role.instance_specs(v)}
            mine = [i for i in changing if i.host == host]
            specs = [self.as_run(by_name[i.name], self.runs.get(i.key)) for i in mine]
            fitting = self.role.surge_copies(v, specs)  # type: ignore[attr-defined]
            reasons = self.room(host, v, mine, fitting)
            for item, spec, why in zip(mine, fitting, reasons, strict=True):
                if why:
                    item.no_surge = why
                    continue
                copy = replace(
                    item, name=spec.name, unit=spec.unit, gpus=list(spec.gpus), port=spec.port,
                    ready_url=spec.ready_url, status=InstanceStatus.NOT_RUN, msg="",
                )  # fmt: skip
                item.surge = f"{spec.name} (port {spec.port}, GPUs {list(spec.gpus)})"
                self.specs[spec.unit] = spec
                planned.append(copy)
                self.copies[item.key] = copy
        return planned

    def room(self, host: str, v: RoleVars, items: list[Instance], copies: list[Any]) -> list[str]:
        """Why each of ``items`` gets no copy on ``host``, in order ("": it gets ``copies``'
        one): no free GPUs (no copy), the node's copies at ``per_node``, or no room in memory.
        A copy needs what its instance's processes hold now plus what the role's
        ``surge_memory(v, spec)`` says its variables take (buffers a driver maps may not show
        in what they hold), out of the node's MemAvailable less the reserve and the copies
        accepted before it. Where what an instance holds cannot be read, it gets no copy."""
        declared = getattr(self.role, "surge_memory", None)
        pids = [self.before[item.key].pid for item in items]
        held, left = self.memory(host, [p for p, c in zip(pids, copies, strict=True) if c])
        reasons, accepted = [], 0
        for pid, copy in zip(pids, copies, strict=True):
            if copy is None:
                reasons.append(f"no free GPUs for it on {host} beside the layout")
            elif accepted == self.per_node:
                reasons.append(f"{host} runs {self.per_node} copies at once at most (--max-surge)")
            elif pid not in held:
                reasons.append(
                    f"what it holds in memory could not be read on {host} (/proc/{pid}/status)"
                )
            else:
                need = held[pid] + (declared(v, copy) if declared else 0)
                if need > left:
                    reasons.append(
                        f"no room in {host}'s memory: its copy needs {_gib(need)} (what the "
                        f"instance holds and its buffers), {_gib(max(left, 0))} is available "
                        f"(MemAvailable less the reserve of {_gib(self.reserve)} and the copies "
                        "before it)"
                    )
                    continue
                left -= need
                accepted += 1
                reasons.append("")
        return reasons

    def memory(self, host: str, pids: list[int]) -> tuple[dict[int, int], int]:
        """What the sessions led by ``pids`` hold on ``host`` (by PID), and the node's
        MemAvailable less the reserve (nothing read when there are none; nothing held when
        the host cannot say)."""
        if not pids:
            return {}, 0
        with opened(self.runner, host, self.hostvars[host]) as (conn, become):
            facts = FactCache(conn)
            try:
                left = facts.get(Memory, become=become).available - self.reserve
                return facts.get(SessionMemory, *pids, become=become), left
            except FactError:
                return {}, 0

    @staticmethod
    def as_run(spec: Any, run: Previous | None) -> Any:
        """``spec`` with the command line and environment of ``run`` (none: as it is)."""
        return spec if run is None else replace(spec, argv=list(run.argv), env=dict(run.env))

    def register(self, copies: list[Instance]) -> str | None:
        """Put the ready copies in the load balancer; why not (None: done)."""
        for copy in copies:
            if copy.status is InstanceStatus.READY and self.hooks.register:
                error = self.hooks.register.run("register", target(copy))
                if error:
                    return f"{copy.key}: {error}"
        return None

    def failed(self, group: list[Instance], copies: list[Instance]) -> list[Instance]:
        """The group's instances whose copy is not ready fail: their copy is stopped, they
        serve on, untouched. The group's others."""
        for item in group:
            copy = self.copies.get(item.key)
            if copy is None or copy.status is InstanceStatus.READY:
                continue
            item.status = InstanceStatus.FAILED
            item.msg = (
                f"its surge copy {copy.name} did not become ready ({copy.msg}); the old "
                "revision was not touched and serves on"
            )
        self.retire([c for c in copies if c.status is not InstanceStatus.READY], hooks=False)
        return [i for i in group if i.status is not InstanceStatus.FAILED]

    def retire(self, copies: list[Instance], hooks: bool = True) -> str | None:
        """Deregister, drain and stop the copies (their environment and unit files removed);
        why a hook failed (None: all went)."""
        error = None
        for copy in copies:
            if hooks and self.hooks.deregister and copy.status is InstanceStatus.READY:
                error = self.hooks.deregister.run("deregister", target(copy)) or error
            spec = self.specs.pop(copy.unit)
            with opened(self.runner, copy.host, self.hostvars[copy.host]) as (conn, become):
                if copy.status is InstanceStatus.READY:
                    copy.drained, copy.drain_s = wait_drained(
                        conn, become, metrics_url(copy.ready_url), self.hooks.drain_timeout
                    )
                ctx = OpContext(conn=conn, facts=FactCache(conn), check=False, diff=False,
                                become=become)  # fmt: skip
                instance(ctx, copy.unit, spec.argv, spec.env, state="stopped")
                own_unit = quote(f"{UNIT_DIR}/{copy.unit}")  # its switch wrote it
                reload = "" if systemd_missing(ctx) else " && systemctl daemon-reload"
                conn.run(f"rm -f -- {quote(spec.env_file)} {own_unit}{reload}", become=become)
            self.copies = {k: c for k, c in self.copies.items() if c is not copy}
        return error

    def running(self) -> list[Instance]:
        return list(self.copies.values())


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _changing(state: InstanceState | None) -> bool:
    return state is not None and bool(state.pid) and state.running != state.wanted
