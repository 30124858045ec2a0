"""Variables: precedence, lazy Jinja2 rendering (StrictUndefined), extra vars and secrets.

Precedence, lowest first (a later level replaces a whole top-level value of an earlier one):

1. role defaults (its ``Vars``, or ``roles/<name>/defaults.yml``)
2. inventory variables: group ``all``, then parent groups before their children, then host vars
   (merged by :mod:`fxkit.inventory`)
3. play ``vars``, then the play's ``vars_files`` in order
4. role parameters (``roles: [{role: name, key: value}]``)
5. extra vars (``-e key=value``, ``-e '{"json": 1}'``, ``-e @file.yml``)

On top, fxkit sets ``inventory_hostname``, ``group_names`` and ``role_name``.

Each variable knows where its winning value was set (:meth:`HostVars.where`): ``path:line`` of
a file (inventory, ``group_vars/``, playbook, vars file, ``-e @file``), ``-e #2 on the command
line``, else the level's name. Levels read from a file or ``-e`` are :class:`Variables`, which
carry these origins.

Values are rendered when they are read: a string value may use ``{{ other_variable }}`` and is
rendered with the host's variables at that moment, through a Jinja2 environment with
``StrictUndefined``: an undefined variable is a :class:`~fxkit.errors.TemplateError` naming the
template (file or variable), the line, the undefined name and the host; so is anything else a
template raises (``{{ 1 / 0 }}``, a filter given the wrong type).

Templates come from data (inventories, gate files, ``-e``), so they render in Jinja2's immutable
sandbox: no attribute of Python's internals (``lipsum.__globals__``), no method that changes a
list, dict or set in place. Jinja2's filters, tests and the other methods work as usual.

Secrets (which names and keys are secret: :mod:`fxkit.redaction`; ``fxkit_secret_vars`` at
any level adds to them): the values of secret variables, and of secret keys inside any variable,
are collected so the report redacts them in everything it prints or logs. So is what a template
or a variable's value makes of them (taint follows rendering):

- the output of every ``{{ expression }}`` that reads a secret variable or key, directly or
  through a ``{% set %}``/``{% for %}`` name (``{{ db_password | b64encode }}``);
- the whole value of a variable, or of a template string (a gate's rule), that has such an
  expression; and the variable becomes secret in turn (``url: "pg://u:{{ db_password }}@db"``);
- in a template file, the whole line of an expression that makes something of a secret too
  short to be masked by itself (a slice, a character, a length: ``{{ token[0:4] }}``).

Errors while rendering a secret value never quote it.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import shlex
import threading
import traceback
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2 import nodes
from jinja2.nativetypes import NativeEnvironment
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from fxkit.errors import FxkitError, TemplateError, VarError
from fxkit.redaction import (
    MIN_SECRET_LENGTH,
    SECRET_VARS,
    is_secret_name,
    leaves,
    listed_names,
    secret_leaves,
)
from fxkit.varfiles import Variables, load_vars_file, require_mapping
from fxkit.yamlfile import type_name

_JINJA_MARKERS = ("{{", "{%", "{#")
#: The filter that records what an expression reading a secret renders to.
_RECORD = "fxkit_record_secret"
#: Brackets a piece of a secret too short to be masked in a template file's output (Unicode
#: noncharacters: for a program's internal use, never in text).
_SHORT_OPEN, _SHORT_CLOSE = "\ufdd0", "\ufdd1"
_SHORT_PIECE = re.compile(f"{_SHORT_OPEN}.*?{_SHORT_CLOSE}", re.S)


@dataclass
class _Rendering:
    """The template rendering in this thread right now: whose variables, and whether it read a
    secret."""

    hostvars: HostVars
    read_secret: bool = False


_rendering: contextvars.ContextVar[_Rendering | None] = contextvars.ContextVar(
    "fxkit_rendering", default=None
)


@cache
def environment(templates_dir: str | None = None) -> jinja2.Environment:
    """The Jinja2 environment for one role's ``templates/``, or for variable values.

    Variable values render to native types (``"{{ ports }}"`` stays a list), templates to text.
    """
    if templates_dir is None:
        return _NativeEnvironment(undefined=jinja2.StrictUndefined, finalize=_strict)
    return _Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,  # a line holding only {% ... %} leaves no empty line (as in Ansible)
        autoescape=False,
    )


@lru_cache(maxsize=4096)
def _value_template(source: str) -> jinja2.Template:
    """A variable value's compiled template: compiled once for every host that renders it (the
    compilation, not the rendering, was 90 % of planning G1 on 64 hosts)."""
    return environment().from_string(source)


class _Environment(ImmutableSandboxedEnvironment):
    """Sandboxed templates (files, includes, variable values) whose ``{{ expressions }}`` report
    what they render to when they read a secret: each is wrapped in the filter ``_RECORD`` with
    the names it reads (see :func:`_wrap_outputs`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters[_RECORD] = _record_secret

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        text = not isinstance(self, NativeEnvironment)  # text: a file's lines to mask
        tree = _wrap_outputs(super()._parse(source, name, filename), mark_short=text)
        tree.set_environment(self)
        return tree


class _NativeEnvironment(_Environment, NativeEnvironment):
    """The sandbox, with NativeEnvironment's code generator and ``concat`` (native types)."""


def _read_names(node: nodes.Node) -> set[str]:
    """The names an expression reads: variables, attributes and constant keys (``a.b``,
    ``a['b']``)."""
    found: set[str] = set()
    for part in (node, *node.find_all((nodes.Name, nodes.Getattr, nodes.Getitem))):
        if isinstance(part, nodes.Name) and part.ctx == "load":
            found.add(part.name)
        elif isinstance(part, nodes.Getattr):
            found.add(part.attr)
        elif isinstance(part, nodes.Getitem) and isinstance(part.arg, nodes.Const):
            found.add(str(part.arg.value))
    return found


def _local_sources(tree: nodes.Template) -> dict[str, set[str]]:
    """For each name a template sets (``{% set %}``, ``{% for %}`` targets), every name its
    value comes from, through other set names too."""
    sources: dict[str, set[str]] = {}
    target: nodes.Node
    values: list[nodes.Node]
    for node in tree.find_all((nodes.Assign, nodes.AssignBlock, nodes.For)):
        if isinstance(node, nodes.Assign):
            target, values = node.target, [node.node]
        elif isinstance(node, nodes.AssignBlock):
            target, values = node.target, list(node.body)
        else:
            assert isinstance(node, nodes.For)
            target, values = node.target, [node.iter]
        read = set().union(*map(_read_names, values))
        for name in [target, *target.find_all(nodes.Name)]:
            if isinstance(name, nodes.Name):
                sources.setdefault(name.name, set()).update(read)
    changed = True
    while changed:  # follow chains: a set from b set from db_password
        changed = False
        for read in sources.values():
            more = set().union(*(sources.get(name, set()) for name in read)) - read
            if more:
                read |= more
                changed = True
    return sources


def _wrap_outputs(tree: nodes.Template, mark_short: bool) -> nodes.Template:
    """``{{ expr }}`` -> ``{{ expr | _RECORD(names, mark) }}``, for every expression reading a
    name; ``mark`` when ``mark_short`` and the expression makes something of what it reads."""
    sources = _local_sources(tree)
    for output in tree.find_all(nodes.Output):
        for index, child in enumerate(output.nodes):
            if isinstance(child, nodes.TemplateData):
                continue
            read = _read_names(child)
            read |= set().union(*(sources.get(name, set()) for name in read))
            if read:
                mark = mark_short and not _as_it_is(child, sources)
                args = [nodes.Const(tuple(sorted(read))), nodes.Const(mark)]
                output.nodes[index] = nodes.Filter(
                    child, _RECORD, args, [], None, None, lineno=child.lineno
                )
    return tree


def _as_it_is(node: nodes.Node, local: Mapping[str, Any]) -> bool:
    """True for a variable, or a key or attribute of one, as it is (``a``, ``a.b``,
    ``a['b']``): not a slice, a filter, a local name..."""
    while isinstance(node, nodes.Getattr | nodes.Getitem):
        if isinstance(node, nodes.Getitem) and not (
            isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str)
        ):
            return False
        node = node.node
    return isinstance(node, nodes.Name) and node.name not in local


