"""``fxkit play``: run a playbook against an inventory."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import click

from fxkit import paths
from fxkit.connection import ConnectOptions
from fxkit.engine.console import console_recorder
from fxkit.engine.playbook import Playbook
from fxkit.engine.record import Recorder
from fxkit.engine.role import TagFilter
from fxkit.engine.runlock import LOCK_WAIT
from fxkit.engine.runner import RunOptions, load_inventory, run_playbook
from fxkit.engine.variables import parse_extra_vars

F = TypeVar("F", bound=Callable[..., Any])


def _tags(values: tuple[str, ...]) -> frozenset[str]:
    return frozenset(t.strip() for value in values for t in value.split(",") if t.strip())


#: Which hosts and variables: every command that runs on an inventory (play, rollout, gate).
TARGET_OPTIONS = [
    click.option(
        "-i",
        "--inventory",
        required=True,
        multiple=True,
        help="Inventory file (YAML or INI), directory, or a built-in name; repeat to merge "
        "several.",
    ),
    click.option(
        "-l", "--limit", metavar="PATTERN", help="Only hosts matching PATTERN (a:b, a:&b, a:!b)."
    ),
    click.option(
        "-e",
        "--extra-vars",
        multiple=True,
        metavar="VARS",
        help="key=value, a JSON/YAML mapping, or @file.yml; wins over every other variable.",
    ),
    click.option(
        "-f",
        "--forks",
        type=click.IntRange(min=1),
        default=50,
        show_default=True,
        help="Hosts at once.",
    ),
    click.option(
        "--roles-path",
        multiple=True,
        type=click.Path(file_okay=False),
        envvar="FXKIT_ROLES_PATH",
        help="Extra role folders, searched after the playbook's roles/ and before the built-in "
        "roles (env FXKIT_ROLES_PATH, ':'-separated).",
    ),
]

#: How changes are made and shown (play, rollout).
CHANGE_OPTIONS = [
    click.option("-C", "--check", is_flag=True, help="Change nothing; report what would change."),
    click.option(
        "-D", "--diff", is_flag=True, help="Show diffs of what changes (or would change)."
    ),
    click.option(
        "-t",
        "--tags",
        multiple=True,
        metavar="T[,T]",
        help="Only roles/operations with these tags.",
    ),
    click.option(
        "--skip-tags", multiple=True, metavar="T[,T]", help="Skip roles/operations with these tags."
    ),
    click.option(
        "--log-json",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Write one JSON event per operation, then one summary per host, to FILE.",
    ),
    click.option(
        "-v", "--verbose", is_flag=True, help="Also show operations that were already ok."
    ),
    click.option(
        "--lock-wait",
        type=click.FloatRange(min=0),
        default=LOCK_WAIT,
        show_default=True,
        metavar="SECONDS",
        help="Wait this long for another run's lock of a host (0: fail on that host at once).",
    ),
]

#: How hosts are reached (play, rollout, gate).
CONNECT_OPTIONS = [
    click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to connect."),
    click.option("--command-timeout", type=float, help="Seconds a remote command may run."),
    click.option(
        "--connect-retries",
        type=click.IntRange(min=0),
        default=2,
        show_default=True,
        help="Retries of a failed connection attempt.",
    ),
    click.option(
        "--known-hosts", type=click.Path(dir_okay=False), help="fxkit's known_hosts file."
    ),
    click.option(
        "--accept-new-host-keys",
        is_flag=True,
        help="Trust and record unknown SSH host keys (changed keys are always refused).",
    ),
    click.option("-K", "--ask-become-pass", is_flag=True, help="Prompt for the sudo password."),
    click.option(
        "--become-password-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Read the sudo password from FILE (or set FXKIT_BECOME_PASSWORD).",
    ),
]

#: The options of every command that runs a playbook (``fxkit play``, ``fxkit rollout``).
RUN_OPTIONS = [*TARGET_OPTIONS, *CHANGE_OPTIONS, *CONNECT_OPTIONS]


def with_options(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    """A decorator adding ``options`` (e.g. :data:`TARGET_OPTIONS`) to a click command."""

    def add(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return add


run_options = with_options(RUN_OPTIONS)


def connect_options_from(params: dict[str, Any]) -> ConnectOptions:
    """The connection settings from the values of :data:`CONNECT_OPTIONS`."""
    become_password = os.environ.get("FXKIT_BECOME_PASSWORD")
    if params["become_password_file"]:
        become_password = params["become_password_file"].read_text().rstrip("\n")
    if params["ask_become_pass"]:
        become_password = click.prompt("become password", hide_input=True)
    return ConnectOptions(
        connect_timeout=params["connect_timeout"],
        command_timeout=params["command_timeout"],
        connect_retries=params["connect_retries"],
        known_hosts=params["known_hosts"],
        accept_new_host_keys=params["accept_new_host_keys"],
        become_password=become_password,
    )


def options_from(params: dict[str, Any]) -> tuple[RunOptions, Recorder, IO[str] | None]:
    """The run's options and its recorder (and the open --log-json file, to close) from the
    values of :data:`RUN_OPTIONS`."""
    options = RunOptions(
        check=params["check"],
        diff=params["diff"],
        tags=TagFilter(_tags(params["tags"]), _tags(params["skip_tags"])),
        limit=params["limit"],
        extra_vars=parse_extra_vars(params["extra_vars"]),
        forks=params["forks"],
        roles_path=list(params["roles_path"]),
        connect=connect_options_from(params),
        lock_wait=params["lock_wait"],
    )
    log = params["log_json"].open("w", encoding="utf-8") if params["log_json"] else None
    recorder = console_recorder(diff=params["diff"], verbose=params["verbose"], log_json=log)
    return options, recorder, log


@click.command(context_settings={"max_content_width": 100})
@click.argument("playbook")
@click.option(
    "--list-hosts", is_flag=True, help="Only list the hosts each play would run on, in order."
)
@run_options
def play(playbook: str, list_hosts: bool, **params: Any) -> None:
    """Run PLAYBOOK (a file, or a built-in name like `site`) against an inventory.

    \b
    Example:
      fxkit play site -i local -e node_base_root=/tmp/node --check --diff
      fxkit play site.yml -i hosts.ini --limit 'gpu:!rack2' -e node_role=inference

    Exit code: 0 when no host failed or was unreachable, 1 otherwise, 2 for a mistake in the
    command line, inventory, playbook or roles, 130 when interrupted (Ctrl-C).
    """
    if list_hosts:
        _list_hosts(playbook, params["inventory"], params["limit"])
        return
    options, recorder, log = options_from(params)
    try:
        results = run_playbook(playbook, params["inventory"], options, recorder)
    finally:
        if log:
            log.close()
    sys.exit(results.exit_code)


def _list_hosts(playbook: str, inventory: tuple[str, ...], limit: str | None) -> None:
    """``--list-hosts``: each play's hosts, as ``ansible-playbook --list-hosts`` shows them."""
    book = Playbook.load(paths.resolve(playbook, "playbooks"))
    hosts = load_inventory(inventory)
    click.echo(f"\nplaybook: {book.path}")
    for number, play in enumerate(book.plays, 1):
        selected = hosts.select(play.hosts, limit)
        tags = ",".join(play.tags)
        click.echo(f"\n  play #{number} ({play.hosts}): {play.name or play.hosts}\tTAGS: [{tags}]")
        click.echo(f"    pattern: {[play.hosts]!r}\n    hosts ({len(selected)}):")
        for host in selected:
            click.echo(f"      {host.name}")
