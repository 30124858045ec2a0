"""A gate run's results: every measurement, every check's value, rule and status; as JSON.

Statuses: PASS, FAIL (a critical check's rule does not hold), WARN (a warning's does not),
ERROR (the check could not be judged: the tool is missing, the command failed, the output did
not parse, the host was unreachable: never PASS, and the reason is kept) and SKIP (its ``when``
is false; the reason says so): :class:`CheckStatus`. A host, and the gate, FAIL when a check
FAILs, else are ERROR when a check is ERROR, else PASS.

:func:`judge` applies a check's rule to its measurement, once: the status, and the rule's
thresholds as numbers (:class:`~fxkit.gate.rules.Bounds`, per item for per-item values) are
kept in the result, and every report only shows them. :func:`reevaluate` judges an earlier
run's measurements again against a gate file's current rules, without touching the hosts.
The JSON format (``schema: fxkit-gate-result/1``) is documented in docs/GATES.md.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from fxkit.errors import FxkitError
from fxkit.gate import rules
from fxkit.gate.rules import Bounds
from fxkit.gate.spec import CheckSpec, Gate, GateError
from fxkit.localfile import write_whole
from fxkit.redaction import redact_data

SCHEMA = "fxkit-gate-result/1"


class CheckStatus(StrEnum):
    """A check's status; a host's and the gate's verdict is PASS, FAIL or ERROR."""

    PASS = "PASS"
    FAIL = "FAIL"  # a critical check's rule does not hold
    WARN = "WARN"  # a warning's rule does not hold
    ERROR = "ERROR"  # it could not be judged (not measured, a rule that cannot apply)
    SKIP = "SKIP"  # its ``when`` is false


@dataclass
class Measurement:
    """One kind of measurement with its parameters, made once per host for all its checks."""

    kind: str
    params: dict[str, Any]
    data: Any = None
    #: Why it could not be made (its checks are ERROR), else None.
    error: str | None = None
    duration_s: float = 0.0


@dataclass
class ItemCheck:
    """One item of a per-item value (a GPU, a port), judged by the check's rule alone."""

    status: CheckStatus
    bounds: Bounds | None = None


@dataclass
class CheckResult:
    id: str
    title: str
    severity: str
    status: CheckStatus
    reason: str
    #: The value the rule was applied to (None when there is none).
    value: Any = None
    #: The rule as applied (templates rendered), and in words.
    rule: dict[str, Any] = field(default_factory=dict)
    expected: str = ""
    unit: str | None = None
    why: str = ""
    #: The index of the host's measurement it was judged on (None: skipped, not measured).
    measurement: int | None = None
    #: For ``change`` rules: the baseline's value and the relative change.
    baseline_value: Any = None
    change: float | None = None
    #: The check's file:line.
    where: str = ""
    #: The rule's thresholds for a number judged by a numeric rule (what the charts draw).
    bounds: Bounds | None = None
    #: For a per-item value: each item's status and thresholds.
    items: dict[str, ItemCheck] = field(default_factory=dict)
    #: Where the criterion and threshold come from, and the check's stage (the gate file's).
    source: str | None = None
    stage: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        """A check as result.json keeps it (one of an older fxkit, without thresholds, too)."""
        items = data.get("items") or {}
        return cls(
            **{
                **data,
                "status": CheckStatus(data["status"]),
                "bounds": _read_bounds(data.get("bounds")),
                "items": {
                    name: ItemCheck(CheckStatus(item["status"]), _read_bounds(item.get("bounds")))
                    for name, item in items.items()
                },
            }
        )


def _read_bounds(data: Mapping[str, Any] | None) -> Bounds | None:
    return None if data is None else Bounds(**data)


@dataclass
class Outlier:
    """A value that passes its rule, but lies far on the worse side of the fleet's median."""

    host: str
    #: The item (a GPU, a port) for a per-item value, else None.
    item: str | None
    value: float
    #: (value - median) / median: below the median is negative.
    deviation: float
    #: (value - median) / (1.4826 * MAD), the robust z-score; None when the MAD is 0.
    score: float | None
    #: Why it is flagged, in words.
    why: str


