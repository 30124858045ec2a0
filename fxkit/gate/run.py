"""Running a gate: its checks on every host at once, over the hosts' connections.

Before any host is touched, every check's ``when``, measurement and rule are rendered for every
host (an undefined variable or a wrong parameter is one error naming them all). Then each host,
in its own thread, opens its connection and makes each measurement once (checks that share one,
such as every GPU check on ``{fact: gpus}``, share its result), judging each check as its
measurement comes in. A host that cannot be reached has every check ERROR, with the reason.
Ctrl-C (:meth:`GateRun.interrupt`) stops the hosts before their next measurement (soaks at
their next sample); a second Ctrl-C cuts off the measurements still running: their commands are
killed on the hosts with all they started (fio, a benchmark), then the connections closed. What
was measured is reported, the rest is ERROR ("interrupted").

What a run gives out, its results, the checks it reports as they are judged and its errors,
has every secret masked (:attr:`GateRun.masker`): no caller prints one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from jinja2 import meta
from pydantic import ValidationError

from fxkit.connection import Connection, ConnectOptions, connect
from fxkit.engine.role import RoleLoader, roles_path
from fxkit.engine.runner import ctrl_c, load_inventory
from fxkit.engine.variables import HostVars, Layer, environment
from fxkit.errors import ConnectionFailed, FxkitError, masked_errors
from fxkit.facts.base import FactCache
from fxkit.gate import outliers, platforms
from fxkit.gate.fleet import HostFleetCheck, is_fleet, measure_fleet
from fxkit.gate.measure import KINDS, MeasuredHost, MeasureError, Params
from fxkit.gate.report import masked, write_reports
from fxkit.gate.spec import CheckSpec, Gate, GateError, params_problem, strings
from fxkit.gate.spec import load as load_gate
from fxkit.gate.verdicts import (
    CheckResult,
    GateResult,
    HostChecks,
    Measurement,
    baseline_name,
    baseline_value,
    judge,
    skipped,
    unset,
)
from fxkit.inventory import lab_only
from fxkit.inventory.model import Inventory, InventoryHost
from fxkit.redaction import Masker
from fxkit.varfiles import truthy

#: Called after each check is judged on a host (for progress).
Progress = Callable[[str, CheckResult], None]


@dataclass
class GateOptions:
    """How a gate runs: what ``fxkit gate NAME``'s options say (``--limit``, ``-e``,
    ``--baseline`` as a loaded result...)."""

    limit: str | None = None
    forks: int = 50
    connect: ConnectOptions = field(default_factory=ConnectOptions)
    extra_vars: dict[str, Any] = field(default_factory=dict)
    roles_path: list[str] = field(default_factory=list)
    #: An earlier run's results, for ``change`` rules (``--baseline``).
    baseline: GateResult | None = None
    #: The ``-i`` sources (recorded in the results; :meth:`GateRun.load` sets them).
    inventory_sources: list[str] = field(default_factory=list)
    #: The stages whose checks run (``--stage``); empty: every check.
    stages: list[str] = field(default_factory=list)


class _Planned(NamedTuple):
    """One check, rendered for one host."""

    check: CheckSpec
    #: Why it is skipped (its ``when:`` is false), else None.
    skip: str | None
    kind: str
    #: None when a variable the check ``requires`` is unset (it is not measured).
    params: Params | None
    rule: dict[str, Any]
    #: The variables it ``requires`` that this host does not set (the check is ERROR).
    unset: tuple[str, ...] = ()


@dataclass
class _Plan:
    """One host's checks, rendered."""

    inv: InventoryHost
    vars: HostVars
    checks: list[_Planned]


