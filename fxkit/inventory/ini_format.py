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
from fxkit.inventory.hostnames import split_port

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")


def parse_ini(draft: Draft, path: Path, text: str) -> None:
    """Add the INI inventory ``text`` read from ``path`` to ``draft``.

    As in Ansible, a group is defined by a ``[group]`` or ``[group:children]`` section (in this
    file or an earlier source); a ``:children`` entry or a ``[group:vars]`` section for a group
    never defined is an error. A child named before its own section joins its parents when
    that section comes."""
    group, kind = "ungrouped", "hosts"
    #: group -> (kind of the first mention, file:line, parents waiting for it)
    pending: dict[str, tuple[str, str, list[str]]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        where = f"{path}:{number}"
        if not line or line[0] in "#;":
            continue
        if _SECTION.match(line) or (line[0] == "[" and (line[-1] == "]" or "]" not in line)):
            group, kind = _section(line, where)
            if group not in draft.groups and kind == "vars" and group not in pending:
                pending[group] = ("vars", where, [])
            draft.group(group, where)
            if group in pending and kind != "vars":
                _resolve(draft, group, pending)
        elif kind == "hosts":
            pattern, hostvars = _host_line(line, where)
            draft.add_hosts(group, pattern, hostvars, where)
        elif kind == "children":
            child = _child_line(line, where)
            if child in draft.groups:
                draft.add_child(group, child, where)
            else:
                pending.setdefault(child, ("children", where, []))[2].append(group)
        else:
            key, value = _assignment(line, where)
            draft.set_group_var(group, key, value, where)
    for name, (kind, where, parents) in pending.items():
        if kind == "vars":
            raise InventoryError(
                f"section [{name}:vars] is for a group that is never defined",
                where=where,
                hint=f"add a [{name}] or [{name}:children] section, or fix the group name",
            )
        raise InventoryError(
            f"section [{parents[-1]}:children] names group {name!r}, which is never defined",
            where=where,
            hint=f"add a [{name}] section (it may be empty), or fix the group name",
        )


def _resolve(draft: Draft, group: str, pending: dict[str, tuple[str, str, list[str]]]) -> None:
    """``group`` is now defined: it joins the parents that named it, and so on up."""
    _, where, parents = pending.pop(group)
    for parent in parents:
        draft.add_child(parent, group, where)
        if parent in pending and pending[parent][0] == "children":
            _resolve(draft, parent, pending)


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
            f"cannot parse the line: {exc} (not shown: it may hold a secret)",
            where=where,
            hint="close the quote",
        ) from None


def _host_line(line: str, where: str) -> tuple[str, dict[str, Any]]:
    pattern, *assignments = _tokens(line, where)
    if pattern.endswith(":") and split_port(pattern)[1] is None:
        raise InventoryError(
            f"host {pattern!r} ends in ':' without a port",
            where=where,
            hint="write the port after the colon (gpu01:2222), or remove the colon",
        )
    hostvars = {}
    for number, token in enumerate(assignments, 1):
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise InventoryError(
                f"expected key=value after host {pattern!r}: word {number} after it is not "
                "(not shown: it may be a secret)",
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
            "expected key=value in a :vars section (the line is not shown: it may hold a secret)",
            where=where,
            hint="write one variable per line as name=value",
        )
    return key.strip(), _value(value.strip())


def _value(text: str) -> Any:
    """A Python literal (``8``, ``True``, ``[1, 2]``) where ``text`` is one, else the string;
    as Ansible, tuples and sets become lists, bytes, complex numbers and ``...`` strings."""
    try:
        return _plain(ast.literal_eval(text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple | set):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, complex) or value is Ellipsis:
        return "..." if value is Ellipsis else str(value)
    return value
