"""The fleet view: per numeric check, the fleet's median, and the nodes that pass but lie far
on the worse side of it.

AMD's acceptance pages and CVS judge each node against a threshold alone; a node that passes
but is the slowest of the rack by far is what a site wants to see before it accepts the rack.
For every check with a numeric value judged by a one-sided rule (``>=``/``>``: lower is worse;
``<=``/``<``: higher is worse), the values of every host (every item of per-item values: each
GPU, each port) give the median and the median absolute deviation (MAD). A value that PASSes
is an outlier when it is worse than the median by more than ``fleet_outlier_fraction`` of the
median, or when its robust z-score ``(value - median) / (1.4826 * MAD)`` is beyond
``fleet_outlier_mad_k`` on the worse side (not used when the MAD is 0: identical values).
Both are gate variables (the gate's ``vars:``, then ``-e``); the defaults and where they come
from are in docs/gates/reports.md. A fleet of fewer than :data:`MIN_HOSTS` hosts has
medians and no outliers. Outliers never change a status or the verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from fxkit.errors import FxkitError
from fxkit.gate.report import value_text
from fxkit.gate.verdicts import CheckResult, CheckStatus, FleetCheck, GateResult, Outlier

#: The settings, as gate variables, and their defaults: SuperBench's example data-diagnosis
#: rule flags a bandwidth more than 5 % below its baseline (microsoft/superbenchmark
#: tests/analyzer/test_rules.yaml, rule1, ``lambda x:x<-0.05``); a robust z-score beyond 3.5 is
#: Iglewicz and Hoaglin's cut-off for a potential outlier (NIST/SEMATECH e-Handbook of
#: Statistical Methods, 1.3.5.17 "Detection of Outliers").
FRACTION, MAD_K = "fleet_outlier_fraction", "fleet_outlier_mad_k"
DEFAULTS = {FRACTION: 0.05, MAD_K: 3.5}
#: A fleet of fewer hosts than this has medians and no outliers: a node is compared with
#: other nodes, never only with its own GPUs or ports.
MIN_HOSTS = 3
#: MAD * 1.4826 estimates the standard deviation of normally distributed values.
MAD_SCALE = 1.4826
JUDGED = (CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WARN)
#: The rules that set a minimum (a lower value is worse) and those that set a maximum.
WORSE = {">=": "below", ">": "below", "<=": "above", "<": "above"}


def settings(*layers: Mapping[str, Any]) -> dict[str, float]:
    """The two settings from ``layers`` (the gate's vars, then -e; the later winning): a
    fraction (``0.05`` or ``"5%"``) and k, each a number above 0."""
    found = dict(DEFAULTS)
    for layer in layers:
        for name in DEFAULTS:
            if name in layer:
                found[name] = _positive(name, layer[name])
    return found


def _positive(name: str, value: Any) -> float:
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise FxkitError(
            f"{name}: {value!r} is not a number above 0",
            hint=f"set {name} in the gate's vars or with -e (e.g. {DEFAULTS[name]})",
        )
    return number


def view(result: GateResult, found: Mapping[str, float]) -> dict[str, FleetCheck]:
    """Per numeric check id (in the order of the first host's checks), the fleet view."""
    by_id: dict[str, list[tuple[str, CheckResult]]] = {}
    for name, host in result.hosts.items():
        for check in host.checks:
            by_id.setdefault(check.id, []).append((name, check))
    fleet = {}
    for check_id, checks in by_id.items():
        worse = _worse(checks)
        values = [v for name, check in checks for v in _values(name, check)]
        if worse is None or not values:
            continue
        fleet[check_id] = _check(values, worse, found, checks[0][1].unit)
    return fleet


def _worse(checks: list[tuple[str, CheckResult]]) -> str | None:
    """Which side is worse, from the rule of the checks that were judged (one for all)."""
    sides = {WORSE.get(next(iter(c.rule), "")) for _, c in checks if c.status in JUDGED}
    return sides.pop() if len(sides) == 1 else None


Value = tuple[str, str | None, float, bool]


def _values(host: str, check: CheckResult) -> list[Value]:
    """(host, item, number, passed) of a judged check: its number, or each item's."""
    if check.status not in JUDGED:
        return []
    if isinstance(check.value, Mapping):
        found: list[Value] = []
        for item, value in check.value.items():
            judged = check.items.get(str(item))
            number = _number(value)
            if judged is None or number is None:
                return []
            found.append((host, str(item), number, judged.status is CheckStatus.PASS))
        return found
    number = _number(check.value)
    return [] if number is None else [(host, None, number, check.status is CheckStatus.PASS)]


def _check(
    values: list[Value], worse: str, found: Mapping[str, float], unit: str | None
) -> FleetCheck:
    numbers = [v[2] for v in values]
    median = statistics.median(numbers)
    mad = statistics.median(abs(n - median) for n in numbers)
    fleet = FleetCheck(median=median, mad=mad, count=len(numbers), worse=worse)
    if len({v[0] for v in values}) < MIN_HOSTS:
        return fleet
    sign = -1.0 if worse == "below" else 1.0
    for host, item, number, passed in values:
        deviation = (number - median) / abs(median) if median else 0.0
        score = (number - median) / (MAD_SCALE * mad) if mad else None
        reasons = []
        if sign * deviation > found[FRACTION]:
            reasons.append(
                f"{abs(deviation):.0%} {worse} the fleet median {value_text(median, unit)} "
                f"(flagged beyond {found[FRACTION]:.0%})"
            )
        if score is not None and sign * score > found[MAD_K]:
            reasons.append(f"robust z-score {score:+.1f} (flagged beyond {found[MAD_K]:g})")
        if passed and reasons:
            why = "; ".join(reasons)
            fleet.outliers.append(Outlier(host, item, number, deviation, score, why))
    fleet.outliers.sort(key=lambda o: sign * o.deviation, reverse=True)
    return fleet


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
