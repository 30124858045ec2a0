"""Roles: finding them on the roles path, loading them, and the Host API their ``apply`` calls.

A role is a folder ``roles/<name>/``::

    role.py        class Vars(RoleVars): its variables, declared once (fxkit.engine.rolevars);
                   def apply(host, v): the desired state, as calls to host.<operation>(...)
    templates/     Jinja2 templates for host.template()
    README.md      what the role does and a table of its variables (generated from Vars)

(A role without ``Vars`` keeps its defaults in ``defaults.yml`` and gets an untyped ``HostVars``.)
``role.py`` reads like a checklist::

    from pydantic import Field

    from fxkit.api import AbsolutePath, Host, RoleVars

    class Vars(RoleVars):
        nvmet_config: AbsolutePath = Field("/etc/nvmet/config.json", description="...")

    def restart_nvmet(host: Host, v: Vars) -> None:
        host.service("nvmet.service", state="restarted")

    def apply(host: Host, v: Vars) -> None:
        host.packages(["nvmetcli"])
        if host.template("config.json.j2", v.nvmet_config, mode="0600"):
            host.notify(restart_nvmet)     # runs once, after the role, only if notified
        with host.task(tags=["slow"], ignore_errors=True) as slow:
            slow.command("nvme discover -t rdma -a 10.0.0.1", only_if="command -v nvme")

``host`` has one typed method per operation (``host.file``, ``host.sysctl``, ...; see
:mod:`fxkit.ops`), with exactly the operation's parameters, returning its
:class:`~fxkit.ops.base.Result` (truthy when it changed something). Task keywords (``name``,
``tags``, ``ignore_errors``, ``become``) never mix with an operation's parameters: they go to
:meth:`Host.task`, which returns a view of the host that applies them.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import hashlib
import inspect
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from fxkit import ops, paths
from fxkit.engine.rolevars import FleetVars, RoleVars
from fxkit.engine.serving import ServingRole, serving_role
from fxkit.engine.variables import HostVars
from fxkit.errors import ConnectionFailed, FxkitError, PlaybookError
from fxkit.ops.base import OpContext, Operation, Result, Status
from fxkit.ops.files import Mode, Owner
from fxkit.varfiles import load_vars_file, truthy

if TYPE_CHECKING:
    from fxkit.engine.record import Recorder
    from fxkit.facts.base import Fact

T = TypeVar("T")
P = ParamSpec("P")
#: ``handler(host, v)``: ``v`` is the role's typed ``Vars`` (or its HostVars, for a role that
#: declares none).
Handler = Callable[["Host", Any], None]


class HostFailed(Exception):
    """An operation failed on a host (or the role called host.fail): that host stops here."""

    def __init__(self, result: Result):
        super().__init__(result.msg)
        self.result = result


class HostUnreachable(Exception):
    """The host's connection broke during an operation: the host is unreachable from here on."""

    def __init__(self, operation: str, error: ConnectionFailed):
        super().__init__(str(error))
        self.operation = operation
        self.error = error


class Interrupted(Exception):
    """The run was interrupted (Ctrl-C): hosts stop before their next operation."""


class UnknownOperation(AttributeError):
    """A role called ``host.<name>`` for an operation that does not exist."""


@dataclass(frozen=True)
class TagFilter:
    """``--tags`` and ``--skip-tags``: ``always`` runs unless skipped by name, ``never`` only
    when asked for by one of its other tags."""

    only: frozenset[str] = frozenset()
    skip: frozenset[str] = frozenset()

    def selects(self, tags: Iterable[str]) -> bool:
        tags = frozenset(tags)
        if tags & self.skip:
            return False
        if "never" in tags and not (tags - {"never"}) & self.only:
            return False
        return not self.only or "all" in self.only or "always" in tags or bool(tags & self.only)


@dataclass
class Role:
    """A loaded role: its folder, its defaults and its ``apply`` function."""

    name: str
    path: Path
    defaults: dict[str, Any]
    apply: Handler
    #: ``validate(v)``: checks one host's variables before any host is touched (what the types
    #: of ``Vars`` cannot say).
    validate: Callable[[Any], None] | None = None
    #: ``validate_all({host: v}, fleet)``: checks across the play's hosts (an NQN used twice)
    #: and, through ``fleet`` (:class:`~fxkit.engine.rolevars.FleetVars`), other roles' values
    #: across the inventory; role.py's own may take ``hosts`` alone.
    validate_all: Callable[[dict[str, Any], FleetVars], None] | None = None
    #: The declaration of the role's variables (role.py's ``Vars``), if it has one.
    vars_model: type[RoleVars] | None = None
    #: role.py as a serving role, if it is one: the instances ``fxkit rollout`` rolls out.
    serving: ServingRole[RoleVars] | None = field(default=None, repr=False, compare=False)

    @property
    def templates(self) -> Path:
        return self.path / "templates"

    def typed(self, v: HostVars) -> Any:
        """What ``apply`` and the hooks receive: the role's typed ``Vars`` (a wrong value raises
        :class:`~fxkit.errors.VarError`), or ``v`` itself for a role that declares none."""
        return self.vars_model.of(v) if self.vars_model else v


