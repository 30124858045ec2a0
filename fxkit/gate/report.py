"""A gate run's reports: the files ``--out DIR`` gets, and the table on the terminal.

``--out DIR`` gets ``result.json`` (every measurement, rule and status: what ``fxkit gate
evaluate`` reads), ``junit.xml`` (for CI: :mod:`fxkit.gate.junit`), ``report.md`` and
``report.html`` (for people, to read and sign: :mod:`fxkit.gate.markdown`,
:mod:`fxkit.gate.html`). Each is written whole (a temporary file, renamed), with every secret
masked. The pieces both human reports show (the run's facts, the failures grouped by check,
the host x check matrix, the outliers, the stages' durations, the thresholds' source, the
sign-off lines) are made here, once.
"""

from __future__ import annotations

import html
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from fxkit.gate.verdicts import CheckResult, CheckStatus, GateResult, Outlier
from fxkit.localfile import write_whole
from fxkit.redaction import maskable, redact

STYLES = {
    CheckStatus.PASS: "green",
    CheckStatus.FAIL: "bold red",
    CheckStatus.WARN: "yellow",
    CheckStatus.ERROR: "bold magenta",
    CheckStatus.SKIP: "dim",
}


def write_reports(result: GateResult, out: Path, secrets: Iterable[str] = ()) -> dict[str, Path]:
    """Write every report of ``result`` into ``out`` (made if missing); their paths by kind."""
    # Here, not at the top: the writers use this module's helpers (facts, value texts).
    from fxkit.gate import html as html_report
    from fxkit.gate import junit, markdown

    out.mkdir(parents=True, exist_ok=True)
    masks = maskable(secrets)
    written = {"json": out / "result.json"}
    result.save(written["json"], masks)
    shown = masked(result, masks)
    writers: dict[str, tuple[str, Callable[[GateResult], str]]] = {
        "junit": ("junit.xml", junit.render),
        "markdown": ("report.md", markdown.render),
        "html": ("report.html", html_report.render),
    }
    for kind, (name, render) in writers.items():
        written[kind] = out / name
        write_whole(written[kind], redact(render(shown), _escaped(masks)))
    return written


def masked(result: GateResult, masks: list[str]) -> GateResult:
    """``result`` with every secret text masked in every string of it (keys too)."""
    if not masks:
        return result
    return GateResult.from_json(result.to_json(masks), "the results")


