"""The ``fxkit`` command line: parses arguments and calls the layers below; no logic of its own."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.markup import escape

from fxkit import __version__
from fxkit.cli.bench import bench
from fxkit.cli.demo import demo
from fxkit.cli.inventory import inventory
from fxkit.cli.lab import lab
from fxkit.cli.loader import load, make_checkpoint
from fxkit.cli.play import play
from fxkit.cli.probe import serve_probe
from fxkit.cli.rollout import rollout
from fxkit.cli.stage import stage
from fxkit.errors import FxkitError

err_console = Console(stderr=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fxkit")
def cli() -> None:
    """Provision inference nodes Ansible-style, and load models fast.

    \b
    Provisioning:  fxkit play PLAYBOOK -i INVENTORY [--check] [--diff]
    Rollout:       fxkit rollout -i INVENTORY [--canary] [--serial N] [--report FILE]
    Inventories:   fxkit inventory -i INVENTORY [-i ...] --list | --graph | --list-hosts P
    Lab fleet:     fxkit lab up N | status | down
    Models:        fxkit stage SRC DEST; fxkit load MODEL; fxkit bench load MODEL;
                   fxkit make-checkpoint DIR; fxkit serve-probe MODEL --port P
    Demo:          fxkit demo (both halves on a lab fleet, as root)
    """


COMMANDS = (play, rollout, inventory, lab, stage, load, bench, make_checkpoint, serve_probe, demo)
for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    """Console entry point: user mistakes print as one clear message, never a traceback."""
    from fxkit.loader.errors import LoaderError

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