@dataclass
class FleetCheck:
    """One numeric check across the fleet: its median, spread and outliers."""

    median: float
    #: The median absolute deviation from the median (unscaled).
    mad: float
    #: How many values (hosts, or host items) it was computed from.
    count: int
    #: Which way is worse: "below" (the rule sets a minimum) or "above" (a maximum).
    worse: str
    outliers: list[Outlier] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetCheck:
        return cls(**{**data, "outliers": [Outlier(**o) for o in data.get("outliers", [])]})


@dataclass
class HostChecks:
    name: str
    checks: list[CheckResult] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    #: Why the host could not be reached (all its checks are then ERROR), else None.
    unreachable: str | None = None
    #: The (rendered, non-secret) values of the variables the rules use, and where each came
    #: from ("inventory", "gate g1 vars"...): the thresholds, and for re-evaluation.
    vars: dict[str, Any] = field(default_factory=dict)
    var_sources: dict[str, str] = field(default_factory=dict)

    @property
    def verdict(self) -> CheckStatus:
        return verdict(c.status for c in self.checks)

    def check(self, check_id: str) -> CheckResult | None:
        return next((c for c in self.checks if c.id == check_id), None)


@dataclass
class GateResult:
    """A gate's run: every host's checks and measurements, the verdict (result.json)."""

    gate: str
    title: str
    gate_file: str
    gate_sha256: str
    started_at: str
    finished_at: str = ""
    hosts: dict[str, HostChecks] = field(default_factory=dict)
    inventory: list[str] = field(default_factory=list)
    limit: str | None = None
    #: The results file ``change`` rules were judged against.
    baseline: str | None = None
    interrupted: bool = False
    #: Set by ``fxkit gate evaluate``: the results file re-evaluated.
    reevaluated_from: str | None = None
    #: The gate's stages, in order, with their expected durations in seconds (None: the gate
    #: declares none for it), and the stages this run was limited to (``--stage``; [] = all).
    stages: dict[str, float | None] = field(default_factory=dict)
    stages_run: list[str] = field(default_factory=list)
    #: The fleet view: per numeric check, its median and outliers (:mod:`fxkit.gate.outliers`),
    #: and the settings they were found with.
    fleet: dict[str, FleetCheck] = field(default_factory=dict)
    fleet_settings: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> CheckStatus:
        return verdict(h.verdict for h in self.hosts.values())

    @property
    def summary(self) -> dict[CheckStatus, int]:
        """Checks by status, over every host (every status, in order)."""
        return _count(c.status for h in self.hosts.values() for c in h.checks)

    def summary_of(self, host: str) -> dict[CheckStatus, int]:
        return _count(c.status for c in self.hosts[host].checks)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.verdict is CheckStatus.PASS else 1

    def to_json(self, secrets: Iterable[str] = ()) -> dict[str, Any]:
        data = {"schema": SCHEMA, "verdict": self.verdict, "summary": self.summary, **asdict(self)}
        hosts = data["hosts"]
        for name, host in self.hosts.items():
            hosts[name]["verdict"] = host.verdict
        masked: dict[str, Any] = redact_data(data, sorted(set(secrets), key=len, reverse=True))
        return masked

    def save(self, path: Path, secrets: Iterable[str] = ()) -> None:
        """Write the JSON whole (a temporary file, renamed), secrets masked; strict JSON (a
        number that is not finite is kept as text: ``"NaN"``, ``"Infinity"``)."""
        data = _finite_json(self.to_json(secrets))
        write_whole(path, json.dumps(data, indent=2, default=str, allow_nan=False) + "\n")

    @classmethod
    def from_json(cls, data: Any, where: str) -> GateResult:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise GateError(
                f"not a gate results file (want schema {SCHEMA!r})",
                where=where,
                hint="give the result.json that `fxkit gate ... --out DIR` wrote",
            )
        try:
            hosts = {
                name: HostChecks(
                    name=host["name"],
                    checks=[CheckResult.from_json(c) for c in host["checks"]],
                    measurements=[Measurement(**m) for m in host["measurements"]],
                    unreachable=host.get("unreachable"),
                    vars=host.get("vars", {}),
                    var_sources=host.get("var_sources", {}),
                )
                for name, host in data["hosts"].items()
            }
            fields = {
                k: data[k]
                for k in cls.__dataclass_fields__
                if k in data and k not in ("hosts", "fleet")
            }
            fleet = {k: FleetCheck.from_json(v) for k, v in (data.get("fleet") or {}).items()}
            return cls(**fields, hosts=hosts, fleet=fleet)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise GateError(
                f"a gate results file with a broken entry ({exc})", where=where
            ) from None


