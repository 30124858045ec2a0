"""``fxkit gate``: run an acceptance gate (g1-g4, or a gate file) on nodes; re-evaluate results."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fxkit import paths
from fxkit.cli.play import CONNECT_OPTIONS, TARGET_OPTIONS, connect_options_from, with_options
from fxkit.engine.runner import ctrl_c
from fxkit.engine.variables import parse_extra_vars
from fxkit.errors import FxkitError, masked_errors
from fxkit.gate import spec
from fxkit.gate.report import (
    STAGE_COLUMNS,
    STYLES,
    duration_text,
    masked,
    stage_table,
    table,
    value_text,
    write_reports,
)
from fxkit.gate.run import GateOptions, GateRun, rule_renderer
from fxkit.gate.verdicts import CheckResult, CheckStatus, GateResult, load_results, reevaluate
from fxkit.redaction import Masker

console = Console(highlight=False, soft_wrap=True)

OUT_OPTION = click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for result.json and the reports (default: ./gate-results/GATE-TIMESTAMP).",
)


class GateGroup(click.Group):
    """``fxkit gate NAME``: NAME is a built-in gate (g1...) or a gate file; ``evaluate`` too."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        gates = sorted(p.stem for p in paths.builtin("gates").glob("*.yml"))
        return [*gates, "evaluate"]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "evaluate":
            return evaluate
        if name in self.list_commands(ctx) or Path(name).is_file():
            return _run_command(name)
        return None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        command = self.get_command(ctx, name)
        if command is None:
            gates = ", ".join(self.list_commands(ctx)[:-1])
            raise click.UsageError(
                f"no gate {name!r}: give a built-in gate ({gates}), a gate file, or evaluate"
            )
        return name, command, args[1:]


@click.group(cls=GateGroup, context_settings={"max_content_width": 100})
def gate() -> None:
    """Acceptance gates: G1 arrival, G2 single-node baseline, G3 main gate, G4 stability.

    \b
    Examples:
      fxkit gate g1 -i inventory/mi308x.yml --out g1-rack1
      fxkit gate g1 -i inventory/mi308x.yml --stage health      # one stage alone (minutes)
      fxkit gate g3 -i inventory/mi308x.yml --baseline g2-rack1/result.json
      fxkit gate g4 -i inventory/mi308x.yml -e g4_duration=72h
      fxkit gate my-gates/g1-site.yml -i hosts.ini --limit 'gpu:!rack2'
      fxkit gate evaluate g1-rack1/result.json -e g1_storage_read_min_gbps=6

    Each gate is a YAML file of checks (built-in: gates/g1.yml...; copy and edit them). Exit
    code: 0 when every check on every host passed, 1 when one FAILed or is ERROR (it could not
    run), 2 for a mistake in the command line or the files, 130 when interrupted.
    """


def _run_command(name: str) -> click.Command:
    @click.command(name=name, context_settings={"max_content_width": 100}, help=_about(name))
    @with_options(TARGET_OPTIONS)
    @OUT_OPTION
    @click.option(
        "--baseline",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="An earlier run's result.json that the gate's change rules compare with (G3: G2's).",
    )
    @click.option(
        "--stage",
        "stages",
        multiple=True,
        metavar="STAGE",
        help="Run only this stage's checks (repeat for more); without it, the whole gate.",
    )
    @with_options(CONNECT_OPTIONS)
    def run(
        out: Path | None, baseline: Path | None, stages: tuple[str, ...], **params: Any
    ) -> None:
        gate_file = spec.load(name)
        if gate_file.spec.baseline and baseline is None and _has_change_rules(gate_file):
            console.print(
                f"[yellow]note:[/] {gate_file.name}'s change rules need --baseline "
                f"({gate_file.spec.baseline}'s result.json); without it they are ERROR"
            )
        options = GateOptions(
            limit=params["limit"],
            forks=params["forks"],
            connect=connect_options_from(params),
            extra_vars=parse_extra_vars(params["extra_vars"]),
            roles_path=list(params["roles_path"]),
            baseline=load_results(baseline) if baseline else None,
            stages=list(dict.fromkeys(stages)),
        )
        runner = GateRun.load(gate_file, params["inventory"], options, progress=_progress)
        plans = runner.plan()  # mistakes show before any host is touched
        console.print(
            f"[bold]{escape(gate_file.spec.title)}[/] ({gate_file.path}): "
            f"{len(gate_file.checks_of(options.stages))} checks on {len(plans)} host(s)"
            + (f", stage {', '.join(options.stages)} only" if options.stages else "")
        )
        _expected(gate_file, options.stages)
        with ctrl_c(lambda: _interrupt(runner)):
            result = runner.run(plans)
        _finish(result, out, runner.masker)

    return run


