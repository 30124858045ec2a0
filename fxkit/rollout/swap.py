"""Replacing the instances of a batch that change revision: each one's previous run recorded,
then deregistered and drained; switched to the revision its batch prepared (with a role that
switches instances itself: :meth:`Swap.switch`); registered once ready; rolled back when the
batch fails. One connection per host serves the whole batch."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

from fxkit.connection import Connection
from fxkit.engine.rolevars import RoleVars
from fxkit.engine.runner import Runner, shielded
from fxkit.engine.serving import ServingRole
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext
from fxkit.ops.instances import InstanceReady, InstanceStarted
from fxkit.rollout.drain import Target, metrics_url, smoke_command, smoke_problem, wait_drained
from fxkit.rollout.report import Hooks, Instance, InstanceStatus
from fxkit.rollout.rollback import Previous, capture, keep, restore
from fxkit.rollout.state import InstanceState, opened, revisions_of, wanted_revision


@dataclass
class Swap:
    """Deregisters and drains the instances of a batch that change revision; registers them
    again once ready."""

    runner: Runner
    hostvars: dict[str, HostVars]
    before: dict[str, InstanceState]
    hooks: Hooks
    #: Each host's folder of revision records (where runs are kept for undo).
    folders: dict[str, str] = field(default_factory=dict)
    #: How each replaced instance ran before its batch.
    previous: dict[str, Previous] = field(default_factory=dict)
    #: When each instance was deregistered (the controller's monotonic clock).
    out_at: dict[str, float] = field(default_factory=dict)
    #: The serving role, when it switches instances itself (``PREPARE``, ``switch_instance``,
    #: ``switch_ready``); None: a batch's playbook run starts them.
    role: ServingRole[RoleVars] | None = None
    #: The revision each host's batch prepared.
    revisions: dict[str, str] = field(default_factory=dict)
    #: Each host's open connection and operations' context, for the batch.
    contexts: dict[str, OpContext] = field(default_factory=dict)
    held: ExitStack = field(default_factory=ExitStack)

    def context(self, host: str) -> OpContext:
        """The host's context for operations; its connection opened once, kept until
        :meth:`close`."""
        if host not in self.contexts:
            conn, become = self.held.enter_context(opened(self.runner, host, self.hostvars[host]))
            self.contexts[host] = OpContext(
                conn=conn, facts=FactCache(conn), check=False, diff=False, become=become
            )
        return self.contexts[host]

    def close(self) -> None:
        """Close the batch's connections."""
        self.contexts.clear()
        self.held.close()

    def changing(self, item: Instance) -> bool:
        """It serves now, and the batch gives it another revision."""
        state = self.before.get(item.key)
        return state is not None and bool(state.pid) and state.running != state.wanted

    def prepared(self, hosts: list[str]) -> None:
        """Read the revision each host's batch prepared (its model's manifest may have been
        staged meanwhile): the one its instances switch to."""
        assert self.role is not None
        for host in hosts:
            ctx = self.context(host)
            rev = revisions_of(self.role, self.role.Vars.of(self.hostvars[host]))
            self.revisions[host] = wanted_revision(ctx.conn, ctx.become, rev)
            for key, state in self.before.items():
                if state.host == host:
                    self.before[key] = replace(state, wanted=self.revisions[host])

    def out(self, group: list[Instance]) -> str | None:
        """Record, deregister and drain the group's changing instances; why not (None:
        done)."""
        for item in filter(self.changing, group):
            ctx = self.context(item.host)
            was = capture(ctx.conn, ctx.become, item.unit, self.folders.get(item.host, ""))
            if was is not None:
                self.previous[item.key] = was
                keep(ctx.conn, ctx.become, self.folders[item.host], item.name, was)
            if self.hooks.deregister:
                error = self.hooks.deregister.run("deregister", target(item))
                if error:
                    return f"{item.key}: {error}"
            self.out_at[item.key] = time.monotonic()
            url = metrics_url(item.ready_url)
            item.drained, item.drain_s = wait_drained(
                ctx.conn, ctx.become, url, self.hooks.drain_timeout
            )
        return None

    def switch(self, items: list[Instance], specs: Mapping[str, Any] | None = None) -> None:
        """Point each of ``items`` at its host's prepared revision and start it (those on it
        already are left running), then await each: their status, time to ready and message,
        as a batch's run would report them. ``specs``: the role's spec of an item by its unit
        (a surge copy's); else the role's instance of that name."""
        role: Any = self.role
        started = []
        for item in items:
            v = role.Vars.of(self.hostvars[item.host])
            spec = (specs or {}).get(item.unit) or next(
                s for s in role.instance_specs(v) if s.name == item.name
            )
            with shielded():  # Ctrl-C waits until the instance's restart is done and recorded
                done = role.switch_instance(
                    self.context(item.host), v, spec, self.revisions[item.host]
                )
            report = InstanceStarted.read(done.data)
            item.restarted = bool(report and report.restarted)
            if done.failed:
                item.status, item.msg = InstanceStatus.FAILED, done.msg
            else:
                started.append((item, v, spec))
        for item, v, spec in started:
            ready = role.switch_ready(self.context(item.host), v, spec)
            item.msg = ready.msg
            if ready.failed:
                item.status = InstanceStatus.FAILED
                continue
            served = InstanceReady.read(ready.data)
            item.status = InstanceStatus.READY if item.restarted else InstanceStatus.UNCHANGED
            item.load_s = served.load_s if served else None
            item.time_to_ready_s = served.time_to_ready_s if served and item.restarted else None

    def register(self, item: Instance) -> str:
        """Run the register hook for ``item`` (timed); what went wrong ("": nothing). Its time
        out of service ends here."""
        error = ""
        if self.hooks.register:
            start = time.monotonic()
            error = self.hooks.register.run("register", target(item))
            item.register_s = round(time.monotonic() - start, 3)
        if item.key in self.out_at:
            item.not_serving_s = round(time.monotonic() - self.out_at.pop(item.key), 3)
        return error

    def reregister(self, group: list[Instance]) -> str:
        """Register again the group's instances deregistered so far (they still run)."""
        errors = []
        for item in filter(self.changing, group):
            errors.append(self.register(item))
        told = "; ".join(e for e in errors if e)
        return f"; {told}" if told else ""

    def back(self, group: list[Instance]) -> str | None:
        """Register the group's instances that are ready on their new revision."""
        for item in group:
            state = self.before.get(item.key)
            if item.status is not InstanceStatus.READY:
                continue
            item.revision = state.wanted if state else ""
            kept = item.host in self.folders
            ctx = self.context(item.host) if kept else None
            if ctx and self.hooks.smoke_prompt and not self.smoke(ctx.conn, ctx.become, item):
                continue
            error = self.register(item)
            if error:
                return f"{item.key}: {error}"
            if ctx:  # after the register hook: not part of the time out of service
                now = capture(ctx.conn, ctx.become, item.unit, self.folders[item.host])
                if now is not None:
                    keep(ctx.conn, ctx.become, self.folders[item.host], item.name, now)
        for item in group:
            state = self.before.get(item.key)
            if item.status is InstanceStatus.UNCHANGED and state is not None:
                item.revision = state.running
        return None

    def smoke(self, conn: Connection, become: bool, item: Instance) -> bool:
        """The smoke request answered with the right shape; else the instance failed."""
        command = smoke_command(item.ready_url, item.served_name, self.hooks.smoke_prompt)
        problem = smoke_problem(conn.run(command, become=become).stdout, item.served_name)
        if problem:
            item.status, item.msg = InstanceStatus.FAILED, f"smoke request: {problem}"
        return not problem

    def roll_back(self, group: list[Instance], interrupted: bool) -> list[str]:
        """Start the group's replaced instances again as they ran before (after an interrupt,
        those not ready on the new revision only); what was rolled back, or why not."""
        told = []
        for item in group:
            left = item.status in (InstanceStatus.UNCHANGED, InstanceStatus.NOT_RUN)
            if left or (interrupted and item.status is InstanceStatus.READY):
                continue
            was = self.previous.get(item.key)
            if was is None:
                told.append(
                    f"{item.key} not rolled back (no run of it was read: it was not running)"
                )
                continue
            ctx = self.context(item.host)
            done = restore(
                ctx.conn, ctx.become, item.unit, was, item.ready_url, item.served_name,
                self.hooks.ready_timeout,
            )  # fmt: skip
            if done.failed:
                told.append(f"{item.key} could not be rolled back: {done.msg}")
                continue
            why = item.msg
            item.status, item.revision = InstanceStatus.ROLLED_BACK, was.revision
            item.msg = f"rolled back to {was.revision or 'its previous run'}; why: {why}"
            told.append(f"{item.key} to {was.revision or 'its previous run'}")
            error = self.register(item)
            if error:
                told.append(f"{item.key}: {error}")
        return told


def target(item: Instance) -> Target:
    return Target(item.host, item.name, item.address, item.port)
