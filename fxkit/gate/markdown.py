"""A gate run as a Markdown report people can read, keep and sign.

The gate, when it ran, the gate file and its sha256, the inventory, the verdict and summary; a
table per node (check, status, value, rule, reason); every ERROR with why it could not run;
where the thresholds come from; and a sign-off block. Text from hosts is escaped so it shows as
written (a ``|`` does not break a table, ``<script>`` is not markup).
"""

from __future__ import annotations

import re

from fxkit.gate.report import (
    SIGN_OFF_FIELDS,
    SIGNERS,
    errors,
    facts,
    full_value_text,
    printable,
    sign_off_statement,
    thresholds,
    thresholds_source,
)
from fxkit.gate.verdicts import CheckResult, CheckStatus, GateResult

#: What CommonMark (and GitHub's tables) would read as markup: ``_`` only where it can open or
#: close emphasis (not inside a word: ``g1_rdma_peer`` stays as it is).
_SPECIAL = re.compile(r"[\\`*\[\]<|~&]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def render(result: GateResult) -> str:
    """The Markdown report of ``result``."""
    lines = [f"# {text(result.title)} ({result.gate}): {result.verdict}", ""]
    lines += [f"- **{label}:** {text(value)}" for label, value in facts(result)]
    for name, host in result.hosts.items():
        lines += ["", f"## {text(name)}: {host.verdict}", ""]
        if host.unreachable:
            lines += [f"Unreachable: {text(host.unreachable)}", ""]
        lines += _table(
            ("check", "status", "value", "rule", "reason"), [_row(c) for c in host.checks]
        )
    lines += ["", "## Errors: checks that could not run", ""]
    found = errors(result)
    if found:
        lines += [
            f"- **{text(host)}** `{check}`: could not run: {text(reason)}"
            for host, check, reason in found
        ]
    else:
        lines.append("None: every check that was not skipped was measured.")
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


def _row(check: CheckResult) -> tuple[str, ...]:
    reason = check.reason
    if check.status is CheckStatus.ERROR:
        reason = f"could not run: {reason}"
    failed = check.status in (CheckStatus.FAIL, CheckStatus.ERROR)
    return (
        f"`{check.id}` {text(check.title)}",
        f"**{check.status}**" if failed else str(check.status),
        text(full_value_text(check.value, check.unit)),
        text(check.expected or "-"),
        text(reason if check.status is not CheckStatus.PASS else ""),
    )


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def text(value: str) -> str:
    """``value`` as Markdown shows it literally: on one line, its markup characters escaped."""
    one_line = " ".join(printable(str(value)).split())
    return _SPECIAL.sub(lambda m: "\\" + m.group(), one_line)