#: Characters a report must not hold as they are (a host's output may have them: terminal
#: escapes, NULs): XML 1.0 cannot, and they would garble Markdown and HTML.
_UNPRINTABLE = re.compile(r"[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def printable(text: str) -> str:
    """``text`` with each control character written as ``\\xNN`` (tabs and newlines kept)."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _escaped(masks: list[str]) -> list[str]:
    """The masks as written, and as HTML and XML escape them (a last guard on the files)."""
    escaped = {html.escape(m, quote=q) for m in masks for q in (True, False)}
    return sorted(set(masks) | escaped, key=len, reverse=True)


def value_text(value: Any, unit: str | None = None) -> str:
    """A measured value in a few characters (per-item values summarised)."""
    if isinstance(value, dict | list):
        items = list(value.values()) if isinstance(value, dict) else value
        shown = ", ".join(value_text(v) for v in items[:4])
        more = f", +{len(items) - 4}" if len(items) > 4 else ""
        return f"[{shown}{more}]" + (f" {unit}" if unit else "")
    return _scalar_text(value, unit)


def full_value_text(value: Any, unit: str | None = None) -> str:
    """A measured value in full: every item of a per-item value, by name (``all 8: ...``
    when they are the same)."""
    if isinstance(value, dict):
        texts = [_scalar_text(v) for v in value.values()]
        if len(texts) > 1 and len(set(texts)) == 1:
            shown = f"all {len(texts)}: {texts[0]}"
        else:
            shown = ", ".join(f"{k}: {text}" for k, text in zip(value, texts, strict=True))
        return f"{shown} ({unit})" if unit and value else shown
    return _scalar_text(value, unit)


def _scalar_text(value: Any, unit: str | None = None) -> str:
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    elif value is None:
        text = "-"
    else:
        text = str(value)
    return f"{text} {unit}" if unit and value is not None else text


#: Above this many rows (hosts x checks), the terminal's table leaves out those that passed.
TABLE_ROWS = 200


def table(result: GateResult) -> Table:
    """One row per host and check: status, value, rule and why it failed; for a fleet (more
    than :data:`TABLE_ROWS` rows), only the checks that did not pass and the outliers."""
    flagged = outliers(result)
    rows = [(n, c) for n, h in result.hosts.items() for c in h.checks]
    title = f"{result.title} ({result.gate}): {result.verdict}"
    if len(rows) > TABLE_ROWS:
        shown = [
            (n, c) for n, c in rows if c.status is not CheckStatus.PASS or (n, c.id) in flagged
        ]
        title += f" ({len(rows) - len(shown)} passing rows not shown: see report.md)"
        rows = shown
    grid = Table(title=title, title_justify="left")
    for column in ("host", "check", "status", "value", "rule", "reason"):
        grid.add_column(column, overflow="fold")
    for name, check in rows:
        reason = "" if check.status is CheckStatus.PASS else check.reason
        if (name, check.id) in flagged:
            reason = "; ".join(f"outlier: {o.why}" for o in flagged[(name, check.id)])
        # Text, not markup: host output like "[ubuntu 22.04, ...]" is shown as it is.
        grid.add_row(
            Text(name),
            Text(check.id),
            Text(check.status, style=STYLES[check.status]),
            Text(value_text(check.value, check.unit)),
            Text(check.expected),
            Text(reason),
        )
    return grid


def summary_text(result: GateResult) -> str:
    """``12 PASS, 1 FAIL, 2 ERROR`` (the statuses that occur)."""
    return ", ".join(f"{n} {status}" for status, n in result.summary.items() if n) or "no checks"


def stages_text(result: GateResult) -> str | None:
    """Which stages ran, when the run was limited to some (``--stage``); else None."""
    if not result.stages_run:
        return None
    left = [s for s in result.stages if s not in result.stages_run]
    rest = f"; not run: {', '.join(left)}" if left else ""
    return f"{', '.join(result.stages_run)} only (a partial run, not the whole gate{rest})"


def facts(result: GateResult) -> list[tuple[str, str]]:
    """What was run, when, on which hosts, judged by which file: the reports' header."""
    rows = [
        ("Gate", f"{result.gate}: {result.title}"),
        ("Verdict", result.verdict),
        ("Summary", summary_text(result)),
        ("Started", result.started_at),
        ("Finished", result.finished_at or "-"),
        ("Gate file", result.gate_file),
        ("Gate file sha256", result.gate_sha256),
        ("Inventory", ", ".join(result.inventory) or "-"),
        ("Hosts", f"{len(result.hosts)}: {', '.join(result.hosts)}"),
    ]
    optional = [
        ("Limit", result.limit),
        ("Baseline", result.baseline),
        ("Re-evaluated from", result.reevaluated_from),
        ("Stages run", stages_text(result)),
        ("Interrupted", "yes: checks not measured are ERROR" if result.interrupted else None),
    ]
    return rows + [(label, value) for label, value in optional if value]


def errors(result: GateResult) -> list[tuple[str, str, str]]:
    """Every ERROR check: (host, check id, why it could not run)."""
    return [
        (name, check.id, check.reason)
        for name, host in result.hosts.items()
        for check in host.checks
        if check.status is CheckStatus.ERROR
    ]


def thresholds(result: GateResult) -> list[tuple[str, str, str]]:
    """The variables the rules were rendered with: (name, value, hosts), one row per value
    (``all hosts`` when every host had the same)."""
    rows = []
    names = sorted({n for host in result.hosts.values() for n in host.vars})
    for name in names:
        by_value: dict[str, list[str]] = {}
        for host_name, host in result.hosts.items():
            if name in host.vars:
                by_value.setdefault(full_value_text(host.vars[name]), []).append(host_name)
        for value, hosts in by_value.items():
            everyone = len(hosts) == len(result.hosts) and len(result.hosts) > 1
            rows.append((name, value, "all hosts" if everyone else ", ".join(hosts)))
    return rows


def thresholds_source(result: GateResult) -> str:
    """Where the thresholds come from, in a sentence."""
    judged = " (re-evaluated: no host was touched)" if result.reevaluated_from else ""
    return (
        f"The rules of {result.gate_file} (sha256 {result.gate_sha256}){judged}, rendered for "
        "each host with its variables: the defaults of the gate's roles, the gate file's vars, "
        "the inventory and -e, in that order, the later winning."
    )


#: The sign-off block: who signs, and the lines each one fills in.
SIGN_OFF_FIELDS = ("Name", "Role", "Date", "Signature")
SIGNERS = 3


def sign_off_statement(result: GateResult) -> str:
    return (
        f"I have reviewed this report of {result.gate} ({result.title}), run {result.started_at} "
        f"on {len(result.hosts)} host(s) against the gate file with sha256 "
        f"{result.gate_sha256}, verdict {result.verdict}."
    )


# -- the fleet: failures by check, the host x check matrix, outliers, stages ------------------

#: The statuses reported first, in this order: what fails the gate, then what could not run,
#: then the warnings.
PROBLEMS = (CheckStatus.FAIL, CheckStatus.ERROR, CheckStatus.WARN)


@dataclass
class Problem:
    """A check that FAILed, was ERROR or WARNed on some hosts: the hosts, grouped by reason."""

    check: CheckResult
    status: CheckStatus
    #: (reason, hosts), the hosts that gave the same reason together.
    reasons: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def hosts(self) -> int:
        return sum(len(hosts) for _, hosts in self.reasons)


def checks(result: GateResult) -> list[CheckResult]:
    """One result of each check id (the first host's), in the gate's order, grouped by stage
    (the gate's stages in order, then the checks of none)."""
    first: dict[str, CheckResult] = {}
    for host in result.hosts.values():
        for check in host.checks:
            first.setdefault(check.id, check)
    order = {name: i for i, name in enumerate(result.stages)}
    return sorted(first.values(), key=lambda c: order.get(c.stage or "", len(order)))


def rule_text(result: GateResult, check_id: str) -> str:
    """The check's rule as applied: the same on every host, or a note that hosts differ
    (per-host thresholds: each host's is in the check's table)."""
    found = {c.expected for h in result.hosts.values() if (c := h.check(check_id)) and c.expected}
    if len(found) > 1:
        return "per host (their thresholds differ)"
    return found.pop() if found else "-"


def unreachable(result: GateResult) -> list[tuple[str, str]]:
    """The hosts that could not be reached, and why (each of their checks is ERROR)."""
    return [(name, host.unreachable) for name, host in result.hosts.items() if host.unreachable]


def problems(result: GateResult) -> list[Problem]:
    """Every check that did not pass somewhere: FAILs first, then ERRORs, then WARNs, each in
    the gate's order; a host that was not reached is listed once (:func:`unreachable`), not
    under each of its checks."""
    found: dict[tuple[CheckStatus, str], Problem] = {}
    for check in checks(result):
        for status in PROBLEMS:
            found[(status, check.id)] = Problem(check, status)
    for name, host in result.hosts.items():
        if host.unreachable:
            continue
        for check in host.checks:
            if check.status not in PROBLEMS:
                continue
            problem = found[(check.status, check.id)]
            reason = next((r for r in problem.reasons if r[0] == check.reason), None)
            if reason is None:
                problem.reasons.append((check.reason, [name]))
            else:
                reason[1].append(name)
    ordered = sorted(found.values(), key=lambda p: PROBLEMS.index(p.status))
    return [p for p in ordered if p.reasons]


def outliers(result: GateResult) -> dict[tuple[str, str], list[Outlier]]:
    """The fleet view's outliers by (host, check id)."""
    found: dict[tuple[str, str], list[Outlier]] = {}
    for check_id, fleet in result.fleet.items():
        for outlier in fleet.outliers:
            found.setdefault((outlier.host, check_id), []).append(outlier)
    return found


def host_order(result: GateResult) -> list[str]:
    """The hosts, those with a FAIL first, then an ERROR, then a WARN, then an outlier, then
    the rest (each group in the inventory's order)."""
    flagged = {host for host, _ in outliers(result)}

    def rank(name: str) -> int:
        statuses = {c.status for c in result.hosts[name].checks}
        found = [i for i, s in enumerate(PROBLEMS) if s in statuses]
        return found[0] if found else (len(PROBLEMS) if name in flagged else len(PROBLEMS) + 1)

    return sorted(result.hosts, key=rank)


def outlier_text(outlier: Outlier) -> str:
    """``node07``, or ``node07 · GPU 3`` for an item."""
    return outlier.host if outlier.item is None else f"{outlier.host} · {outlier.item}"


def fleet_settings_text(result: GateResult) -> str:
    """How outliers were found, in a sentence."""
    found = result.fleet_settings
    if not found:
        return "These results have no fleet view (made by an older fxkit): re-evaluate them."
    fraction, k = found.get("fleet_outlier_fraction"), found.get("fleet_outlier_mad_k")
    return (
        "Per numeric check with a minimum (or a maximum), the fleet's median over every host "
        "(every GPU or port of per-item values). A value that passes is flagged when it is more "
        f"than {fraction:.0%} worse than the median (fleet_outlier_fraction), or its robust "
        f"z-score (value - median) / (1.4826 x MAD) is beyond {k:g} on the worse side "
        "(fleet_outlier_mad_k). Flags change no status and no verdict."
    )


@dataclass
class StageTime:
    """One stage of the run: its checks, its expected duration, and the time it took."""

    name: str
    checks: int
    expected_s: float | None
    #: The slowest host's time measuring the stage's checks (None: the stage did not run).
    actual_s: float | None
    slowest: str | None
    #: The median host's time.
    median_s: float | None


def stage_times(result: GateResult) -> list[StageTime]:
    """Each stage's expected and actual duration: a host's time in a stage is the time of the
    measurements its checks of that stage made (a measurement shared by checks of two stages
    counts in the first); the stage's time is its slowest host's. Checks of no stage are the
    stage ``-``."""
    ids: dict[str, set[str]] = {}
    times: dict[str, dict[str, float]] = {}
    for name, host in result.hosts.items():
        counted: set[int] = set()
        for check in host.checks:
            stage = check.stage or "-"
            ids.setdefault(stage, set()).add(check.id)
            spent = times.setdefault(stage, {}).setdefault(name, 0.0)
            if check.measurement is not None and check.measurement not in counted:
                counted.add(check.measurement)
                times[stage][name] = spent + host.measurements[check.measurement].duration_s
    rows = []
    for stage in dict.fromkeys([*result.stages, *ids]):
        per_host = times.get(stage, {})
        slowest = max(per_host, key=lambda h: per_host[h]) if per_host else None
        rows.append(
            StageTime(
                stage,
                len(ids.get(stage, ())),
                result.stages.get(stage),
                per_host[slowest] if slowest else None,
                slowest,
                statistics.median(per_host.values()) if per_host else None,
            )
        )
    return rows


def duration_text(seconds: float | None) -> str:
    """``42 s``, ``12 min 5 s``, ``2 h 30 min``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def wall_time(result: GateResult) -> float | None:
    """The run's time from start to finish, in seconds (None when it did not finish)."""
    try:
        started = datetime.fromisoformat(result.started_at.replace("Z", "+00:00"))
        finished = datetime.fromisoformat(result.finished_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (finished - started).total_seconds()


def stage_table(result: GateResult) -> list[tuple[str, ...]]:
    """The stages as rows of text: stage, checks, expected, actual (slowest host), median
    host, the slowest host, and how the actual compares with the expected."""
    rows: list[tuple[str, ...]] = []
    for stage in stage_times(result):
        if stage.actual_s is None:
            against = "not run"
        elif stage.expected_s is None:
            against = "no expected duration declared"
        else:
            ratio = stage.actual_s / stage.expected_s
            against = "within" if ratio <= 1 else f"{ratio:.1f}x the expected"
        rows.append(
            (
                stage.name,
                str(stage.checks),
                duration_text(stage.expected_s),
                duration_text(stage.actual_s),
                duration_text(stage.median_s),
                stage.slowest or "-",
                against,
            )
        )
    return rows


STAGE_COLUMNS = (
    "stage",
    "checks",
    "expected",
    "actual (slowest host)",
    "median host",
    "slowest host",
    "against expected",
)