def load_results(path: Path) -> GateResult:
    """A result.json; older ones with bare ``NaN``/``Infinity`` (not strict JSON) load too."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GateError(f"cannot read the results file: {exc.strerror}", where=str(path)) from None
    except json.JSONDecodeError as exc:
        raise GateError(f"not JSON: {exc.msg}", where=f"{path}:{exc.lineno}") from None
    return GateResult.from_json(data, str(path))


def verdict(statuses: Iterable[CheckStatus]) -> CheckStatus:
    seen = set(statuses)
    if CheckStatus.FAIL in seen:
        return CheckStatus.FAIL
    if CheckStatus.ERROR in seen:
        return CheckStatus.ERROR
    return CheckStatus.PASS


def _count(statuses: Iterable[CheckStatus]) -> dict[CheckStatus, int]:
    counts = Counter(statuses)
    return {status: counts[status] for status in CheckStatus}


def select(data: Any, path: str | None) -> Any:
    """The value at ``path`` (``count``, ``ports.*.state``) in a measurement's data: ``*`` takes
    each item of a mapping (or list) and gives ``{item: value}``. :class:`KeyError` naming the
    part when something is missing."""
    if not path:
        return data
    parts = path.split(".")
    return _select(data, parts, "")


def _select(data: Any, parts: list[str], done: str) -> Any:
    if not parts:
        return data
    part, rest = parts[0], parts[1:]
    here = f"{done}.{part}" if done else part
    if part == "*":
        items = data.items() if isinstance(data, Mapping) else enumerate(data or [])
        return {str(k): _select(v, rest, here) for k, v in items}
    if isinstance(data, Mapping) and part in data:
        return _select(data[part], rest, here)
    if isinstance(data, list) and part.isdigit() and int(part) < len(data):
        return _select(data[int(part)], rest, here)
    raise KeyError(here)


def missing(data: Any, path: str | None) -> str | None:
    """Why a part of a measurement is not there: a measurement that could measure some parts
    and not others (a soak: no RDMA devices) puts ``{"missing": WHY}`` in place of the part."""
    for part in (path or "").split("."):
        if not isinstance(data, Mapping):
            return None
        if part not in data:
            reason = data.get("missing")
            return reason if isinstance(reason, str) else None
        data = data[part]
    return None


def judge(
    check: CheckSpec,
    rule: dict[str, Any],
    measurement: Measurement,
    index: int,
    baseline: Any = None,
    where: str = "",
) -> CheckResult:
    """The check's result on one host's measurement (its rule rendered for the host)."""
    result = CheckResult(
        id=check.id,
        title=check.title,
        severity=check.severity,
        status=CheckStatus.ERROR,
        reason="",
        rule=rule,
        expected=_describe(rule),
        unit=check.unit,
        why=check.why,
        measurement=index,
        baseline_value=baseline,
        where=where,
        source=check.source,
        stage=check.stage,
    )
    if measurement.error is not None:
        result.reason = measurement.error
        return result
    try:
        result.value = select(measurement.data, check.value)
    except KeyError as exc:
        why = missing(measurement.data, check.value)
        result.reason = why or f"the {measurement.kind} measurement has no {exc.args[0]!r}"
        return result
    try:
        outcome = rules.evaluate(rule, result.value, baseline)
    except rules.RuleError as exc:
        result.reason = str(exc)
        return result
    result.reason, result.change = outcome.reason, outcome.change
    result.status, result.bounds = _status(outcome, check), outcome.bounds
    result.items = {
        item: ItemCheck(_status(judged, check), judged.bounds)
        for item, judged in outcome.items.items()
    }
    return result


def _status(outcome: rules.Verdict, check: CheckSpec) -> CheckStatus:
    if outcome.passed:
        return CheckStatus.PASS
    return CheckStatus.FAIL if check.severity == "critical" else CheckStatus.WARN


def baseline_value(baseline: GateResult | None, host: str, check: CheckSpec) -> Any:
    """The baseline run's value for a ``change`` rule (the same check, or its ``of:``)."""
    op, operand = rules.split(check.rule)
    if op != "change" or baseline is None:
        return None
    of = operand.get("of", check.id) if isinstance(operand, Mapping) else check.id
    found = baseline.hosts.get(host)
    result = found.check(of) if found else None
    return result.value if result and result.status is not CheckStatus.ERROR else None


