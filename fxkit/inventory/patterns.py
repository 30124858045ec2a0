"""Ansible host patterns, as ``--limit`` and a play's ``hosts:`` take them.

``PATTERN`` is terms separated by ``:`` or ``,``. A term is ``all`` or ``*``, a group or host
name, a glob (``gpu*``, ``node0?``) matched against group and host names, or a regular expression
after ``~`` (``~gpu0[1-4]``). ``&term`` keeps only hosts also in ``term``; ``!term`` drops hosts in
``term``. As in Ansible, plain terms are joined first, then intersections, then exclusions, so
``gpu_nodes:!gpu03:&rack1`` means (gpu_nodes) & rack1 - gpu03; a pattern of only ``&``/``!`` terms
starts from ``all``. The result is in inventory order; no match gives an empty list.
"""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING

from fxkit.errors import InventoryError

if TYPE_CHECKING:
    from fxkit.inventory.model import Inventory, InventoryHost

# ':' and ',' separate terms, except inside [...] (a glob class or a regex like ~n[0-9]{1,2}).
_SEPARATOR = re.compile(r"[:,](?![^\[]*\])")
_GLOB = re.compile(r"[*?\[]")


def select(inventory: Inventory, pattern: str) -> list[InventoryHost]:
    """The hosts of ``inventory`` that ``pattern`` matches, in inventory order."""
    terms = [term.strip() for term in _SEPARATOR.split(pattern)]
    if not any(terms):
        raise InventoryError(f"empty host pattern {pattern!r}", hint=_HINT)
    terms = [term for term in terms if term]
    plain = [term for term in terms if term[0] not in "&!"]
    chosen: set[str] = set()
    for term in plain or ["all"]:
        chosen |= _match(inventory, term, pattern)
    for term in terms:
        if term[0] == "&":
            chosen &= _match(inventory, term[1:].strip(), pattern)
    for term in terms:
        if term[0] == "!":
            chosen -= _match(inventory, term[1:].strip(), pattern)
    return [host for name, host in inventory.hosts.items() if name in chosen]


def _match(inventory: Inventory, term: str, pattern: str) -> set[str]:
    """Host names one term (without its operator) stands for."""
    if not term or term[0] in "&!":
        raise InventoryError(f"operator without a name in host pattern {pattern!r}", hint=_HINT)
    if term in ("all", "*"):
        return set(inventory.hosts)
    if term[0] == "~":
        try:
            regex = re.compile(term[1:])
        except re.error as exc:
            raise InventoryError(
                f"bad regular expression {term!r} in host pattern: {exc}", hint=_HINT
            ) from None
        matches = regex.match
    elif _GLOB.search(term):
        matches = re.compile(fnmatch.translate(term)).match
    elif term in inventory.groups:
        return _members(inventory, term)
    else:
        return {term} & inventory.hosts.keys()
    hosts = {name for name in inventory.hosts if matches(name)}
    for group in inventory.groups:
        if matches(group):
            hosts |= _members(inventory, group)
    return hosts


def _members(inventory: Inventory, group: str) -> set[str]:
    return {name for name, host in inventory.hosts.items() if group in host.groups}


_HINT = "write e.g. 'gpu_nodes', 'gpu*', 'gpu_nodes:!gpu03', 'gpu_nodes:&rack1' or '~gpu0[1-4]'"
