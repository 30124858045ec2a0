"""``fxkit rollout``: start or restart server instances across nodes in batches, and report;
``fxkit rollout status`` and ``history``: the revisions the hosts run and keep."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console

from fxkit.cli.play import (
    CONNECT_OPTIONS,
    TARGET_OPTIONS,
    F,
    connect_options_from,
    options_from,
    run_options,
    with_options,
)
from fxkit.engine.playbook import Play
from fxkit.engine.record import Recorder
from fxkit.engine.runner import RunOptions
from fxkit.engine.variables import parse_extra_vars
from fxkit.errors import masked_errors
from fxkit.localfile import write_whole
from fxkit.rollout import Hooks, Rollout, planner, serving_hosts, table
from fxkit.rollout import rollout as run_rollout
from fxkit.rollout.drain import Hook
from fxkit.rollout.state import gather, history_table, status_table, to_json
from fxkit.rollout.undo import undo as run_undo

HOOK_OPTIONS = [
    click.option(
        "--deregister-hook",
        metavar="COMMAND|URL",
        help="Before an instance that changes revision is drained: a command run here ({host}, "
        "{instance}, {address}, {port} in its words, FXKIT_HOOK_* in its environment) or a URL "
        "to POST them to as JSON.",
    ),
    click.option(
        "--register-hook",
        metavar="COMMAND|URL",
        help="Once an instance is ready on its new revision: as --deregister-hook.",
    ),
    click.option(
        "--drain-timeout",
        type=click.FloatRange(min=0),
        default=60.0,
        show_default=True,
        help="Seconds to wait for an instance's running requests (vllm:num_requests_running) to "
        "end before it is stopped anyway.",
    ),
    click.option(
        "--smoke-prompt",
        metavar="TEXT",
        default="",
        help="A replaced instance is ready once it also answers this prompt on /v1/completions "
        "with a completion (vLLM's CompletionResponse shape); else its batch fails.",
    ),
]


def surge_option(text: str) -> Callable[[F], F]:
    """``--max-surge N`` (default 0: no surge), with its help ``text``, and
    ``--surge-memory-reserve GIB``."""
    return with_options(
        [
            click.option(
                "--max-surge", type=click.IntRange(min=0), default=0, show_default=True, help=text
            ),
            click.option(
                "--surge-memory-reserve",
                metavar="GIB",
                type=click.FloatRange(min=0, max=2**30),  # (nan passes a range: see _reserve)
                callback=_reserve,
                default=0.0,
                show_default=True,
                help="Memory each node keeps available beside its surge copies: a copy starts "
                "only where the node's MemAvailable less this holds what its instance's "
                "processes hold now; else the instance is drained first.",
            ),
        ]
    )


def _reserve(ctx: click.Context, param: click.Parameter, gib: float) -> int:
    """``--surge-memory-reserve`` in bytes (nan refused)."""
    if gib != gib:
        raise click.BadParameter("not a number of GiB", ctx, param)
    return int(gib * 2**30)


def _no_lone_reserve(max_surge: int, reserve: int) -> None:
    """A reserve without surge would be ignored: say so."""
    if reserve and not max_surge:
        raise click.UsageError("--surge-memory-reserve needs --max-surge N (N > 0)")


class RolloutGroup(click.Group):
    """``fxkit rollout [run] PLAYBOOK ...``: a first word that names no subcommand runs the
    rollout, as before there were subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=RolloutGroup, context_settings={"max_content_width": 100})
def rollout() -> None:
    """Roll serving instances out (`fxkit rollout [run] PLAYBOOK`), or show what the hosts run
    (`status`) and keep (`history`), or go back to an earlier revision (`undo`)."""


