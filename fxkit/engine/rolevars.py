"""Checks the roles' ``validate(v)`` share: each raises a :class:`VarError` naming the host and
the variable."""

from __future__ import annotations

import re
from typing import Any

from fxkit.engine.variables import HostVars
from fxkit.errors import VarError
from fxkit.facts.nvme import nqn_problem

#: The kernel's dev_valid_name(): 1-15 bytes (IFNAMSIZ 16), no '/', ':' or white space.
_IFNAME = re.compile(r"[^\s/:]{1,15}")


def var_error(v: HostVars, var: str, msg: str, hint: str | None = None) -> VarError:
    return VarError(msg, where=f"{v.host}: {var} ({v.where(var)})", hint=hint)


def mappings(v: HostVars, name: str) -> list[dict[str, Any]]:
    """The variable ``name``: a list of mappings (unset: empty)."""
    value = v.get(name) or []
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise var_error(v, name, f"{name} must be a list of mappings, not {value!r:.60}")
    return value


def words(v: HostVars, var: str, pattern: re.Pattern[str], what: str, hint: str) -> list[str]:
    """The variable ``var``: a list of strings that each match ``pattern`` (``what`` they are)."""
    value = v[var]
    if not isinstance(value, list) or not all(
        isinstance(w, str) and pattern.fullmatch(w) for w in value
    ):
        raise var_error(v, var, f"{value!r} is not a list of {what}", hint)
    return value


def whole_number(
    v: HostVars, var: str, value: object, low: int, high: int, hint: str | None = None
) -> int:
    """A whole number from ``low`` to ``high``; digits in a string count (INI inventories, -e)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        msg = f"{var} is {value!r}: wanted a whole number {low}..{high}"
        raise var_error(v, var, msg, hint or f"use {low} to {high}")
    return value


def valid_nqn(v: HostVars, var: str, value: object) -> str:
    """An NVMe Qualified Name in one of the base specification's two forms."""
    problem = nqn_problem(value)
    if problem:
        raise var_error(
            v,
            var,
            problem,
            hint="NVMe base spec: nqn.YYYY-MM.reverse.domain:name or "
            "nqn.2014-08.org.nvmexpress:uuid:<uuid>",
        )
    return str(value)


def is_interface_name(name: object) -> bool:
    """Whether ``name`` is a name Linux accepts for a network interface."""
    return isinstance(name, str) and bool(_IFNAME.fullmatch(name)) and name not in (".", "..")