def _record_secret(value: Any, names: tuple[str, ...], mark: bool = False) -> Any:
    """The filter ``_RECORD``: tell the HostVars rendering when ``value`` came from a secret;
    with ``mark``, bracket it when it is too short to be masked (see :func:`_short_lines`)."""
    rendering = _rendering.get()
    if (
        rendering is None
        or isinstance(value, jinja2.Undefined)
        or not any(rendering.hostvars.is_secret(name) for name in names)
    ):
        return value
    rendering.read_secret = True
    text = str(value)
    rendering.hostvars.record_secrets([text])
    if mark and 0 < len(text) < MIN_SECRET_LENGTH:
        return f"{_SHORT_OPEN}{text}{_SHORT_CLOSE}"
    return value


def _short_lines(text: str) -> tuple[str, list[str]]:
    """A template file's output without the brackets of :func:`_record_secret`, and the lines
    they were in."""
    lines = []
    for piece in _SHORT_PIECE.finditer(text):
        start = text.rfind("\n", 0, piece.start()) + 1
        end = text.find("\n", piece.end())
        lines.append(text[start : end if end >= 0 else len(text)])
    strip = str.maketrans("", "", _SHORT_OPEN + _SHORT_CLOSE)
    return text.translate(strip), [line.translate(strip) for line in lines]


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
    #: Values rendered already (kept in a results file): data, never rendered again.
    rendered: bool = False
    #: Where each variable was set (``path:line``); ``None``: the values' own origins when
    #: they are :class:`Variables`. A variable with none was set in "``source``".
    origins: Mapping[str, str] | None = None

    def where_set(self) -> Mapping[str, str]:
        """Where each variable of this level was set, as far as known."""
        if self.origins is not None:
            return self.origins
        return self.values.origins if isinstance(self.values, Variables) else {}


