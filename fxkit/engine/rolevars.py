"""A role's variables, declared once: a pydantic model named ``Vars`` in its role.py::

    class Vars(RoleVars):
        node_gpu_count: Whole = Field(8, ge=1, description="written to node.yaml")
        node_base_etc_dir: str = Field("{{ node_base_root }}/etc/fxkit", description="...")

    def apply(host: Host, v: Vars) -> None:
        host.directory(v.node_base_etc_dir)          # a str, to mypy and to the role

Everything else comes from that declaration:

- the role's defaults, the lowest precedence level (:meth:`RoleVars.defaults`); a string may be
  a Jinja2 template, rendered like any variable;
- the checks of every host's values before any host is touched (:func:`check_vars`): each wrong
  variable with its host, where its value was set (file:line) and a hint (the field's
  ``examples``, or its description);
- the typed object ``apply(host, v)``, handlers, ``validate(v)`` and ``validate_all(hosts)``
  receive (:meth:`RoleVars.of`); ``validate_all(hosts, fleet)`` also reads other roles' values
  across the inventory (:class:`FleetVars`);
- the table of the role's README (:func:`readme_table`), which a test keeps in step.

Values are converted as Ansible users expect: digits from an INI inventory or ``-e`` make a
number, ``yes``/``no``/``true``/``false`` a boolean; a ``bool`` is never a number
(:data:`Whole`).
"""

from __future__ import annotations

import ipaddress
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Generic, Protocol, Self, TypeVar, get_args, get_origin

import yaml
from annotated_types import BaseMetadata, Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PrivateAttr
from pydantic import ValidationError as PydanticError
from pydantic.fields import FieldInfo

from fxkit.engine.variables import HostVars
from fxkit.errors import FxkitError, VarError
from fxkit.facts.nvme import nqn_problem
from fxkit.redaction import Masker
from fxkit.yamlfile import short

#: The kernel's dev_valid_name(): 1-15 bytes (IFNAMSIZ 16), no '/', ':' or white space.
_IFNAME = re.compile(r"[^\s/:]{1,15}")


class FleetVars(Protocol):
    """What ``validate_all(hosts, fleet)`` reads beyond the play's hosts: ``fleet.of(role)``,
    that role's typed values on every host of the inventory that runs it in the playbook (any
    play; ``--limit`` does not narrow it) or whose inventory sets one of its variables."""

    def of(self, role: str) -> Mapping[str, RoleVars]: ...


class RoleVars(BaseModel):
    """The base of a role's ``Vars``: one field per variable, with its default, type,
    constraints and ``description`` (the README's "meaning"); ``examples`` make the hint of a
    wrong value. Instances are frozen: a role reads its variables, never sets them."""

    model_config = ConfigDict(frozen=True, extra="ignore", protected_namespaces=())

    #: Every variable of the host (magic ones, other roles'), for what no field declares.
    _all: HostVars = PrivateAttr()

    @property
    def host(self) -> str:
        """The inventory name of the host these values are for."""
        return self._all.host

    @property
    def all(self) -> HostVars:
        """Every variable of the host, untyped: ``v.all.get("ansible_host")``."""
        return self._all

    def wrong(self, var: str, msg: str, hint: str | None = None) -> VarError:
        """The error for ``var`` (a name, or a path into one: ``ports[0].addr``), placed where
        its value was set: for ``validate(v)``'s checks of what a type cannot say."""
        return VarError(msg, where=f"{self.host}: {var} ({self._all.where(var)})", hint=hint)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each variable's default as plain data (models dumped), for the defaults level."""
        return {
            name: _plain(field.get_default(call_default_factory=True))
            for name, field in cls.model_fields.items()
            if not field.is_required()
        }

    @classmethod
    def of(cls, v: HostVars) -> Self:
        """The host's values, typed; the first wrong one raised as :class:`VarError`."""
        typed, problems = check_vars(cls, v)
        if typed is None:
            raise problems[0]
        return typed


V = TypeVar("V", bound=RoleVars)


