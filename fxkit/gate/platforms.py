"""Platform profiles: a gate's thresholds for one kind of node, as data.

A gate whose variables name a platform (the variable ``<gate>_platform``, e.g. ``g1_platform:
mi308x``, set in the gate's ``vars:``, the inventory or with ``-e``) gets that platform's
thresholds as variables, between the gate's ``vars:`` and the inventory (so a site still
overrides any one of them). A platform is a file ``gates/platforms/NAME.yml`` (or a path)::

    platform: mi300x
    title: AMD Instinct MI300X, 8 GPUs (UBB 2.0)
    gate: g1
    thresholds:
      g1_rccl_busbw_min_gbps:
        value: 304
        source: ROCm/system-acceptance-docs docs/gpus/mi300x.md:186 (RCCL Allreduce)
      g1_rocblas_bf16_min_gflops:
        value: null            # no published figure: the site sets it
        source: none published for this platform

Every threshold names its ``source``. A ``null`` value is *unset*: the variable becomes a marker
(:data:`fxkit.gate.rules.UNSET`) that makes every check whose rule uses it ERROR, naming the
variable to set (never PASS, never another platform's figure). A site adds a platform (MI325X,
MI355X) by copying a file and editing its figures.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from fxkit import paths
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import FxkitError
from fxkit.gate.rules import UNSET
from fxkit.yamlfile import line_at, plain, read_yaml


class PlatformError(FxkitError):
    """A platform file is wrong, or the platform a gate names does not exist."""


class Threshold(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The figure; None: unset (the site sets it).
    value: Any
    #: Where it comes from (document and line or section, or repository path), or why unset.
    source: str

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("every threshold names its source")
        return value


class Platform(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    platform: str
    title: str
    about: str = ""
    #: The gate whose variables these are (their names start with ``<gate>_``).
    gate: str
    thresholds: dict[str, Threshold]


@functools.lru_cache(maxsize=32)
def load(name_or_path: str) -> tuple[Platform, Path]:
    """A platform by path, or a built-in one by name (``mi308x`` -> gates/platforms/mi308x.yml)."""
    given = Path(name_or_path)
    path = given if given.suffix in (".yml", ".yaml") else _builtin() / f"{name_or_path}.yml"
    if not path.is_file():
        known = ", ".join(names()) or "none"
        raise PlatformError(
            f"no platform profile {name_or_path!r}",
            hint=f"set the platform to one of: {known}, or to a platform file's path",
        )
    data = read_yaml(path, PlatformError, what="platform file")
    try:
        platform = Platform.model_validate(plain(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        line, _ = line_at(data, first["loc"])
        field = ".".join(str(p) for p in first["loc"]) or "platform"
        reason = first["msg"].removeprefix("Value error, ")
        raise PlatformError(
            f"{field}: {reason}", where=f"{path}:{line}", hint="see docs/GATES.md, Platforms"
        ) from None
    foreign = [n for n in platform.thresholds if not n.startswith(f"{platform.gate}_")]
    if foreign:
        raise PlatformError(
            f"thresholds of gate {platform.gate} are named {platform.gate}_*: {foreign}",
            where=str(path),
        )
    return platform, path


def names() -> list[str]:
    """The built-in platforms."""
    return sorted(p.stem for p in _builtin().glob("*.yml"))


def variables(platform: Platform) -> dict[str, Any]:
    """The platform's thresholds as variables; an unset one is the marker naming it."""
    return {
        name: _unset(name, platform.platform) if t.value is None else t.value
        for name, t in platform.thresholds.items()
    }


def layer(gate: str, v: HostVars) -> Layer | None:
    """The variables of the platform the host's ``<gate>_platform`` names (None: no platform)."""
    chosen = v.get(f"{gate}_platform")
    if not chosen:
        return None
    platform, path = load(str(chosen))
    if platform.gate != gate:
        raise PlatformError(
            f"platform {platform.platform} holds thresholds of gate {platform.gate}, not {gate}",
            where=str(path),
        )
    origin = f"{path}"
    values = variables(platform)
    return Layer(f"platform {platform.platform}", values, origins=dict.fromkeys(values, origin))


def _unset(name: str, platform: str) -> str:
    return f"{UNSET}set {name} (platform {platform} has no figure for it)"


def _builtin() -> Path:
    return paths.builtin("gates") / "platforms"
