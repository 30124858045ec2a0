"""``fxkit inventory``: show an inventory as ``ansible-inventory`` does (JSON, graph, one host),
or the hosts a pattern selects as ``ansible PATTERN --list-hosts`` does."""

from __future__ import annotations

import json
from typing import Any

import click

from fxkit import paths
from fxkit.engine.playbook import Playbook
from fxkit.errors import InventoryError
from fxkit.inventory import Inventory, InventoryHost
from fxkit.inventory.views import as_graph, as_list
from fxkit.redaction import masked


@click.command()
@click.option(
    "-i",
    "--inventory",
    "sources",
    required=True,
    multiple=True,
    help="Inventory file (Ansible YAML or INI), inventory directory, or 'host1,host2,'; "
    "repeat to merge several, in order.",
)
@click.option("--list", "show_list", is_flag=True, help="All groups and host vars as JSON.")
@click.option("--graph", "show_graph", is_flag=True, help="The group tree (from GROUP or all).")
@click.option("--host", "host", metavar="NAME", help="One host's merged variables as JSON.")
@click.option(
    "--list-hosts",
    "pattern",
    metavar="PATTERN",
    help="The hosts PATTERN selects, in the order a run takes them.",
)
@click.option(
    "-l", "--limit", metavar="PATTERN", help="Only hosts matching PATTERN (--list, --list-hosts)."
)
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
    sources: tuple[str, ...],
    show_list: bool,
    show_graph: bool,
    host: str | None,
    pattern: str | None,
    limit: str | None,
    show_secrets: bool,
    secret_vars: tuple[str, ...],
    playbooks: tuple[str, ...],
    group: str | None,
) -> None:
    """Show an inventory: --list (JSON), --graph [GROUP] (tree), --host NAME (variables) or
    --list-hosts PATTERN (the hosts a run on PATTERN touches, in order).

    \b
    fxkit inventory -i inventory/mi308x.yml --graph
    fxkit inventory -i inventory/mi308x.yml --list --limit 'gpu_nodes:!gpu03'
    fxkit inventory -i inventory/mi308x.yml --host gpu01
    fxkit inventory -i inventories/prod/ -i extra.ini --list-hosts 'gpu_nodes[0:3]'

    Secret variables (see docs/PLAYBOOKS.md) show as ******** unless --show-secrets is given;
    --secret-vars and --playbook name more of them.
    """
    if [show_list, show_graph, host is not None, pattern is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --list, --graph, --host NAME or --list-hosts")
    if group is not None and not show_graph:
        raise click.UsageError("a GROUP argument goes with --graph only")
    inv = Inventory.load(sources)
    where = ", ".join(sources)
    extra = {name.strip() for names in secret_vars for name in names.split(",") if name.strip()}
    for book in playbooks:
        plays = Playbook.load(paths.resolve(book, "playbooks")).plays
        extra.update(name for play in plays for name in play.secret_vars)
    shown = dict if show_secrets else lambda variables: masked(variables, extra)
    if show_graph:
        if (group or "all") not in inv.groups:
            raise InventoryError(f"no group named {group!r}", where=where)
        click.echo(as_graph(inv, group or "all"))
    elif host is not None:
        click.echo(json.dumps(shown(_one_host(inv, host, where).vars), **JSON))
    elif pattern is not None:
        hosts = inv.select(pattern, limit)
        if not hosts:
            click.echo(f"warning: no hosts matched {pattern!r}", err=True)
        click.echo("\n".join([f"  hosts ({len(hosts)}):", *(f"    {h.name}" for h in hosts)]))
    else:
        names = None if limit is None else [h.name for h in inv.select(limit)]
        if names == []:
            raise InventoryError(f"no hosts matched {limit!r}", where=where)
        click.echo(json.dumps(as_list(inv, names, shown), **JSON))


JSON: dict[str, Any] = {"indent": 4, "sort_keys": True, "default": str}


def _one_host(inv: Inventory, name: str, where: str) -> InventoryHost:
    """``--host NAME``: a host name, or a pattern that selects one host (as Ansible)."""
    if name in inv.hosts:
        return inv.hosts[name]
    try:
        hosts = inv.select(name)
    except InventoryError:
        hosts = []
    if len(hosts) != 1:
        raise InventoryError(f"no host named {name!r}", where=where)
    return hosts[0]
