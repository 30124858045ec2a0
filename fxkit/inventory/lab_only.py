"""A lab rehearsal runs on lab hosts only: the overlay inventory of ``fxkit lab up --like`` sets
``fxkit_lab_only`` for all hosts and ``fxkit_lab`` for those the lab has, so a host of the
user's inventory that the lab left out (``--limit``) is refused before anything connects to its
real address."""

from __future__ import annotations

from collections.abc import Iterable

from fxkit.errors import FxkitError
from fxkit.inventory.model import InventoryHost
from fxkit.varfiles import truthy


def outside(hosts: Iterable[InventoryHost]) -> list[str]:
    """The hosts a rehearsal's inventory marks as not in the lab."""
    return [
        h.name
        for h in hosts
        if truthy(h.vars.get("fxkit_lab_only", False))
        and not truthy(h.vars.get("fxkit_lab", False))
    ]


def check(hosts: Iterable[InventoryHost], where: str) -> None:
    """Refuse ``hosts`` when a rehearsal's inventory says some are not lab hosts."""
    absent = outside(hosts)
    if absent:
        raise FxkitError(
            f"not in the lab: {', '.join(absent)} (the inventory rehearses on lab hosts only, "
            "fxkit_lab_only): fxkit does not connect to their real addresses",
            where=where,
            hint="--limit the run to the lab's hosts (`fxkit lab status` lists them), or add "
            "them with `fxkit lab up --like INVENTORY`",
        )
