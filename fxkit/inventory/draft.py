"""What inventory sources declare, before variables are merged: the parsers fill one Draft.

Several sources (``-i a -i b``, the files of an inventory directory) fill the same Draft in
order, as Ansible fills one ``InventoryData``: a host or group named again gets the later
variables, and keeps its first position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fxkit.errors import InventoryError
from fxkit.inventory.hostnames import expand, split_port
from fxkit.varfiles import Variables

#: Names Ansible treats as the controller itself (its implicit localhost).
LOCALHOST = ("127.0.0.1", "localhost", "::1")
PRIORITY = "ansible_group_priority"


@dataclass
class DraftGroup:
    name: str
    where: str
    vars: Variables = field(default_factory=Variables)
    #: host names in declaration order (a dict used as an ordered set)
    hosts: dict[str, None] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    #: child name -> file:line of the line that made it a child (for cycle errors)
    child_where: dict[str, str] = field(default_factory=dict)
    priority: int = 1


@dataclass
class Draft:
    """Groups and hosts in the order Ansible creates them; ``all`` and ``ungrouped`` always
    exist, ``ungrouped`` as the first child of ``all``."""

    groups: dict[str, DraftGroup] = field(default_factory=dict)
    #: host name -> its inline variables
    hosts: dict[str, Variables] = field(default_factory=dict)
    #: the first host named like the controller (localhost, 127.0.0.1, ::1), if any
    localhost: str | None = None

    def __post_init__(self) -> None:
        self.group("all", "<inventory>")
        self.add_child("all", "ungrouped", "<inventory>")

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

    def set_group_var(self, group: str, key: str, value: Any, where: str) -> None:
        """A group variable from the inventory itself, set at ``where``;
        ``ansible_group_priority`` sets the group's priority instead, as in Ansible, and is no
        variable."""
        target = self.groups[group]
        if key == PRIORITY:
            target.priority = priority(value, f"group {group!r}", where)
        else:
            target.vars[key] = value
            target.vars.origins[key] = where

    def add_hosts(
        self,
        group: str,
        pattern: str,
        hostvars: Mapping[str, Any],
        where: str,
        origins: Mapping[str, str] | None = None,
    ) -> None:
        """Add the host(s) ``pattern`` names (``node[01:08]``, ``gpu01:2222``,
        ``[2001:db8::12]:2222``) to ``group``, declared at ``where``; ``origins``: where each
        of ``hostvars`` was set, when not on that line. As in Ansible, ``:port`` is the port
        of a host seen for the first time, and an ``ansible_port`` variable beats it."""
        name, port = split_port(pattern)
        try:
            names = expand(name)
        except ValueError as exc:
            raise InventoryError(
                f"bad host range in {pattern!r}: {exc}",
                where=where,
                hint="write ranges as name[01:08] (both ends as wide), name[a:f] or "
                "name[1:9:2]; an IPv6 address with a port as [2001:db8::12]:2222",
            ) from None
        for host in names:
            self.add_host(group, host, port, hostvars, where, origins)

    def add_host(
        self,
        group: str,
        host: str,
        port: int | None = None,
        hostvars: Mapping[str, Any] | None = None,
        where: str = "<host list>",
        origins: Mapping[str, str] | None = None,
    ) -> None:
        """Add one host (no ranges) to ``group`` (see :meth:`add_hosts`). As in Ansible, the
        variables of a host that has the name of an existing group go to that group."""
        if host not in self.hosts:
            port_var = {} if port is None else {"ansible_port": port}
            self.hosts[host] = Variables(port_var, dict.fromkeys(port_var, where))
            if host in LOCALHOST and self.localhost is None:
                self.localhost = host
        for key, value in (hostvars or {}).items():
            origin = origins.get(key, where) if origins else where
            if host in self.groups:
                self.set_group_var(host, key, value, origin)
            else:
                self.hosts[host][key] = value
                self.hosts[host].origins[key] = origin
        self.group(group, where).hosts[host] = None


def priority(value: Any, whose: str, where: str) -> int:
    """``ansible_group_priority`` as Ansible reads it: ``int(value)``."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InventoryError(
            f"ansible_group_priority of {whose} must be an integer, got {value!r}",
            where=where,
            hint="set ansible_group_priority to a number, e.g. 10 (higher wins)",
        ) from None
