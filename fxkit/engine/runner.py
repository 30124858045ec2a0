"""The runner: plays x hosts, in batches, with forks, a failure policy, handlers and check mode.

For each play, its hosts (the play's pattern, narrowed by ``--limit``) are split into ``serial``
batches. In a batch, hosts run at once in threads (at most ``forks``); each host runs the play's
roles in order without waiting for the others. A failed operation stops that host only: it takes
no further part in the run. When more than ``max_fail_percentage`` of a batch failed, or every
host of a batch failed, the run stops before the next batch. A host whose connection cannot be
opened, or breaks, is unreachable. Each host's connection is opened once per run and closed at
the end.

Ctrl-C stops every host before its next operation; a second Ctrl-C cuts off the operations still
running (their connections close). Either way the run ends once every host thread has reported,
and only then comes the recap.

Before its first change to a host the run takes the host's run lock
(:mod:`fxkit.engine.runlock`), and holds it to the end: two runs never change one host at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from fxkit import paths
from fxkit.connection import Connection, ConnectOptions, connect
from fxkit.engine.playbook import Play, Playbook, RoleRef
from fxkit.engine.record import Outcome, PlaybookResult, Recorder
from fxkit.engine.role import (
    Host,
    HostFailed,
    HostUnreachable,
    Interrupted,
    Role,
    RoleLoader,
    TagFilter,
    UnknownOperation,
    roles_path,
)
from fxkit.engine.rolevars import FleetVars, RoleVars, check_vars
from fxkit.engine.runlock import LOCK_WAIT, RunLock, RunLockError, holder
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import ConnectionFailed, FxkitError, PlaybookError, VarError, masked_errors
from fxkit.facts.base import FactCache
from fxkit.inventory import Inventory, InventoryHost, lab_only
from fxkit.ops.base import OpContext, failed
from fxkit.varfiles import truthy

Connector = Callable[[str, Mapping[str, Any], ConnectOptions], Connection]


@dataclass
class RunOptions:
    """How a playbook runs: what ``fxkit play``'s options say (``--check``, ``--limit``, ``-e``,
    ``--forks``...; ``extra_vars`` as :func:`~fxkit.engine.variables.parse_extra_vars` makes
    them)."""

    check: bool = False
    diff: bool = False
    tags: TagFilter = field(default_factory=TagFilter)
    limit: str | None = None
    extra_vars: dict[str, Any] = field(default_factory=dict)
    forks: int = 50
    roles_path: list[str] = field(default_factory=list)
    connect: ConnectOptions = field(default_factory=ConnectOptions)
    #: Seconds to wait for another run's lock of a host (0: fail on that host at once).
    lock_wait: float = LOCK_WAIT


def load_inventory(sources: str | Path | Sequence[str | Path]) -> Inventory:
    """The inventory of ``-i`` sources (paths or built-in names), merged in order."""
    sources = [sources] if isinstance(sources, str | Path) else sources
    return Inventory.load([paths.resolve(source, "inventories") for source in sources])


def run_playbook(
    playbook: str | Path,
    inventory: str | Path | Sequence[str | Path],
    options: RunOptions,
    recorder: Recorder,
) -> PlaybookResult:
    """Run ``playbook`` on the hosts of ``inventory`` (each a path or a built-in name; several
    inventories merge in order) as ``fxkit play`` does, then the recap. ``recorder`` records
    the run and tells its listeners (:func:`~fxkit.engine.console.console_recorder` prints as
    ``fxkit play``).

    Returns the run's results (``.exit_code``: 0, 1 when a host failed or was unreachable, 130
    when interrupted). Ctrl-C, even during the recap, never raises here: it interrupts the run.
    """
    book = Playbook.load(paths.resolve(playbook, "playbooks"))
    runner = Runner(book, load_inventory(inventory), options, recorder)
    with ctrl_c(runner.interrupt):
        with recorder:
            results = runner.run()
        recorder.recap()
    return results


@contextlib.contextmanager
def ctrl_c(interrupt: Callable[[], object]) -> Iterator[None]:
    """While inside, SIGINT calls ``interrupt`` instead of raising KeyboardInterrupt (which
    could land anywhere: in the middle of the recap, or while host threads still report)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals go to the main thread only; nothing to catch here
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupt())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def interruptible() -> contextlib.AbstractContextManager[None]:
    """While inside, Ctrl-C raises KeyboardInterrupt, also in a process that inherited SIGINT
    ignored (a job a shell started in the background): fxkit honours it, as ``play`` does."""
    return ctrl_c(_raise_interrupt)


