"""``fxkit rollout status`` and ``history``: what each host runs and keeps, read over SSH.

Per instance, the revision it runs (``FXKIT_REVISION`` in its process's environment), the
revision its variables want now (:mod:`fxkit.rollout.revision`, with the model's digest read
from the host's stage manifest), its PID and its health (``/v1/models`` lists its served name).
Per host, the revisions it keeps (newest first) and which instances use each. Nothing changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from shlex import quote
from typing import Any

from rich.table import Table

from fxkit.connection import Connection
from fxkit.engine.rolevars import RoleVars
from fxkit.engine.runner import Runner
from fxkit.engine.serving import ServingRole
from fxkit.engine.variables import HostVars
from fxkit.errors import PlaybookError
from fxkit.ops.instances import STATE_DIR, Record
from fxkit.rollout.revision import (
    Kept,
    RevisionPlan,
    list_command,
    model_digest,
    parse_list,
    revision_id,
    running_command,
)
from fxkit.varfiles import truthy


@dataclass
class InstanceState:
    """One instance as its host has it now."""

    host: str
    name: str
    unit: str
    port: int
    pid: int
    running: str  # "" when it runs no revision (stopped, or started before revisions)
    wanted: str
    health: str  # ready, not ready, stopped, unreachable

    @property
    def current(self) -> bool:
        return bool(self.running) and self.running == self.wanted and self.health == "ready"


@dataclass
class HostHistory:
    """The revisions one host keeps, newest first, and the instances that use each."""

    host: str
    kept: list[Kept]
    wanted: str
    used: dict[str, list[str]] = field(default_factory=dict)


def revisions_of(role: ServingRole[RoleVars], v: RoleVars) -> RevisionPlan:
    """The role's :class:`RevisionPlan` for a host; a role without one is refused."""
    plan = getattr(role, "revision_plan", None)
    if plan is None:
        raise PlaybookError(
            "the playbook's serving role keeps no revisions",
            hint="a serving role defines revision_plan(v) -> fxkit.rollout.revision.RevisionPlan "
            "(roles/vllm_lmcache does)",
        )
    result: RevisionPlan = plan(v)
    return result


@contextmanager
def opened(runner: Runner, host: str, hostvars: HostVars) -> Iterator[tuple[Connection, bool]]:
    """The host's connection, open, and whether commands on it become root."""
    conn = runner.connector(host, hostvars, runner.options.connect)
    conn.open()
    try:
        yield conn, truthy(hostvars.get("ansible_become"))
    finally:
        conn.close()


def wanted_revision(conn: Connection, become: bool, rev: RevisionPlan) -> str:
    """The revision the variables want on this host (its model's manifest read there)."""
    manifest = conn.get(rev.manifest, become=become) if rev.manifest else None
    return revision_id(rev.inputs, model_digest(manifest))


def _pid(conn: Connection, become: bool, unit: str) -> int:
    """The instance's main PID, 0 when it does not run."""
    record = Record.parse(conn.get(f"{STATE_DIR}/{unit}.json", become=become))
    if record is None:
        return 0
    if record.backend == "systemd":
        out = conn.run(f"systemctl show -p MainPID --value -- {quote(unit)}", become=become)
        pid = int(out.stdout.strip() or 0) if out.stdout.strip().isdigit() else 0
    else:
        pid = record.pid
    alive = pid and conn.run(f"test -d /proc/{pid}", become=become).ok
    return pid if alive else 0


def _health(conn: Connection, url: str, served: str) -> str:
    q = quote(url)
    fetch = (
        f"curl -fsS -m 5 {q} 2>/dev/null || python3 -c 'import sys, urllib.request as u; "
        f"print(u.urlopen(sys.argv[1], timeout=5).read().decode())' {q} 2>/dev/null"
    )
    out = conn.run(fetch)
    try:
        ids = [card.get("id") for card in json.loads(out.stdout).get("data", [])]
    except (ValueError, AttributeError):
        return "not ready"
    return "ready" if served in ids else "not ready"


def host_states(
    runner: Runner, role: ServingRole[RoleVars], host: str, hostvars: HostVars
) -> tuple[list[InstanceState], HostHistory]:
    """The host's instances and its revisions."""
    v = role.Vars.of(hostvars)
    rev = revisions_of(role, v)
    specs = role.instance_specs(v)
    with opened(runner, host, hostvars) as (conn, become):
        wanted = wanted_revision(conn, become, rev)
        states = []
        for spec in specs:
            pid = _pid(conn, become, spec.unit)
            running = conn.run(running_command(pid), become=become).stdout.strip() if pid else ""
            url = getattr(spec, "ready_url", f"http://127.0.0.1:{spec.port}/v1/models")
            health = _health(conn, url, spec.served_name) if pid else "stopped"
            states.append(
                InstanceState(host, spec.name, spec.unit, spec.port, pid, running, wanted, health)
            )
        kept = parse_list(conn.run(list_command(rev.folder), become=become).stdout)
    history = HostHistory(host, kept, wanted)
    for state in states:
        if state.running:
            history.used.setdefault(state.running, []).append(state.name)
    return states, history


def gather(
    runner: Runner, role: ServingRole[RoleVars], hosts: Mapping[str, HostVars]
) -> tuple[list[InstanceState], list[HostHistory]]:
    """Every host's instances and revisions, host by host."""
    states: list[InstanceState] = []
    histories = []
    for host, hostvars in hosts.items():
        found, history = host_states(runner, role, host, hostvars)
        states += found
        histories.append(history)
    return states, histories


def status_table(states: list[InstanceState]) -> Table:
    grid = Table(title="rollout status", title_justify="left")
    for column in ("host", "instance", "port", "PID", "running", "wanted", "health"):
        grid.add_column(column)
    for s in states:
        color = "green" if s.current else "yellow" if s.health == "ready" else "red"
        grid.add_row(
            s.host,
            s.name,
            str(s.port),
            str(s.pid or "-"),
            s.running or "-",
            s.wanted,
            f"[{color}]{s.health}[/]",
        )
    return grid


def history_table(histories: list[HostHistory]) -> Table:
    grid = Table(title="rollout history", title_justify="left")
    for column in ("host", "revision", "recorded (UTC)", "model", "used by", "wanted"):
        grid.add_column(column)
    for h in histories:
        for kept in h.kept:
            when = datetime.fromtimestamp(kept.created, UTC).strftime("%Y-%m-%d %H:%M:%S")
            grid.add_row(
                h.host,
                kept.revision,
                when,
                str(kept.inputs.get("model", "")),
                ", ".join(h.used.get(kept.revision, [])) or "-",
                "yes" if kept.revision == h.wanted else "",
            )
    return grid


def to_json(states: list[InstanceState], histories: list[HostHistory]) -> dict[str, Any]:
    return {
        "instances": [
            {k: getattr(s, k) for k in s.__dataclass_fields__} | {"current": s.current}
            for s in states
        ],
        "history": {
            h.host: [
                {
                    "revision": k.revision,
                    "created": k.created,
                    "runs_kept": k.runs,
                    "used_by": h.used.get(k.revision),
                }
                for k in h.kept
            ]
            for h in histories
        },
    }
