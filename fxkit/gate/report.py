"""A gate run's reports: the files ``--out DIR`` gets, and the table on the terminal."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from fxkit.gate.results import GateResult

STYLES = {
    "PASS": "green",
    "FAIL": "bold red",
    "WARN": "yellow",
    "ERROR": "bold magenta",
    "SKIP": "dim",
}


def write_reports(result: GateResult, out: Path, secrets: Iterable[str] = ()) -> dict[str, Path]:
    """Write every report of ``result`` into ``out`` (made if missing); their paths by kind."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"json": out / "result.json"}
    result.save(written["json"], secrets)
    return written


def value_text(value: Any, unit: str | None = None) -> str:
    """A measured value in a few characters (per-item values summarised)."""
    if isinstance(value, dict):
        items = list(value.values())
        shown = ", ".join(value_text(v) for v in items[:4])
        more = f", +{len(items) - 4}" if len(items) > 4 else ""
        return f"[{shown}{more}]" + (f" {unit}" if unit else "")
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
            reason = "" if check.status == "PASS" else check.reason
            grid.add_row(
                name,
                check.id,
                Text(check.status, style=STYLES[check.status]),
                value_text(check.value, check.unit),
                check.expected,
                reason,
            )
    return grid