def roles_path(playbook_folder: Path | None, extra: Sequence[str | Path] = ()) -> list[Path]:
    """Where roles are searched, first match wins: the playbook's ``roles/``, then ``extra``
    (``--roles-path`` / ``FXKIT_ROLES_PATH``), then the built-in roles."""
    folders = [playbook_folder / "roles"] if playbook_folder else []
    return [*folders, *(Path(p) for p in extra), paths.builtin("roles")]


@dataclass
class RoleLoader:
    """Finds and loads roles once per run."""

    search: list[Path]
    _loaded: dict[str, Role] = field(default_factory=dict)

    def load(self, name: str, where: str = "") -> Role:
        if name not in self._loaded:
            self._loaded[name] = self._load(name, where)
        return self._loaded[name]

    def _load(self, name: str, where: str) -> Role:
        for folder in self.search:
            path = folder / name
            if (path / "role.py").is_file():
                module = _module(path / "role.py")
                model = _vars_model(module, path)
                return Role(
                    name,
                    path,
                    model.defaults() if model else _defaults(path),
                    _apply_function(module, path / "role.py"),
                    _hook(module, "validate", path / "role.py"),
                    _across(_hook(module, "validate_all", path / "role.py")),
                    model,
                    serving_role(name, module, model, path / "role.py"),
                )
        known = sorted({p.parent.name for folder in self.search for p in folder.glob("*/role.py")})
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise PlaybookError(
            f"role {name!r} not found in {', '.join(map(str, self.search))}",
            where=where or None,
            hint=f"{hint}known roles: {', '.join(known) or 'none'}; a role is a folder "
            "<name>/ with role.py (add folders with --roles-path)",
        )


def _vars_model(module: ModuleType, path: Path) -> type[RoleVars] | None:
    """role.py's ``Vars``, the one declaration of the role's variables (then no defaults.yml)."""
    model = getattr(module, "Vars", None)
    if model is None:
        return None
    if not (isinstance(model, type) and issubclass(model, RoleVars)):
        raise PlaybookError(
            "role.py's Vars is not a RoleVars model",
            where=str(path / "role.py"),
            hint="declare class Vars(RoleVars): one field per variable (fxkit.engine.rolevars)",
        )
    if (path / "defaults.yml").exists():
        raise PlaybookError(
            "the role declares its variables twice: role.py's Vars and defaults.yml",
            where=str(path / "defaults.yml"),
            hint="give each default in Vars and delete defaults.yml",
        )
    return model


def _defaults(path: Path) -> dict[str, Any]:
    file = path / "defaults.yml"
    if not file.exists():
        return {}
    return load_vars_file(file, PlaybookError)


def _module(file: Path) -> ModuleType:
    """Run ``role.py`` and return it as a module; mistakes point at file:line.

    Compiled here rather than imported, so no ``__pycache__`` lands in the roles folders.
    """
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:8]
    module = ModuleType(f"fxkit_role_{file.parent.name}_{digest}")
    module.__file__ = str(file)
    sys.modules[module.__name__] = module  # dataclasses and pickling look modules up by name
    try:
        exec(compile(file.read_bytes(), str(file), "exec"), module.__dict__)
    except SyntaxError as exc:
        raise PlaybookError(
            f"syntax error in role: {exc.msg}",
            where=f"{exc.filename}:{exc.lineno}",
            hint="fix the Python syntax",
        ) from None
    except Exception as exc:
        raise PlaybookError(
            f"role failed to load: {type(exc).__name__}: {exc}",
            where=_location_in(exc, file),
            hint="role.py should only define its Vars, functions and constants at import time",
        ) from None
    return module


