"""Inventory: hosts with their merged variables, groups, and host selection by pattern.

How a host's variables are merged (later wins, dicts replaced not deep-merged), exactly Ansible's
default order:

1. inline vars of group ``all`` (``all: vars:`` in YAML, ``[all:vars]`` in INI);
2. inline vars of the host's other groups, shallow groups before deeper ones (a group's depth
   is its longest path from ``all``, so a child group beats its parent); groups of equal depth
   go by ``ansible_group_priority`` (default 1, higher wins), then alphabetically;
3. ``group_vars/all`` of each ``-i`` source in turn;
4. ``group_vars/<group>`` of each source in turn, for the other groups in the order of step 2;
5. inline host vars (a host listed in several places gets all of them, the later one winning);
6. ``host_vars/<host>`` of each source in turn.

So a file in ``group_vars/`` beats any inline group variable and a ``host_vars/`` file beats an
inline host variable. ``ansible_group_priority`` set inline is the group's priority and no
variable; in a ``group_vars/`` file it is an ordinary variable that changes no order (as in
Ansible 2.19). Connection variables (``ansible_host``, ``ansible_port``, ``ansible_user``, ...)
are ordinary variables here and pass through unchanged. Each host keeps, beside its variables,
where the winning value of each was set (``path:line``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxkit.errors import InventoryError
from fxkit.inventory.draft import Draft
from fxkit.inventory.patterns import select
from fxkit.inventory.sources import read_source, vars_folder
from fxkit.inventory.vars_files import VarsFiles
from fxkit.varfiles import Variables

UNGROUPED = ("all", "ungrouped")
#: The variable of Ansible's implicit localhost (see :meth:`Inventory.localhost`).
_LOCAL = Variables({"ansible_connection": "local"}, {"ansible_connection": "implicit localhost"})
Source = str | Path


@dataclass
class InventoryHost:
    """One host: its merged variables, every group it is in (``all`` and ancestors included,
    in merge order), and where each variable was set (``path:line``)."""

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass
class InventoryGroup:
    """One group as declared: its own hosts and child groups, and its own variables (inline,
    then its ``group_vars`` files)."""

    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    priority: int = 1


class Inventory:
    """Hosts (in the order they were declared) and groups read from Ansible inventory sources."""

    def __init__(
        self,
        hosts: dict[str, InventoryHost],
        groups: dict[str, InventoryGroup],
        localhost: str | None = None,
        implicit_vars: Variables | None = None,
    ):
        self.hosts = hosts
        self.groups = groups
        #: the inventory's first host named localhost, 127.0.0.1 or ::1, if any
        self._localhost = localhost
        self._implicit_vars = implicit_vars or _LOCAL
        self._implicit: InventoryHost | None = None
        self._group_hosts: dict[str, list[InventoryHost]] = {}

    @classmethod
    def load(cls, sources: Source | Sequence[Source]) -> Inventory:
        """Read inventory sources in order, as repeated ``-i`` options: YAML or INI files,
        inventory directories, or ``host1,host2`` lists (see :mod:`fxkit.inventory.sources`),
        each with the ``group_vars/`` and ``host_vars/`` that belong to it."""
        sources = [sources] if isinstance(sources, str | Path) else list(sources)
        if not sources:
            raise InventoryError("no inventory given", hint="pass one with -i")
        draft = Draft()
        for source in sources:
            read_source(draft, source)
        folders = [folder for folder in map(vars_folder, sources) if folder is not None]
        return cls._build(draft, folders)

    @classmethod
    def from_hosts(cls, names: Iterable[str]) -> Inventory:
        """An inventory of ungrouped hosts without variables, for ad-hoc runs (``localhost``)."""
        draft = Draft()
        for name in names:
            draft.add_hosts("ungrouped", name, {}, "<host list>")
        return cls._build(draft, [])

    def select(self, pattern: str, limit: str | None = None) -> list[InventoryHost]:
        """Hosts matching an Ansible host pattern, in Ansible's order, narrowed to those that
        ``limit`` (``--limit``) matches (see :mod:`fxkit.inventory.patterns`)."""
        hosts = select(self, pattern)
        if limit is None:
            return hosts
        allowed = {host.name for host in select(self, limit)}
        return [host for host in hosts if host.name in allowed]

    def localhost(self, name: str) -> InventoryHost:
        """What the pattern ``localhost`` (``127.0.0.1``, ``::1``) stands for when it matches
        nothing else, as in Ansible: the inventory's first such host, else an implicit host
        with ``ansible_connection: local`` (and the vars of ``all``), in no group, so not in
        ``all``, and named as the pattern that first asked for it."""
        if self._localhost is not None:
            return self.hosts[self._localhost]
        if self._implicit is None:
            implicit = self._implicit_vars
            self._implicit = InventoryHost(name, dict(implicit), [], dict(implicit.origins))
        return self._implicit

    def group_hosts(self, name: str) -> list[InventoryHost]:
        """The hosts of group ``name`` and of its descendants in Ansible's order: the group's
        own hosts, then those of its children, of their children, and so on, level by level;
        each host once."""
        if name in self._group_hosts:
            return self._group_hosts[name]
        order: dict[str, None] = {}
        level, seen = [name], {name}
        while level:
            for group in level:
                order.update(dict.fromkeys(self.groups[group].hosts))
            level = [c for g in level for c in self.groups[g].children if c not in seen]
            level = list(dict.fromkeys(level))
            seen.update(level)
        self._group_hosts[name] = [self.hosts[host] for host in order]
        return self._group_hosts[name]

    @classmethod
    def _build(cls, draft: Draft, folders: list[Path]) -> Inventory:
        groups = _link_groups(draft)
        group_vars = [VarsFiles(folder / "group_vars") for folder in folders]
        host_vars = [VarsFiles(folder / "host_vars") for folder in folders]

        def files(kind: list[VarsFiles], name: str) -> list[Variables]:
            """The files for ``name`` of every source, in order (later ones win)."""
            return [source.read(name) for source in kind]

        for name, group in groups.items():
            own = Variables()
            own.merge(draft.groups[name].vars, *files(group_vars, name))
            group.vars = own
        direct: dict[str, list[str]] = {name: [] for name in draft.hosts}
        for group in groups.values():
            for host in group.hosts:
                direct[host].append(group.name)
        hosts = {}
        all_files = files(group_vars, "all")
        # what the groups set, by merge order: merged once for all hosts of the same groups
        by_groups: dict[tuple[str, ...], Variables] = {}
        for name, inline in draft.hosts.items():
            order = _merge_order(groups, direct[name])
            shared = by_groups.get(tuple(order))
            if shared is None:
                shared = by_groups[tuple(order)] = Variables()
                shared.merge(*(draft.groups[group].vars for group in order), *all_files)
                # source by source, and in each the groups in order
                shared.merge(*(source.read(other) for source in group_vars for other in order[1:]))
            merged = Variables(shared, shared.origins)
            merged.merge(inline, *files(host_vars, name))
            hosts[name] = InventoryHost(name, merged, order, merged.origins)
        implicit = Variables()
        implicit.merge(draft.groups["all"].vars, *all_files, _LOCAL, *files(host_vars, "localhost"))
        return cls(hosts, groups, draft.localhost, implicit)


def _link_groups(draft: Draft) -> dict[str, InventoryGroup]:
    """Public groups with parents, depths and ``ungrouped`` filled in; refuses cycles."""
    for name in list(draft.groups):
        if name != "all" and not any(name in g.children for g in draft.groups.values()):
            draft.add_child("all", name, draft.groups[name].where)
    # As Ansible: ungrouped holds exactly the hosts that are in no other group.
    other = {h for name, g in draft.groups.items() if name not in UNGROUPED for h in g.hosts}
    ungrouped = draft.groups["ungrouped"]
    ungrouped.hosts = dict.fromkeys(h for h in [*ungrouped.hosts, *draft.hosts] if h not in other)

    groups = {
        name: InventoryGroup(name, list(g.hosts), list(g.children), priority=g.priority)
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
        return groups[name].depth, groups[name].priority, name

    return ["all", *sorted(found, key=key)]