class GateRun:
    """One run of one gate on an inventory's hosts; :meth:`run` returns the results."""

    def __init__(
        self,
        gate: Gate,
        inventory: Inventory,
        options: GateOptions,
        *,
        connector: Callable[[str, Mapping[str, Any], ConnectOptions], Connection] = connect,
        progress: Progress | None = None,
    ):
        self.gate = gate
        self.inventory = inventory
        self.options = options
        self.connector = connector
        self.progress = progress
        self.stop = threading.Event()
        self.cut = threading.Event()  # the second Ctrl-C
        self._interrupts = itertools.count(1)
        #: The run's secrets: every host's, and what its templates made of them.
        self.masker = Masker()
        if options.connect.become_password:
            self.masker.add([options.connect.become_password])
        self._lock = threading.Lock()
        self._connections: list[Connection] = []
        #: The hosts kept connected for the fleet phase (fxkit.gate.fleet), by name.
        self._nodes: dict[str, MeasuredHost] = {}
        #: The variables the rules name: their values are kept in the results.
        self._referenced = sorted(referenced(gate))

    @classmethod
    def load(
        cls,
        gate: str | Path | Gate,
        inventory: str | Path | Sequence[str | Path],
        options: GateOptions | None = None,
        *,
        progress: Progress | None = None,
    ) -> GateRun:
        """A run of ``gate`` (a built-in name such as ``g1``, a gate file, or one loaded) on the
        hosts of ``inventory`` (paths or built-in names, merged in order, as ``-i`` gives
        them), which the results name."""
        sources = [inventory] if isinstance(inventory, str | Path) else list(inventory)
        options = replace(options or GateOptions(), inventory_sources=[str(s) for s in sources])
        loaded = gate if isinstance(gate, Gate) else load_gate(gate)
        return cls(loaded, load_inventory(sources), options, progress=progress)

    @property
    def secrets(self) -> frozenset[str]:
        return self.masker.values

    def interrupt(self) -> int:
        """Ctrl-C: the first stops hosts before their next measurement, the second cuts off the
        running ones (killed on the hosts by threads of their own: this runs in the signal
        handler, where a second Ctrl-C may interrupt the first). Which Ctrl-C it was."""
        number = next(self._interrupts)  # one step: a nested handler counts apart
        self.stop.set()
        if number == 2:
            self.cut.set()
            with self._lock:
                connections = list(self._connections)
            for conn in connections:
                threading.Thread(target=_cancel, args=(conn,)).start()
        return number

    def hosts(self) -> list[InventoryHost]:
        try:
            hosts = self.inventory.select(self.gate.spec.hosts, self.options.limit)
        except FxkitError as exc:
            raise GateError(exc.message, where=self.gate.where(""), hint=exc.hint) from None
        try:
            lab_only.check(hosts, f"hosts of gate {self.gate.name}")
        except FxkitError as exc:
            raise GateError(exc.message, where=exc.where, hint=exc.hint) from None
        if not hosts:
            raise GateError(
                f"no host matches {self.gate.spec.hosts!r}"
                + (f" and --limit {self.options.limit!r}" if self.options.limit else ""),
                where=str(self.gate.path),
                hint="check the inventory (fxkit inventory -i ... --graph) and --limit",
            )
        return hosts

    def plan(self) -> list[_Plan]:
        """Every host's checks, and the variables its connection reads (``ansible_*``),
        rendered; all mistakes at once, before any host is touched."""
        self.gate.checks_of(self.options.stages)  # an unknown stage, before anything
        outliers.settings(self.gate.spec.vars, self.options.extra_vars)
        with masked_errors(self.masker.text):
            return self._plan()

    def _plan(self) -> list[_Plan]:
        defaults = role_defaults(self.gate, self.options.roles_path)
        plans, problems, hints = [], [], set()

        def attempt(render: Callable[[], Any], host: str, where: str = "") -> Any:
            try:
                return render()
            except FxkitError as exc:
                problems.append(f"{where}{problem(exc, host)}")
                hints.add(exc.hint)
                return None

        for inv in self.hosts():
            v = host_vars(inv, self.gate, defaults, self.options.extra_vars, self.masker.add)
            self.masker.add(v.secret_values())
            for name in sorted(n for n in v if n.startswith("ansible_")):
                attempt(functools.partial(v.__getitem__, name), inv.name)
            checks = []
            for check in self.gate.checks_of(self.options.stages):
                where = f"{self.gate.where(check.id)}: "
                planned = attempt(functools.partial(self._render, check, v), inv.name, where)
                if planned is not None:
                    checks.append(planned)
            plans.append(_Plan(inv, v, checks))
        if problems:
            more = f"\n  (and {len(problems) - 20} more)" if len(problems) > 20 else ""
            hint = next(iter(hints)) if len(hints) == 1 else None
            raise GateError(
                "\n  ".join(problems[:20]) + more,
                hint=hint
                or "define the variables (inventory, the gate's vars:, -e) or fix the check",
            )
        return plans

    def _render(self, check: CheckSpec, v: HostVars) -> _Planned:
        label = f"check {check.id}"
        skip = None
        if check.when is not None:
            when = render(v, check.when, f"{label}, when")
            if not truthy(when):
                skip = f"when: {_short(check.when)} is false on this host"
        name, raw = next(iter(check.measure.items()))
        missing = tuple(n for n in check.requires if n not in v or v[n] in (None, "", [], {}))
        if missing and skip is None:  # not measured: its templates may need what is unset
            return _Planned(check, skip, name, None, {}, missing)
        params = render(v, raw, f"{label}, measure")
        try:
            parsed = KINDS[name].parse(params)
        except ValidationError as exc:
            raise FxkitError(f"{label}: measure {params_problem(name, exc)}") from None
        return _Planned(check, skip, name, parsed, render(v, check.rule, f"{label}, rule"))

    def run(self, plans: list[_Plan] | None = None) -> GateResult:
        """Run the gate; ``plans``: what :meth:`plan` returned, when it was called first."""
        plans = plans if plans is not None else self.plan()
        result = GateResult(
            gate=self.gate.name,
            title=self.gate.spec.title,
            gate_file=str(self.gate.path),
            gate_sha256=self.gate.sha256,
            started_at=_now(),
            inventory=list(self.options.inventory_sources),
            limit=self.options.limit,
            baseline=baseline_name(self.options.baseline) if self.options.baseline else None,
            stages=self.gate.expected_stages(),
            stages_run=list(self.options.stages),
        )
        with ThreadPoolExecutor(max_workers=self.options.forks) as pool:
            futures = [pool.submit(self._host, plan) for plan in plans]
            while wait(futures, timeout=0.2).not_done:
                pass  # short waits: the main thread takes Ctrl-C between them
        for plan, future in zip(plans, futures, strict=True):
            result.hosts[plan.inv.name] = future.result()
        try:
            self._fleet(plans, result)
        finally:
            for node in self._nodes.values():
                with contextlib.suppress(Exception):
                    node.conn.close()
        result.finished_at = _now()
        result.interrupted = self.stop.is_set()
        result.fleet_settings = outliers.settings(self.gate.spec.vars, self.options.extra_vars)
        result.fleet = outliers.view(result, result.fleet_settings)
        return masked(result, self.masker.masks)

    def _fleet(self, plans: list[_Plan], result: GateResult) -> None:
        """The checks measured across hosts (node pairs, paced storage reads), after every
        host's own; in a thread, so that the main thread takes Ctrl-C."""

        def where(planned: _Planned) -> str:
            return self.gate.where(planned.check.id)

        checks = [
            HostFleetCheck(
                plan.inv.name,
                p.check,
                p.skip,
                p.kind,
                p.params,
                p.rule,
                self.gate.where(p.check.id),
            )
            for plan in plans
            for p in plan.checks
            if is_fleet(p.kind) and p.params is not None
        ]
        if not checks:
            return

        def report(host: str, checked: CheckResult) -> None:
            if self.progress:
                self.progress(host, self._shown(checked))

        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(
                measure_fleet,
                checks,
                result.hosts,
                self._nodes,
                order=[c.id for c in self.gate.spec.checks],
                stop=self.stop,
                baseline=self.options.baseline,
                report=report,
            )
            while wait([future], timeout=0.2).not_done:
                pass
            future.result()

    def _host(self, plan: _Plan) -> HostChecks:
        values, sources = snapshot(plan.vars, self._referenced)
        host = HostChecks(plan.inv.name, vars=values, var_sources=sources)
        conn = self.connector(plan.inv.name, plan.vars, self.options.connect)
        with self._lock:
            self._connections.append(conn)
        try:
            if not self.stop.is_set():
                conn.open()
        except ConnectionFailed as exc:
            host.unreachable = str(exc)
        node = MeasuredHost(
            plan.inv.name,
            conn,
            FactCache(conn),
            plan.vars,
            become=self.gate.spec.become,
            stop=self.stop,
        )
        done: dict[str, int] = {}
        keep = False  # connected still for the fleet phase
        try:
            for check, skip, name, params, rule, missing in plan.checks:
                where = self.gate.where(check.id)
                if is_fleet(name) and params is not None:  # measured in the fleet phase
                    keep = keep or skip is None
                    continue
                if skip is not None:
                    checked = skipped(check, skip, where)
                elif missing or params is None:
                    checked = unset(check, list(missing), where)
                else:
                    key = json.dumps([name, params.model_dump(mode="json")], sort_keys=True)
                    if key not in done:
                        done[key] = len(host.measurements)
                        node.timeout = check.timeout
                        host.measurements.append(self._measure(node, name, params, host))
                    index = done[key]
                    base = baseline_value(self.options.baseline, plan.inv.name, check)
                    checked = judge(check, rule, host.measurements[index], index, base, where)
                host.checks.append(checked)
                if self.progress:
                    self.progress(plan.inv.name, self._shown(checked))
        finally:
            if keep and host.unreachable is None and not self.cut.is_set():
                with self._lock:
                    self._nodes[plan.inv.name] = node
            else:
                with contextlib.suppress(Exception):
                    conn.close()
        self.masker.add(plan.vars.secret_values())
        return host

    def _shown(self, checked: CheckResult) -> CheckResult:
        """``checked`` as progress shows it: a copy with the run's secrets masked, or itself
        while the run has none (a copy per check is most of what progress costs)."""
        if not self.masker.masks:
            return checked
        return CheckResult.from_json(self.masker.data(asdict(checked)))

    def _measure(self, node: MeasuredHost, name: str, params: Any, host: HostChecks) -> Measurement:
        measurement = Measurement(name, params.model_dump(mode="json"))
        started = time.monotonic()
        if host.unreachable is not None:
            measurement.error = f"unreachable: {host.unreachable}"
        elif self.stop.is_set():
            measurement.error = "interrupted (Ctrl-C) before it ran"
        else:
            try:
                measurement.data = KINDS[name].measure(node, params)
            except (MeasureError, FxkitError) as exc:
                if self.cut.is_set():  # killed, or its connection closed, by the second Ctrl-C
                    measurement.error = "interrupted (Ctrl-C): cut off while it ran"
                elif isinstance(exc, ConnectionFailed):
                    host.unreachable = str(exc)
                    measurement.error = f"unreachable: {exc}"
                else:
                    measurement.error = str(exc)
        measurement.duration_s = round(time.monotonic() - started, 3)
        return measurement


