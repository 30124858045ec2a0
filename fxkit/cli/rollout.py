"""``fxkit rollout``: start or restart server instances across nodes in batches, and report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console

from fxkit.cli.play import options_from, run_options
from fxkit.engine.playbook import Play
from fxkit.localfile import write_whole
from fxkit.rollout import rollout as run_rollout
from fxkit.rollout import table


@click.command(context_settings={"max_content_width": 100})
@click.argument("playbook", default="rollout")
@click.option(
    "--serial",
    metavar="N[,N]",
    help="Instances per batch: a number, a percentage or a list (the last repeats); default: "
    "the play's serial, else all at once.",
)
@click.option("--canary", is_flag=True, help="The first batch is one instance.")
@click.option(
    "--max-fail-percentage",
    type=click.FloatRange(0, 100),
    help="Stop after a batch in which more instances failed (default: the play's, else 0).",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report (every instance, the batches, the fleet's time to ready) as JSON.",
)
@run_options
def rollout(
    playbook: str,
    serial: str | None,
    canary: bool,
    max_fail_percentage: float | None,
    report: Path | None,
    **params: Any,
) -> None:
    """Roll out the instances of PLAYBOOK (default: the built-in `rollout`) batch by batch.

    \b
    Example:
      fxkit rollout -i inventory/mi308x.yml --canary --serial 25% --report rollout.json
      fxkit rollout -i .lab/inventory.yml -e @lab-rollout.yml --check

    Exit code: 0 when every instance it acted on is ready, 1 when one failed or the rollout
    stopped, 2 for a mistake in the command line or the files, 130 when interrupted.
    """
    options, recorder, log = options_from(params)
    batches = _serial(serial) if serial else None
    try:
        result = run_rollout(
            playbook,
            params["inventory"],
            options,
            recorder,
            serial=batches,
            max_fail_percentage=max_fail_percentage,
            canary=canary,
        )
    finally:
        if log:
            log.close()
    console = Console(highlight=False, soft_wrap=True)
    console.print(table(result))
    if result.stopped:
        console.print(f"[bold red]STOPPED:[/] {result.stopped}")
    if report:
        write_whole(report, json.dumps(result.to_json(), indent=2) + "\n")
    sys.exit(result.exit_code)


def _serial(text: str) -> list[int | str]:
    """``--serial 1,25%`` as a play's ``serial`` (checked as the playbook's is)."""
    sizes: list[int | str] = [int(s) if s.strip().isdigit() else s.strip() for s in text.split(",")]
    try:
        return Play.model_validate({"hosts": "all", "serial": sizes}).serial or []
    except ValidationError as exc:
        raise click.BadParameter(exc.errors()[0]["msg"], param_hint="--serial") from None
