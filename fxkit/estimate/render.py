"""The estimate as a rich table (one per section, values in readable units) or as JSON (values in
base units with a ``unit`` field, the verdicts, every input with its origin)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from fxkit.estimate.from_results import Used
from fxkit.estimate.inputs import Inputs
from fxkit.estimate.summary import Estimate, Row

TITLES = {
    "model": "Model",
    "kv": "KV cache",
    "offload": "Offload break-even",
    "load": "Load time",
    "cost": "Cost",
}

_SCALES = {
    "B": [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")],
    "FLOP/s": [(1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1, "FLOP/s")],
    "FLOP": [(1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1, "FLOP")],
}


def text(row: Row) -> str:
    """``row``'s value for people: bytes in decimal units, times in ms/s/min/h, counts with
    thousands separators."""
    value = row.value
    if value is None:
        return "never (up to the longest context tried)" if row.unit == "tokens" else "-"
    if isinstance(value, bool | str):
        return str(value)
    if row.unit in _SCALES:
        for scale, name in _SCALES[row.unit]:
            if abs(value) >= scale or scale == 1:
                return f"{value / scale:,.3g} {name}"
    if row.unit == "s":
        return _seconds(value)
    if row.unit == "x":
        return f"{value:,.2f}x"
    if row.unit in ("tokens", ""):
        return f"{value:,}" if isinstance(value, int) else f"{value:.3g}"
    return f"{value:,.2f} {row.unit}"


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    if value < 600:
        return f"{value:.3g} s"
    if value < 36000:
        return f"{value / 60:.3g} min"
    return f"{value / 3600:.3g} h"


def table(estimate: Estimate, used: list[Used], console: Console) -> None:
    """Print one table per section, then the verdicts and the measured figures used."""
    for name, rows in estimate.sections.items():
        grid = Table(title=TITLES[name], title_justify="left", show_header=False)
        grid.add_column("figure")
        grid.add_column("value", justify="right")
        for row in rows:
            grid.add_row(row.label, text(row))
        console.print(grid)
    v = estimate.verdicts
    even = v["break_even_tokens"]
    console.print(
        "needs external KV capacity: " + ("yes" if v["needs_external_kv"] else "no"),
        highlight=False,
    )
    console.print(
        "reload vs recompute at the workload's context: "
        + ("reload wins" if v["reload_wins"] else "recompute wins")
        + (
            f" (reload wins from {even:,} tokens)"
            if even
            else " (recompute wins at every length tried)"
        ),
        highlight=False,
    )
    if not v["weights_fit"]:
        console.print("[bold red]the weights do not fit in GPU memory at this TP size[/]")
    for result in used:
        figures = ", ".join(f"{key} = {value} ({check})" for key, value, check in result.figures)
        console.print(
            f"from {result.path} ({result.kind}): {figures or 'nothing'}", highlight=False
        )
        for skipped in result.skipped:
            console.print(f"  skipped {skipped}", highlight=False)


def as_json(estimate: Estimate, inputs: Inputs, used: list[Used]) -> dict[str, Any]:
    """The estimate as plain JSON: sections of {key: {label, value, unit}}."""
    return {
        "schema": "fxkit-estimate/1",
        "sections": {
            name: {
                r.key: {"label": r.label, "value": _clean(r.value), "unit": r.unit} for r in rows
            }
            for name, rows in estimate.sections.items()
        },
        "verdicts": estimate.verdicts,
        "inputs": {
            key: {"value": _clean(value), "from": inputs.origins.get(key, "default")}
            for key, value in sorted(inputs.values.items())
        },
        "results": [
            {
                "path": str(u.path),
                "kind": u.kind,
                "used": [{"input": k, "value": v, "check": c} for k, v, c in u.figures],
                "skipped": u.skipped,
            }
            for u in used
        ],
    }


def _clean(value: Any) -> Any:
    """Floats at 12 significant digits (no 2013.9999999999998); price tuples as their value."""
    if isinstance(value, tuple):
        return {"per_byte": _clean(value[0]), "currency": value[1]}
    if isinstance(value, float) and math.isfinite(value) and value:
        return float(f"{value:.12g}")
    return value
