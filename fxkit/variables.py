"""Variables: precedence, lazy Jinja2 rendering (StrictUndefined), extra vars and secrets.

Precedence, lowest first (a later level replaces a whole top-level value of an earlier one):

1. role defaults (``roles/<name>/defaults.yml``)
2. inventory variables: group ``all``, then parent groups before their children, then host vars
   (merged by :mod:`fxkit.inventory`)
3. play ``vars``, then the play's ``vars_files`` in order
4. role parameters (``roles: [{role: name, key: value}]``)
5. extra vars (``-e key=value``, ``-e '{"json": 1}'``, ``-e @file.yml``)

On top, fxkit sets ``inventory_hostname``, ``group_names`` and ``role_name``.

Values are rendered when they are read: a string value may use ``{{ other_variable }}`` and is
rendered with the host's variables at that moment, through a Jinja2 environment with
``StrictUndefined``: an undefined variable is a :class:`~fxkit.errors.TemplateError` naming the
template (file or variable), the line, the undefined name and the host.

Secrets (which names are secret: :mod:`fxkit.redaction`): the values of secret variables are
collected so the report redacts them in everything it prints or logs.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
import traceback
from collections import ChainMap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2.nativetypes import NativeEnvironment

from fxkit.errors import FxkitError, TemplateError
from fxkit.redaction import REDACTED, is_secret_name
from fxkit.yamlfile import read_yaml, type_name

_JINJA_MARKERS = ("{{", "{%", "{#")


def masked(variables: Mapping[str, Any]) -> dict[str, Any]:
    """``variables`` for display: the value of each secret variable replaced by ``********``."""
    return {name: REDACTED if is_secret_name(name) else v for name, v in variables.items()}


@cache
def environment(templates_dir: str | None = None) -> jinja2.Environment:
    """The Jinja2 environment for one role's ``templates/``, or for variable values.

    Variable values render to native types (``"{{ ports }}"`` stays a list), templates to text.
    """
    if templates_dir is None:
        return NativeEnvironment(undefined=jinja2.StrictUndefined, finalize=_strict)
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,  # a line holding only {% ... %} leaves no empty line (as in Ansible)
        autoescape=False,
    )


def _strict(value: Any) -> Any:
    """Native rendering passes values through unprinted: make an undefined one fail here too."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises UndefinedError
    return value


class UndefinedVariable(TemplateError, KeyError):
    """A role read a variable that no level defines (also a KeyError, so ``v.get()`` works)."""


@dataclass(frozen=True)
class Layer:
    """One precedence level: where its values come from (for messages) and the values."""

    source: str
    values: Mapping[str, Any]