class RoleKeys(BaseModel):
    """The base of a mapping inside a variable (a port, a subsystem): frozen, and a key it does
    not declare is an error (a misspelt ``adress`` is never ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


T = TypeVar("T")


def check_vars(cls: type[V], v: HostVars) -> tuple[V | None, list[FxkitError]]:
    """Every declared variable of one host, rendered and checked: the typed values, or every
    problem (a template that does not render, a wrong type or value)."""
    values: dict[str, Any] = {}
    problems: list[FxkitError] = []
    for name in cls.model_fields:
        if name not in v:
            continue
        try:
            values[name] = v[name]
        except FxkitError as exc:
            problems.append(exc)
    try:
        typed = cls.model_validate(values)
    except PydanticError as exc:
        masker = Masker(v.secret_values())  # a value is quoted cut short: mask it whole first
        problems.extend(_var_error(cls, v, error, masker) for error in _one_per_value(exc))
    if problems:
        return None, problems
    typed._all = v
    return typed, []


def _one_per_value(exc: PydanticError) -> list[dict[str, Any]]:
    """Pydantic's errors, one per wrong value: a value that fits none of a union's types gets
    one error per type, each under that type's label (``str``, ``function-before[...]``); they
    become one, at the value's own place, saying what each type wanted."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for error in exc.errors():
        loc = tuple(error["loc"])
        if len(loc) > 1 and _type_label(loc[-1]):
            key: tuple[Any, ...] = (loc[:-1], id(error.get("input")))
            if key in merged:
                merged[key]["msg"] += f", or {error['msg'].removeprefix('Input should be ')}"
                continue
            merged[key] = {**error, "loc": loc[:-1]}
        else:
            merged[(loc, id(error))] = dict(error)
    return list(merged.values())


def _type_label(part: Any) -> bool:
    """Whether a part of an error's place is the label of a union's member, not a key."""
    if not isinstance(part, str) or part == "[key]":  # [key]: a mapping's key was wrong
        return False
    return part in {"str", "int", "float", "bool", "none"} or "[" in part


def _var_error(
    cls: type[RoleVars], v: HostVars, error: Mapping[str, Any], masker: Masker
) -> VarError:
    name, *path = error["loc"] or ("?",)
    field = _field_at(cls.model_fields.get(str(name)), path)
    at = str(name) + "".join(
        f"[{p}]" if isinstance(p, int) else p if str(p).startswith("[") else f".{p}" for p in path
    )
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        text = f"{at} is not set"
    else:
        text = f"{at} is {short(masker.data(error.get('input')))}: {message}"
    where = f"{v.host}: {at} ({v.where(str(name))})" if name in v else f"{v.host}: {at}"
    return VarError(text, where=where, hint=_hint(field))


def _field_at(field: FieldInfo | None, path: list[Any]) -> FieldInfo | None:
    """The innermost declared key on ``path`` (``[0, "address"]`` of a list of models), whose
    examples or description make the hint of a wrong nested value."""
    for part in path:
        model = _model_in(field.annotation) if field else None
        if isinstance(part, str) and model is not None and part in model.model_fields:
            field = model.model_fields[part]
    return field


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field's type holds: ``Port``, ``list[Port]``, ``Port | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, (_model_in(a) for a in get_args(annotation))), None)


def _hint(field: FieldInfo | None) -> str | None:
    if field is None:
        return None
    if field.examples:
        return "e.g. " + ", ".join(_yaml(e) for e in field.examples)
    return field.description