class HostVars(Mapping[str, Any]):
    """One host's variables for one role: the merged levels, rendered lazily and cached.

    Read them as ``v["name"]`` or ``v.name``; ``v.get("name", default)`` for optional ones.
    """

    def __init__(
        self,
        host: str,
        layers: Iterable[Layer],
        secret_names: Iterable[str] = (),
        on_secret: Callable[[Iterable[str]], None] | None = None,
    ):
        """``secret_names``: the play's ``secret_vars``, to which every level's
        ``fxkit_secret_vars`` adds; ``on_secret`` is told of secret values found while
        rendering (what templates make of secrets)."""
        self._host = host
        self._raw: dict[str, Any] = {}
        self._source: dict[str, str] = {}
        self._where: dict[str, str] = {}
        self._rendered: dict[str, Any] = {}
        marked = set(secret_names)
        for layer in layers:
            origins = layer.where_set()
            for key, value in layer.values.items():
                self._raw[key] = value
                self._source[key] = layer.source
                self._where[key] = origins.get(key, layer.source)
                if layer.rendered:
                    self._rendered[key] = value
                else:
                    self._rendered.pop(key, None)
            if SECRET_VARS in layer.values:
                marked.update(self._marked(layer.values))
        self._secret_names = frozenset(marked)
        #: Variables secret because their values read a secret.
        self._tainted: set[str] = set()
        self._on_secret = on_secret
        self._rendered_secrets: set[str] = set()
        self._local = threading.local()

    def _marked(self, values: Mapping[str, Any]) -> list[str]:
        names = listed_names(values[SECRET_VARS])
        if names is None:
            raise VarError(
                f"{SECRET_VARS} must be a list of variable names, not "
                f"{type_name(values[SECRET_VARS])}",
                where=f"host {self._host}, variable {SECRET_VARS} ({self._where[SECRET_VARS]})",
                hint=f"write {SECRET_VARS}: [bmc_login, 'vault_*'] (names or glob patterns)",
            )
        return names

    @property
    def host(self) -> str:
        return self._host

    def source(self, name: str) -> str:
        """Where the winning value of ``name`` was defined (e.g. ``play vars``)."""
        return self._source[name]

    def where(self, name: str) -> str:
        """Where the winning value of ``name`` was set: ``path:line`` when known (e.g.
        ``inventory/group_vars/all.yml:12``), else how (``-e #2 on the command line``) or the
        level (``role node_base defaults``). For a path into a variable (``ports[0].addr``):
        where the variable was set; for a variable set nowhere: ``not set``."""
        if name not in self._where:
            name = re.split(r"[.\[]", name, maxsplit=1)[0]
        return self._where.get(name, "not set")

    def __getitem__(self, name: str) -> Any:
        if name in self._rendered:
            return self._rendered[name]
        if name not in self._raw:
            raise UndefinedVariable(
                f"variable {name!r} is not defined",
                where=f"host {self._host}",
                hint="declare it in the role's Vars, or set it in the inventory, the play or -e",
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
        label = f"variable {name!r} ({self._where[name]})"
        try:
            value = self._render_value(self._raw[name], label, self._holds_secrets(name))
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

    def _render_value(self, value: Any, label: str, secret: bool) -> Any:
        if isinstance(value, str):
            return (
                self.render_string(value, label, secret=secret)
                if any(m in value for m in _JINJA_MARKERS)
                else value
            )
        if isinstance(value, Mapping):
            return {k: self._render_value(v, label, secret) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._render_value(v, label, secret) for v in value]
        return value

    def render_string(self, source: str, label: str, *, secret: bool = False) -> Any:
        """Render a variable's value (native types); ``label`` names it in error messages,
        which quote nothing of ``source`` when it is ``secret``."""
        try:
            template = _value_template(source)
        except jinja2.TemplateSyntaxError as exc:
            raise _template_error(exc, label, self._host, exc.lineno, secret) from None
        value, read_secret = self._render(template, label, secret)
        if read_secret:  # the whole value is secret, and so is the variable it is
            self.record_secrets(leaves(value))
            stack = self._local.__dict__.get("stack")
            if stack:
                self._tainted.add(stack[-1])
        return value

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
            raise _template_error(exc, f"{path}:", self._host, exc.lineno) from None
        text, lines = _short_lines(self._render(template, f"{path}:")[0])
        self.record_secrets(lines)
        return text

    def _render(
        self, template: jinja2.Template, label: str, secret: bool = False
    ) -> tuple[Any, bool]:
        """Render with this mapping as the context, so variables render only when used; the
        output, and whether it read a secret. ``label`` names the template in errors (a file as
        ``path:``)."""
        env = template.environment
        # The empty dict takes Jinja2's own writes; the others are only read.
        scope = ChainMap({}, self, env.globals)  # type: ignore[arg-type]
        context = template.new_context(scope, shared=True)  # type: ignore[arg-type]
        rendering = _Rendering(self)
        token = _rendering.set(rendering)
        try:
            return env.concat(template.root_render_func(context)), rendering.read_secret
        except FxkitError:
            raise  # a variable the template reads is wrong: its own error names it
        except Exception as exc:  # Jinja2's errors, and whatever a filter or operator raised
            line = _template_line(exc, template)
            raise _template_error(exc, label, self._host, line, secret) from None
        finally:
            _rendering.reset(token)

    def is_secret(self, name: str) -> bool:
        """True when the variable (or key) ``name`` is secret, by its name or (once rendered)
        because its value reads a secret."""
        return name in self._tainted or is_secret_name(name, self._secret_names)

    def _holds_secrets(self, name: str) -> bool:
        return self.is_secret(name) or bool(_nested_secrets(self._raw[name], self._secret_names))

    def record_secrets(self, values: Iterable[str]) -> None:
        """Values rendered from secrets: kept, and passed on to ``on_secret``."""
        new = {v for v in values if v} - self._rendered_secrets
        if new:
            self._rendered_secrets |= new
            if self._on_secret:
                self._on_secret(new)

    def secret_values(self) -> set[str]:
        """The values (raw and, where they render, rendered) of this host's secret variables
        and of secret keys inside its variables, and what templates rendered from them."""
        values: set[str] = set(self._rendered_secrets)
        extra = self._secret_names
        for name, raw in self._raw.items():
            secret = self.is_secret(name)
            found = set(leaves(raw)) if secret else _nested_secrets(raw, extra)
            values |= found
            if any(marker in value for value in found for marker in _JINJA_MARKERS):
                with contextlib.suppress(FxkitError):  # the error surfaces where it is used
                    rendered = self[name]
                    values.update(leaves(rendered) if secret else secret_leaves(rendered, extra))
        return {v for v in values if v}


#: id(value) -> (value, secret_vars, its secret leaves): found once per value object, as the
#: variables of plays and inventory groups are the same objects for every host.
_NESTED: dict[int, tuple[Any, frozenset[str], frozenset[str]]] = {}


def _nested_secrets(value: Any, extra: frozenset[str]) -> frozenset[str]:
    """The values under secret keys inside ``value``
    (:func:`fxkit.redaction.secret_leaves`)."""
    if not isinstance(value, Mapping | list | tuple):
        return frozenset()
    cached = _NESTED.get(id(value))
    if cached and cached[0] is value and cached[1] == extra:
        return cached[2]
    found = frozenset(secret_leaves(value, extra))
    if len(_NESTED) >= 4096:
        _NESTED.clear()
    _NESTED[id(value)] = (value, extra, found)
    return found


def _template_line(exc: BaseException, template: jinja2.Template) -> int | None:
    """The template line where rendering failed: the last frame of the template's compiled code,
    mapped to its line. (Not Jinja2's ``handle_exception``: the locals it collects for its
    traceback render every variable of the host.)"""
    filename = template.filename or "<template>"
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    return template.get_corresponding_lineno(lines[-1]) if lines and lines[-1] else None


def _template_error(
    exc: Exception, label: str, host: str, line: int | None, secret: bool = False
) -> TemplateError:
    """``label``: a variable or part of a check (``, line N`` follows), or a file's ``path:``."""
    if label.endswith(":"):
        where = f"{label}{line}" if line else label[:-1]
    else:
        where = f"{label}, line {line}" if line else label
    if secret:  # Jinja2's message quotes pieces of the value, too short to be masked
        return TemplateError(
            f"{type(exc).__name__} for host {host} in a secret value (not shown)",
            where=where,
            hint="a value holding '{{', '{%' or '{#' is a template: to keep such characters "
            'as they are, write the value as "{% raw %}...{% endraw %}"',
        )
    if isinstance(exc, jinja2.UndefinedError):
        match = re.search(r"'([^']+)' is undefined|has no attribute '([^']+)'", exc.message or "")
        name = next((g for g in match.groups() if g), "?") if match else "?"
        return TemplateError(
            f"undefined variable {name!r} for host {host} ({exc.message})",
            where=where,
            hint="define it (role defaults, inventory, play vars or -e) or use "
            "{{ name | default(...) }}",
        )
    if isinstance(exc, SecurityError):
        hint = (
            "templates render in a sandbox: they cannot reach Python's internals (names "
            "starting with _) or change a list or dict in place; build new values with filters"
        )
    elif isinstance(exc, jinja2.TemplateSyntaxError):
        hint = "fix the Jinja2 syntax"
    else:
        hint = "fix the expression, or the values it reads"
    message = exc.message if isinstance(exc, jinja2.TemplateError) else str(exc)
    return TemplateError(f"{type(exc).__name__} for host {host}: {message}", where=where, hint=hint)


def parse_extra_vars(items: Iterable[str], base: Path | None = None) -> Variables:
    """Merge ``-e`` values, later ones winning: ``k=v k2=v2``, a JSON/YAML mapping, ``@file``;
    each set at ``path:line`` of its file, or at ``-e #N on the command line``.

    Errors name the ``-e`` by its number and never quote its text: it may hold secrets.
    """
    merged = Variables()
    for number, item in enumerate(items, 1):
        text, where = item.strip(), f"-e #{number}"
        if text.startswith("@"):
            merged.merge(load_vars_file(Path(base or ".") / text[1:]))
            continue
        if text.startswith("{"):
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise FxkitError(
                    f"extra vars are not valid JSON/YAML: {_yaml_problem(exc)}",
                    where=where,
                    hint='write -e \'{"key": "value"}\'',
                ) from None
            values = require_mapping(value, where)
        else:
            values = _key_values(text, where)
        merged.merge(Variables(values, dict.fromkeys(values, f"{where} on the command line")))
    return merged


def _key_values(text: str, where: str) -> dict[str, str]:
    """``-e 'k=v k2="two words"'``; errors show keys at most, never values."""
    hint = "write -e key=value, -e '{\"key\": 1}' or -e @vars.yml"
    try:
        words = shlex.split(text)
    except ValueError as exc:  # "No closing quotation"
        raise FxkitError(f"cannot read extra vars: {exc}", where=where, hint=hint) from None
    pairs: dict[str, str] = {}
    for index, word in enumerate(words, 1):
        key, sep, value = word.partition("=")
        if not sep:
            raise FxkitError(
                f"cannot read extra var {index}: no '=' in it (not shown: it may be a secret)",
                where=where,
                hint=hint,
            )
        if not key.isidentifier():
            raise FxkitError(
                f"cannot read extra var {index}: {key!r} is not a variable name",
                where=where,
                hint=hint,
            )
        pairs[key] = value
    return pairs


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML found wrong, and where, without the text it quotes (the value may be a
    secret): quoted pieces longer than one character are left out, tokens like '<scalar>' kept."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return "unreadable"
    problem = re.sub(r"'(?!<)[^']{2,}'", "'...'", exc.problem or exc.context or "unreadable")
    mark = exc.problem_mark or exc.context_mark
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem
