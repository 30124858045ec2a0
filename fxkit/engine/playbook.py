"""Playbooks: YAML -> plays and role references, validated, with file:line in every error.

A playbook is a list of plays::

    - name: base set-up            # optional, defaults to the hosts pattern
      hosts: gpu_nodes:&rack1      # host pattern (see fxkit.inventory)
      serial: [1, "25%"]           # batch sizes: number, percentage, or a list (last repeats)
      max_fail_percentage: 20      # stop after a batch in which more hosts failed
      become: true                 # run operations as root (default: the host's ansible_become)
      tags: [base]
      vars: {node_role: inference}
      vars_files: [vars/site.yml]  # relative to the playbook's folder; override vars
      secret_vars: [registry_auth] # redact these values too (beside *password*, *token*, ...)
      roles:
        - node_base
        - {role: rocm, rocm_version: "7.2", tags: [rocm]}
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from fxkit.errors import FxkitError, PlaybookError
from fxkit.varfiles import Variables, load_vars_file
from fxkit.yamlfile import key_origins, line_at, plain, read_yaml, type_name

T = TypeVar("T")


def _as_list(value: Any) -> Any:
    """``tags: a,b`` and ``tags: a`` mean ``[a, b]`` and ``[a]``; an empty ``tags:`` none."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [] if value is None else value


