"""``fxkit estimate``: KV cache, offload break-even, load time and cost (docs/ESTIMATOR.md)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console


@click.command()
@click.argument(
    "inputs", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A Hugging Face config.json (replaces the inputs file's model.config).",
)
@click.option(
    "--from-results",
    "results",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Measured figures: fxkit bench load --json output or a gate result JSON (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set one input, e.g. --set store.read_bandwidth='5 GB/s' (repeatable; wins over all).",
)
def estimate(
    inputs: Path | None, model: Path | None, results: tuple[Path, ...], as_json: bool,
    sets: tuple[str, ...],
) -> None:  # fmt: skip
    """Estimate KV cache, offload break-even, load time and cost for a model on GPUs.

    INPUTS is a YAML file of inputs with units (examples/estimate/); every input has a default.
    """
    from fxkit.estimate import collect, render
    from fxkit.estimate.summary import estimate as run

    values, used = collect(inputs, model, results, sets)
    result = run(values)
    if as_json:
        click.echo(json.dumps(render.as_json(result, values, used), indent=2))
    else:
        render.table(result, used, Console())
