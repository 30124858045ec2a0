"""A gate run as one standalone HTML page, for a fleet: opens offline, prints, and is signed.

In order: the verdict and counts; the failures and errors, each check that did not pass with
its hosts grouped by reason, its rule and its source (then the warnings); the host x check
matrix (a row per host, those that failed first; a column per check, grouped by stage; a cell
per status, outliers marked); the fleet view's outliers (:mod:`fxkit.gate.outliers`); each stage's
expected and actual duration; the run's facts; then every check folded (``<details>``): why,
source, rule, the fleet's median and a strip of every host's value (a dot per host, or per GPU
or port, on one axis: the band that passes shaded, the threshold and the median drawn), and a
row per host; the thresholds' source; the sign-off block. At 64 nodes x 8 GPUs a check is one
strip of 512 dots, not 512 bars. The page draws what the results keep (each check's status
and thresholds, per item: :class:`~fxkit.gate.verdicts.CheckResult`, and the fleet view): no
rule is applied here. No external asset (inline CSS and SVG, no script). The page is built as
an element tree (:mod:`xml.etree.ElementTree`), which escapes every text and attribute: a host
printing ``<script>`` shows those characters. :func:`screenshot` and :func:`print_to_pdf` open
it in headless Chromium (tests, docs).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxkit.errors import FxkitError
from fxkit.gate.report import (
    PROBLEMS,
    SIGN_OFF_FIELDS,
    SIGNERS,
    STAGE_COLUMNS,
    Problem,
    checks,
    duration_text,
    facts,
    fleet_settings_text,
    full_value_text,
    host_order,
    outlier_text,
    outliers,
    printable,
    problems,
    rule_text,
    sign_off_statement,
    stage_table,
    summary_text,
    thresholds,
    thresholds_source,
    unreachable,
    value_text,
    wall_time,
)
from fxkit.gate.rules import Bounds
from fxkit.gate.verdicts import CheckResult, CheckStatus, FleetCheck, GateResult, Outlier

CSS = """
:root { --PASS: #2e7d32; --FAIL: #c62828; --WARN: #d97d00; --ERROR: #8e24aa; --SKIP: #6b6b6b;
        --OUT: #e65100; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif;
       color: #1b1b1b; background: #fff; margin: 24px auto; max-width: 1120px; padding: 0 18px; }
h1 { font-size: 24px; margin: 0 0 12px; }
h2 { font-size: 19px; margin: 28px 0 8px; border-bottom: 2px solid #ddd; padding-bottom: 3px; }
h3 { font-size: 15px; margin: 0 0 4px; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 14px; }
th, td { border: 1px solid #cfcfcf; padding: 4px 7px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td { overflow-wrap: anywhere; }
table.facts th { width: 170px; }
code { font: 12.5px ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
.status { display: inline-block; min-width: 50px; text-align: center; font-weight: 700;
          color: #fff; border-radius: 3px; padding: 0 6px; white-space: nowrap; }
.s-PASS { background: var(--PASS); } .s-FAIL { background: var(--FAIL); }
.s-WARN { background: var(--WARN); } .s-ERROR { background: var(--ERROR); }
.s-SKIP { background: var(--SKIP); } .s-OUTLIER { background: var(--OUT); }
h1 .status, h2 .status, h3 .status { font-size: 0.8em; vertical-align: 2px; }
tr.r-FAIL td { background: #fdecea; } tr.r-ERROR td { background: #f6ecf8; }
tr.r-WARN td { background: #fff5e5; } tr.r-SKIP td { color: #555; }
.summary { margin: 0 0 8px; } .summary .status { margin-right: 6px; }
.title, .meta { color: #444; } .meta { font-size: 12.5px; margin: 0 0 4px; }
table.problems th:nth-child(1) { width: 70px; } table.problems th:nth-child(2) { width: 38%; }
table.problems th:nth-child(3) { width: 18%; }
table.matrix { table-layout: fixed; font-size: 10px; line-height: 1; margin-top: 2px; }
table.matrix th, table.matrix td { padding: 0; border: 1px solid #fff; text-align: center;
                                   vertical-align: bottom; }
table.matrix col.host { width: 130px; }
table.matrix th.host { text-align: left; padding: 1px 4px; white-space: nowrap;
                       overflow: hidden; text-overflow: ellipsis; font: 11px ui-monospace,
                       "DejaVu Sans Mono", monospace; background: #f7f7f7; }
table.matrix th.host.h-FAIL { box-shadow: inset 4px 0 var(--FAIL); }
table.matrix th.host.h-ERROR { box-shadow: inset 4px 0 var(--ERROR); }
table.matrix th.host.h-WARN { box-shadow: inset 4px 0 var(--WARN); }
table.matrix th.stage { font-size: 10.5px; padding: 2px 0; overflow: hidden;
                        white-space: nowrap; text-overflow: ellipsis; background: #eaeaea;
                        border-left: 2px solid #fff; }
table.matrix th.id { height: 150px; background: #fafafa; overflow: hidden; }
table.matrix th.id span { writing-mode: vertical-rl; transform: rotate(180deg);
                          white-space: nowrap; font: 10px ui-monospace, "DejaVu Sans Mono",
                          monospace; max-height: 146px; overflow: hidden; display: inline-block; }
table.matrix td { height: 15px; font-weight: 700; color: #fff; }
table.matrix .first { border-left: 2px solid #888; }
.c-PASS { background: #a5d6a7; } .c-FAIL { background: var(--FAIL); }
.c-ERROR { background: var(--ERROR); } .c-WARN { background: var(--WARN); }
.c-SKIP { background: #e0e0e0; } .c-none { background: #fff; }
.c-OUTLIER { background: #ffb74d; color: #5d2600; }
.legend { font-size: 12px; color: #444; margin: 0 0 8px; }
.swatch { display: inline-block; width: 12px; height: 10px; margin: 0 4px 0 10px;
          vertical-align: -1px; text-align: center; font-size: 9px; font-weight: 700;
          line-height: 10px; color: #fff; }
details.check { border: 1px solid #ddd; border-radius: 4px; margin: 0 0 6px; }
details.check > summary { cursor: pointer; padding: 4px 8px; background: #f7f7f7; }
details.check > summary .status { min-width: 0; margin-right: 4px; font-size: 11px; }
details.check > div { padding: 4px 10px; }
table.hosts th:nth-child(1) { width: 15%; }
table.hosts th:nth-child(2) { width: 80px; }
table.hosts th:nth-child(3) { width: 28%; } table.hosts th:nth-child(4) { width: 14%; }
svg { max-width: 100%; height: auto; }
svg text { font: 11px system-ui, "DejaVu Sans", Arial, sans-serif; fill: #222; }
table.signoff td { height: 2.6em; }
footer { margin-top: 24px; color: #666; font-size: 12px; }
@page { size: A4; margin: 14mm; }
@media print {
  body { margin: 0; max-width: none; padding: 0; font-size: 11px; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  h2 { break-after: avoid; }
  tr, .signoff-block { break-inside: avoid; }
}
"""

#: Dot colours: a passing value, a failing one (critical / warning); the baseline's.
COLOURS = {CheckStatus.PASS: "#2e7d32", CheckStatus.FAIL: "#c62828", CheckStatus.WARN: "#d97d00"}
BASE, BAND, LINE, MEDIAN, OUTLIER = "#9e9e9e", "#dcefdc", "#1b1b1b", "#1565c0", "#e65100"
#: The statuses of a check whose rule was applied to its value: those drawn.
JUDGED = (CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WARN)
#: A matrix cell's letter per status ("" for PASS and SKIP: their colour says it).
LETTERS = {CheckStatus.FAIL: "F", CheckStatus.ERROR: "E", CheckStatus.WARN: "W"}
#: Strip geometry, in pixels: width, label column, right margin, a lane's height, the axis.
WIDTH, LABELS, RIGHT, LANE, AXIS = 1040, 80, 16, 44, 22
Axis = tuple[float, float]


def render(result: GateResult) -> str:
    """The HTML page of ``result``."""
    page = ET.Element("html", lang="en")
    head = _el(page, "head")
    _el(head, "meta", charset="utf-8")
    _el(head, "meta", name="viewport", content="width=device-width, initial-scale=1")
    _el(head, "title", f"{result.title} ({result.gate}): {result.verdict}")
    _el(head, "style", CSS)
    body = _el(page, "body")
    h1 = _el(body, "h1", f"{result.title} ({result.gate}) ")
    _status(h1, result.verdict)
    summary = _el(body, "p", class_="summary")
    for status, count in result.summary.items():
        if count:
            _status(summary, status, f"{count} {status}")
    flagged = sum(len(f.outliers) for f in result.fleet.values())
    if flagged:
        _el(summary, "span", f"{flagged} OUTLIER", class_="status s-OUTLIER")
    _el(summary, "span", f" on {len(result.hosts)} host(s)", class_="title")
    _problems(_el(body, "section", id="failures"), result)
    _matrix(_el(body, "section", id="matrix"), result)
    _outliers(_el(body, "section", id="outliers"), result)
    _stages(_el(body, "section", id="stages"), result)
    _facts(_el(body, "section", id="run"), result)
    _checks(_el(body, "section", id="checks"), result)
    _thresholds(_el(body, "section"), result)
    _sign_off(_el(body, "section", class_="signoff-block"), result)
    _el(body, "footer", f"Written by fxkit gate: {summary_text(result)}.")
    return "<!DOCTYPE html>\n" + ET.tostring(page, encoding="unicode", method="html") + "\n"


# -- failures first ----------------------------------------------------------------------


def _problems(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Failures and errors")
    gone = unreachable(result)
    found = problems(result)
    if not gone and not found:
        _el(section, "p", "None: every check that ran passed on every host.")
        return
    table = _el(section, "table", class_="problems")
    head = _el(table, "tr")
    for title in ("status", "check, its source and rule", "hosts", "reason"):
        _el(head, "th", title)
    if gone:
        row = _el(table, "tr", class_="r-ERROR")
        _status(_el(row, "td"), CheckStatus.ERROR)
        _el(row, "td", f"Unreachable: {len(gone)} of {len(result.hosts)} host(s)")
        _el(row, "td", ", ".join(host for host, _ in gone))
        _el(row, "td", "; ".join(f"{host}: {why}" for host, why in gone))
    for problem in found:
        _problem(table, problem, result)


def _problem(table: ET.Element, problem: Problem, result: GateResult) -> None:
    """A check's rows: its status and check (id, title, on how many hosts, source, rule) once,
    then a row per reason with its hosts."""
    check = problem.check
    prefix = "could not run: " if problem.status is CheckStatus.ERROR else ""
    for i, (reason, names) in enumerate(problem.reasons):
        row = _el(table, "tr", class_=f"r-{problem.status}")
        if i == 0:
            span = str(len(problem.reasons))
            _status(_el(row, "td", rowspan=span), problem.status)
            cell = _el(row, "td", rowspan=span)
            _el(cell, "code", check.id).tail = printable(f" {check.title}")
            _el(cell, "br").tail = f"on {problem.hosts} of {len(result.hosts)} host(s)"
            _meta(cell, check, rule_text(result, check.id))
        _el(row, "td", ", ".join(names))
        _el(row, "td", prefix + reason)


def _meta(parent: ET.Element, check: CheckResult, rule: str) -> None:
    """The check's source, then its stage, rule and file:line, in a line."""
    line = _el(parent, "div", class_="meta")
    _el(line, "strong", "Source: ").tail = printable(check.source or "none given in the gate file")
    parts = [f"stage {check.stage}" if check.stage else "", f"rule {rule}"]
    parts.append(check.where)
    _el(line, "br").tail = printable(" · ".join(p for p in parts if p))


# -- the matrix --------------------------------------------------------------------------


def _matrix(section: ET.Element, result: GateResult) -> None:
    columns = checks(result)
    _el(section, "h2", f"Hosts x checks: {len(result.hosts)} x {len(columns)}")
    legend = _el(section, "p", class_="legend")
    for css, letter, words in (
        ("c-PASS", "", "passes"),
        ("c-OUTLIER", "▼", "passes, fleet outlier"),
        ("c-FAIL", "F", "fails"),
        ("c-ERROR", "E", "could not run"),
        ("c-WARN", "W", "warning"),
        ("c-SKIP", "", "skipped"),
    ):
        _el(legend, "span", letter, class_=f"swatch {css}")
        _el(legend, "span", words)
    _el(legend, "span", ". Hosts that failed come first; hover a cell for its reason.")
    table = _el(section, "table", class_="matrix")
    _el(table, "col", class_="host")
    stages = [(c.stage or "-") for c in columns]
    firsts = {i for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s}
    groups = _el(table, "tr")
    _el(groups, "th", "stage", class_="host")
    for i in sorted(firsts):
        span = next((j for j in sorted(firsts) if j > i), len(stages)) - i
        _el(groups, "th", stages[i], colspan=span, class_="stage", title=stages[i])
    ids = _el(table, "tr")
    _el(ids, "th", "host \\ check", class_="host")
    for i, check in enumerate(columns):
        cell = _el(ids, "th", class_="id first" if i in firsts else "id")
        cell.set("title", f"{check.id}: {check.title}")
        _el(cell, "span", check.id)
    flagged = outliers(result)
    for name in host_order(result):
        host = result.hosts[name]
        row = _el(table, "tr")
        _el(row, "th", name, class_=f"host h-{host.verdict}", title=f"{name}: {host.verdict}")
        for i, column in enumerate(columns):
            marks = flagged.get((name, column.id), [])
            cell = _cell(row, name, host.check(column.id), marks, result.fleet.get(column.id))
            if i in firsts:
                cell.set("class", cell.get("class", "") + " first")


def _cell(
    row: ET.Element,
    host: str,
    check: CheckResult | None,
    marks: list[Outlier],
    fleet: FleetCheck | None,
) -> ET.Element:
    if check is None:
        return _el(row, "td", "", class_="c-none", title=f"{host}: not run")
    tip = f"{host} · {check.id}: {check.status}"
    if check.status is not CheckStatus.PASS:
        tip += f": {check.reason}"
    if check.status is CheckStatus.PASS and marks:
        why = "; ".join(f"{outlier_text(m)}: {m.why}" for m in marks)
        arrow = "▲" if fleet is not None and fleet.worse == "above" else "▼"
        return _el(row, "td", arrow, class_="c-OUTLIER", title=f"{tip}, outlier: {why}")
    return _el(row, "td", LETTERS.get(check.status, ""), class_=f"c-{check.status}", title=tip)


# -- the fleet view and the stages -------------------------------------------------------


def _outliers(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Fleet view: outliers that pass")
    _el(section, "p", fleet_settings_text(result), class_="meta")
    rows = [
        (check_id, fleet, outlier)
        for check_id, fleet in result.fleet.items()
        for outlier in fleet.outliers
    ]
    if not rows:
        _el(section, "p", "None: every value that passes lies near its fleet's median.")
        return
    table = _el(section, "table", class_="outliers")
    head = _el(table, "tr")
    for title in ("check", "host", "value", "fleet median", "why it is flagged", "source"):
        _el(head, "th", title)
    by_id = {c.id: c for c in checks(result)}
    for check_id, fleet, outlier in rows:
        check = by_id[check_id]
        row = _el(table, "tr")
        _el(_el(row, "td"), "code", check_id)
        _el(row, "td", outlier_text(outlier))
        _el(row, "td", value_text(outlier.value, check.unit))
        _el(row, "td", value_text(fleet.median, check.unit))
        _el(row, "td", outlier.why)
        _el(row, "td", check.source or "-")


def _stages(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Stages: expected and actual duration")
    total = duration_text(wall_time(result))
    _el(section, "p", f"The run took {total} from start to finish, every host in parallel.")
    table = _el(section, "table", class_="stages")
    head = _el(table, "tr")
    for title in STAGE_COLUMNS:
        _el(head, "th", title)
    for cells in stage_table(result):
        row = _el(table, "tr")
        for text in cells:
            _el(row, "td", text)


# -- every check, folded -----------------------------------------------------------------


def _checks(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Every check (click to unfold)")
    for column in checks(result):
        _check(_el(section, "details", class_="check", id=f"check-{column.id}"), column, result)


def _check(details: ET.Element, column: CheckResult, result: GateResult) -> None:
    per_host = [(n, h.check(column.id)) for n, h in result.hosts.items()]
    found = [(name, check) for name, check in per_host if check is not None]
    summary = _el(details, "summary")
    for status in CheckStatus:
        count = sum(1 for _, c in found if c.status is status)
        if count:
            _status(summary, status, f"{count} {status}")
    fleet = result.fleet.get(column.id)
    if fleet and fleet.outliers:
        _el(summary, "span", f"{len(fleet.outliers)} OUTLIER", class_="status s-OUTLIER")
    _el(summary, "code", column.id).tail = printable(f" {column.title}")
    if fleet is not None:
        _el(summary, "span", f" · median {value_text(fleet.median, column.unit)}", class_="title")
    body = _el(details, "div")
    _el(body, "p", column.why)
    _meta(body, column, rule_text(result, column.id))
    if fleet is not None:
        spread = f"MAD {value_text(fleet.mad, column.unit)}, {fleet.count} values"
        _el(body, "p", f"Fleet median {value_text(fleet.median, column.unit)} ({spread}).")
    dots = [dot for name, check in found for dot in _dots(name, check, fleet)]
    if dots:
        body.append(_strip(dots, fleet, column.unit))
    table = _el(body, "table", class_="hosts")
    head = _el(table, "tr")
    for title in ("host", "status", "value", "rule", "reason"):
        _el(head, "th", title)
    rank = [*PROBLEMS, CheckStatus.SKIP, CheckStatus.PASS]
    for name, check in sorted(found, key=lambda f: rank.index(f[1].status)):
        row = _el(table, "tr", class_=f"r-{check.status}")
        _el(row, "td", name)
        _status(_el(row, "td"), check.status)
        _el(row, "td", full_value_text(check.value, check.unit))
        _el(row, "td", check.expected or "-")
        reason = "" if check.status is CheckStatus.PASS else check.reason
        _el(row, "td", f"could not run: {reason}" if check.status is CheckStatus.ERROR else reason)


@dataclass
class Dot:
    """One value on a check's strip: a host's (or one item's), its status and thresholds."""

    label: str
    value: float
    #: PASS, FAIL or WARN: the rule on this value alone.
    status: CheckStatus
    bounds: Bounds
    outlier: bool = False

    def numbers(self) -> list[float]:
        b = self.bounds
        return [n for n in (self.value, b.line, b.base, b.low, b.high) if n is not None]


def _dots(host: str, check: CheckResult, fleet: FleetCheck | None) -> list[Dot]:
    """The dots of one host's check, from the status and thresholds the results keep (of each
    item, for a per-item value); none when its value or rule is not numeric."""
    if check.status not in JUDGED:
        return []
    flagged = {o.item for o in fleet.outliers if o.host == host} if fleet else set()
    if not isinstance(check.value, Mapping):
        dot = _dot(host, check.value, check.status, check.bounds, None in flagged)
        return [dot] if dot else []
    dots = []
    for item, value in check.value.items():
        judged = check.items.get(str(item))
        label = f"{host} · {item}"
        dot = None
        if judged is not None:
            dot = _dot(label, value, judged.status, judged.bounds, str(item) in flagged)
        if dot is None:
            return []  # every item, or none
        dots.append(dot)
    return dots


def _dot(
    label: str, value: Any, status: CheckStatus, bounds: Bounds | None, outlier: bool
) -> Dot | None:
    number = _number(value)
    if number is None or bounds is None:
        return None
    return Dot(label, number, status, bounds, outlier)


def _strip(dots: list[Dot], fleet: FleetCheck | None, unit: str | None) -> ET.Element:
    """Every value of a check on one axis: a dot per host (or item), the band that passes
    shaded, the threshold drawn, the median dashed, outliers ringed; a lane above for the
    baseline's values (``change`` rules)."""
    numbers = [n for dot in dots for n in dot.numbers()]
    if fleet is not None:
        numbers.append(fleet.median)
    low, high = _scale(numbers)
    bases = [dot for dot in dots if dot.bounds.base is not None]
    lanes = [("baseline", True)] * bool(bases) + [("now" if bases else "", False)]
    height = LANE * len(lanes) + AXIS + 6
    plot = WIDTH - LABELS - RIGHT

    def x(value: float) -> float:
        return round(LABELS + (min(max(value, low), high) - low) / (high - low) * plot, 1)

    svg = ET.Element(
        "svg", width=str(WIDTH), height=str(height), viewBox=f"0 0 {WIDTH} {height}", role="img"
    )
    bottom = height - AXIS
    _band(svg, dots, x, (low, high), bottom)
    for tick in _ticks(low, high):
        _el(svg, "line", x1=x(tick), x2=x(tick), y1=4, y2=bottom, stroke="#e6e6e6")
        _el(svg, "text", _number_text(tick), x=x(tick), y=bottom + 14, **{"text-anchor": "middle"})
    for line in sorted({d.bounds.line for d in dots if d.bounds.line is not None}):
        _el(svg, "line", x1=x(line), x2=x(line), y1=2, y2=bottom, stroke=LINE)
        svg[-1].set("stroke-width", "2")
        _el(svg[-1], "title", f"threshold {_number_text(line)}")
    if fleet is not None:
        mid = x(fleet.median)
        _el(svg, "line", x1=mid, x2=mid, y1=2, y2=bottom, stroke=MEDIAN)
        svg[-1].set("stroke-dasharray", "4 3")
        _el(svg, "text", f"median {_number_text(fleet.median)}", x=mid + 3, y=12)
        svg[-1].set("style", f"fill:{MEDIAN}")
    for lane, (name, baseline) in enumerate(lanes):
        top = 4 + lane * LANE
        _el(svg, "text", name, x=LABELS - 8, y=top + LANE / 2 + 4, **{"text-anchor": "end"})
        shown = bases if baseline else dots
        for i, dot in enumerate(shown):
            _dot_svg(svg, dot, x, top + 8 + (i % 8) * 4, baseline)
    if unit:
        _el(svg, "text", unit, x=WIDTH - 4, y=bottom + 14, **{"text-anchor": "end"})
    return svg


def _band(
    svg: ET.Element, dots: list[Dot], x: Callable[[float], float], axis: Axis, bottom: float
) -> None:
    """The values that pass, shaded, when every dot has the same band."""
    bands = {(d.bounds.low, d.bounds.high) for d in dots}
    if len(bands) != 1:
        return
    band_low, band_high = bands.pop()
    if band_low is None and band_high is None:
        return
    start = x(axis[0] if band_low is None else band_low)
    end = x(axis[1] if band_high is None else band_high)
    _el(svg, "rect", x=start, y=2, width=max(end - start, 1), height=bottom - 2, fill=BAND)


def _dot_svg(
    svg: ET.Element, dot: Dot, x: Callable[[float], float], y: float, baseline: bool
) -> None:
    if baseline:
        assert dot.bounds.base is not None
        circle = _el(svg, "circle", cx=x(dot.bounds.base), cy=y, r=3.5, fill=BASE)
        _el(circle, "title", f"{dot.label}: baseline {_number_text(dot.bounds.base)}")
        return
    circle = _el(svg, "circle", cx=x(dot.value), cy=y, r=3.5, fill=COLOURS[dot.status])
    circle.set("fill-opacity", "0.8")
    outlier = ", fleet outlier" if dot.outlier else ""
    _el(circle, "title", f"{dot.label}: {_number_text(dot.value)} ({dot.status}){outlier}")
    if dot.outlier:
        ring = _el(svg, "circle", cx=x(dot.value), cy=y, r=7, fill="none", stroke=OUTLIER)
        ring.set("stroke-width", "2.5")


def _scale(numbers: list[float]) -> Axis:
    """The axis: from 0 (or the lowest negative number) past the highest; zoomed in on the
    numbers when they are all positive and within 10 % of each other (a tolerance band of 1 %
    of 196608 MiB would not show from 0), the ticks saying where the axis starts."""
    smallest, largest = min(numbers), max(numbers)
    if 0 < largest - smallest < 0.1 * largest and smallest > 0:
        low, high = smallest - (largest - smallest) * 0.5, largest
    else:
        low, high = min(0.0, smallest), max(0.0, largest)
    if high == low:
        high = low + 1
    return low, high + (high - low) * 0.08


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round numbers between ``low`` and ``high``."""
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step) + 1)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _number_text(value: float) -> str:
    """An axis tick: whole numbers as the reports write them, others with the digits a tick
    step of 0.05 needs (191.75, not 192)."""
    return value_text(int(value)) if float(value).is_integer() else f"{value:.6g}"


# -- the run, thresholds, sign-off ---------------------------------------------------------


def _facts(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "The run")
    table = _el(section, "table", class_="facts")
    for label, value in facts(result):
        row = _el(table, "tr")
        _el(row, "th", label)
        cell = _el(row, "td")
        if label == "Verdict":
            _status(cell, CheckStatus(value))
        else:
            cell.text = value


def _thresholds(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Thresholds")
    _el(section, "p", thresholds_source(result))
    rows = thresholds(result)
    if not rows:
        _el(section, "p", "The rules use no variables: their thresholds are written in the file.")
        return
    table = _el(section, "table", class_="thresholds")
    head = _el(table, "tr")
    for title in ("variable", "value", "hosts"):
        _el(head, "th", title)
    for name, value, hosts in rows:
        row = _el(table, "tr")
        _el(_el(row, "td"), "code", name)
        _el(row, "td", value)
        _el(row, "td", hosts)


def _sign_off(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Sign-off")
    _el(section, "p", sign_off_statement(result))
    table = _el(section, "table", class_="signoff")
    head = _el(table, "tr")
    for title in SIGN_OFF_FIELDS:
        _el(head, "th", title)
    for _ in range(SIGNERS):
        row = _el(table, "tr")
        for _field in SIGN_OFF_FIELDS:
            _el(row, "td")


# -- the browser ---------------------------------------------------------------------


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1280, 2000)) -> None:
    """Open ``page`` in headless Chromium (Debian's ``chromium``) and save what shows as ``png``
    (``size``: the window, in pixels): the page as a browser renders it."""
    _chromium(page, png, f"--screenshot={png}", f"--window-size={size[0]},{size[1]}")


def print_to_pdf(page: Path, pdf: Path) -> None:
    """Print ``page`` to ``pdf`` with headless Chromium, as people print the report to sign."""
    _chromium(page, pdf, f"--print-to-pdf={pdf}", "--no-pdf-header-footer")


def _chromium(page: Path, out: Path, *flags: str) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise FxkitError(
            "chromium not found", hint="install Debian's chromium (scripts/install-system-deps.sh)"
        )
    with tempfile.TemporaryDirectory(prefix="fxkit-chromium-") as profile:
        argv = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *flags,
            page.resolve().as_uri(),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0 or not out.is_file():
        tail = done.stderr.strip().splitlines()[-3:]
        raise FxkitError(f"chromium could not open {page}: {' | '.join(tail)}")


# -- elements ----------------------------------------------------------------------------


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs: Any) -> ET.Element:
    """A child element; ``class_`` is the ``class`` attribute, numbers become text."""
    element = ET.SubElement(
        parent, tag, {k.rstrip("_"): printable(str(v)) for k, v in attrs.items() if v is not None}
    )
    element.text = None if text is None else printable(text)
    return element


def _status(parent: ET.Element, status: CheckStatus, text: str | None = None) -> None:
    _el(parent, "span", text or status, class_=f"status s-{status}")
