"""A gate run's reports: the files ``--out DIR`` gets, and the table on the terminal.

``--out DIR`` gets ``result.json`` (every measurement, rule and status: what ``fxkit gate
evaluate`` reads), ``junit.xml`` (for CI: :mod:`fxkit.gate.junit`), ``report.md`` and
``report.html`` (for people, to read and sign: :mod:`fxkit.gate.markdown`,
:mod:`fxkit.gate.html`). Each is written whole (a temporary file, renamed), with every secret
masked. The pieces both human reports show (the run's facts, the errors, the thresholds'
source, the sign-off lines) are made here, once.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from fxkit.gate.verdicts import CheckStatus, GateResult
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


def table(result: GateResult) -> Table:
    """One row per host and check: status, value, rule and why it failed."""
    grid = Table(title=f"{result.title} ({result.gate}): {result.verdict}", title_justify="left")
    for column in ("host", "check", "status", "value", "rule", "reason"):
        grid.add_column(column, overflow="fold")
    for name, host in result.hosts.items():
        for check in host.checks:
            reason = "" if check.status is CheckStatus.PASS else check.reason
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
