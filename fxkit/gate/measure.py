"""What a check measures: kinds of measurement, each a function of a host and its parameters.

A kind is registered with :func:`kind`: a name (the key in a check's ``measure:``), a Pydantic
model of its parameters (unknown keys refused) and a function that measures one host through a
:class:`MeasuredHost` and returns plain data (numbers, text, lists, mappings) that checks pick
values from (``value: ports.*.state``). A measurement that cannot be made (the tool is missing, the
command failed, its output does not parse) raises :class:`MeasureError`: its checks are ERROR,
with that reason, never PASS.

The kinds live in :mod:`fxkit.gate.measures`; :data:`KINDS` lists them once it is imported.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from fxkit.connection.base import Connection, RunResult
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache, FactError

P = TypeVar("P", bound="Params")


class MeasureError(Exception):
    """The measurement could not be made; the message says why (the check is ERROR)."""


class Params(BaseModel):
    """Base of every kind's parameters: unknown keys are mistakes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def regex(value: str, name: str) -> re.Pattern[str]:
    """A parameter's regex, compiled when the parameters are checked (before any host is
    touched); a ValueError naming the parameter when it is not one."""
    try:
        return re.compile(value)
    except re.error as exc:
        raise ValueError(f"{name} is not a regex: {exc}") from None


@dataclass
class MeasuredHost:
    """One host, as a measurement sees it: its connection, facts and variables."""

    host: str
    conn: Connection
    facts: FactCache
    vars: HostVars
    #: Run commands as root (the gate's ``become``).
    become: bool = False
    #: Seconds a command may run (the check's ``timeout``).
    timeout: float | None = None
    #: Set at Ctrl-C: long measurements (soaks) stop at their next sample.
    stop: threading.Event = field(default_factory=threading.Event)

    def run(
        self, command: str, *, timeout: float | None = None, become: bool | None = None
    ) -> RunResult:
        """Run ``command`` on the host; never raises on rc != 0."""
        return self.conn.run(
            command,
            become=self.become if become is None else become,
            timeout=timeout or self.timeout,
        )

    def output(self, command: str, *, timeout: float | None = None) -> str:
        """The command's stdout; :class:`MeasureError` (with its stderr's tail) when it fails."""
        result = self.run(command, timeout=timeout)
        if not result.ok:
            tail = (result.stderr or result.stdout).strip()[-400:]
            raise MeasureError(f"`{result.command}` exited {result.rc}: {tail}")
        return result.stdout

    def require(self, *tools: str) -> None:
        """:class:`MeasureError` ("fio not found") unless every tool is on the host's PATH."""
        for tool in tools:
            if not self.run(f"command -v {shlex.quote(tool)} >/dev/null 2>&1").ok:
                raise self.not_found(tool)

    def not_found(self, tool: str, as_root: bool = False) -> MeasureError:
        """The error of a tool missing from the host's PATH (root's, ``as_root``)."""
        if as_root:
            return MeasureError(f"{tool} not found on {self.host} (root's PATH): install it")
        return MeasureError(f"{tool} not found on {self.host} (install it, or fix PATH)")

    def fact(self, fact: Any, *args: Any) -> Any:
        """A fact of the host (see :mod:`fxkit.facts`); a failing fact is a MeasureError."""
        try:
            return self.facts.get(fact, *args, become=self.become)
        except FactError as exc:
            raise MeasureError(exc.message) from None


#: What a command of :func:`with_tool` prints (exiting 127) when its tool is not on the PATH.
MISSING = "--- fxkit: tool not found ---"


def with_tool(tool: str, command: str) -> str:
    """``command``, run when ``tool`` is on the PATH, else :data:`MISSING` and exit 127: one
    round trip where :meth:`MeasuredHost.require` and the command take two."""
    missing = f"{{ echo {shlex.quote(MISSING)}; exit 127; }}"
    return f"command -v {shlex.quote(tool)} >/dev/null 2>&1 || {missing}; {command}"


Measure = Callable[[MeasuredHost, Any], Any]
#: A fleet measurement: every host's node and parameters -> each host's data, or the
#: :class:`MeasureError` that host's checks are ERROR with.
FleetMeasure = Callable[[dict[str, MeasuredHost], dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Kind:
    name: str
    params: type[Params]
    measure: Callable[..., Any]
    #: One line for the reference (the function's docstring's first line).
    about: str = field(default="")
    #: Measured across hosts at once (``measure`` is a :data:`FleetMeasure`), after every
    #: host's own measurements: node pairs, storage reads paced across the fleet.
    fleet: bool = False

    def parse(self, value: Any) -> Params:
        """The parameters from a check's ``measure: {NAME: value}``: a mapping, or a plain
        value for the model's first field (``{fact: gpus}``). Raises pydantic's ValidationError."""
        if not isinstance(value, dict):
            first = next(iter(self.params.model_fields))
            value = {first: value}
        return self.params.model_validate(value)


#: Every kind of measurement, by name (filled by :func:`kind` as fxkit.gate.measures imports).
KINDS: dict[str, Kind] = {}


def kind(
    name: str, params: type[P]
) -> Callable[[Callable[[MeasuredHost, P], Any]], Callable[[MeasuredHost, P], Any]]:
    """Register a kind of measurement: ``@kind("fio", FioParams)`` over ``def fio(node, p)``."""

    def register(func: Callable[[MeasuredHost, P], Any]) -> Callable[[MeasuredHost, P], Any]:
        about = (func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else ""
        KINDS[name] = Kind(name, params, func, about)
        return func

    return register


def fleet_kind(
    name: str, params: type[P]
) -> Callable[[Callable[[dict[str, MeasuredHost], dict[str, P]], dict[str, Any]]], Any]:
    """Register a kind measured across the fleet: ``@fleet_kind("ib_write_bw_pairs", ...)``
    over ``def pairs(nodes, params)`` (both by host name) returning each host's data or
    :class:`MeasureError`."""

    def register(func: Callable[[dict[str, MeasuredHost], dict[str, P]], dict[str, Any]]) -> Any:
        about = (func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else ""
        KINDS[name] = Kind(name, params, func, about, fleet=True)
        return func

    return register
