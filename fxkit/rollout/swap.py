"""Replacing the instances of a batch that change revision: each deregistered, drained and its
previous run recorded before the batch; registered once ready; rolled back when the batch
fails."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fxkit.connection import Connection
from fxkit.engine.runner import Runner
from fxkit.engine.variables import HostVars
from fxkit.rollout.drain import Target, metrics_url, smoke_command, smoke_problem, wait_drained
from fxkit.rollout.report import Hooks, Instance, InstanceStatus
from fxkit.rollout.rollback import Previous, capture, keep, restore
from fxkit.rollout.state import InstanceState, opened


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

    def changing(self, item: Instance) -> bool:
        """It serves now, and the batch gives it another revision."""
        state = self.before.get(item.key)
        return state is not None and bool(state.pid) and state.running != state.wanted

    def out(self, group: list[Instance]) -> str | None:
        """Deregister and drain the group's changing instances; why not (None: done)."""
        for item in filter(self.changing, group):
            if self.hooks.deregister:
                error = self.hooks.deregister.run("deregister", target(item))
                if error:
                    return f"{item.key}: {error}"
            self.out_at[item.key] = time.monotonic()
            with opened(self.runner, item.host, self.hostvars[item.host]) as (conn, become):
                was = capture(conn, become, item.unit)
                if was is not None:
                    self.previous[item.key] = was
                    keep(conn, become, self.folders[item.host], item.name, was)
                url = metrics_url(item.ready_url)
                item.drained, item.drain_s = wait_drained(
                    conn, become, url, self.hooks.drain_timeout
                )
        return None

    def register(self, item: Instance) -> str:
        """Run the register hook for ``item``; how long it was out of service."""
        error = self.hooks.register.run("register", target(item)) if self.hooks.register else ""
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
            if item.host in self.folders:
                with opened(self.runner, item.host, self.hostvars[item.host]) as (conn, become):
                    if self.hooks.smoke_prompt and not self.smoke(conn, become, item):
                        continue
                    now = capture(conn, become, item.unit)
                    if now is not None:
                        keep(conn, become, self.folders[item.host], item.name, now)
            error = self.register(item)
            if error:
                return f"{item.key}: {error}"
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
                    f"{item.key} not rolled back (no run of it was read: under systemd, or stopped)"
                )
                continue
            with opened(self.runner, item.host, self.hostvars[item.host]) as (conn, become):
                done = restore(
                    conn, become, item.unit, was, item.ready_url, item.served_name,
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