@gate.command(context_settings={"max_content_width": 100})
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--gate",
    "gate_file",
    help="The gate file to judge by (default: the built-in gate the results name, as it is now).",
)
@click.option("-e", "--extra-vars", multiple=True, metavar="VARS", help="Override variables.")
@click.option(
    "--baseline",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Judge change rules against this result.json instead of the recorded baseline values.",
)
@OUT_OPTION
def evaluate(
    results: Path,
    gate_file: str | None,
    extra_vars: tuple[str, ...],
    baseline: Path | None,
    out: Path | None,
) -> None:
    """Judge RESULTS (a result.json) again against the gate's current thresholds, touching no
    host: edit the gate file (or pass -e) and re-evaluate. The values kept in RESULTS are data:
    they are never rendered again, and the gate file it names is opened only by --gate."""
    earlier = load_results(results)
    judged_by = spec.load(gate_file) if gate_file else _builtin_gate(earlier, results)
    masker = Masker()
    with masked_errors(masker.text):
        result = reevaluate(
            earlier,
            judged_by,
            rule_renderer(judged_by, parse_extra_vars(extra_vars), on_secret=masker.add),
            load_results(baseline) if baseline else None,
            parse_extra_vars(extra_vars),
        )
    result.reevaluated_from = str(results)
    _finish(result, out or results.parent / f"reevaluated-{_stamp()}", masker)


def _builtin_gate(earlier: GateResult, results: Path) -> spec.Gate:
    """The built-in gate that ``earlier`` was made with; any other file it names is shown, never
    opened (a results file does not choose what fxkit reads)."""
    builtins = {p.stem: p for p in paths.builtin("gates").glob("*.yml")}
    path = builtins.get(earlier.gate)
    if path is not None and str(path) == earlier.gate_file:
        return spec.load(path)
    raise FxkitError(
        f"the results were made with the gate file {earlier.gate_file} "
        "(not opened: only --gate chooses the file to judge by)",
        where=str(results),
        hint=f"check that file, then: --gate {earlier.gate_file}",
    )


def _about(name: str) -> str:
    """The command's help: the gate file's title and about (its mistakes show when it runs)."""
    generic = "Run the gate's checks on the inventory's hosts, in parallel; write the reports."
    try:
        gate_file = spec.load(name)
    except FxkitError:
        return generic
    about = f"{gate_file.spec.title}: {gate_file.spec.about}\n\n{generic}".strip()
    expected = gate_file.expected_stages()
    if not expected:
        return about
    stages = ", ".join(f"{s} ({duration_text(t)})" if t else s for s, t in expected.items())
    return f"{about}\n\nStages (--stage NAME; expected time on a healthy node): {stages}."


def _finish(result: GateResult, out: Path | None, masker: Masker) -> None:
    """The table, the reports and the verdict, every secret of ``masker`` masked."""
    result = masked(result, masker.masks)
    console.print(table(result))
    if result.stages:  # a gate that declares stages: their expected and actual durations
        console.print(_stage_grid(result))
    folder = out or Path("gate-results") / f"{result.gate}-{_stamp()}"
    written = write_reports(result, folder, masker.values)
    summary = ", ".join(f"{n} {s}" for s, n in result.summary.items() if n)
    style = STYLES[result.verdict]
    console.print(f"[{style}]{result.gate.upper()} {result.verdict}[/]: {summary}")
    for kind, path in written.items():
        console.print(f"  {kind}: {escape(str(path))}")
    sys.exit(result.exit_code)


def _expected(gate_file: spec.Gate, stages: list[str]) -> None:
    """The stages about to run, each with its expected duration."""
    expected = gate_file.expected_stages()
    shown = [s for s in expected if not stages or s in stages]
    if shown:
        words = [f"{s} (expected {duration_text(expected[s])})" for s in shown]
        console.print(f"stages: {', '.join(words)}")


def _stage_grid(result: GateResult) -> Table:
    """Each stage's expected and actual duration."""
    grid = Table(title="Stages: expected and actual duration", title_justify="left")
    for column in STAGE_COLUMNS:
        grid.add_column(column)
    for row in stage_table(result):
        grid.add_row(*(Text(cell) for cell in row))
    return grid


def _progress(host: str, check: CheckResult) -> None:
    style = STYLES[check.status]
    passed = check.status is CheckStatus.PASS
    detail = value_text(check.value, check.unit) if passed else check.reason
    console.print(
        f"{escape(host)} [{style}]{check.status:5}[/] {check.id}: {escape(detail)}", overflow="fold"
    )


def _interrupt(runner: GateRun) -> None:
    number = runner.interrupt()
    if number == 1:
        console.print(
            "[bold red]interrupted:[/] hosts stop after their current measurement "
            "(Ctrl-C again to cut them off)"
        )
    elif number == 2:
        console.print("[bold red]cutting off the running measurements[/]")


def _has_change_rules(gate_file: spec.Gate) -> bool:
    return any("change" in check.rule for check in gate_file.spec.checks)


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