def run_gate(
    gate: str | Path | Gate,
    inventory: str | Path | Sequence[str | Path],
    options: GateOptions | None = None,
    *,
    progress: Progress | None = None,
    reports: str | Path | None = None,
) -> GateResult:
    """Run ``gate`` on the hosts of ``inventory`` (see :meth:`GateRun.load`), as ``fxkit gate``
    does: every check rendered first (mistakes raise before any host is touched), then the hosts
    in parallel, Ctrl-C stopping them (a second one cuts off the running measurements). Writes
    result.json and the reports into the folder ``reports``, when given. The results, with
    every secret masked."""
    runner = GateRun.load(gate, inventory, options, progress=progress)
    plans = runner.plan()
    with ctrl_c(runner.interrupt):
        result = runner.run(plans)
    if reports is not None:
        write_reports(result, Path(reports), runner.secrets)
    return result


def _cancel(conn: Connection) -> None:
    """Kill what runs on ``conn``'s host and close it; a broken link must not hide results."""
    with contextlib.suppress(Exception):
        conn.cancel()


def role_defaults(gate: Gate, extra_paths: list[str]) -> list[Layer]:
    """The defaults of the gate's ``roles:``, lowest first."""
    loader = RoleLoader(roles_path(None, extra_paths))
    return [
        Layer(f"role {name} defaults", loader.load(name, str(gate.path)).defaults)
        for name in gate.spec.roles
    ]


