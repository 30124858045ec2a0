"""Ansible's INI inventory format.

.. code-block:: ini

    localhost ansible_connection=local      # before any section: ungrouped

    [gpu_nodes]
    gpu[01:04] ansible_user=ops

    [gpu_nodes:vars]
    rocm_version=7.2

    [fleet:children]
    gpu_nodes

Values are read as Python literals where they are one (``8``, ``[1, 2]``), else as strings, as
Ansible does; ``#`` and ``;`` start comments.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

from fxkit.errors import InventoryError
from fxkit.inventory.draft import Draft

_SECTION = re.compile(r"^\[([^\[\]:\s]+)(?::(\w+))?\]\s*(?:[#;].*)?$")


def parse_ini(path: Path, text: str) -> Draft:
    """Parse the INI inventory ``text`` read from ``path``."""
    draft = Draft(str(path))
    group, kind = "ungrouped", "hosts"
    defined = {"all", "ungrouped"}
    #: groups named in [x:vars] sections: each must be defined somewhere in the file
    vars_sections: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        where = f"{path}:{number}"
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            group, kind = _section(line, where)
            if kind == "vars":
                vars_sections.setdefault(group, where)
            else:
                draft.group(group, where)
                defined.add(group)
        elif kind == "hosts":
            pattern, hostvars = _host_line(line, where)
            draft.add_hosts(group, pattern, hostvars, where)
        elif kind == "children":
            child = _child_line(line, where)
            draft.add_child(group, child, where)
            defined.add(child)
        else:
            key, value = _assignment(line, where)
            draft.group(group, where).vars[key] = value
    for name, where in vars_sections.items():
        if name not in defined:
            raise InventoryError(
                f"section [{name}:vars] is for a group that is never defined",
                where=where,
                hint=f"add a [{name}] or [{name}:children] section, or fix the group name",
            )
    return draft


def _section(line: str, where: str) -> tuple[str, str]:
    match = _SECTION.match(line)
    if match is None:
        raise InventoryError(
            f"cannot parse section header {line!r}",
            where=where,
            hint="write [group], [group:vars] or [group:children]",
        )
    kind = match[2] or "hosts"
    if match[2] not in (None, "vars", "children"):
        raise InventoryError(
            f"unknown section kind ':{kind}' in {line!r}",
            where=where,
            hint="only [group:vars] and [group:children] exist",
        )
    return match[1], kind


def _tokens(line: str, where: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError as exc:
        raise InventoryError(
            f"cannot parse {line!r}: {exc}", where=where, hint="close the quote"
        ) from None


def _host_line(line: str, where: str) -> tuple[str, dict[str, Any]]:
    pattern, *assignments = _tokens(line, where)
    hostvars = {}
    for token in assignments:
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise InventoryError(
                f"expected key=value after host {pattern!r}, got {token!r}",
                where=where,
                hint="one host per line, then key=value variables (quote values with spaces)",
            )
        hostvars[key] = _value(value)
    return pattern, hostvars


def _child_line(line: str, where: str) -> str:
    tokens = _tokens(line, where)
    if len(tokens) != 1:
        raise InventoryError(
            f"expected one group name in a :children section, got {line!r}",
            where=where,
            hint="list one child group per line",
        )
    return tokens[0]


def _assignment(line: str, where: str) -> tuple[str, Any]:
    key, sep, value = line.partition("=")
    if not sep or not key.strip():
        raise InventoryError(
            f"expected key=value in a :vars section, got {line!r}",
            where=where,
            hint="write one variable per line as name=value",
        )
    return key.strip(), _value(value.strip())


def _value(text: str) -> Any:
    """A Python literal (``8``, ``True``, ``[1, 2]``) where ``text`` is one, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
