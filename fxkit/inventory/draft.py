"""What an inventory file declares, before variables are merged: the parsers fill a Draft."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fxkit.errors import InventoryError
from fxkit.inventory.hostnames import expand, split_port


@dataclass
class DraftGroup:
    name: str
    where: str
    vars: dict[str, Any] = field(default_factory=dict)
    #: host names in declaration order (a dict used as an ordered set)
    hosts: dict[str, None] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    #: child name -> file:line of the line that made it a child (for cycle errors)
    child_where: dict[str, str] = field(default_factory=dict)


@dataclass
class Draft:
    """Groups and hosts in declaration order; ``all`` and ``ungrouped`` always exist."""

    source: str
    groups: dict[str, DraftGroup] = field(default_factory=dict)
    #: host name -> inline host vars (a host named twice gets both sets, the later one winning)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.group("all", self.source)
        self.add_child("all", "ungrouped", self.source)

    def group(self, name: str, where: str) -> DraftGroup:
        """The group called ``name``, created on first mention."""
        if name not in self.groups:
            self.groups[name] = DraftGroup(name, where)
        return self.groups[name]

    def add_child(self, parent: str, child: str, where: str) -> None:
        self.group(child, where)
        group = self.group(parent, where)
        if child not in group.children:
            group.children.append(child)
            group.child_where[child] = where

    def add_hosts(self, group: str, pattern: str, hostvars: dict[str, Any], where: str) -> None:
        """Add the host(s) ``pattern`` names (``node[01:08]``, ``gpu01:2222``) to ``group``."""
        name, port = split_port(pattern)
        try:
            names = expand(name)
        except ValueError as exc:
            raise InventoryError(
                f"bad host range in {pattern!r}: {exc}",
                where=where,
                hint="write ranges as name[01:08] or name[a:f], optionally name[01:08:2]",
            ) from None
        extra = {"ansible_port": port} if port is not None else {}
        target = self.group(group, where)
        for host in names:
            self.hosts.setdefault(host, {}).update(hostvars, **extra)
            target.hosts[host] = None
