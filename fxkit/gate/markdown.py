"""A gate run as a Markdown report people can read, keep and sign, for a fleet.

In the HTML page's order (:mod:`fxkit.gate.html`): the verdict and counts; the failures and
errors (then the warnings), a row per check and reason with its hosts and the check's source;
the host x check matrix (a row per host, those that failed first; a numbered column per check,
the key below it); the fleet view's outliers; each stage's expected and actual duration; the
run's facts; every check folded in a ``<details>`` block (GitHub and GitLab fold it): source,
rule, the fleet's median and a row per host; the thresholds' source; a sign-off block. Text
from hosts is escaped so it shows as written (a ``|`` does not break a table, ``<script>`` is
not markup).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from fxkit.gate.report import (
    PROBLEMS,
    SIGN_OFF_FIELDS,
    SIGNERS,
    STAGE_COLUMNS,
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
from fxkit.gate.verdicts import CheckResult, CheckStatus, GateResult, Outlier

#: What CommonMark (and GitHub's tables) would read as markup: ``_`` only where it can open or
#: close emphasis (not inside a word: ``g1_rdma_peer`` stays as it is).
_SPECIAL = re.compile(r"[\\`*\[\]<|~&]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
#: A matrix cell per status; an outlier that passes is an arrow to the worse side.
CELLS = {
    CheckStatus.PASS: "·",
    CheckStatus.FAIL: "**F**",
    CheckStatus.ERROR: "**E**",
    CheckStatus.WARN: "W",
    CheckStatus.SKIP: "-",
}


def render(result: GateResult) -> str:
    """The Markdown report of ``result``."""
    flagged = sum(len(f.outliers) for f in result.fleet.values())
    counts = summary_text(result) + (f", {flagged} OUTLIER" if flagged else "")
    lines = [f"# {text(result.title)} ({result.gate}): {result.verdict}", ""]
    lines += [f"**{counts}** on {len(result.hosts)} host(s).", ""]
    lines += _problems(result)
    lines += _matrix(result)
    lines += _outliers(result)
    lines += ["", "## Stages: expected and actual duration", ""]
    lines += [f"The run took {duration_text(wall_time(result))}, every host in parallel.", ""]
    lines += _table(STAGE_COLUMNS, [tuple(text(c) for c in row) for row in stage_table(result)])
    lines += ["", "## The run", ""]
    lines += [f"- **{label}:** {text(value)}" for label, value in facts(result)]
    lines += ["", "## Every check", ""]
    for column in checks(result):
        lines += _check(column, result)
    lines += ["", "## Thresholds", "", text(thresholds_source(result)), ""]
    rows = thresholds(result)
    if rows:
        lines += _table(
            ("variable", "value", "hosts"),
            [(f"`{name}`", text(value), text(hosts)) for name, value, hosts in rows],
        )
    else:
        lines.append("The rules use no variables: their thresholds are written in the file.")
    lines += ["", "## Sign-off", "", text(sign_off_statement(result)), ""]
    lines += _table(SIGN_OFF_FIELDS, [("&nbsp;",) * len(SIGN_OFF_FIELDS)] * SIGNERS)
    return "\n".join(lines) + "\n"


def _problems(result: GateResult) -> list[str]:
    lines = ["## Failures and errors", ""]
    gone = unreachable(result)
    found = problems(result)
    if not gone and not found:
        return [*lines, "None: every check that ran passed on every host.", ""]
    rows = [
        ("**ERROR**", "unreachable", text(host), text(f"Unreachable: {why}"), "-")
        for host, why in gone
    ]
    for problem in found:
        check = problem.check
        status = f"**{problem.status}**" if problem.status is not CheckStatus.WARN else "WARN"
        prefix = "could not run: " if problem.status is CheckStatus.ERROR else ""
        for reason, hosts in problem.reasons:
            rows.append(
                (
                    status,
                    f"`{check.id}` {text(check.title)}",
                    text(", ".join(hosts)),
                    text(prefix + reason),
                    text(check.source or "-"),
                )
            )
    return [*lines, *_table(("status", "check", "hosts", "reason", "source"), rows), ""]


def _matrix(result: GateResult) -> list[str]:
    columns = checks(result)
    lines = [f"## Hosts x checks: {len(result.hosts)} x {len(columns)}", ""]
    lines += [
        "`·` passes, `▼`/`▲` passes but is a fleet outlier (below/above the median), **F** "
        "fails, **E** could not run, W warning, - skipped. Hosts that failed come first; the "
        "columns are numbered, the key follows.",
        "",
    ]
    flagged = outliers(result)
    rows = []
    for name in host_order(result):
        host = result.hosts[name]
        cells = [text(name)]
        for column in columns:
            check = host.check(column.id)
            cells.append(" " if check is None else _cell(result, name, check, flagged))
        rows.append(tuple(cells))
    header = ("host", *(str(i) for i in range(1, len(columns) + 1)))
    lines += [*_table(header, rows), ""]
    key = [
        (str(i), f"`{c.id}` {text(c.title)}", text(c.stage or "-"), text(c.source or "-"))
        for i, c in enumerate(columns, 1)
    ]
    return [*lines, *_table(("#", "check", "stage", "source"), key)]


def _cell(
    result: GateResult, host: str, check: CheckResult, flagged: dict[tuple[str, str], list[Outlier]]
) -> str:
    if check.status is CheckStatus.PASS and (host, check.id) in flagged:
        return "▲" if result.fleet[check.id].worse == "above" else "▼"
    return CELLS[check.status]


def _outliers(result: GateResult) -> list[str]:
    lines = ["", "## Fleet view: outliers that pass", "", text(fleet_settings_text(result)), ""]
    units = {c.id: c for c in checks(result)}
    rows = [
        (
            f"`{check_id}`",
            text(outlier_text(outlier)),
            text(value_text(outlier.value, units[check_id].unit)),
            text(value_text(fleet.median, units[check_id].unit)),
            text(outlier.why),
            text(units[check_id].source or "-"),
        )
        for check_id, fleet in result.fleet.items()
        for outlier in fleet.outliers
    ]
    if not rows:
        return [*lines, "None: every value that passes lies near its fleet's median."]
    header = ("check", "host", "value", "fleet median", "why it is flagged", "source")
    return [*lines, *_table(header, rows)]


def _check(column: CheckResult, result: GateResult) -> list[str]:
    """A check's ``<details>`` block: summary line, source and rule, a row per host."""
    found = [(n, c) for n, h in result.hosts.items() if (c := h.check(column.id)) is not None]
    counts = [f"{n} {s}" for s in CheckStatus if (n := sum(c.status is s for _, c in found))]
    fleet = result.fleet.get(column.id)
    if fleet and fleet.outliers:
        counts.append(f"{len(fleet.outliers)} OUTLIER")
    summary = f"<code>{html.escape(column.id)}</code> {html.escape(printable(column.title))}"
    lines = ["<details>", f"<summary>{summary}: {', '.join(counts)}</summary>", ""]
    lines += [
        f"- **Why:** {text(column.why)}",
        f"- **Source:** {text(column.source or 'none given in the gate file')}",
        f"- **Stage:** {text(column.stage or '-')}; "
        f"**rule:** {text(rule_text(result, column.id))}; {text(column.where)}",
    ]
    if fleet is not None:
        median = value_text(fleet.median, column.unit)
        spread = f"MAD {value_text(fleet.mad, column.unit)}, {fleet.count} values"
        lines.append(f"- **Fleet median:** {text(median)} ({text(spread)})")
    lines.append("")
    rank = [*PROBLEMS, CheckStatus.SKIP, CheckStatus.PASS]
    rows = [
        _row(name, check) for name, check in sorted(found, key=lambda f: rank.index(f[1].status))
    ]
    header = ("host", "status", "value", "rule", "reason")
    return [*lines, *_table(header, rows), "", "</details>", ""]


def _row(host: str, check: CheckResult) -> tuple[str, ...]:
    reason = check.reason
    if check.status is CheckStatus.ERROR:
        reason = f"could not run: {reason}"
    failed = check.status in (CheckStatus.FAIL, CheckStatus.ERROR)
    return (
        text(host),
        f"**{check.status}**" if failed else str(check.status),
        text(full_value_text(check.value, check.unit)),
        text(check.expected or "-"),
        text(reason if check.status is not CheckStatus.PASS else ""),
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def text(value: str) -> str:
    """``value`` as Markdown shows it literally: on one line, its markup characters escaped."""
    one_line = " ".join(printable(str(value)).split())
    return _SPECIAL.sub(lambda m: "\\" + m.group(), one_line)
