"""Gate files: one YAML file per gate (``gates/g1.yml``...), checked when read.

A gate names the hosts it runs on, the roles whose variables its checks may use (their defaults,
then the inventory's values, as ``fxkit play`` sees them), variables of its own, and its checks::

    gate: g1
    title: G1 arrival acceptance
    hosts: gpu_nodes
    roles: [rocm_host, roce_nic]
    vars: {g1_fio_file: /mnt/models/.fxkit-g1.fio}
    stages:                       # optional: the stages checks name, in order, each with the
      health: {expected: 5m}      # time a healthy node takes (shown against the actual time)
    checks:
      - id: gpu_count
        title: GPU count
        why: Every GPU the node was bought with is visible to the driver.
        measure: {fact: gpus}     # a kind of measurement (fxkit.gate.measures) and its parameters
        value: count              # the value checked: a path into the measurement (* = each item)
        rule: {"==": "{{ rocm_host_gpu_count }}"}
        severity: critical        # critical (the default): FAIL fails the gate; warning: WARN
        unit: GPUs
        when: "{{ ... }}"         # optional: false -> SKIP, with the reason in the report
        source: "AMD system-acceptance-docs, docs/gpus/mi300x.md, Basic health"  # where the
                                  # criterion and its threshold come from (document and section,
                                  # or repository path)
        stage: health             # optional: the stage the check belongs to (`--stage`); one
                                  # of the gate's stages when it declares them
        requires: [g1_x]          # optional: variables only the site can set (a figure, a
                                  # pinned list); one unset, null or empty: the check is ERROR
                                  # naming it, without measuring, never PASS

Strings anywhere in ``measure``, ``rule`` and ``when`` are Jinja2 templates rendered with each
host's variables. Every mistake names the file and line.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

import fxkit.gate.measures  # noqa: F401  (registers the kinds checks name)
from fxkit import paths
from fxkit.errors import FxkitError
from fxkit.gate import rules
from fxkit.gate.measure import KINDS
from fxkit.gate.measures.soak import seconds
from fxkit.yamlfile import line_at, plain, read_yaml

SEVERITIES = ("critical", "warning")
_ID = re.compile(r"[a-z][a-z0-9_]*")
_JINJA = ("{{", "{%")


class GateError(FxkitError):
    """A gate file (or a results file) is wrong: ``where`` is its file:line."""


class CheckSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    title: str
    why: str
    measure: dict[str, Any]
    value: str | None = None
    rule: dict[str, Any]
    severity: Literal["critical", "warning"] = "critical"
    unit: str | None = None
    when: str | bool | None = None
    timeout: float = Field(default=600.0, gt=0)
    #: Where the criterion and its threshold come from: a document and section, or a repository
    #: path. The reports show it beside the verdict.
    source: str | None = None
    #: The stage the check belongs to (a word, e.g. ``health``), for running one stage alone.
    stage: str | None = None
    #: Variables only the site can set (its memory figure, its pinned firmware): while one is
    #: unset, null or empty on a host the check is ERROR there, naming it, unmeasured.
    requires: list[str] = []

    @field_validator("id", "stage")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        if value is not None and not _ID.fullmatch(value):
            raise ValueError(f"{value!r}: ids and stages are lowercase letters, digits and _")
        return value

    @field_validator("measure")
    @classmethod
    def _measure(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) != 1:
            raise ValueError(f"name one kind of measurement, not {len(value)}: {list(value)}")
        name, params = next(iter(value.items()))
        if name not in KINDS:
            close = difflib.get_close_matches(str(name), KINDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown kind {name!r}{hint}; kinds: {', '.join(sorted(KINDS))}")
        if not _templated(params):
            try:
                KINDS[name].parse(params)
            except ValidationError as exc:
                raise ValueError(params_problem(name, exc)) from None
        return value

    @field_validator("rule")
    @classmethod
    def _rule(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            rules.split(value)
        except rules.RuleError as exc:
            raise ValueError(str(exc)) from None
        return value


class StageSpec(BaseModel):
    """A stage of a gate: how long it takes on a healthy node (a duration: ``90s``, ``10m``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expected: str | float
    about: str = ""

    @field_validator("expected", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"{value!r} is not a duration (e.g. 90s, 10m, 72h, 1h30m)")
        seconds(value)
        return value

    @property
    def expected_s(self) -> float:
        return seconds(self.expected)


class GateSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gate: str
    title: str
    about: str = ""
    hosts: str = "all"
    roles: list[str] = []
    vars: dict[str, Any] = {}
    become: bool = False
    #: The gate whose results ``change`` rules compare with (``--baseline``), e.g. g2 for g3.
    baseline: str | None = None
    #: The stages its checks name (``stage:``), in the order they run, with their expected
    #: durations; ``fxkit gate NAME --stage S`` runs one alone.
    stages: dict[str, StageSpec] = {}
    checks: list[CheckSpec]

    @field_validator("stages")
    @classmethod
    def _stage_names(cls, value: dict[str, StageSpec]) -> dict[str, StageSpec]:
        for name in value:
            if not _ID.fullmatch(name):
                raise ValueError(f"{name!r}: stages are lowercase letters, digits and _")
        return value

    @field_validator("checks")
    @classmethod
    def _unique(cls, value: list[CheckSpec], info: ValidationInfo) -> list[CheckSpec]:
        seen: set[str] = set()
        declared = info.data.get("stages") or {}
        for check in value:
            if check.id in seen:
                raise ValueError(f"two checks have the id {check.id!r}")
            seen.add(check.id)
            if declared and check.stage is not None and check.stage not in declared:
                raise ValueError(
                    f"check {check.id!r}: stage {check.stage!r} is not one of the gate's "
                    f"stages: ({', '.join(declared)}); declare it under stages:"
                )
        if not value:
            raise ValueError("a gate has at least one check")
        return value

    def stage_names(self) -> list[str]:
        """The stages: those declared, in order, then any other that a check names."""
        named = [c.stage for c in self.checks if c.stage is not None]
        return list(dict.fromkeys([*self.stages, *named]))


@dataclass(frozen=True)
class Gate:
    """A gate file, read and checked."""

    spec: GateSpec
    path: Path
    #: sha256 of the file's bytes (recorded in results: which thresholds they were judged by).
    sha256: str
    #: Line of each check in the file, by id.
    lines: dict[str, int]

    @property
    def name(self) -> str:
        return self.spec.gate

    def check(self, check_id: str) -> CheckSpec | None:
        return next((c for c in self.spec.checks if c.id == check_id), None)

    def where(self, check_id: str) -> str:
        return f"{self.path}:{self.lines.get(check_id, 1)}"

    def checks_of(self, stages: Sequence[str]) -> list[CheckSpec]:
        """The checks of ``stages`` (every check when empty); an unknown stage is an error
        naming the gate's stages."""
        if not stages:
            return list(self.spec.checks)
        known = self.spec.stage_names()
        unknown = [s for s in stages if s not in known]
        if unknown:
            raise GateError(
                f"no stage {', '.join(map(repr, unknown))} in gate {self.name}",
                where=str(self.path),
                hint=f"its stages: {', '.join(known)}" if known else "its checks name no stage",
            )
        found = [c for c in self.spec.checks if c.stage in stages]
        if not found:
            raise GateError(
                f"no check of gate {self.name} is in stage {', '.join(stages)}",
                where=str(self.path),
                hint="give a stage whose checks name it (stage:), or run the whole gate",
            )
        return found

    def expected_stages(self) -> dict[str, float | None]:
        """The stages, in order, with their expected durations in seconds (None: not
        declared)."""
        declared = self.spec.stages
        return {
            name: declared[name].expected_s if name in declared else None
            for name in self.spec.stage_names()
        }


def load(name_or_path: str | Path) -> Gate:
    """A gate by path, or a built-in one by name (``g1`` -> the packaged ``gates/g1.yml``)."""
    path = paths.resolve(name_or_path, "gates")
    if not path.is_file():
        builtin = sorted(p.stem for p in paths.builtin("gates").glob("*.yml"))
        raise GateError(
            f"no gate file {str(name_or_path)!r}",
            hint=f"give a gate file's path, or one of the built-in gates: {', '.join(builtin)}",
        )
    data = read_yaml(path, GateError, what="gate file")
    if not isinstance(data, dict):
        raise GateError("a gate file is a mapping (gate:, title:, checks: ...)", where=str(path))
    try:
        spec = GateSpec.model_validate(plain(data))
    except ValidationError as exc:
        raise _error(exc, data, path) from None
    checks = data.get("checks") or []
    lines = {
        str(c.get("id")): checks.item_lines[i]
        for i, c in enumerate(checks)
        if isinstance(c, dict) and hasattr(checks, "item_lines")
    }
    return Gate(spec, path, hashlib.sha256(path.read_bytes()).hexdigest(), lines)


def params_problem(kind: str, exc: ValidationError) -> str:
    """A kind's parameters' first problem in words (an unknown key first: likely a typo)."""
    first = _first(exc)
    where = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        known = ", ".join(KINDS[kind].params.model_fields)
        return f"{kind}: unknown parameter {where!r}; {kind} takes: {known}"
    reason = first["msg"].removeprefix("Value error, ")
    return f"{kind}: {where}: {reason}" if where else f"{kind}: {reason}"


def _first(exc: ValidationError) -> Any:
    """The error to show: an unknown key before the missing one it probably misspells."""
    return sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]


def strings(value: Any) -> Iterator[str]:
    """Every string in a YAML value (mapping values and list items, at any depth)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def _templated(value: Any) -> bool:
    return any(m in text for text in strings(value) for m in _JINJA)


def _error(exc: ValidationError, data: Any, path: Path) -> GateError:
    first = _first(exc)
    line, loc = line_at(data, first["loc"])
    field = ".".join(str(p) for p in loc) or "gate"
    more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
    reason = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        model = CheckSpec if "checks" in loc else GateSpec
        keys = sorted(model.model_fields)
        close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        hint = (f"did you mean {close[0]!r}? " if close else "") + f"keys: {', '.join(keys)}"
        return GateError(f"unknown key {loc[-1]!r}{more}", where=f"{path}:{line}", hint=hint)
    if first["type"] == "missing":
        return GateError(
            f"{field}: missing key {first['loc'][-1]!r}{more}",
            where=f"{path}:{line}",
            hint="see the gate file format in docs/GATES.md",
        )
    return GateError(
        f"{field}: {reason}{more}",
        where=f"{path}:{line}",
        hint="see the gate file format in docs/GATES.md",
    )