def host_vars(
    inv: InventoryHost,
    gate: Gate,
    defaults: list[Layer],
    extra_vars: Mapping[str, Any],
    on_secret: Callable[[Iterable[str]], None] | None = None,
) -> HostVars:
    """A host's variables for a gate, by precedence: the roles' defaults, the gate's ``vars:``
    (its default thresholds), the thresholds of the platform the host's ``<gate>_platform``
    names (fxkit.gate.platforms), the inventory's (per group, per host), then ``-e``."""
    above = [
        Layer("inventory", inv.vars, origins=inv.origins),
        Layer("extra vars", extra_vars),
        Layer("fxkit", {"inventory_hostname": inv.name, "gate_name": gate.name}),
    ]
    below = [*defaults, Layer(gate_layer(gate), gate.spec.vars)]
    platform = platforms.layer(gate.name, HostVars(inv.name, [*below, *above]))
    layers = [*below, *([platform] if platform else []), *above]
    return HostVars(inv.name, layers, on_secret=on_secret)


def render(v: HostVars, value: Any, label: str) -> Any:
    """Every template string in ``value`` rendered with the host's variables."""
    if isinstance(value, str):
        if "{{" in value or "{%" in value:
            return v.render_string(value, label)
        return value
    if isinstance(value, dict):
        return {k: render(v, item, label) for k, item in value.items()}
    if isinstance(value, list):
        return [render(v, item, label) for item in value]
    return value