class RoleRef(BaseModel):
    """``- name`` or ``- {role: name, tags: [...], <parameters>}``."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    tags: list[str] = []
    _where: str = PrivateAttr("")
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    _tags = field_validator("tags", mode="before")(_as_list)

    @property
    def params(self) -> Variables:
        """Role parameters: every key besides ``role`` and ``tags``, each set at
        ``path:line``."""
        params = self.model_extra or {}
        return Variables(params, {k: at for k, at in self._origins.items() if k in params})

    @property
    def where(self) -> str:
        return self._where


class Play(BaseModel):
    """One play: which hosts, which roles, in which batches, with which variables."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    hosts: str = Field(min_length=1)
    vars: dict[str, Any] = {}
    vars_files: list[str] = []
    roles: list[RoleRef] = []
    serial: list[int | str] | None = None
    max_fail_percentage: float | None = Field(None, ge=0, le=100)
    tags: list[str] = []
    become: bool | None = None
    secret_vars: list[str] = []
    _where: str = PrivateAttr("")
    _vars_origins: dict[str, str] = PrivateAttr(default_factory=dict)
    _file_vars: Variables = PrivateAttr(default_factory=Variables)

    _tags = field_validator("tags", "secret_vars", mode="before")(_as_list)

    @field_validator("vars", "vars_files", "roles", mode="before")
    @classmethod
    def _empty(cls, value: Any, info: ValidationInfo) -> Any:
        """An empty ``vars:`` (YAML null) means no variables, not an error."""
        return ({} if info.field_name == "vars" else []) if value is None else value

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any) -> Any:
        return ":".join(value) if isinstance(value, list) else value

    @field_validator("roles", mode="before")
    @classmethod
    def _roles(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"role": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("serial", mode="before")
    @classmethod
    def _serial(cls, value: Any) -> Any:
        return value if isinstance(value, list) or value is None else [value]

    @field_validator("serial")
    @classmethod
    def _serial_sizes(cls, value: list[int | str] | None) -> list[int | str] | None:
        for size in value or ():
            if isinstance(size, int) and size < 1:
                raise ValueError("a batch needs at least 1 host")
            if isinstance(size, str):
                number = size.removesuffix("%")
                if not size.endswith("%") or not number.replace(".", "", 1).isdigit():
                    raise ValueError(f"{size!r} is neither a number nor a percentage like '25%'")
                if not 0 < float(number) <= 100:
                    raise ValueError(f"{size!r}: a percentage must be in (0, 100]")
        return value

    @property
    def where(self) -> str:
        return self._where

    @property
    def vars_origins(self) -> dict[str, str]:
        """Where each of ``vars`` was set (``path:line``)."""
        return self._vars_origins

    @property
    def file_vars(self) -> Variables:
        """The variables of ``vars_files``, merged in order, each set at ``path:line``."""
        return self._file_vars

    def batches(self, hosts: Sequence[T]) -> list[list[T]]:
        """Split the play's hosts into ``serial`` batches (all at once without ``serial``)."""
        if not self.serial:
            return [list(hosts)] if hosts else []
        sizes = [
            max(1, int(len(hosts) * float(s[:-1]) / 100)) if isinstance(s, str) else s
            for s in self.serial
        ]
        out: list[list[T]] = []
        start = 0
        while start < len(hosts):
            size = sizes[min(len(out), len(sizes) - 1)]
            out.append(list(hosts[start : start + size]))
            start += size
        return out


@dataclass
class Playbook:
    path: Path
    plays: list[Play] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return self.path.parent

    @classmethod
    def load(cls, path: str | Path) -> Playbook:
        """Read and validate a playbook; every mistake is a PlaybookError with file:line."""
        path = Path(path)
        data = read_yaml(
            path,
            PlaybookError,
            what="playbook",
            hint="give the path of a playbook YAML file, or the name of a built-in one",
        )
        if data is None:
            data = []
        if not isinstance(data, list):
            raise PlaybookError(
                "a playbook is a list of plays",
                where=f"{path}:{getattr(data, 'line', 1)}",
                hint="start each play with '- name: ...' and 'hosts: ...'",
            )
        plays = [_play(path, data, index) for index in range(len(data))]
        return cls(path, plays)


def _play(path: Path, plays: list[Any], index: int) -> Play:
    data, where, label = plays[index], _where(path, plays, [index]), f"play {index + 1}"
    if not isinstance(data, dict):
        raise PlaybookError(
            f"{label} is a {type_name(data)}, not a mapping",
            where=where,
            hint="a play is a mapping with at least 'hosts' and 'roles'",
        )
    if isinstance(data.get("name"), str):
        label += f" ({data['name']})"
    try:
        play = Play.model_validate(plain(data))
    except ValidationError as exc:
        raise _validation_error(exc, label, data, path) from None
    play.name = play.name or play.hosts
    play._where = where
    play._vars_origins = key_origins(path, data.get("vars"))
    for role_index, ref in enumerate(play.roles):
        ref._where = _where(path, data, ["roles", role_index])
        ref._origins = key_origins(path, data["roles"][role_index])
    for file_index, name in enumerate(play.vars_files):
        try:
            play._file_vars.merge(load_vars_file(path.parent / name))
        except FxkitError as exc:
            raise PlaybookError(
                f"{label}: vars_files entry {name!r}: {exc.where}: {exc.message}",
                where=_where(path, data, ["vars_files", file_index]),
                hint=exc.hint,
            ) from None
    return play


def _validation_error(exc: ValidationError, label: str, data: Any, path: Path) -> PlaybookError:
    """The first validation error, placed at its YAML line, with a hint (did you mean ...?)."""
    errors = exc.errors()
    first = errors[0]
    line, loc = line_at(data, first["loc"])
    field_path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    reason = first["msg"].removeprefix("Value error, ")
    missing = first["loc"][-1] if first["type"] == "missing" else None
    hint = _hint(first, loc, missing)
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    if first["type"] == "extra_forbidden":
        message = f"{label}: unknown key {loc[-1]!r}{more}"
    elif missing:
        message = f"{label}: {field_path or 'play'}: missing key {missing!r}{more}"
    else:
        message = f"{label}: {field_path or 'play'}: {reason}{more}"
    return PlaybookError(message, where=f"{path}:{line}", hint=hint)


def _hint(error: Any, loc: list[int | str], missing: Any) -> str:
    valid = sorted(f.alias or name for name, f in Play.model_fields.items())
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        prefix = f"did you mean {close[0]!r}? " if close else ""
        return f"{prefix}a play takes: {', '.join(valid)}"
    if loc and loc[0] == "roles":
        return "write a role as '- name' or '- {role: name, tags: [...], param: value}'"
    if loc and loc[0] == "serial":
        return "serial is a number of hosts, a percentage like '25%', or a list of them"
    if missing:
        return f"add '{missing}:' to the play"
    return "see the playbook format in docs/PLAYBOOKS.md"


def _where(path: Path, data: Any, location: Sequence[Any]) -> str:
    """``path:line`` of a location (e.g. ``["roles", 2]``) in data from :func:`read_yaml`."""
    line, _ = line_at(data, location)
    return f"{path}:{line}" if line else str(path)