def _apply_function(module: ModuleType, file: Path) -> Handler:
    apply = getattr(module, "apply", None)
    if not callable(apply):
        raise PlaybookError(
            "role.py has no apply function",
            where=f"{file}:1",
            hint="define def apply(host, v): ... (host: the Host API, v: the variables)",
        )
    try:
        inspect.signature(apply).bind(None, None)
    except TypeError:
        line = apply.__code__.co_firstlineno if hasattr(apply, "__code__") else 1
        raise PlaybookError(
            "apply must take two arguments",
            where=f"{file}:{line}",
            hint="define def apply(host, v): ...",
        ) from None
    return apply


def _across(hook: Callable[..., None] | None) -> Callable[[Any, FleetVars], None] | None:
    """``validate_all`` as the runner calls it, ``(hosts, fleet)``, whether role.py's takes
    ``fleet`` or not."""
    if hook is None or _takes(hook, 2):
        return hook
    return lambda hosts, fleet: hook(hosts)


def _takes(hook: Callable[..., None], count: int) -> bool:
    try:
        inspect.signature(hook).bind(*[None] * count)
    except (TypeError, ValueError):
        return False
    return True


def _hook(module: ModuleType, name: str, file: Path) -> Callable[..., None] | None:
    """The role's optional ``validate(v)`` / ``validate_all(hosts)`` (or
    ``validate_all(hosts, fleet)``): one argument each, ``fleet`` besides."""
    hook = getattr(module, name, None)
    if hook is None:
        return None
    if not (_takes(hook, 1) or (name == "validate_all" and _takes(hook, 2))):
        line = getattr(getattr(hook, "__code__", None), "co_firstlineno", 1)
        which = "one argument" if name == "validate" else "one or two arguments"
        raise PlaybookError(
            f"{name} must be a function of {which}",
            where=f"{file}:{line}",
            hint="define def validate(v): ..."
            if name == "validate"
            else "define def validate_all(hosts): ... or def validate_all(hosts, fleet): ...",
        )
    return hook


def _location_in(exc: BaseException, file: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(file)]
    return f"{file}:{frames[-1].lineno}" if frames else str(file)


def _caller() -> str:
    """file:line of the role code that called the Host API."""
    frame = sys._getframe(1)
    while frame and frame.f_code.co_filename in (__file__, functools.__file__):
        frame = frame.f_back  # type: ignore[assignment]
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "role"


@functools.lru_cache(maxsize=1024)
def _cached_signature(op: Callable[..., Result]) -> inspect.Signature:
    return inspect.signature(op)


def _signature(op: Callable[..., Result]) -> inspect.Signature:
    """``op``'s signature, read once (inspect reads it anew at every call: a role makes many;
    bounded, as a role may pass a new callable each time); an unhashable callable (a method of
    an unhashable object) is read each time."""
    try:
        return _cached_signature(op)
    except TypeError:
        return inspect.signature(op)