@rollout.command("run", context_settings={"max_content_width": 100})
@click.argument("playbook", default="rollout")
@click.option(
    "--serial",
    metavar="N[,N]",
    help="Instances per batch: a number, a percentage or a list (the last repeats); default: "
    "the play's serial, else all at once.",
)
@click.option("--canary", is_flag=True, help="The first batch is one instance.")
@click.option(
    "--max-unavailable-per-node",
    type=click.IntRange(min=1),
    help="At most this many instances of one host in a batch (replaced at once); a batch "
    "that would take more is cut into several. The fleet's limit is --serial.",
)
@surge_option(
    "Per host, start this many of a batch's changing instances' new revisions beside the "
    "old ones first, on GPUs the layout leaves free and ports after its own, and move traffic "
    "to them (hooks) while the old ones are replaced; an instance with no room is drained first."
)
@click.option(
    "--max-fail-percentage",
    type=click.FloatRange(0, 100),
    help="Stop after a batch in which more instances failed (default: the play's, else 0).",
)
@with_options(HOOK_OPTIONS)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report (every instance, the batches, the fleet's time to ready) as JSON.",
)
@run_options
def run(
    playbook: str,
    serial: str | None,
    canary: bool,
    max_unavailable_per_node: int | None,
    max_surge: int,
    surge_memory_reserve: int,
    max_fail_percentage: float | None,
    deregister_hook: str | None,
    register_hook: str | None,
    drain_timeout: float,
    smoke_prompt: str,
    report: Path | None,
    **params: Any,
) -> None:
    """Roll out the instances of PLAYBOOK (default: the built-in `rollout`) batch by batch.

    \b
    Example:
      fxkit rollout -i inventory/mi308x.yml --canary --serial 25% --report rollout.json
      fxkit rollout -i .lab/inventory.yml -e @lab-rollout.yml --check
      fxkit rollout -i hosts.yml --serial 1 --deregister-hook 'lb-ctl remove {address}:{port}' \\
        --register-hook http://lb.example:9000/backends
      fxkit rollout -i hosts.yml --serial 1 --max-surge 1 --deregister-hook ... --register-hook ...

    Exit code: 0 when every instance it acted on is ready, 1 when one failed or the rollout
    stopped, 2 for a mistake in the command line or the files, 130 when interrupted.
    """
    _no_lone_reserve(max_surge, surge_memory_reserve)
    hooks = _hooks(deregister_hook, register_hook, drain_timeout, smoke_prompt)
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
            hooks=hooks,
            max_unavailable_per_node=max_unavailable_per_node,
            max_surge=max_surge,
            surge_memory_reserve=surge_memory_reserve,
        )
    finally:
        if log:
            log.close()
    _report(result, report)


def _hooks(
    deregister: str | None, register: str | None, drain_timeout: float, smoke_prompt: str
) -> Hooks:
    return Hooks(
        deregister=Hook(deregister) if deregister else None,
        register=Hook(register) if register else None,
        drain_timeout=drain_timeout,
        smoke_prompt=smoke_prompt,
    )


def _report(result: Rollout, report: Path | None) -> None:
    """Print the table (and why it stopped), write the JSON report, exit with its code."""
    console = Console(highlight=False, soft_wrap=True)
    console.print(table(result))
    if result.stopped:
        console.print(f"[bold red]STOPPED:[/] {result.stopped}")
    if report:
        write_whole(report, json.dumps(result.to_json(), indent=2) + "\n")
    sys.exit(result.exit_code)