def skipped(check: CheckSpec, reason: str, where: str) -> CheckResult:
    return CheckResult(
        id=check.id,
        title=check.title,
        severity=check.severity,
        status=CheckStatus.SKIP,
        reason=reason,
        unit=check.unit,
        why=check.why,
        where=where,
        source=check.source,
        stage=check.stage,
    )


def unset(check: CheckSpec, names: list[str], where: str) -> CheckResult:
    """ERROR, unmeasured: the site has not set ``names``, which the check ``requires``."""
    result = skipped(check, "", where)
    result.status = CheckStatus.ERROR
    result.reason = (
        f"{', '.join(names)} not set: a figure only the site can give (set it in the inventory "
        "or with -e; the gate file's vars say what it is); nothing was measured"
    )
    return result


def _describe(rule: dict[str, Any]) -> str:
    try:
        return rules.describe(rule)
    except (rules.RuleError, AttributeError, IndexError, TypeError):
        return str(rule)


def _finite_json(value: Any) -> Any:
    """``value`` with each float that is not finite as JSON's usual text for it (strict JSON
    has no NaN or Infinity); :mod:`fxkit.gate.rules` judges such text as what it is."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    return value


def reevaluate(
    results: GateResult,
    gate: Gate,
    render: Callable[[HostChecks, CheckSpec], dict[str, Any]],
    baseline: GateResult | None = None,
    extra_vars: Mapping[str, Any] | None = None,
) -> GateResult:
    """Judge ``results``' measurements again against ``gate``'s rules, touching no host.

    ``render(host_result, check) -> rule`` renders a check's rule for a host (see
    :func:`fxkit.gate.run.rule_renderer`). A check the run did not measure is ERROR; one it
    skipped stays SKIP; a run of some stages (``--stage``) is judged on those stages' checks.
    The fleet view is found again, with the gate's settings and ``extra_vars`` (``-e``).
    """
    from fxkit.gate import outliers  # here: the fleet view reads these results' classes

    settings = outliers.settings(gate.spec.vars, extra_vars or {})
    if gate.name != results.gate:
        raise FxkitError(
            f"the results are of gate {results.gate!r}, the gate file is {gate.name!r}",
            hint="give the gate file the results were made with (--gate FILE)",
        )
    out = GateResult(
        gate=results.gate,
        title=gate.spec.title,
        gate_file=str(gate.path),
        gate_sha256=gate.sha256,
        started_at=results.started_at,
        finished_at=results.finished_at,
        inventory=results.inventory,
        limit=results.limit,
        baseline=results.baseline if baseline is None else baseline_name(baseline),
        interrupted=results.interrupted,
        stages=gate.expected_stages(),
        stages_run=results.stages_run,
    )
    checks = gate.checks_of(results.stages_run)
    for name, host in results.hosts.items():
        new = HostChecks(name, [], host.measurements, host.unreachable, host.vars, host.var_sources)
        for check in checks:
            old = host.check(check.id)
            where = gate.where(check.id)
            if old is None or (old.measurement is None and old.status is not CheckStatus.SKIP):
                new.checks.append(_unmeasured(check, old, where))
            elif old.status is CheckStatus.SKIP:
                new.checks.append(skipped(check, old.reason, where))
            else:
                assert old.measurement is not None
                measurement = host.measurements[old.measurement]
                base = baseline_value(baseline, name, check) if baseline else old.baseline_value
                new.checks.append(
                    judge(check, render(host, check), measurement, old.measurement, base, where)
                )
        out.hosts[name] = new
    out.fleet_settings = settings
    out.fleet = outliers.view(out, settings)
    return out


def baseline_name(baseline: GateResult) -> str:
    return f"{baseline.gate} run of {baseline.started_at}"


def _unmeasured(check: CheckSpec, old: CheckResult | None, where: str) -> CheckResult:
    result = skipped(check, "", where)
    result.status = CheckStatus.ERROR
    result.reason = (
        old.reason
        if old is not None
        else "not measured in this run (a check added since): run the gate again"
    )
    return result