def referenced(gate: Gate) -> set[str]:
    """The variables the gate's rules and conditions name, and those its ``vars:`` name (kept
    in the results, so that re-evaluation can render the gate's vars again)."""
    names: set[str] = set()
    env = environment()
    texts = [*strings([c.rule for c in gate.spec.checks]), *strings(gate.spec.vars)]
    texts += [c.when for c in gate.spec.checks if isinstance(c.when, str)]
    for text in texts:
        with contextlib.suppress(Exception):
            names |= meta.find_undeclared_variables(env.parse(text))
    return names


def problem(exc: FxkitError, host: str) -> str:
    """A rendering error in one line, for a check's file:line: the host, the variable or part
    of the check (``exc.where``) and what is wrong."""
    where = f"{exc.where}: " if exc.where and exc.where != f"host {host}" else ""
    named = f"host {host}" in exc.message  # Jinja2's errors say "... for host H"
    return f"{where}{exc.message}" if named else f"host {host}: {where}{exc.message}"


def gate_layer(gate: Gate) -> str:
    return f"gate {gate.name} vars"


def snapshot(v: HostVars, names: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The rendered, non-secret values of ``names`` (the variables the gate's rules use), and
    where each came from (a role's defaults, the gate's vars, the inventory, -e)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(FxkitError):
            value = v[name]
            if not v.is_secret(name):  # after rendering: a value reading a secret is one
                values[name] = value
                sources[name] = v.source(name)
    return values, sources


def rule_renderer(
    gate: Gate,
    extra_vars: Mapping[str, Any],
    roles_paths: list[str] | None = None,
    on_secret: Callable[[Iterable[str]], None] | None = None,
) -> Callable[[HostChecks, CheckSpec], dict[str, Any]]:
    """Renders a check's rule for a host of earlier results (``fxkit gate evaluate``): the
    roles' defaults, the run's values from them, the gate file's current ``vars:`` (not the
    run's), the run's values from the inventory and -e, then this ``-e``. The run's values are
    data, as they were rendered in the run: never rendered again. ``on_secret`` is told of the
    secrets among them, and of what the rules make of them."""
    defaults = role_defaults(gate, roles_paths or [])

    def rule(host: HostChecks, check: CheckSpec) -> dict[str, Any]:
        def kept(below_gate: bool) -> dict[str, Any]:
            return {
                name: value
                for name, value in host.vars.items()
                if host.var_sources.get(name, "") != gate_layer(gate)
                and host.var_sources.get(name, "").startswith("role ") == below_gate
            }

        layers = [
            *defaults,
            Layer("the run's role defaults", kept(True), rendered=True),
            Layer(gate_layer(gate), gate.spec.vars),
            Layer("the run's variables", kept(False), rendered=True),
            Layer("extra vars", extra_vars),
        ]
        v = HostVars(host.name, layers, on_secret=on_secret)
        if on_secret:
            on_secret(v.secret_values())
        try:
            rendered: dict[str, Any] = render(v, check.rule, f"check {check.id}, rule")
        except FxkitError as exc:
            error = GateError(problem(exc, host.name), where=gate.where(check.id), hint=exc.hint)
            raise error from None
        return rendered

    return rule


def _short(condition: Any, width: int = 70) -> str:
    """A condition in one line of at most ``width`` characters."""
    text = " ".join(str(condition).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