@rollout.command("undo", context_settings={"max_content_width": 100})
@click.argument("playbook", default="rollout")
@click.option("--to", "to", metavar="REVISION", help="The revision (default: the previous one).")
@click.option("--serial", metavar="N[,N]", help="Instances per batch, as for the rollout.")
@surge_option(
    "Per host, start this many of a batch's instances on the earlier revision beside them "
    "first, as for the rollout; an instance with no room is drained first."
)
@click.option(
    "--max-fail-percentage",
    type=click.FloatRange(0, 100),
    help="Stop (and roll the batch back) after a batch in which more instances failed.",
)
@with_options(HOOK_OPTIONS)
@click.option(
    "--report", type=click.Path(dir_okay=False, path_type=Path), help="Write the report as JSON."
)
@run_options
def undo(
    playbook: str,
    to: str | None,
    serial: str | None,
    max_surge: int,
    surge_memory_reserve: int,
    max_fail_percentage: float | None,
    deregister_hook: str | None,
    register_hook: str | None,
    drain_timeout: float,
    smoke_prompt: str,
    report: Path | None,
    **params: Any,
) -> None:
    """Return every instance to an earlier revision (`fxkit rollout history` lists them),
    batch by batch, each drained first (or with a surge copy serving); a failed batch is rolled
    back.

    \b
    Example:
      fxkit rollout undo -i inventory/mi308x.yml --serial 1
      fxkit rollout undo -i inventory/mi308x.yml --to r-1a2b3c4d5e6f
      fxkit rollout undo -i hosts.yml --max-surge 1 --deregister-hook CMD --register-hook CMD

    Exit code: as for the rollout.
    """
    if params["check"]:
        raise click.UsageError(
            "undo has no check mode: fxkit rollout history shows what it would do"
        )
    _no_lone_reserve(max_surge, surge_memory_reserve)
    options, recorder, log = options_from(params)
    try:
        result = run_undo(
            playbook,
            params["inventory"],
            options,
            recorder,
            to=to,
            serial=_serial(serial) if serial else None,
            max_fail_percentage=max_fail_percentage,
            hooks=_hooks(deregister_hook, register_hook, drain_timeout, smoke_prompt),
            max_surge=max_surge,
            surge_memory_reserve=surge_memory_reserve,
        )
    finally:
        if log:
            log.close()
    _report(result, report)


def _serial(text: str) -> list[int | str]:
    """``--serial 1,25%`` as a play's ``serial`` (checked as the playbook's is)."""
    sizes: list[int | str] = [int(s) if s.strip().isdigit() else s.strip() for s in text.split(",")]
    try:
        return Play.model_validate({"hosts": "all", "serial": sizes}).serial or []
    except ValidationError as exc:
        raise click.BadParameter(exc.errors()[0]["msg"], param_hint="--serial") from None


def _inspect(playbook: str, report: Path | None, params: dict[str, Any], *, history: bool) -> None:
    """Read every host's instances and revisions; print the status or the history."""
    options = RunOptions(
        limit=params["limit"],
        extra_vars=parse_extra_vars(params["extra_vars"]),
        forks=params["forks"],
        roles_path=list(params["roles_path"]),
        connect=connect_options_from(params),
    )
    recorder = Recorder()
    _, _, runner = planner(playbook, params["inventory"], options, recorder)
    with masked_errors(runner.recorder.redact):
        _, role, hosts = serving_hosts(runner)
        states, histories = gather(runner, role, hosts)
    console = Console(highlight=False, soft_wrap=True)
    console.print(history_table(histories) if history else status_table(states))
    if report:
        write_whole(report, json.dumps(to_json(states, histories), indent=2) + "\n")
    if not history and not all(s.current for s in states):
        sys.exit(1)


INSPECT_OPTIONS = [
    click.argument("playbook", default="rollout"),
    click.option(
        "--report",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Also write the instances and revisions as JSON.",
    ),
    *TARGET_OPTIONS,
    *CONNECT_OPTIONS,
]


@rollout.command(context_settings={"max_content_width": 100})
@with_options(INSPECT_OPTIONS)
def status(playbook: str, report: Path | None, **params: Any) -> None:
    """Per instance: its PID, the revision it runs, the revision wanted now, its health.

    \b
    Example:
      fxkit rollout status -i inventory/mi308x.yml

    Exit code: 0 when every instance runs the wanted revision and is ready, 1 otherwise.
    """
    _inspect(playbook, report, params, history=False)


@rollout.command(context_settings={"max_content_width": 100})
@with_options(INSPECT_OPTIONS)
def history(playbook: str, report: Path | None, **params: Any) -> None:
    """Per host: the revisions it keeps, newest first, and the instances that use each.

    \b
    Example:
      fxkit rollout history -i inventory/mi308x.yml
    """
    _inspect(playbook, report, params, history=True)
