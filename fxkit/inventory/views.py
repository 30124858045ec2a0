"""An inventory shown as ``ansible-inventory`` shows it: ``--list`` JSON, ``--graph`` tree."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fxkit.inventory.model import Inventory


def as_list(
    inventory: Inventory,
    hosts: list[str] | None = None,
    shown: Callable[[Mapping[str, Any]], Mapping[str, Any]] = dict,
) -> dict[str, Any]:
    """``ansible-inventory --list``: ``_meta.hostvars`` (hosts with variables) and, per group,
    its own ``hosts`` and ``children``; empty keys and empty groups left out, as Ansible does.
    ``hosts`` limits the output to those hosts; ``shown`` turns host variables into what is
    printed (e.g. :func:`fxkit.redaction.masked`)."""
    keep = set(inventory.hosts if hosts is None else hosts)
    hostvars = {name: shown(host.vars) for name, host in inventory.hosts.items() if name in keep}
    result: dict[str, Any] = {"_meta": {"hostvars": {k: v for k, v in hostvars.items() if v}}}
    for name, group in inventory.groups.items():
        entry = {
            "hosts": [h for h in group.hosts if h in keep and name != "all"],
            "children": list(group.children),
        }
        entry = {key: value for key, value in entry.items() if value}
        if entry:
            result[name] = entry
    return result


def as_graph(inventory: Inventory, group: str = "all") -> str:
    """``ansible-inventory --graph [GROUP]``: child groups then hosts, in declaration order."""
    return "\n".join(_graph(inventory, group, 0))


def _graph(inventory: Inventory, name: str, depth: int) -> list[str]:
    group = inventory.groups[name]
    lines = [_indent(f"@{name}:", depth)]
    for child in group.children:
        lines += _graph(inventory, child, depth + 1)
    if name != "all":  # hosts declared under all: are shown in ungrouped, as Ansible does
        lines += [_indent(host, depth + 1) for host in group.hosts]
    return lines


def _indent(text: str, depth: int) -> str:
    return "  |" * depth + "--" + text if depth else text