def _raise_interrupt() -> NoReturn:
    raise KeyboardInterrupt


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """While inside, Ctrl-C waits: KeyboardInterrupt is raised once the block is done, so that
    what it does on a host (a restart: the old process stopped, the new one started and
    recorded) is never cut in half. Where Ctrl-C is ignored it stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    pressed: list[bool] = []
    with ctrl_c(lambda: pressed.append(True)):
        yield
    if pressed:
        raise KeyboardInterrupt


class Runner:
    """Runs one playbook against one inventory; :meth:`run` returns the results."""

    def __init__(
        self,
        playbook: Playbook,
        inventory: Inventory,
        options: RunOptions,
        recorder: Recorder,
        *,
        connector: Connector = connect,
        host_class: type[Host] = Host,
    ):
        self.playbook = playbook
        self.inventory = inventory
        self.options = options
        self.recorder = recorder
        self.connector = connector
        self.host_class = host_class
        self.roles = RoleLoader(roles_path(playbook.folder, options.roles_path))
        self._connections: dict[str, Connection] = {}
        self._facts: dict[str, FactCache] = {}
        self._locks: dict[str, RunLock] = {}
        #: How this run names itself in the hosts' lock files.
        self._owner = holder()
        #: Hosts that failed or were unreachable: they sit out the rest of the run.
        self._down: set[str] = set()
        self._interrupts = 0
        #: Set at the first Ctrl-C: hosts stop before their next operation.
        self._stop = threading.Event()
        #: Set at the second: the operations still running are cut off.
        self._abort = threading.Event()

    def run(self) -> PlaybookResult:
        """Every play; returns once every host thread has reported (see the module docstring)."""
        if self.options.connect.become_password:
            self.recorder.add_secrets([self.options.connect.become_password])
        self.validate()
        self.recorder.run_started(check=self.options.check)
        try:
            with ctrl_c(self.interrupt):
                for play in self.playbook.plays:
                    if not self._play(play):
                        break
        finally:
            self._release()
            self._close()
            self.recorder.run_done(interrupted=self._stop.is_set())
        return self.recorder.results

    def validate(self) -> None:
        """Every role's variable checks on every host of its play: mistakes show (all at once,
        as one error, the secrets masked as everything the run prints) before any host is
        touched."""
        fleet = _Fleet(self)
        with masked_errors(self.recorder.redact):
            for play in self.playbook.plays:
                hosts = self._hosts(play)
                for ref in play.roles:
                    role = self.roles.load(ref.role, ref.where)
                    self._validate(play, ref, role, hosts, fleet)

    def interrupt(self) -> None:
        """Ctrl-C (safe in a signal handler: it only counts; the waiting runner acts on it)."""
        self._interrupts += 1

    def _react(self) -> None:
        """Act on Ctrl-C: the first stops hosts before their next operation, the second closes
        the connections, cutting off the operations still running."""
        if self._interrupts and not self._stop.is_set():
            self._stop.set()
            self.recorder.note(
                "interrupted: hosts stop after their current operation (Ctrl-C again to cut "
                "them off)",
                style="bold red",
            )
        if self._interrupts > 1 and not self._abort.is_set():
            self._abort.set()
            self.recorder.note("cutting off the running operations", style="bold red")
            self._close()

    def _release(self) -> None:
        """Let go of the hosts' run locks, all at once: each is free when the run ends."""
        if not self._locks:
            return
        with ThreadPoolExecutor(min(self.options.forks, len(self._locks))) as pool:
            pool.map(_release, self._locks.values())

    def _close(self) -> None:
        for conn in list(self._connections.values()):
            with contextlib.suppress(Exception):  # closing a broken link must not hide results
                conn.close()

    def _hosts(self, play: Play) -> list[InventoryHost]:
        hosts = self._select(play.hosts, f"{play.where} (hosts of play {play.name!r})")
        if self.options.limit:
            allowed = {h.name for h in self._select(self.options.limit, "--limit")}
            hosts = [h for h in hosts if h.name in allowed]
        try:
            lab_only.check(hosts, f"{play.where} (hosts of play {play.name!r})")
        except FxkitError as exc:
            raise PlaybookError(exc.message, where=exc.where, hint=exc.hint) from None
        return [h for h in hosts if h.name not in self._down]

    def _select(self, pattern: str, where: str) -> list[InventoryHost]:
        try:
            return list(self.inventory.select(pattern))
        except FxkitError as exc:
            raise PlaybookError(exc.message, where=where, hint=exc.hint) from None

    def _validate(
        self, play: Play, ref: RoleRef, role: Role, hosts: list[InventoryHost], fleet: FleetVars
    ) -> None:
        """Check each host's values against the role's ``Vars``, then run its ``validate(v)``
        for each host and ``validate_all`` across them (and ``fleet``): every wrong variable of
        every host is named at once, before any host is touched."""
        if not (role.vars_model or role.validate or role.validate_all):
            return
        problems: list[FxkitError] = []
        everyone: dict[str, Any] = {}
        hosts_vars = self.role_vars(play, ref, role, hosts)
        for name, v in hosts_vars.items():
            if role.vars_model is None:
                everyone[name] = v
                continue
            typed, wrong = check_vars(role.vars_model, v)
            problems += wrong
            if typed is not None:
                everyone[name] = typed
        validate = role.validate
        for v in everyone.values():
            with _collect(problems):
                if validate:
                    validate(v)
        if role.validate_all and len(everyone) == len(hosts_vars):  # each host's typed
            with _collect(problems):
                role.validate_all(everyone, fleet)
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise VarError(
                f"role {role.name}: {len(problems)} wrong variables (nothing was changed):\n"
                + "\n".join("  - " + str(p).replace("\n", "\n    ") for p in problems),
                hint="fix them in the inventory, group_vars, the play's vars or -e",
            )

    def fleet_vars(self, name: str) -> dict[str, RoleVars]:
        """Role ``name``'s typed values on every host that runs it in the playbook (any play,
        ``--limit`` aside), then on the inventory's other hosts that set one of its variables
        (without play vars): what :class:`~fxkit.engine.rolevars.FleetVars` gives."""
        role = self.roles.load(name)
        if role.vars_model is None:
            raise PlaybookError(f"role {name} declares no Vars: no typed values to compare")
        model, found = role.vars_model, {}
        for play in self.playbook.plays:
            for ref in (r for r in play.roles if r.role == name):
                for inv in self._select(play.hosts, play.where):
                    if inv.name not in found:
                        found[inv.name] = model.of(self._vars(play, inv, role, ref))
        declared, bare = set(model.model_fields), Play.model_validate({"hosts": "all"})
        for inv in self.inventory.select("all"):
            if inv.name not in found and declared & set(inv.vars):
                found[inv.name] = model.of(self._vars(bare, inv, role))
        return found

    def role_vars(
        self, play: Play, ref: RoleRef, role: Role, hosts: list[InventoryHost] | None = None
    ) -> dict[str, HostVars]:
        """Each host's variables as ``role`` sees them in ``play`` (its hosts, within --limit)."""
        chosen = self._hosts(play) if hosts is None else hosts
        return {inv.name: self._vars(play, inv, role, ref) for inv in chosen}

    def _play(self, play: Play) -> bool:
        """Run one play batch by batch; False when the failure policy stops the run."""
        hosts = self._hosts(play)
        self.recorder.play_started(play.name, [h.name for h in hosts])
        if not hosts:
            within = f" within --limit {self.options.limit!r}" if self.options.limit else ""
            self.recorder.note(f"  no hosts match {play.hosts!r}{within}", style="dim")
            return True
        batches = play.batches(hosts)
        for number, batch in enumerate(batches, 1):
            self._react()
            if self._stop.is_set():
                return False
            workers = min(self.options.forks, len(batch))
            with ThreadPoolExecutor(workers, thread_name_prefix="fxkit-host") as pool:
                futures = [pool.submit(self._host, play, h) for h in batch]
                self._wait(futures)
                outcomes = [f.result() for f in futures]
            if self._stop.is_set():
                return False
            failed = len(batch) - outcomes.count(Outcome.OK)
            percent = 100.0 * failed / len(batch)
            limit = play.max_fail_percentage
            label = f"batch {number}/{len(batches)}" if len(batches) > 1 else "the play"
            if limit is not None and percent > limit:
                self.recorder.note(
                    f"STOPPED: {failed} of {len(batch)} hosts failed in {label} "
                    f"({percent:.0f}% > max_fail_percentage {limit:g}%)",
                    style="bold red",
                )
                return False
            if failed == len(batch) and number < len(batches):
                self.recorder.note(f"STOPPED: every host failed in {label}", style="bold red")
                return False
        return True

    def _wait(self, futures: list[Future[Outcome]]) -> None:
        """Until every host thread of the batch is done, acting on Ctrl-C meanwhile."""
        while wait(futures, timeout=0.2).not_done:
            self._react()

    def _host(self, play: Play, inv: InventoryHost) -> Outcome:
        """Run the play's roles on one host; how its part ended."""
        name = inv.name
        role: Role | None = None
        outcome = Outcome.FAILED
        try:
            if self._stop.is_set():  # Ctrl-C came before this host's turn
                raise Interrupted
            ctx = self._context(play, inv)
            for ref in play.roles:
                role_tags = {*play.tags, *ref.tags}
                tags = self.options.tags
                # Not selected by --tags, a role still runs: its operations may have the tags.
                if role_tags & tags.skip or ("never" in role_tags and not tags.only):
                    continue
                role = self.roles.load(ref.role)
                self._apply(play, ref, role, inv, ctx, role_tags)
            outcome = Outcome.OK
        except Exception as exc:
            outcome = self._stopped(play, name, role, exc)
        finally:
            self.recorder.host_done(name, outcome)
        if outcome is not Outcome.OK:
            self._down.add(name)
        return outcome

    def _stopped(self, play: Play, host: str, role: Role | None, exc: Exception) -> Outcome:
        """Why a host stopped: reported (unless it already was), and its outcome."""
        role_name = role.name if role else None
        if isinstance(exc, Interrupted) or self._abort.is_set():
            return Outcome.INTERRUPTED  # Ctrl-C, or what cutting off its connection raised
        if isinstance(exc, HostFailed):
            return Outcome.FAILED  # the failed operation is already reported
        if isinstance(exc, HostUnreachable):
            self.recorder.host_unreachable(host, play.name, str(exc), role_name, exc.operation)
            return Outcome.UNREACHABLE
        if isinstance(exc, ConnectionFailed):
            self.recorder.host_unreachable(host, play.name, str(exc))
            return Outcome.UNREACHABLE
        if isinstance(exc, FxkitError):
            self.recorder.host_error(host, play.name, role_name, str(exc))
        else:
            self._crashed(play, host, role, exc)
        return Outcome.FAILED

    def _crashed(self, play: Play, host: str, role: Role | None, exc: Exception) -> None:
        """An exception escaped a role: the role's own bug (file:line), or fxkit's (traceback)."""
        frames = traceback.extract_tb(exc.__traceback__)
        in_role = [f for f in frames if role and Path(f.filename).is_relative_to(role.path)]
        where = f"{in_role[-1].filename}:{in_role[-1].lineno}: " if in_role else ""
        message = f"{where}{type(exc).__name__}: {exc}"
        self.recorder.host_error(host, play.name, role.name if role else None, message)
        if not (in_role and in_role[-1] == frames[-1]) and not isinstance(exc, UnknownOperation):
            self.recorder.traceback(exc)

    def _context(self, play: Play, inv: InventoryHost) -> OpContext:
        """The host's operation context; opens its connection on first use in the run."""
        hostvars = self._vars(play, inv)
        if inv.name not in self._connections:
            self.recorder.op_started(inv.name, None, "connecting")
            conn = self.connector(inv.name, hostvars, self.options.connect)
            self._connections[inv.name] = conn
            conn.open()
            self._facts[inv.name] = FactCache(conn)
        become = play.become if play.become is not None else truthy(hostvars.get("ansible_become"))
        self._lock(play, inv.name, become)
        return OpContext(
            conn=self._connections[inv.name],
            facts=self._facts[inv.name],
            check=self.options.check,
            diff=self.options.diff,
            become=become,
        )

    def _lock(self, play: Play, name: str, become: bool) -> None:
        """Take the host's run lock (see :meth:`RunLock.take`); check mode takes none. A lock
        another run keeps fails the host, as a failed "run lock" step."""
        conn = self._connections[name]
        if self.options.check or not conn.run_lock:
            return
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = RunLock(conn, wait=self.options.lock_wait, owner=self._owner)
        self.recorder.op_started(name, None, "run lock")

        def note(msg: str) -> None:
            self.recorder.note(f"  {name}: {msg}", style="yellow")

        try:
            lock.take(become=become, note=note)
        except RunLockError as exc:
            result = failed(str(exc))
            result.name = "run lock"
            self.recorder.op_done(name, play.name, None, result, 0.0)
            raise HostFailed(result) from None

    def _apply(
        self,
        play: Play,
        ref: RoleRef,
        role: Role,
        inv: InventoryHost,
        ctx: OpContext,
        role_tags: set[str],
    ) -> None:
        v = self._vars(play, inv, role, ref)
        host = self.host_class(
            ctx,
            v,
            typed=role.typed(v),
            role=role,
            play=play.name,
            recorder=self.recorder,
            tags=self.options.tags,
            role_tags=role_tags,
            stop=self._stop,
        )
        self.recorder.op_started(inv.name, role.name, "starting")
        role.apply(host, host.typed)
        host.run_handlers()

    def _vars(
        self, play: Play, inv: InventoryHost, role: Role | None = None, ref: RoleRef | None = None
    ) -> HostVars:
        """The host's variables, by precedence (see :mod:`fxkit.engine.variables`); their secrets
        are the recorder's from here on."""
        layers = [
            Layer(f"role {role.name} defaults", role.defaults) if role else None,
            Layer("inventory", inv.vars, origins=inv.origins),
            Layer("play vars", play.vars, origins=play.vars_origins),
            Layer("play vars_files", play.file_vars),
            Layer(f"role {ref.role} parameters", ref.params) if ref else None,
            Layer("extra vars", self.options.extra_vars),
            Layer("fxkit", _magic(inv, role)),
        ]
        v = HostVars(
            inv.name,
            [lay for lay in layers if lay],
            play.secret_vars,
            on_secret=self.recorder.add_secrets,
        )
        self.recorder.add_secrets(v.secret_values())
        return v


@dataclass
class _Fleet:
    """:class:`~fxkit.engine.rolevars.FleetVars` of a run: each role's values read once."""

    runner: Runner
    _read: dict[str, dict[str, RoleVars]] = field(default_factory=dict)

    def of(self, role: str) -> dict[str, RoleVars]:
        if role not in self._read:
            self._read[role] = self.runner.fleet_vars(role)
        return self._read[role]


@contextlib.contextmanager
def _collect(problems: list[FxkitError]) -> Iterator[None]:
    try:
        yield
    except FxkitError as exc:
        problems.append(exc)


def _release(lock: RunLock) -> None:
    with contextlib.suppress(Exception):  # a broken link lets go of it anyway
        lock.release()


def _magic(inv: InventoryHost, role: Role | None) -> dict[str, Any]:
    magic: dict[str, Any] = {
        "inventory_hostname": inv.name,
        "group_names": sorted(g for g in inv.groups if g != "all"),  # as Ansible: ungrouped too
    }
    if role:
        magic["role_name"] = role.name
    return magic
