"""``fxkit lab up --like INVENTORY``: one lab host per inventory host, with its names and groups.

Each host gets the simulated hardware its groups ask for, first found of:

1. the command's mapping (``--profile gpu_nodes=mi308x``; a bare ``--profile NAME`` for every
   host), the host's most specific group first;
2. the inventory's ``fxkit_lab_profile`` (a host or group variable);
3. :data:`DEFAULTS`: GPU nodes are mi308x nodes, storage targets storage-target hosts; any other
   host is a plain one.

``--fault HOST=FAULT`` gives one host a fault variant of its profile (``gpu02=gpu-link-x8`` on an
mi308x host: the profile mi308x-gpu-link-x8), so that G1 fails there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fxkit.errors import FxkitError
from fxkit.inventory import Inventory
from fxkit.lab import node
from fxkit.lab import profile as profiles
from fxkit.lab.fleet import Fleet, LabError, check_requirements
from fxkit.lab.resources import Limits

#: The profile of a host in these groups (the groups of inventory/mi308x.yml and site.yml).
DEFAULTS = {"gpu_nodes": "mi308x", "storage_targets": "storage-target"}


@dataclass
class Shape:
    """The lab hosts an inventory asks for: each one's profile (None: plain) and groups."""

    profiles: dict[str, str | None] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    faults: dict[str, str] = field(default_factory=dict)


def faults(profile: str) -> list[str]:
    """The fault variants of ``profile``: the names ``--fault HOST=NAME`` takes."""
    return [n.removeprefix(f"{profile}-") for n in profiles.names() if n.startswith(f"{profile}-")]


def shape(
    sources: Sequence[str],
    limit: str | None = None,
    mapping: Sequence[str] = (),
    fault_options: Sequence[str] = (),
) -> Shape:
    """The hosts of the inventory ``sources`` (cut by ``limit``) with their profiles."""
    try:
        hosts = Inventory.load(list(sources)).select("all", limit)
    except FxkitError as exc:
        raise LabError(f"--like: {exc.message}", where=exc.where, hint=exc.hint) from None
    if not hosts:
        raise LabError(
            f"no host of {', '.join(sources)} matches --limit {limit}",
            hint="`fxkit inventory -i INVENTORY --list` shows the hosts",
        )
    by_group, everyone = _mapping(mapping)
    result = Shape()
    for host in hosts:
        groups = [g for g in host.groups if g not in ("all", "ungrouped")]
        chosen = next((by_group[g] for g in reversed(groups) if g in by_group), everyone)
        if chosen is None:
            chosen = host.vars.get("fxkit_lab_profile")
        if chosen is None:
            chosen = next((DEFAULTS[g] for g in reversed(groups) if g in DEFAULTS), None)
        result.profiles[host.name] = _known(chosen, f"host {host.name}") if chosen else None
        result.groups[host.name] = groups
    for option in fault_options:
        name, _, fault = option.partition("=")
        if name not in result.profiles or not fault:
            raise LabError(
                f"--fault {option}: {'no lab host ' + name if fault else 'not HOST=FAULT'}",
                hint=f"the hosts: {', '.join(result.profiles)}",
            )
        base = result.profiles[name]
        if base is None or fault not in faults(base):
            known = ", ".join(faults(base)) if base else "none: it is a plain host"
            raise LabError(f"--fault {option}: {base or 'a plain host'} has no fault {fault!r}",
                           where=f"host {name}", hint=f"its faults: {known}")  # fmt: skip
        result.profiles[name] = f"{base}-{fault}"
        result.faults[name] = fault
    return result


def _mapping(options: Sequence[str]) -> tuple[dict[str, str], str | None]:
    """``--profile GROUP=PROFILE`` options by group, and a bare ``--profile PROFILE``."""
    by_group: dict[str, str] = {}
    everyone = None
    for option in options:
        group, sep, name = option.rpartition("=")
        if sep:
            by_group[group] = _known(name, f"--profile {option}")
        else:
            everyone = _known(name, f"--profile {option}")
    return by_group, everyone


def _known(name: object, where: str) -> str:
    if not isinstance(name, str) or name not in profiles.names():
        raise LabError(
            f"there is no lab profile {name!r}",
            where=where,
            hint=f"use one of: {', '.join(profiles.names())}",
        )
    return name


def up_like(
    fleet: Fleet,
    sources: Sequence[str],
    limit: str | None = None,
    mapping: Sequence[str] = (),
    fault_options: Sequence[str] = (),
    timeout: float = 60.0,
    limits: Limits | None = None,
) -> list[str]:
    """``fxkit lab up --like``: the hosts of ``sources`` (cut by ``limit``) up, each with its
    profile, the lab mirror built, the new hosts shaped as their nodes; the names started."""
    shaped = shape(sources, limit, mapping, fault_options)
    check_requirements()  # before the mirror is built
    fleet.dir.mkdir(parents=True, exist_ok=True)
    overlay, keyring = node.lab_mirror(fleet)
    new = fleet.up_like(
        shaped.profiles, " ".join(sources), timeout=timeout, limits=limits,
        groups=shaped.groups, faults=shaped.faults, overlay=overlay,
    )  # fmt: skip
    node.prepare(fleet, new, node.login_users(list(sources), list(shaped.profiles)), keyring)
    return new
