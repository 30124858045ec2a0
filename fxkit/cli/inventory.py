"""``fxkit inventory``: show an inventory as ``ansible-inventory`` does (JSON, graph, one host)."""

from __future__ import annotations

import json

import click

from fxkit import paths
from fxkit.errors import InventoryError
from fxkit.inventory import Inventory
from fxkit.inventory.views import as_graph, as_list
from fxkit.playbook import Playbook
from fxkit.redaction import masked


@click.command()
@click.option(
    "-i",
    "--inventory",
    "path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Inventory file (Ansible YAML or INI).",
)
@click.option("--list", "show_list", is_flag=True, help="All groups and host vars as JSON.")
@click.option("--graph", "show_graph", is_flag=True, help="The group tree (from GROUP or all).")
@click.option("--host", "host", metavar="NAME", help="One host's merged variables as JSON.")
@click.option("-l", "--limit", metavar="PATTERN", help="Only hosts matching PATTERN (--list).")
@click.option(
    "--show-secrets",
    is_flag=True,
    help="Print secret variables (*password*, *token*, ...) in clear instead of ********.",
)
@click.option(
    "--secret-vars",
    multiple=True,
    metavar="A[,B]",
    help="Mask these variables too, as a play's secret_vars does.",
)
@click.option(
    "--playbook",
    "playbooks",
    multiple=True,
    metavar="PLAYBOOK",
    help="Mask the secret_vars of this playbook's plays too.",
)
@click.argument("group", required=False)
def inventory(
    path: str,
    show_list: bool,
    show_graph: bool,
    host: str | None,
    limit: str | None,
    show_secrets: bool,
    secret_vars: tuple[str, ...],
    playbooks: tuple[str, ...],
    group: str | None,
) -> None:
    """Show an inventory: --list (JSON), --graph [GROUP] (tree) or --host NAME (variables).

    \b
    fxkit inventory -i inventory/mi308x.yml --graph
    fxkit inventory -i inventory/mi308x.yml --list --limit 'gpu_nodes:!gpu03'
    fxkit inventory -i inventory/mi308x.yml --host gpu01

    Secret variables (see docs/PLAYBOOKS.md) show as ******** unless --show-secrets is given;
    --secret-vars and --playbook name more of them.
    """
    if [show_list, show_graph, host is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --list, --graph or --host NAME")
    if group is not None and not show_graph:
        raise click.UsageError("a GROUP argument goes with --graph only")
    inv = Inventory.load(path)
    extra = {name.strip() for names in secret_vars for name in names.split(",") if name.strip()}
    for book in playbooks:
        plays = Playbook.load(paths.resolve(book, "playbooks")).plays
        extra.update(name for play in plays for name in play.secret_vars)
    shown = dict if show_secrets else lambda variables: masked(variables, extra)
    if show_graph:
        if (group or "all") not in inv.groups:
            raise InventoryError(f"no group named {group!r}", where=path)
        click.echo(as_graph(inv, group or "all"))
    elif host is not None:
        if host not in inv.hosts:
            raise InventoryError(f"no host named {host!r}", where=path)
        click.echo(json.dumps(shown(inv.hosts[host].vars), indent=4, sort_keys=True, default=str))
    else:
        hosts = None if limit is None else [h.name for h in inv.select(limit)]
        if hosts == []:
            raise InventoryError(f"no hosts matched {limit!r}", where=path)
        click.echo(json.dumps(as_list(inv, hosts, shown), indent=4, sort_keys=True, default=str))
