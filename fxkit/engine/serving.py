"""The contract between ``fxkit rollout`` and a serving role: what role.py defines so that the
rollout can roll its instances out (roles/vllm_lmcache keeps it)::

    SELECT = "my_role_rollout_instances"     # a variable of Vars: the instances a run acts on

    class Vars(RoleVars):
        my_role_rollout_instances: list[str] | None = Field(None, description="...")

    def instance_specs(v: Vars) -> list[MySpec]:   # each with name, unit, gpus, port, served_name
        ...

The rollout asks ``instance_specs`` for every host's instances before any host is touched, and
runs each batch with ``SELECT`` set to the batch's instances (``HOST/NAME`` each); the role acts
on those only and starts each with ``host.instance(unit, ...)`` and ``host.instance_ready(unit,
...)``, whose results (:class:`fxkit.ops.instances.InstanceStarted`,
:class:`~fxkit.ops.instances.InstanceReady`) the rollout reads back by ``unit``.

A role that defines ``instance_specs`` or ``SELECT`` is checked when it loads
(:func:`serving_role`): whatever it lacks is named, with the role.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar, cast

from fxkit.engine.rolevars import RoleVars
from fxkit.errors import PlaybookError

V = TypeVar("V", bound=RoleVars)


class ServedInstance(Protocol):
    """One instance of a serving role as the rollout reads it (a role's spec may say more:
    its command line, its environment)."""

    @property
    def name(self) -> str:
        """Unique on its host: ``tp4-0``."""

    @property
    def unit(self) -> str:
        """The unit its instance operations name: ``vllm@tp4-0.service``."""

    @property
    def gpus(self) -> Sequence[int]: ...

    @property
    def port(self) -> int: ...

    @property
    def served_name(self) -> str: ...


@dataclass(frozen=True)
class SimpleInstance:
    """A :class:`ServedInstance` with only what the rollout reads, for a serving role whose
    instances need no more (roles/vllm_lmcache's InstanceSpec also holds the command line)."""

    name: str
    unit: str
    gpus: tuple[int, ...]
    port: int
    served_name: str


class ServingRole(Protocol[V]):
    """What role.py of a serving role defines (see the module's docstring)."""

    #: The role's variables: ``instance_specs`` receives them typed.
    Vars: type[V]
    #: The variable of ``Vars`` that names the instances a run acts on (``HOST/NAME`` or
    #: ``NAME`` each; null: all): the rollout sets it for each batch.
    SELECT: str

    def instance_specs(self, v: V, /) -> Sequence[ServedInstance]:
        """Every instance of the host, in order, from its variables alone (no host is
        touched)."""
        ...


def serving_role(
    role: str, module: ModuleType, model: type[RoleVars] | None, file: Path
) -> ServingRole[RoleVars] | None:
    """role.py (``module``, its ``Vars`` ``model``) as a :class:`ServingRole`; None when it
    defines neither ``instance_specs`` nor ``SELECT``. One that defines either but breaks the
    contract is refused, naming the role and everything it lacks."""
    defined = [name for name in ("instance_specs", "SELECT") if hasattr(module, name)]
    if not defined:
        return None
    problems = [*_select_problems(module, model), *_specs_problems(module)]
    if problems:
        raise PlaybookError(
            f"role {role} defines {' and '.join(defined)} but is not a serving role as fxkit "
            f"rollout needs one: {'; '.join(problems)}",
            where=str(file),
            hint="a serving role's role.py defines Vars (its variables), SELECT (the variable "
            "of Vars that names the instances a run acts on) and instance_specs(v) (see "
            "fxkit.engine.serving; roles/vllm_lmcache keeps the contract)",
        )
    return cast("ServingRole[RoleVars]", module)


def _select_problems(module: ModuleType, model: type[RoleVars] | None) -> list[str]:
    select = getattr(module, "SELECT", None)
    problems = ["no Vars"] if model is None else []
    if select is None:
        problems.append("no SELECT")
    elif not isinstance(select, str):
        problems.append(f"SELECT is {select!r}, not a variable's name")
    elif model is not None and select not in model.model_fields:
        problems.append(f"SELECT names {select!r}, which its Vars does not declare")
    return problems


def _specs_problems(module: ModuleType) -> list[str]:
    specs = getattr(module, "instance_specs", None)
    if specs is None:
        return ["no instance_specs(v)"]
    try:
        inspect.signature(specs).bind(None)
    except (TypeError, ValueError):
        return ["instance_specs is not a function of one argument (v)"]
    return []
