"""Inventory: hosts with their merged variables, groups, and host selection by pattern.

How a host's variables are merged (later wins, dicts replaced not deep-merged), exactly Ansible's
default order:

1. inline vars of group ``all`` (``all: vars:`` in YAML, ``[all:vars]`` in INI);
2. inline vars of the host's other groups, shallow groups before deeper ones (a group's depth
   is its longest path from ``all``, so a child group beats its parent); groups of equal depth
   go by ``ansible_group_priority`` (default 1), then alphabetically;
3. ``group_vars/all`` beside the inventory file;
4. ``group_vars/<group>`` for the other groups, in the order of step 2;
5. inline host vars (a host listed in several places gets all of them, the later one winning);
6. ``host_vars/<host>``.

So a file in ``group_vars/`` beats any inline group variable and a ``host_vars/`` file beats an
inline host variable. Connection variables (``ansible_host``, ``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_become``, ``ansible_become_password``,
``ansible_connection``) are ordinary variables here and pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxkit.errors import InventoryError
from fxkit.inventory.draft import Draft
from fxkit.inventory.ini_format import parse_ini
from fxkit.inventory.patterns import select
from fxkit.inventory.vars_files import read_vars
from fxkit.inventory.yaml_format import parse_yaml
from fxkit.yamlfile import Marked, read_yaml

YAML_SUFFIXES = (".yml", ".yaml", ".json")
UNGROUPED = ("all", "ungrouped")


@dataclass
class InventoryHost:
    """One host: its merged variables and every group it is in (``all`` and ancestors included,
    in merge order)."""

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)


@dataclass
class InventoryGroup:
    """One group as declared: its own hosts and child groups, and its own variables (inline,
    then its ``group_vars`` file)."""

    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)
    depth: int = 0


class Inventory:
    """Hosts (in inventory order) and groups read from an Ansible YAML or INI inventory."""

    def __init__(self, hosts: dict[str, InventoryHost], groups: dict[str, InventoryGroup]):
        self.hosts = hosts
        self.groups = groups

    @classmethod
    def load(cls, path: str | Path) -> Inventory:
        """Read an inventory file (YAML: .yml/.yaml/.json; anything else: INI, or YAML when it
        parses as a mapping) with ``group_vars/`` and ``host_vars/`` beside it."""
        path = Path(path)
        if not path.exists():
            raise InventoryError(
                "inventory file not found",
                where=str(path),
                hint="pass the inventory file with -i, e.g. -i inventory/mi308x.yml",
            )
        if path.is_dir():
            raise InventoryError(
                "the inventory is a directory",
                where=str(path),
                hint="pass the inventory file inside it, e.g. -i inventory/mi308x.yml",
            )
        return cls._build(_parse(path), path.parent)

    @classmethod
    def from_hosts(cls, names: Iterable[str]) -> Inventory:
        """An inventory of ungrouped hosts without variables, for ad-hoc runs (``localhost``)."""
        draft = Draft("<host list>")
        for name in names:
            draft.add_hosts("ungrouped", name, {}, "<host list>")
        return cls._build(draft, None)

    def select(self, pattern: str) -> list[InventoryHost]:
        """Hosts matching an Ansible host pattern, in inventory order (see ``patterns``)."""
        return select(self, pattern)

    @classmethod
    def _build(cls, draft: Draft, folder: Path | None) -> Inventory:
        groups = _link_groups(draft)
        group_files = {name: _vars_from(folder, "group_vars", name) for name in groups}
        for name, group in groups.items():
            group.vars = {**draft.groups[name].vars, **group_files[name]}
        direct: dict[str, list[str]] = {name: [] for name in draft.hosts}
        for group in groups.values():
            for host in group.hosts:
                direct[host].append(group.name)
        hosts = {}
        for name, inline in draft.hosts.items():
            order = _merge_order(groups, direct[name])
            merged: dict[str, Any] = {}
            for group in order:
                merged.update(draft.groups[group].vars)
            for group in order:
                merged.update(group_files[group])
            merged.update(inline)
            merged.update(_vars_from(folder, "host_vars", name))
            hosts[name] = InventoryHost(name, merged, order)
        return cls(hosts, groups)


def _parse(path: Path) -> Draft:
    if path.suffix in YAML_SUFFIXES:
        return parse_yaml(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"cannot read: {exc}", where=str(path)) from None
    if not path.suffix and not text.lstrip().startswith("["):
        try:
            data = read_yaml(path, InventoryError)
        except InventoryError:
            data = None
        if isinstance(data, Marked):
            return parse_yaml(path, data)
    return parse_ini(path, text)


def _vars_from(folder: Path | None, kind: str, name: str) -> dict[str, Any]:
    return read_vars(folder / kind, name) if folder else {}


def _link_groups(draft: Draft) -> dict[str, InventoryGroup]:
    """Public groups with parents, depths and ``ungrouped`` filled in; refuses cycles."""
    for name in list(draft.groups):
        if name != "all" and not any(name in g.children for g in draft.groups.values()):
            draft.add_child("all", name, draft.groups[name].where)
    # As Ansible: ungrouped holds exactly the hosts that are in no other group.
    other = {h for name, g in draft.groups.items() if name not in UNGROUPED for h in g.hosts}
    ungrouped = draft.groups["ungrouped"]
    ungrouped.hosts = dict.fromkeys(h for h in [*ungrouped.hosts, *draft.hosts] if h not in other)
    draft.groups["all"].hosts.clear()

    groups = {
        name: InventoryGroup(name, list(g.hosts), list(g.children))
        for name, g in draft.groups.items()
    }
    for name, group in groups.items():
        for child in group.children:
            groups[child].parents.append(name)
    reached: set[str] = set()
    _set_depths(draft, groups, "all", [], reached)
    for name in groups:  # only groups in a cycle are out of reach of all; report the first one
        if name not in reached:
            _set_depths(draft, groups, name, [], reached)
    return groups


def _set_depths(
    draft: Draft, groups: dict[str, InventoryGroup], name: str, path: list[str], reached: set[str]
) -> None:
    """Depth-first from ``all``: each group's depth is its longest path from ``all``."""
    reached.add(name)
    group = groups[name]
    group.depth = max(group.depth, len(path))
    for child in group.children:
        if child in path or child == name:
            raise InventoryError(
                f"group {child!r} is its own ancestor: {' -> '.join([*path, name, child])}",
                where=draft.groups[name].child_where[child],
                hint="remove one of these children: entries so that no group contains itself",
            )
        _set_depths(draft, groups, child, [*path, name], reached)


def _merge_order(groups: dict[str, InventoryGroup], direct: list[str]) -> list[str]:
    """``all``, then the ``direct`` groups of a host and their ancestors, in merge order."""
    found: set[str] = set()
    todo = list(direct)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(groups[name].parents)
    found.discard("all")

    def key(name: str) -> tuple[int, int, str]:
        priority = groups[name].vars.get("ansible_group_priority", 1)
        if not isinstance(priority, int):
            raise InventoryError(
                f"ansible_group_priority of group {name!r} must be an integer, got {priority!r}",
                where=f"group {name}",
                hint="set ansible_group_priority to a number, e.g. 10 (higher wins)",
            )
        return groups[name].depth, priority, name

    return ["all", *sorted(found, key=key)]