def _check_arguments(
    name: str, op: Operation, ctx: OpContext, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """A wrong argument in a role is the role's mistake: say which, at the role's line."""
    signature = _signature(op)
    params = list(signature.parameters)[1:]  # after ctx
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    unknown = [k for k in kwargs if k not in params and not takes_any]
    try:
        if unknown:
            close = difflib.get_close_matches(unknown[0], params, n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"unexpected argument {unknown[0]!r}{guess}")
        signature.bind(ctx, *args, **kwargs)
    except TypeError as exc:
        raise PlaybookError(
            f"host.{name}(): {exc}",
            where=_caller(),
            hint=f"host.{name} takes {', '.join(params)}; task keywords (name, tags, "
            "ignore_errors, become) go to host.task(...)",
        ) from None


class operation(Generic[P]):
    """An operation ``op(ctx, ...)`` as a typed method of :class:`Host`: ``host.op(...)`` takes
    exactly the operation's parameters after ``ctx`` (type checkers and editors see them)."""

    def __init__(self, op: Callable[Concatenate[OpContext, P], Result]) -> None:
        self.op = op
        self.name = op.__name__
        self.__doc__ = op.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The method's signature: the operation's, without ``ctx``."""
        full = _signature(self.op)
        return full.replace(parameters=list(full.parameters.values())[1:])

    @overload
    def __get__(self, host: None, owner: type) -> operation[P]: ...

    @overload
    def __get__(self, host: Host, owner: type) -> Callable[P, Result]: ...

    def __get__(self, host: Host | None, owner: type) -> operation[P] | Callable[P, Result]:
        if host is None:
            return self
        op, name = self.op, self.name

        def bound(*args: P.args, **kwargs: P.kwargs) -> Result:
            return host._call(name, op, args, kwargs)

        functools.update_wrapper(bound, op)
        bound.__signature__ = self.signature  # type: ignore[attr-defined]
        return bound


@dataclass(frozen=True)
class Task:
    """Task keywords, as in Ansible: kept apart from every operation's own parameters."""

    #: Shown in the report instead of ``operation first-argument``.
    name: str | None = None
    tags: frozenset[str] = frozenset()
    #: A failure is reported and counted, and the host goes on.
    ignore_errors: bool = False
    #: Run as root through sudo (None: as the play says).
    become: bool | None = None


class Host:
    """What a role's ``apply(host, v)`` works with: operations, templates, facts, handlers."""

    # -- operations: one typed method each (a test checks them against fxkit.ops.OPERATIONS) --
    directory = operation(ops.directory)
    file = operation(ops.file)
    link = operation(ops.link)
    line = operation(ops.line)
    block = operation(ops.block)
    command = operation(ops.command)
    packages = operation(ops.packages)
    unit = operation(ops.unit)
    service = operation(ops.service)
    sysctl = operation(ops.sysctl)
    module = operation(ops.module)
    kernel_cmdline = operation(ops.kernel_cmdline)
    group_member = operation(ops.group_member)
    virtualenv = operation(ops.virtualenv)
    git = operation(ops.git)
    dropin = operation(ops.dropin)
    wait_for = operation(ops.wait_for)
    reboot = operation(ops.reboot)
    attribute = operation(ops.attribute)
    group = operation(ops.group)
    user = operation(ops.user)
    apt_repository = operation(ops.apt_repository)
    apt_pin = operation(ops.apt_pin)
    package_hold = operation(ops.package_hold)
    copy = operation(ops.copy)
    download = operation(ops.download)
    mount = operation(ops.mount)
    filesystem = operation(ops.filesystem)
    instance = operation(ops.instance)
    instance_ready = operation(ops.instance_ready)
    stage = operation(ops.stage)

    def __init__(
        self,
        ctx: OpContext,
        v: HostVars,
        *,
        role: Role,
        play: str,
        recorder: Recorder,
        tags: TagFilter = TagFilter(),
        role_tags: Iterable[str] = (),
        stop: threading.Event | None = None,
        typed: Any = None,
    ):
        """``typed``: the role's typed ``Vars`` of this host, which handlers receive (``v``
        itself when None)."""
        self.ctx = ctx
        self.vars = v
        self.typed = v if typed is None else typed
        self.role = role
        self.play = play
        self._recorder = recorder
        self._tags = tags
        self._role_tags = frozenset(role_tags)
        self._task = Task()
        self._handlers: list[Handler] = []
        self._stop = stop or threading.Event()

    @classmethod
    def operations(cls) -> dict[str, operation[Any]]:
        """Every operation method of this class (and its bases), by name."""
        found: dict[str, operation[Any]] = {}
        for klass in reversed(cls.__mro__):
            found.update({k: v for k, v in vars(klass).items() if isinstance(v, operation)})
        return found

    if not TYPE_CHECKING:  # a type checker reports a misspelt operation itself

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):  # a protocol probed (copy.copy asks for __setstate__)
                raise AttributeError(name)
            known = list(type(self).operations())
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean host.{close[0]}?)" if close else ""
            raise UnknownOperation(f"no operation {name!r}{hint}; operations: {', '.join(known)}")

    @property
    def name(self) -> str:
        return self.vars.host

    @property
    def check(self) -> bool:
        """True in check mode: operations report what they would change and change nothing."""
        return self.ctx.check

    @property
    def diff(self) -> bool:
        return self.ctx.diff

    # -- task keywords ------------------------------------------------------------------------

    def task(
        self,
        name: str | None = None,
        *,
        tags: Iterable[str] = (),
        ignore_errors: bool | None = None,
        become: bool | None = None,
    ) -> Host:
        """This host with task keywords for the calls made through it::

            host.task("NVMe tools", tags=["nvme"]).packages(["nvme-cli"])
            with host.task(ignore_errors=True) as lenient:
                lenient.command("nvme disconnect-all")

        Tags add to those already given; the other keywords replace theirs.
        """
        view = copy.copy(self)
        view._task = Task(
            name=name if name is not None else self._task.name,
            tags=self._task.tags | frozenset([tags] if isinstance(tags, str) else tags),
            ignore_errors=self._task.ignore_errors if ignore_errors is None else ignore_errors,
            become=self._task.become if become is None else become,
        )
        if become is not None:
            view.ctx = dataclasses.replace(self.ctx, become=become)
        return view

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    # -- running operations -------------------------------------------------------------------

    def call(
        self, op: Callable[Concatenate[OpContext, P], Result], *args: P.args, **kwargs: P.kwargs
    ) -> Result:
        """Run an operation function of your own, ``op(ctx, ...) -> Result``, as the built-in
        ones run (task keywords, tags, the report, failures)::

            host.call(my_operation, "/etc/thing", wanted=3)
        """
        return self._call(op.__name__, op, args, kwargs)

    def _call(
        self, name: str, op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Result:
        """Run an operation; record its result; stop the host if it failed."""
        if self._stop.is_set():
            raise Interrupted
        task = self._task
        label = task.name or (
            f"{name} {args[0]}" if args and isinstance(args[0], str | Path) else name
        )
        if not self._tags.selects(self._role_tags | task.tags):
            return Result(Status.SKIPPED, "not selected by --tags/--skip-tags", name=label)
        _check_arguments(name, op, self.ctx, args, kwargs)
        self._recorder.op_started(self.name, self.role.name, label)
        start = time.perf_counter()
        try:
            result = op(self.ctx, *args, **kwargs)
        except ConnectionFailed as exc:
            raise HostUnreachable(label, exc) from None
        except FxkitError as exc:  # arguments the operation cannot work with
            result = Result(Status.FAILED, str(exc))
        result.name = result.name or label
        self._recorder.op_done(
            self.name, self.play, self.role.name, result, time.perf_counter() - start
        )
        if result.failed and not task.ignore_errors:
            raise HostFailed(result)
        return result

    def template(
        self,
        src: str,
        dest: str,
        mode: Mode = None,
        owner: Owner = None,
        group: Owner = None,
        backup: bool = False,
        secret: bool = False,
    ) -> Result:
        """Render ``templates/src`` with this host's variables and write it to ``dest``, as
        :meth:`file` writes content::

            host.template("discovery.conf.j2", "/etc/nvme/discovery.conf", mode="0644")
        """
        content = self.vars.render_template(self.role.templates, src)
        view = self if self._task.name else self.task(f"template {dest}")
        return view.file(
            dest, content=content, mode=mode, owner=owner, group=group, backup=backup, secret=secret
        )

    def fact(self, fact: type[Fact[T]], *args: Any) -> T:
        """A fact about this host (see :mod:`fxkit.facts`), gathered with the play's ``become``
        and kept until an operation changes the host::

            gpus = host.fact(CommandJSON, "amd-smi list --json")
        """
        try:
            return self.ctx.fact(fact, *args)
        except ConnectionFailed as exc:
            label = " ".join(["fact", fact.__name__, *map(str, args)])
            raise HostUnreachable(label, exc) from None

    def notify(self, handler: Handler, when: object = True) -> None:
        """Run ``handler(host, v)`` once after this role, if ``when`` (e.g. a Result) is true."""
        if when and handler not in self._handlers:
            self._handlers.append(handler)

    @property
    def lab(self) -> bool:
        """Whether the inventory marks this host as a lab host (``fxkit_lab: true``, which
        ``fxkit lab up`` writes): missing hardware is then skipped, not a failure."""
        return truthy(self.vars.get("fxkit_lab", False))

    def needs(self, present: object, step: str, reason: str) -> bool:
        """Gate a step that needs hardware or kernel support the host may lack::

            gpus = host.fact(Gpus)
            if host.needs(gpus.count, "verify GPUs", gpus.missing or "no GPU found"):
                ...

        True when ``present``. Otherwise the step did not run, and says so: on a lab host it is
        reported skipped with the reason (and False returned), on any other host it fails the host.
        """
        if present:
            return True
        msg = f"{step}: {reason}"
        if not self.lab:
            self.fail(f"{msg} (this host is not marked as a lab host, so this is a failure)")
        if not self._tags.selects(self._role_tags | self._task.tags):
            return False
        result = Result(Status.SKIPPED, msg, name=self._task.name or step)
        self._recorder.op_done(self.name, self.play, self.role.name, result, 0.0)
        return False

    def fail(self, msg: str) -> None:
        """Stop this host with a failure (e.g. a precondition the role cannot fix)."""
        result = Result(Status.FAILED, msg, name="fail")
        self._recorder.op_done(self.name, self.play, self.role.name, result, 0.0)
        raise HostFailed(result)

    def run_handlers(self) -> None:
        """Run the notified handlers once each, in the order they were first notified."""
        for handler in self._handlers:
            self._recorder.op_started(self.name, self.role.name, f"handler {handler.__name__}")
            handler(self, self.typed)
        self._handlers.clear()
