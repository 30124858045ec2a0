"""A gate run as one standalone HTML page: opens offline, prints, and is signed on paper.

The Markdown report's content (:mod:`fxkit.gate.markdown`: the run's facts, a table per node,
the errors, the thresholds' source, the sign-off block) and, after the facts, charts of the
measured numbers against their thresholds: one per numeric check, a bar per host (a small bar
per item for per-item values: each GPU, each port), the band of values that pass shaded and the
threshold drawn as a line; ``change`` rules show the baseline's value beside the new one. The
charts draw what the results keep (each check's status and thresholds, per item for per-item
values, :class:`~fxkit.gate.verdicts.CheckResult`): no rule is applied here. No
external asset (the CSS and the SVG charts are inline, there is no script). The page is built
as an element tree (:mod:`xml.etree.ElementTree`), which escapes every text and attribute:
values come from hosts, and a host printing ``<script>`` shows those characters.
:func:`screenshot` and :func:`print_to_pdf` open the page in headless Chromium (tests, docs).
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
    SIGN_OFF_FIELDS,
    SIGNERS,
    errors,
    facts,
    full_value_text,
    printable,
    sign_off_statement,
    summary_text,
    thresholds,
    thresholds_source,
    value_text,
)
from fxkit.gate.rules import Bounds
from fxkit.gate.verdicts import CheckResult, CheckStatus, GateResult, HostChecks

CSS = """
:root { --PASS: #2e7d32; --FAIL: #c62828; --WARN: #d97d00; --ERROR: #8e24aa; --SKIP: #6b6b6b; }
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
table.checks th:nth-child(1) { width: 19%; } table.checks th:nth-child(2) { width: 70px; }
table.checks th:nth-child(3) { width: 22%; } table.checks th:nth-child(4) { width: 15%; }
.s-PASS { background: var(--PASS); } .s-FAIL { background: var(--FAIL); }
.s-WARN { background: var(--WARN); } .s-ERROR { background: var(--ERROR); }
.s-SKIP { background: var(--SKIP); }
h1 .status, h2 .status { font-size: 0.8em; vertical-align: 2px; }
tr.r-FAIL td { background: #fdecea; } tr.r-ERROR td { background: #f6ecf8; }
tr.r-WARN td { background: #fff5e5; } tr.r-SKIP td { color: #555; }
.summary { margin: 0 0 8px; }
.summary .status { margin-right: 6px; }
.title { color: #444; }
.charts { display: grid; grid-template-columns: 1fr; gap: 10px; }
figure { margin: 0; border: 1px solid #ddd; border-radius: 4px; padding: 8px 10px; }
figcaption { margin-bottom: 4px; }
.rule { color: #444; }
svg { max-width: 100%; height: auto; }
svg text { font: 11px system-ui, "DejaVu Sans", Arial, sans-serif; fill: #222; }
.legend { font-size: 12px; color: #444; margin: 0 0 8px; }
.swatch { display: inline-block; width: 12px; height: 10px; margin: 0 4px 0 10px;
          vertical-align: -1px; }
table.signoff td { height: 2.6em; }
footer { margin-top: 24px; color: #666; font-size: 12px; }
@page { size: A4; margin: 14mm; }
@media print {
  body { margin: 0; max-width: none; padding: 0; font-size: 11px; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  h2 { break-after: avoid; }
  tr, figure, .signoff-block { break-inside: avoid; }
}
"""

#: Bar colours: a passing value, a failing one (critical / warning); the baseline's.
COLOURS = {CheckStatus.PASS: "#2e7d32", CheckStatus.FAIL: "#c62828", CheckStatus.WARN: "#d97d00"}
BASE, BAND, LINE = "#9e9e9e", "#dcefdc", "#1b1b1b"
#: The statuses of a check whose rule was applied to its value: those charted.
JUDGED = (CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WARN)
#: Chart geometry, in pixels: width, label column, value column, row heights.
WIDTH, LABELS, VALUES, ROW, ITEM, AXIS = 1040, 230, 150, 22, 14, 22
#: Characters of a bar's label shown (the whole label is its tooltip).
LABEL_CHARS = 34
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
    _facts(_el(body, "section"), result)
    _charts(_el(body, "section"), result)
    for name, host in result.hosts.items():
        _host(_el(body, "section"), name, host)
    _errors(_el(body, "section"), result)
    _thresholds(_el(body, "section"), result)
    _sign_off(_el(body, "section", class_="signoff-block"), result)
    _el(body, "footer", f"Written by fxkit gate: {summary_text(result)}.")
    return "<!DOCTYPE html>\n" + ET.tostring(page, encoding="unicode", method="html") + "\n"


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


def _host(section: ET.Element, name: str, host: HostChecks) -> None:
    h2 = _el(section, "h2", f"{name} ")
    _status(h2, host.verdict)
    if host.unreachable:
        _el(section, "p", f"Unreachable: {host.unreachable}")
    table = _el(section, "table", class_="checks")
    head = _el(table, "tr")
    for title in ("check", "status", "value", "rule", "reason"):
        _el(head, "th", title)
    for check in host.checks:
        row = _el(table, "tr", class_=f"r-{check.status}")
        cell = _el(row, "td")
        _el(cell, "code", check.id)
        _el(cell, "br")
        _el(cell, "span", check.title, class_="title")
        _status(_el(row, "td"), check.status)
        _el(row, "td", full_value_text(check.value, check.unit))
        _el(row, "td", check.expected or "-")
        reason = "" if check.status is CheckStatus.PASS else check.reason
        if check.status is CheckStatus.ERROR:
            reason = f"could not run: {reason}"
        _el(row, "td", reason)


def _errors(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Errors: checks that could not run")
    found = errors(result)
    if not found:
        _el(section, "p", "None: every check that was not skipped was measured.")
        return
    listing = _el(section, "ul")
    for host, check, reason in found:
        item = _el(listing, "li")
        _el(item, "strong", host).tail = " "
        _el(item, "code", check).tail = printable(f": could not run: {reason}")


def _thresholds(section: ET.Element, result: GateResult) -> None:
    _el(section, "h2", "Thresholds")
    _el(section, "p", thresholds_source(result))
    rows = thresholds(result)
    if not rows:
        _el(section, "p", "The rules use no variables: their thresholds are written in the file.")
        return
    table = _el(section, "table")
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


# -- charts ------------------------------------------------------------------------------


@dataclass
class Bar:
    """One bar of a chart: a host's value (or one item's), its pass band and threshold line."""

    label: str
    value: float
    #: PASS, FAIL or WARN: the rule on this value alone.
    status: CheckStatus
    bounds: Bounds
    small: bool = False

    @property
    def band(self) -> tuple[float | None, float | None] | None:
        """The values that pass: (low, high), either open (None); None when there is no band."""
        low, high = self.bounds.low, self.bounds.high
        return None if low is None and high is None else (low, high)

    def numbers(self) -> list[float]:
        b = self.bounds
        return [n for n in (self.value, b.line, b.base, b.low, b.high) if n is not None]


def _charts(section: ET.Element, result: GateResult) -> None:
    charts = [(check, bars) for check, bars in _chart_data(result) if bars]
    _el(section, "h2", "Measured values against thresholds")
    if not charts:
        _el(section, "p", "No check measured a number.")
        return
    legend = _el(section, "p", class_="legend")
    for colour, words in (
        (COLOURS[CheckStatus.PASS], "passes"),
        (COLOURS[CheckStatus.FAIL], "fails (critical)"),
        (COLOURS[CheckStatus.WARN], "fails (warning)"),
        (BASE, "baseline"),
        (BAND, "values that pass"),
        (LINE, "threshold"),
    ):
        _el(legend, "span", class_="swatch", style=f"background:{colour}")
        _el(legend, "span", words)
    grid = _el(section, "div", class_="charts")
    for check, bars in charts:
        figure = _el(grid, "figure")
        caption = _el(figure, "figcaption")
        _el(caption, "code", check.id).tail = " "
        _el(caption, "strong", check.title)
        unit = f" ({check.unit})" if check.unit else ""
        _el(caption, "span", f"{unit}: {check.expected}", class_="rule")
        figure.append(_svg(bars, check.unit))


def _chart_data(result: GateResult) -> list[tuple[CheckResult, list[Bar]]]:
    """Per check id (in the gate's order), the bars of every host where it measured a number."""
    by_id: dict[str, tuple[CheckResult, list[Bar]]] = {}
    for name, host in result.hosts.items():
        for check in host.checks:
            entry = by_id.setdefault(check.id, (check, []))
            if check.status in JUDGED:
                entry[1].extend(_bars(name, check))
    return list(by_id.values())


def _bars(host: str, check: CheckResult) -> list[Bar]:
    """The bars of one host's check, from the status and thresholds the results keep (of each
    item, for a per-item value); none when its value or rule is not numeric."""
    if not isinstance(check.value, Mapping):
        bar = _bar(host, check.value, check.status, check.bounds, small=False)
        return [bar] if bar else []
    bars = []
    for item, value in check.value.items():
        judged = check.items.get(str(item))
        label = f"{host} · {item}"
        bar = _bar(label, value, judged.status, judged.bounds, small=True) if judged else None
        if bar is None:
            return []  # every item, or none
        bars.append(bar)
    return bars


def _bar(
    label: str, value: Any, status: CheckStatus, bounds: Bounds | None, small: bool
) -> Bar | None:
    number = _number(value)
    if number is None or bounds is None:
        return None
    return Bar(label, number, status, bounds, small)


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


def _svg(bars: list[Bar], unit: str | None) -> ET.Element:
    low, high = _scale([n for bar in bars for n in bar.numbers()])
    plot = WIDTH - LABELS - VALUES
    height = sum(ITEM if b.small else ROW for b in bars) + AXIS + 8

    def x(value: float) -> float:
        return round(LABELS + (min(max(value, low), high) - low) / (high - low) * plot, 1)

    svg = ET.Element(
        "svg",
        width=str(WIDTH),
        height=str(height),
        viewBox=f"0 0 {WIDTH} {height}",
        role="img",
    )
    ticks = _ticks(low, high)
    bottom = height - AXIS
    for tick in ticks:
        _el(svg, "line", x1=x(tick), x2=x(tick), y1=4, y2=bottom, stroke="#e6e6e6")
        _el(svg, "text", _number_text(tick), x=x(tick), y=bottom + 14, **{"text-anchor": "middle"})
    _el(svg, "line", x1=x(0), x2=x(0), y1=4, y2=bottom, stroke="#999")
    y = 4
    for bar in bars:
        rows = ITEM if bar.small else ROW
        _bar_svg(svg, bar, y, rows - 4, x, (low, high))
        y += rows
    if unit:
        _el(svg, "text", unit, x=WIDTH - 4, y=bottom + 14, **{"text-anchor": "end"})
    return svg


def _bar_svg(
    svg: ET.Element, bar: Bar, y: float, h: float, x: Callable[[float], float], axis: Axis
) -> None:
    low, high = axis
    if bar.band is not None:
        start = x(low if bar.band[0] is None else bar.band[0])
        end = x(high if bar.band[1] is None else bar.band[1])
        _el(svg, "rect", x=start, y=y - 1, width=max(end - start, 1), height=h + 2, fill=BAND)
    zero = x(0)
    now_top, now_h = y, h
    line, was = bar.bounds.line, bar.bounds.base
    if was is not None:
        now_h = h / 2
        now_top = y + now_h
        left, right = sorted((zero, x(was)))
        base = _el(svg, "rect", x=left, y=y, width=max(right - left, 1), height=now_h - 1)
        base.set("fill", BASE)
        _el(base, "title", f"{bar.label}: baseline {_number_text(was)}")
    left, right = sorted((zero, x(bar.value)))
    rect = _el(svg, "rect", x=left, y=now_top, width=max(right - left, 1), height=now_h)
    rect.set("fill", COLOURS[bar.status])
    _el(rect, "title", f"{bar.label}: {_number_text(bar.value)} ({bar.status})")
    if line is not None:
        _el(svg, "line", x1=x(line), x2=x(line), y1=y - 2, y2=y + h + 2, stroke=LINE)
        svg[-1].set("stroke-width", "2")
    middle = y + h / 2 + 4
    shown = bar.label if len(bar.label) <= LABEL_CHARS else bar.label[: LABEL_CHARS - 1] + "…"
    label = _el(svg, "text", shown, x=LABELS - 6, y=middle, **{"text-anchor": "end"})
    _el(label, "title", bar.label)
    value = _number_text(bar.value)
    if was is not None:
        value = f"{value} (was {_number_text(was)})"
    number = _el(svg, "text", value, x=WIDTH - VALUES + 6, y=middle)
    if bar.status is not CheckStatus.PASS:
        number.set("style", f"fill:{COLOURS[bar.status]};font-weight:700")
    if bar.small:
        label.set("font-size", "10")


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
