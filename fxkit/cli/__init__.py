"""The ``fxkit`` command line: parses arguments and calls the layers below; no logic of its own."""

from __future__ import annotations

import importlib
import sys

import click
from rich.console import Console
from rich.markup import escape

from fxkit import __version__
from fxkit.errors import FxkitError

#: Each command's module, imported when the command runs (``fxkit serve-probe`` and
#: ``fxkit stage`` start without loading the engine, the lab or the benchmarks).
COMMANDS = {
    "play": "fxkit.cli.play:play",
    "rollout": "fxkit.cli.rollout:rollout",
    "inventory": "fxkit.cli.inventory:inventory",
    "lab": "fxkit.cli.lab:lab",
    "stage": "fxkit.cli.stage:stage",
    "load": "fxkit.cli.loader:load",
    "bench": "fxkit.cli.bench:bench",
    "make-checkpoint": "fxkit.cli.loader:make_checkpoint",
    "serve-probe": "fxkit.cli.serve_probe:serve_probe",
    "gate": "fxkit.cli.gate:gate",
    "demo": "fxkit.cli.demo:demo",
    "estimate": "fxkit.cli.estimate:estimate",
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, _, attr = COMMANDS[name].partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command


err_console = Console(stderr=True)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fxkit")
def cli() -> None:
    """Provision inference nodes Ansible-style, and load models fast.

    \b
    Provisioning:  fxkit play PLAYBOOK -i INVENTORY [--check] [--diff]
    Rollout:       fxkit rollout -i INVENTORY [--canary] [--serial N] [--max-surge N]
                   [--deregister-hook H --register-hook H] [--report FILE];
                   fxkit rollout status | history | undo [--to REVISION] -i INVENTORY
    Inventories:   fxkit inventory -i INVENTORY [-i ...] --list | --graph | --list-hosts P
    Gates:         fxkit gate g1|g2|g3|g4 -i INVENTORY [--out DIR]; fxkit gate evaluate FILE
    Estimate:      fxkit estimate [INPUTS.yml] [--model config.json] [--from-results F]
    Lab fleet:     fxkit lab up N | status | down
    Models:        fxkit stage SRC DEST; fxkit load MODEL; fxkit bench load MODEL;
                   fxkit make-checkpoint DIR; fxkit serve-probe MODEL --port P
    Demo:          fxkit demo (both halves on a lab fleet, as root)
    """


def main() -> None:
    """Console entry point: user mistakes print as one clear message, never a traceback."""
    from fxkit.loader import LoaderError

    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (FxkitError, LoaderError) as exc:
        err_console.print(
            f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        sys.exit(2)
    except SystemExit:
        raise
