"""Ansible's YAML inventory format: groups with ``hosts``, ``vars`` and ``children``.

.. code-block:: yaml

    all:
      vars: {ntp_server: 10.0.0.1}
      children:
        gpu_nodes:
          hosts:
            gpu[01:04]:
              ansible_user: ops
          children:
            gpu_rack1: {hosts: {gpu01: , gpu02: }}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fxkit.errors import InventoryError
from fxkit.inventory.draft import Draft
from fxkit.yamlfile import Marked, key_origins, plain, read_yaml, type_name

GROUP_KEYS = ("hosts", "vars", "children")


def parse_yaml(draft: Draft, path: Path, data: Any = None) -> None:
    """Add a YAML inventory to ``draft`` (``data`` when the caller has parsed it already)."""
    data = read_yaml(path, InventoryError) if data is None else data
    if data is None:
        return
    if not isinstance(data, Marked):
        raise InventoryError(
            "a YAML inventory must be a mapping of group names (usually just 'all')",
            where=f"{path}:1",
            hint="start the file with 'all:' and put 'hosts:', 'vars:' or 'children:' under it",
        )
    if data.get("plugin"):
        raise InventoryError(
            f"this is the configuration of Ansible's inventory plugin {data['plugin']!r}, "
            "not an inventory",
            where=f"{path}:{data.line_of('plugin')}",
            hint="fxkit reads YAML and INI inventories; write the hosts out (e.g. with "
            "ansible-inventory -i THIS --list --yaml > hosts.yml)",
        )
    for name, body in data.items():
        _parse_group(draft, path, name, body, f"{path}:{data.line_of(name)}")


def _parse_group(draft: Draft, path: Path, name: Any, body: Any, where: str) -> None:
    if not isinstance(name, str) or not name:
        raise InventoryError(f"group name {name!r} must be a non-empty string", where=where)
    draft.group(name, where)
    if body is None:
        return
    if not isinstance(body, Marked):
        raise InventoryError(
            f"group {name!r} must be a mapping, not {type_name(body)}",
            where=where,
            hint=f"put 'hosts:', 'vars:' or 'children:' under '{name}:'",
        )
    for key in body:
        here = f"{path}:{body.line_of(key)}"
        if key not in GROUP_KEYS:
            raise InventoryError(
                f"unexpected key {key!r} in group {name!r}",
                where=here,
                hint="a group has only 'hosts', 'vars' and 'children'; "
                "a host belongs under 'hosts:', a subgroup under 'children:'",
            )
        section = body[key]
        if isinstance(section, str):  # Ansible reads 'hosts: gpu01' as one host
            section = {section: None}
        if not section:
            continue
        if not isinstance(section, dict):
            raise InventoryError(
                f"'{key}' of group {name!r} must be a mapping, not {type_name(section)}",
                where=here,
                hint=_SECTION_HINTS[key],
            )
        if key == "vars":
            for var, value in plain(section).items():
                draft.set_group_var(name, var, value, f"{path}:{_line(section, var)}")
        elif key == "hosts":
            for host, hostvars in section.items():
                _parse_host(draft, path, name, host, hostvars, f"{path}:{_line(section, host)}")
        else:
            for child, child_body in section.items():
                child_where = f"{path}:{_line(section, child)}"
                _parse_group(draft, path, child, child_body, child_where)
                draft.add_child(name, child, child_where)


def _line(section: dict[Any, Any], key: Any) -> int | str:
    return section.line_of(key) if isinstance(section, Marked) else "?"


def _parse_host(draft: Draft, path: Path, group: str, host: Any, hostvars: Any, where: str) -> None:
    if not isinstance(host, str) or host == "":
        raise InventoryError(
            f"host name {host!r} must be a non-empty string",
            where=where,
            hint="quote a host name that YAML reads as a number: '10':",
        )
    if hostvars is not None and not isinstance(hostvars, Marked):
        raise InventoryError(
            f"the vars of host '{host}' in group {group!r} must be a mapping, "
            f"not {type_name(hostvars)}",
            where=where,
            hint=f"write '{host}:' alone, or with 'key: value' lines indented under it",
        )
    draft.add_hosts(group, host, plain(hostvars or {}), where, key_origins(path, hostvars))


_SECTION_HINTS = {
    "hosts": "list hosts as keys ('gpu01:' on its own line), not as a YAML list ('- gpu01')",
    "vars": "write variables as 'name: value' lines indented under 'vars:'",
    "children": "list subgroups as keys ('gpu_rack1:' on its own line), not as a YAML list",
}
