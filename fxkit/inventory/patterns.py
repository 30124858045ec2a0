"""Ansible host patterns, as ``--limit`` and a play's ``hosts:`` take them, read as Ansible does.

A pattern is terms separated by ``,`` (or by ``:`` when it has no comma and is not one host
name or address, so ``2001:db8::12`` and ``web[1:3]`` stay whole). A term is a group or host
name, ``all``/``*``, a glob (``gpu*``, ``node0?``) matched against group and host names, or a
regular expression after ``~`` (matched from the start of the name). ``&term`` keeps only
hosts also in ``term``; ``!term`` drops them. Plain terms are joined first, then intersections,
then exclusions, so ``gpu:!gpu03:&rack1`` means (gpu) & rack1 - gpu03; a pattern of only
``&``/``!`` terms starts from ``all``.

A term other than a regex may end in a subscript that picks from its hosts in order:
``web[0]``, ``web[-1]``, ``web[1:3]`` (both ends included), ``web[2:]``; so ``gpu0[13]`` is
host 13 of ``gpu0``, not a glob (a glob class needs something else: ``gpu0[1-3x]``,
``gpu0[!2]``). A name that is a group stands for the group, even where a host has the same
name, unless the term is exactly that host's name in the plain position.

Hosts come in pattern order: term after term, a group's hosts in group-tree order (see
:meth:`Inventory.group_hosts`), ``all`` the whole tree; that order makes ``serial`` batches.
``localhost``, ``127.0.0.1`` and ``::1`` match the controller when they match nothing else.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from fxkit.errors import InventoryError
from fxkit.inventory.draft import LOCALHOST
from fxkit.inventory.hostnames import parse_address

if TYPE_CHECKING:
    from fxkit.inventory.model import Inventory, InventoryHost

_COLON_TERMS = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
_SUBSCRIPT = re.compile(r"(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]")
_GLOB = (".", "?", "*", "[")
_HINT = (
    "write e.g. 'gpu_nodes', 'gpu*', 'gpu_nodes:!gpu03', 'gpu_nodes:&rack1', 'gpu_nodes[0:3]' "
    "or '~gpu0[1-4]'"
)


def split_pattern(pattern: str) -> list[str]:
    """The terms of ``pattern``, as Ansible's ``split_host_pattern`` makes them."""
    if "," in pattern:
        terms = pattern.split(",")
    else:
        try:
            parse_address(pattern)
            terms = [pattern]
        except ValueError:
            terms = _COLON_TERMS.findall(pattern)
    return [term.strip() for term in terms if term.strip()]


def select(inventory: Inventory, pattern: str) -> list[InventoryHost]:
    """The hosts of ``inventory`` that ``pattern`` matches, in Ansible's order."""
    terms = split_pattern(pattern)
    if not terms:
        raise InventoryError(f"empty host pattern {pattern!r}", hint=_HINT)
    plain = [term for term in terms if term[0] not in "&!"]
    ordered = (
        (plain or ["all"]) + [t for t in terms if t[0] == "&"] + [t for t in terms if t[0] == "!"]
    )
    chosen: dict[str, InventoryHost] = {}
    for term in ordered:
        if term in inventory.hosts:
            chosen.setdefault(term, inventory.hosts[term])
            continue
        matched = _match(inventory, term, pattern)
        if term[0] == "&":
            names = {host.name for host in matched}
            chosen = {name: host for name, host in chosen.items() if name in names}
        elif term[0] == "!":
            names = {host.name for host in matched}
            chosen = {name: host for name, host in chosen.items() if name not in names}
        else:
            for host in matched:
                chosen.setdefault(host.name, host)
    return list(chosen.values())


def _match(inventory: Inventory, term: str, pattern: str) -> list[InventoryHost]:
    """The hosts one term (without its operator) stands for, subscript applied."""
    term = term[1:].strip() if term[0] in "&!" else term
    if not term or term[0] in "&!":
        raise InventoryError(f"operator without a name in host pattern {pattern!r}", hint=_HINT)
    expression, subscript = _split_subscript(term)
    hosts = _enumerate(inventory, expression)
    if not hosts or subscript is None:
        return hosts
    start, end = subscript
    if end is None:
        if not -len(hosts) <= start < len(hosts):
            raise InventoryError(
                f"{expression!r} has {len(hosts)} hosts: there is no [{start}] in {pattern!r}",
                hint="subscripts count from 0: web[0] is the first host, web[-1] the last",
            )
        return [hosts[start]]
    return hosts[start : (len(hosts) if end == -1 else end + 1)]


def _split_subscript(term: str) -> tuple[str, tuple[int, int | None] | None]:
    """``web[1:3]`` -> ``("web", (1, 3))``; ``web[2:]`` -> ``("web", (2, -1))``; as Ansible,
    ``[x-y]`` reads as ``[x:y]`` and an end of 0 as a single index."""
    match = None if term[0] == "~" else _SUBSCRIPT.fullmatch(term)
    if match is None:
        return term, None
    expression, index, start, _, end = match.groups()
    if index is not None:
        return expression, (int(index), None)
    last = int(end) if end else -1
    return expression, (int(start), last or None)


def _enumerate(inventory: Inventory, expression: str) -> list[InventoryHost]:
    """Hosts of the groups ``expression`` names or matches (in group order), then, for a glob,
    a regex or a name no group has, the hosts it matches. As in Ansible, a host two of these
    give is listed twice, which a subscript counts."""
    matches = _matcher(expression)
    groups = [name for name in inventory.groups if matches(name)]
    found = [host for group in groups for host in inventory.group_hosts(group)]
    if not groups or expression[0] == "~" or any(c in expression for c in _GLOB):
        found += [host for name, host in inventory.hosts.items() if matches(name)]
    if not found and expression in LOCALHOST:
        found.append(inventory.localhost(expression))
    return found


def _matcher(expression: str) -> Callable[[str], re.Match[str] | None]:
    try:
        if expression[0] == "~":
            return re.compile(expression[1:]).match
        return re.compile(fnmatch.translate(expression)).match
    except re.error as exc:
        raise InventoryError(
            f"bad regular expression {expression!r} in host pattern: {exc}", hint=_HINT
        ) from None
