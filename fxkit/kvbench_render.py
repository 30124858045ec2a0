"""``fxkit bench kv``'s output: a line per run, the table of settings, and JSON."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from fxkit.kvbench import Report, Run, as_json


def render_line(run: Run) -> str:
    if run.error:
        return f"round {run.round}  {run.label:<40} error: {run.error}"
    cpu = f"  {run.cpu_cores:4.2f} cores" if run.method == "lmcache" else ""
    return f"round {run.round}  {run.label:<40} {run.gbps:6.2f} GB/s{cpu}"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def render(report: Report, ttft: dict[str, Any], console: Console) -> None:
    """The settings by speed, the best as role variables, the ratios and the implied TTFT."""
    summary = report.summary
    chunk = report.chunk
    console.print(
        f"LMCache {report.lmcache} LocalDiskBackend on {', '.join(report.filesystems)}; "
        f"{chunk.model} TP{chunk.tp}: chunk {list(chunk.dims)} {chunk.dtype} = "
        f"{chunk.nbytes / 2**20:.1f} MiB, {report.chunks_per_worker} chunks x "
        f"{report.workers} worker(s)",
        highlight=False,
    )
    if "error" in summary:
        console.print(f"[red]{summary['error']}[/red]: {summary['errors']}")
        return
    table = Table(title="batched_get_blocking, cold (median GB/s over rounds)")
    for name in ("setting", "GB/s", "x threads=1", "x fio-best"):
        table.add_column(name, justify="left" if name == "setting" else "right")
    fio = summary["fio_best_gbps"]
    one = {s.label: s for s in report.settings}
    for label, gbps in sorted(summary["gbps"].items(), key=lambda kv: -kv[1]):
        setting = one[label]
        base = summary["gbps"].get(
            next((s.label for s in report.settings if s.threads == 1
                  and (s.odirect, s.sharded) == (setting.odirect, setting.sharded)), "")
        )  # fmt: skip
        style = "bold" if label == summary["best"] else ""
        table.add_row(
            label, f"{gbps:.2f}", _x(gbps / base if base else None),
            _x(gbps / fio if fio else None), style=style,
        )  # fmt: skip
    if fio:
        table.add_row(f"fio-best ({', '.join(summary['fio_best_settings'])})", f"{fio:.2f}")
    console.print(table)
    console.print(
        f"best: {summary['best']} at {summary['best_gbps']:.2f} GB/s, "
        f"{_x(summary['x_fio_best'])} fio-best, {_x(summary['x_threads1'])} threads=1 "
        f"(within-round medians); {summary['cpu_cores_best']:.2f} of {summary['cpu_count']} "
        "cores busy",
        highlight=False,
    )
    console.print("role variables:", json.dumps(summary["role_vars"]), highlight=False)
    for name in ("best", "threads1"):
        if name in ttft:
            t = ttft[name]
            console.print(
                f"implied at {t['gbps']:.2f} GB/s ({name}), {ttft['context_tokens']:,} tokens: "
                f"reload {t['reload_s']:.2f} s, TTFT with offload {t['ttft_with_offload_s']:.2f} s "
                f"(without {t['ttft_without_offload_s']:.2f} s)",
                highlight=False,
            )
    for note in report.notes:
        console.print(f"[yellow]note[/yellow]: {note}", highlight=False)


def save(report: Report, ttft: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """The JSON report in ``path`` (``-``: on stdout)."""
    text = json.dumps(as_json(report, ttft), indent=2) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        return
    with open(path, "w") as f:
        f.write(text)