class HostVars(Mapping[str, Any]):
    """One host's variables for one role: the merged levels, rendered lazily and cached.

    Read them as ``v["name"]`` or ``v.name``; ``v.get("name", default)`` for optional ones.
    """

    def __init__(self, host: str, layers: Iterable[Layer], secret_names: Iterable[str] = ()):
        self._host = host
        self._raw: dict[str, Any] = {}
        self._source: dict[str, str] = {}
        for layer in layers:
            for key, value in layer.values.items():
                self._raw[key] = value
                self._source[key] = layer.source
        self._secret_names = frozenset(secret_names)
        self._rendered: dict[str, Any] = {}
        self._local = threading.local()

    @property
    def host(self) -> str:
        return self._host

    def source(self, name: str) -> str:
        """Where the winning value of ``name`` was defined (e.g. ``play vars``)."""
        return self._source[name]

    def __getitem__(self, name: str) -> Any:
        if name in self._rendered:
            return self._rendered[name]
        if name not in self._raw:
            raise UndefinedVariable(
                f"variable {name!r} is not defined",
                where=f"host {self._host}",
                hint="define it in the role's defaults.yml, the inventory, the play or with -e",
            )
        stack: list[str] = self._local.__dict__.setdefault("stack", [])
        if name in stack:
            chain = " -> ".join([*stack[stack.index(name) :], name])
            raise TemplateError(
                f"variable {name!r} refers to itself: {chain}",
                where=f"host {self._host}",
                hint="break the loop: one of these variables needs a plain value",
            )
        stack.append(name)
        try:
            value = self._render_value(self._raw[name], f"variable {name!r} ({self._source[name]})")
        finally:
            stack.pop()
        self._rendered[name] = value
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, name: object) -> bool:
        return name in self._raw

    def __repr__(self) -> str:
        return f"HostVars({self._host!r}, {sorted(self._raw)})"

    def _render_value(self, value: Any, label: str) -> Any:
        if isinstance(value, str):
            return (
                self.render_string(value, label)
                if any(m in value for m in _JINJA_MARKERS)
                else value
            )
        if isinstance(value, Mapping):
            return {k: self._render_value(v, label) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._render_value(v, label) for v in value]
        return value

    def render_string(self, source: str, label: str) -> Any:
        """Render a variable's value (native types); ``label`` names it in error messages."""
        try:
            template = environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise _template_error(exc, label, self._host, exc.lineno) from None
        return self._render(template, label)

    def render_template(self, templates_dir: str | Path, name: str) -> str:
        """Render ``templates_dir/name`` (a role's Jinja2 template file)."""
        env = environment(str(templates_dir))
        path = str(Path(templates_dir) / name)
        try:
            template = env.get_template(name)
        except jinja2.TemplateNotFound:
            raise TemplateError(
                f"template {name!r} not found", where=path, hint=f"put it in {templates_dir}/"
            ) from None
        except jinja2.TemplateSyntaxError as exc:
            raise _template_error(exc, path, self._host, exc.lineno) from None
        return self._render(template, path)

    def _render(self, template: jinja2.Template, label: str) -> Any:
        """Render with this mapping as the context, so variables render only when used."""
        env = template.environment
        scope = ChainMap({}, self, env.globals)  # the empty dict takes Jinja2's own writes
        context = template.new_context(scope, shared=True)  # type: ignore[arg-type]
        try:
            try:
                return env.concat(template.root_render_func(context))  # type: ignore[attr-defined]
            except Exception:
                env.handle_exception()  # re-raises with template line numbers in the traceback
        except jinja2.TemplateError as exc:
            raise _template_error(exc, label, self._host, _template_line(exc, template)) from None

    def secret_values(self) -> set[str]:
        """The values (raw and, where they render, rendered) of this host's secret variables."""
        values: set[str] = set()
        for name, raw in self._raw.items():
            if not is_secret_name(name, self._secret_names):
                continue
            values.update(_leaves(raw))
            with contextlib.suppress(FxkitError):  # the error surfaces where the variable is used
                values.update(_leaves(self[name]))
        return {v for v in values if v}


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list | tuple | set):
        for v in value:
            yield from _leaves(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def _template_line(exc: BaseException, template: jinja2.Template) -> int | None:
    """The template line where rendering failed (Jinja2 rewrites tracebacks to template lines)."""
    filename = template.filename or "<template>"
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    return lines[-1] if lines else None


def _template_error(
    exc: jinja2.TemplateError, label: str, host: str, line: int | None
) -> TemplateError:
    where = label
    if line:
        where = f"{label}, line {line}" if label.startswith("variable ") else f"{label}:{line}"
    if isinstance(exc, jinja2.UndefinedError):
        match = re.search(r"'([^']+)' is undefined|has no attribute '([^']+)'", exc.message or "")
        name = next((g for g in match.groups() if g), "?") if match else "?"
        return TemplateError(
            f"undefined variable {name!r} for host {host} ({exc.message})",
            where=where,
            hint="define it (role defaults, inventory, play vars or -e) or use "
            "{{ name | default(...) }}",
        )
    return TemplateError(
        f"{type(exc).__name__} for host {host}: {exc.message}",
        where=where,
        hint="fix the Jinja2 syntax",
    )


def parse_extra_vars(items: Iterable[str], base: Path | None = None) -> dict[str, Any]:
    """Merge ``-e`` values, later ones winning: ``k=v k2=v2``, a JSON/YAML mapping, ``@file``."""
    merged: dict[str, Any] = {}
    for item in items:
        text = item.strip()
        if text.startswith("@"):
            merged.update(load_vars_file(Path(base or ".") / text[1:]))
        elif text.startswith("{"):
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise FxkitError(
                    f"extra vars are not valid JSON/YAML: {exc}",
                    where=f"-e {item}",
                    hint='write -e \'{"key": "value"}\'',
                ) from None
            merged.update(_require_mapping(value, f"-e {item}"))
        else:
            for word in shlex.split(text):
                key, sep, value = word.partition("=")
                if not sep or not key.isidentifier():
                    raise FxkitError(
                        f"cannot read extra var {word!r}",
                        where=f"-e {item}",
                        hint="write -e key=value, -e '{\"key\": 1}' or -e @vars.yml",
                    )
                merged[key] = value
    return merged


def load_vars_file(path: Path, error: type[FxkitError] = FxkitError) -> dict[str, Any]:
    """A YAML (or JSON) file holding one mapping of variables; empty files hold none.

    Mistakes are raised as ``error`` with the file and line.
    """
    value = read_yaml(
        path,
        error,
        what="variables file",
        hint="check that the file exists and is readable (vars_files paths start at the playbook)",
        lines=False,
    )
    return _require_mapping(value, f"{path}:1", error) if value is not None else {}


def _require_mapping(
    value: Any, where: str, error: type[FxkitError] = FxkitError
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise error(
            f"variables must be a mapping of names to values, not {type_name(value)}",
            where=where,
            hint="write key: value pairs",
        )
    return value