def _plain(value: Any) -> Any:
    """Models as mappings, tuples and sets as lists: data as a YAML file would hold it."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(x) for x in value]
    if isinstance(value, dict):
        return {k: _plain(x) for k, x in value.items()}
    return value


# -- types the roles share --------------------------------------------------------------------


def _not_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


class Rule(Generic[T]):
    """A check of a value (a string, a list), named for messages and the README (``what`` it
    must be): ``test`` returns the problem, "" when there is none."""

    def __init__(self, what: str, test: Callable[[T], str]) -> None:
        self.what = what
        self.test = test

    def __call__(self, value: T) -> T:
        problem = self.test(value)
        if problem:
            raise ValueError(problem)
        return value


def pattern(regex: str, what: str) -> AfterValidator:
    """A string that matches ``regex`` as a whole (``what`` it is, for messages)."""
    compiled = re.compile(regex)
    return AfterValidator(Rule(what, lambda s: "" if compiled.fullmatch(s) else f"not {what}"))


def _ip_address(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return "not an IP address"
    return ""


#: A size as ``truncate -s`` and nvme-cli write it: bytes, or a number with K, M, G or T.
SIZE = re.compile(r"([1-9][0-9]*)([KMGT]?)")


def _size_text(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _size(text: str) -> str:
    return "" if SIZE.fullmatch(text) else "not a size (bytes, or a number with K, M, G or T)"


def _interface(name: str) -> str:
    if _IFNAME.fullmatch(name) and name not in (".", ".."):
        return ""
    return "not a Linux interface name (1-15 characters, no '/', ':' or space)"


def _scalar_text(value: object) -> object:
    return str(value) if isinstance(value, int | float) else value


#: Text; a number or boolean that YAML or an INI inventory read (``version: 7.2``) is taken as
#: its text (``"7.2"``), as Ansible's templates would write it.
Text = Annotated[str, BeforeValidator(_scalar_text)]
#: A whole number; digits in a string count (INI inventories, -e), a boolean does not.
Whole = Annotated[int, BeforeValidator(_not_bool)]
#: A number (whole or not); never a boolean.
Number = Annotated[float, BeforeValidator(_not_bool)]
#: A name Linux accepts for a network interface.
InterfaceName = Annotated[str, AfterValidator(Rule("interface name", _interface))]
#: An NVMe Qualified Name in one of the base specification's two forms.
Nqn = Annotated[str, AfterValidator(Rule("NQN", nqn_problem))]
#: An IP address (v4 or v6), kept as written.
IpAddress = Annotated[str, AfterValidator(Rule("IP address", _ip_address))]
#: A size as :data:`SIZE` says, kept as text (``100G``); a whole number counts as bytes.
Size = Annotated[
    str,
    BeforeValidator(_size_text),
    AfterValidator(Rule("size (bytes, or a number with K, M, G or T)", _size)),
]
#: An absolute path.
AbsolutePath = Annotated[
    str,
    AfterValidator(Rule("absolute path", lambda s: "" if s.startswith("/") else "not absolute")),
]


# -- the README table -------------------------------------------------------------------------

BEGIN = "<!-- variables: generated from role.py's Vars by `make docs`; do not edit -->"
END = "<!-- end of variables -->"


def readme_table(cls: type[RoleVars]) -> str:
    """The README's table of variables, and one of keys per nested model."""
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    nested: list[type[BaseModel]] = []
    for name, field in cls.model_fields.items():
        lines.append(_row(name, field, nested))
    done: list[type[BaseModel]] = []
    for model in nested:  # grows while it is read: the models of a model's keys come after it
        if model in done:
            continue
        done.append(model)
        lines += ["", f"Keys of each `{model.__name__}`:", ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        lines += [_row(name, field, nested) for name, field in model.model_fields.items()]
    return "\n".join(lines) + "\n"


def _row(name: str, field: FieldInfo, nested: list[type[BaseModel]]) -> str:
    if field.is_required():
        default = "(required)"
    else:
        default = f"`{_yaml(_plain(field.get_default(call_default_factory=True)))}`"
    kind = type_text(field.annotation, field.metadata, nested)
    meaning = (field.description or "").replace("|", "\\|").replace("\n", " ")
    return f"| `{name}` | {kind} | {default} | {meaning} |"


def _yaml(value: Any) -> str:
    if value == "":
        return '""'
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16, sort_keys=False)
    return text.strip().removesuffix("...").strip().replace("|", "\\|")


def type_text(
    annotation: Any, metadata: Iterable[Any] = (), nested: list[Any] | None = None
) -> str:
    """A type as the README says it: ``list of str``, ``int ≥ 1``, ``one of a, b``."""
    nested = [] if nested is None else nested
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_text(args[0], [*args[1:], *metadata], nested)
    flat = [x for m in metadata for x in (m.metadata if isinstance(m, FieldInfo) else [m])]
    bounds = ", ".join(filter(None, (_bound(m) for m in flat if isinstance(m, BaseMetadata))))
    bounds = f" ({bounds})" if bounds else ""
    rules = [
        m.func.what for m in flat if isinstance(m, AfterValidator) and isinstance(m.func, Rule)
    ]
    if rules:
        return " and ".join(rules) + bounds
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{_yaml(a)}`" for a in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_text(a, (), nested) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {type_text(args[0], (), nested)}" + bounds
    if origin is dict:
        return f"mapping {type_text(args[0], (), nested)}: {type_text(args[1], (), nested)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        nested.append(annotation)
        return annotation.__name__
    if annotation is type(None):
        return "null"
    name = getattr(annotation, "__name__", str(annotation))
    return {"int": "int", "float": "number", "str": "str", "bool": "bool"}.get(name, name) + bounds


def _bound(m: Any) -> str:
    for kind, sign, attribute in (
        (Ge, "≥", "ge"),
        (Gt, ">", "gt"),
        (Le, "≤", "le"),
        (Lt, "<", "lt"),
    ):
        if isinstance(m, kind):
            return f"{sign} {getattr(m, attribute)}"
    if isinstance(m, MinLen) and m.min_length:
        return "not empty" if m.min_length == 1 else f"at least {m.min_length} long"
    if isinstance(m, MaxLen):
        return f"at most {m.max_length} long"
    return ""
