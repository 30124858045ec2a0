"""Long-running service instances (a vLLM server, the probe): started, restarted only when their
configuration changed, and awaited until they serve.

An instance is a unit name (``vllm@tp4-0.service``), the command it runs and its environment.
Where systemd runs the host the unit does the running (its unit file and environment file are
the role's to write); elsewhere (a lab host, a container: no init) the command is started
directly, in a session of its own, with exactly that environment, its output in a log file.
Either way the operation records, on the host, a digest of the command and environment and when
it started (``STATE_DIR/<unit>.json``): a run restarts the instance only when that digest
differs or it is not running, and :func:`instance_ready` measures the time to ready from it.

Every result names its instance (:class:`InstanceReport`: its ``unit``, in ``Result.data``);
once the instance runs :func:`instance` reports :class:`InstanceStarted`, once it serves
:func:`instance_ready` reports :class:`InstanceReady`. ``fxkit rollout`` reads them back from
the run's results with :meth:`InstanceReport.read`.

The environment holds secrets (``HF_TOKEN``), and every user's ``ps`` shows every process's
command line: no value of it, nor its digest, is ever in one. They go on the command's stdin;
a direct instance reads its environment from ``STATE_DIR/<unit>.env`` (root's alone, 0600,
written whole; removed when it stops), the record is 0600 too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from shlex import quote
from typing import Any, Literal, ParamSpec, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from fxkit.connection.base import RunResult
from fxkit.facts.tools import Executables
from fxkit.ops.base import OpContext, OpError, Result, check_state, failed, ok, skipped
from fxkit.ops.systemd import check_unit_name, systemd_missing
from fxkit.ops.wait import HTTP_TOOLS, PROBE_TIMEOUT, check_url, http_condition

P = ParamSpec("P")
STATE_DIR = "/var/lib/fxkit/instances"
LOG_DIR = "/var/log/fxkit"
#: The PATH a directly started instance gets (systemd's default for system services).
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Seconds a stopping instance gets after SIGTERM before SIGKILL (systemd's TimeoutStopSec).
STOP_TIMEOUT = 90
#: Lines of the instance's log shown when it fails.
TAIL = 20
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: What a POSIX shell adds to its environment on its own (dash: PWD; bash: SHLVL and _ too).
_SHELL_ADDS = ("PWD", "SHLVL", "_")
#: Reads an environment file ($0), then runs the command ("$@") with just that.
_RUN_WITH = '. "$0" && exec env {unset} -- "$@"'
#: How long the weights took to load, as the servers log it: fxkit's probe, then vLLM
#: (vllm/v1/worker/gpu_model_runner.py and gpu/model_runner.py: "Model loading took %s GiB
#: memory and %.6f seconds"; model_loader/default_loader.py: "Loading weights took %.2f seconds").
LOAD_LINES = (
    re.compile(r"fxkit serve-probe: loaded .* in ([0-9.]+) s"),
    re.compile(r"Model loading took \S+ GiB(?: memory)? and ([0-9.]+) seconds"),
    re.compile(r"Loading weights took ([0-9.]+) seconds"),
)
_METRIC = re.compile(r"^fxkit_load_seconds(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


class InstanceReport(BaseModel):
    """What every result of an instance operation says of its instance: the keys it adds to
    ``Result.data`` (and so to the task's ``data`` in the run's results and its JSON log)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    #: The instance: ``vllm@tp4-0.service``.
    unit: str

    def data(self) -> dict[str, Any]:
        """The report as ``Result.data`` holds it: the fields given."""
        return self.model_dump(exclude_unset=True)

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> Self | None:
        """The report of this kind in a result's ``data``; None when it holds none."""
        try:
            return cls.model_validate(data)
        except ValidationError:
            return None


Backend = Literal["systemd", "direct"]
#: Where an instance's load time was read: its /metrics, its log, or nowhere.
LoadSource = Literal["metrics", "log", "unknown"]


class InstanceStarted(InstanceReport):
    """:func:`instance`'s report when it left the instance running or (re)started it (in check
    mode: would)."""

    backend: Backend
    #: This run (re)started it.
    restarted: bool
    #: When its (re)start began, on the host's clock (seconds since the epoch): a restart's
    #: stop of the old process is part of it, on both backends. Unknown in check mode.
    started_at: float | None = None
    #: A direct instance's session leader (0 under systemd); unknown in check mode.
    pid: int | None = None


class InstanceReady(InstanceReport):
    """:func:`instance_ready`'s report when the instance serves."""

    backend: Backend
    #: Seconds from its last (re)start until it served (the host's clock), the old process's
    #: stop included.
    time_to_ready_s: float
    #: The weights' load time as the instance tells it (None: it does not), and where from.
    load_s: float | None
    load_source: LoadSource


@dataclass(frozen=True)
class Record:
    """What the host keeps of an instance's last start."""

    digest: str
    backend: Backend
    started_at: float  # the host's clock, seconds since the epoch
    pid: int = 0  # direct: the session leader
    ticks: str = ""  # direct: its start time in /proc/PID/stat (guards against a reused PID)

    @classmethod
    def parse(cls, raw: bytes | None) -> Record | None:
        try:
            data = json.loads(raw or b"")
            return cls(**data)
        except (ValueError, TypeError):
            return None


def _names_unit(op: Callable[P, Result]) -> Callable[P, Result]:
    """Every result of ``op`` names its instance (:class:`InstanceReport`): the rollout's report
    reads the instances' results by it."""

    @functools.wraps(op)
    def named(*args: P.args, **kwargs: P.kwargs) -> Result:
        result = op(*args, **kwargs)
        unit = kwargs["unit"] if "unit" in kwargs else args[1]
        result.data.update(InstanceReport(unit=str(unit)).data())
        return result

    return named


def digest(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The configuration an instance runs with, as one sha256."""
    blob = json.dumps({"argv": list(argv), "env": dict(env)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _check(unit: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
    match = check_unit_name(unit)
    if match.group(3) != "service" or match.group(2) == "":
        raise OpError(
            f"{unit!r} is not a service or a service instance", hint="e.g. vllm@tp4-0.service"
        )
    if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise OpError(f"{unit}: bad command {argv!r}", hint="a list of strings, the program first")
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name) or "\0" in str(value) or "\n" in str(value):
            raise OpError(
                f"{unit}: bad environment variable {name!r} (not shown: it may be a secret)",
                hint="names are letters, digits and _; values hold no newline or NUL",
            )


def _paths(unit: str, state_dir: str, log_dir: str) -> tuple[str, str]:
    return f"{state_dir}/{unit}.json", f"{log_dir}/{unit}.log"


def _private(path: str, write: str) -> str:
    """``write``'s output into ``path``, 0600 and whole (a temporary file, renamed)."""
    q = quote(path)
    return f"rm -f -- {q}.tmp && (umask 077 && {write} > {q}.tmp) && mv -f -- {q}.tmp {q}"


def _alive_command(unit: str, record: Record | None) -> str:
    """Prints ``alive`` or ``dead`` for the instance as last started."""
    if record is None:
        return "echo dead"
    if record.backend == "systemd":
        return (
            f"case $(systemctl is-active -- {quote(unit)} | head -n1) in "
            "active|activating|reloading) echo alive;; *) echo dead;; esac"
        )
    stat = f"/proc/{record.pid}/stat"
    # Fields after the command's ')' start with the state (3rd field); the start time is 22nd.
    return (
        f"s=$(sed 's/.*) //' {stat} 2>/dev/null); set -- $s; "
        f'if [ "${{1:-Z}}" != Z ] && [ "${{20:-}}" = {quote(record.ticks)} ]; '
        "then echo alive; else echo dead; fi"
    )


@_names_unit
def instance(
    ctx: OpContext,
    unit: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    state: str = "started",
    state_dir: str = STATE_DIR,
    log_dir: str = LOG_DIR,
) -> Result:
    """Ensure the instance ``unit`` runs ``argv`` with exactly ``env``: ``started`` starts it, or
    restarts it when the command or environment differ from its last start; ``restarted``
    always restarts; ``stopped`` stops it. Under systemd it starts/restarts and enables the unit
    (whose files must say the same as ``argv`` and ``env``), and ``stopped`` disables it too;
    without systemd it runs the command
    itself (see the module's docstring). ``data``: :class:`InstanceStarted` (unit, backend,
    restarted, started_at, pid).

    Example::

        host.instance("vllm@tp4-0.service", ["/opt/venv/bin/vllm", "serve", model], env)
    """
    check_state(state, ("started", "restarted", "stopped"))
    _check(unit, argv, env)
    record_path, log = _paths(unit, state_dir, log_dir)
    env_path = f"{state_dir}/{unit}.env"
    backend: Backend = "direct" if systemd_missing(ctx) else "systemd"
    record = Record.parse(ctx.get(record_path))
    alive = ctx.read(_alive_command(unit, record)).stdout.strip() == "alive"
    wanted = digest(argv, env)
    how = "under systemd" if backend == "systemd" else "directly (no systemd on this host)"
    if state == "stopped":
        # Under systemd also disabled (started enables it, so it would come back at boot),
        # a unit that failed as well: it is still enabled.
        systemd = record is not None and record.backend == "systemd"
        if not alive and not systemd:
            return ok(f"{unit} is stopped")
        stop = (
            f"systemctl disable -q --now -- {quote(unit)}; systemctl reset-failed -- {quote(unit)}"
            if systemd
            else _stop(unit, record)
        )
        return ctx.change(
            f"{stop} 2>/dev/null; rm -f -- {quote(record_path)} {quote(env_path)}",
            would=f"stop {unit}" if alive else f"disable {unit} (it is not running)",
            done=f"stopped {unit}" if alive else f"disabled {unit} (it was not running)",
            diff=f"{unit}: {'running' if alive else 'stopped, enabled'} -> stopped\n",
        )
    same = record is not None and record.digest == wanted and record.backend == backend
    if alive and same and state == "started":
        assert record is not None
        running = InstanceStarted(
            unit=unit,
            backend=backend,
            restarted=False,
            started_at=record.started_at,
            pid=record.pid,
        )
        return ok(f"{unit} runs as configured {how}", **running.data())
    why = "restart" if state == "restarted" else "configuration changed" if alive else "stopped"
    old = "running" if alive else "stopped"
    start = (
        _start_systemd(unit) if backend == "systemd" else _start_direct(argv, env, env_path, log)
    )
    record_json = (
        f'printf \'{{"digest": "%s", "backend": "%s", "started_at": %s, "pid": %s, '
        f'"ticks": "%s"}}\\n\' "$d" {backend} "$t" "${{p:-0}}" "${{k:-}}"'
    )
    command = (
        "IFS= read -r d; "  # the digest, first on stdin (the environment file follows)
        # The (re)start begins before the old process stops, as ``systemctl restart`` stops
        # the unit after ``t``: the time to ready is the same on both backends.
        f"t=$(date +%s.%N); {_stop(unit, record) if alive and backend == 'direct' else 'true'}; "
        f"mkdir -p -- {quote(state_dir)} {quote(log_dir)} && {start} && "
        f'{_private(record_path, record_json)} && echo "$t ${{p:-0}}"'
    )
    verb = "restart" if alive else "start"
    result = ctx.change(
        command,
        would=f"{verb} {unit} {how} ({why})",
        done=f"{verb}ed {unit} {how} ({why})",
        diff=f"{unit}: {old} -> started ({why})\n",
        stdin=f"{wanted}\n{_env_file(env) if backend == 'direct' else ''}".encode(),
    )
    started: dict[str, Any] = {}
    if result.changed and "stdout" in result.data:
        stamp, _, pid = result.data["stdout"].strip().rpartition("\n")[2].partition(" ")
        started = {"started_at": float(stamp), "pid": int(pid or 0)}
    report = InstanceStarted(unit=unit, backend=backend, restarted=True, **started)
    result.data.update(report.data())
    return result


def _start_systemd(unit: str) -> str:
    q = quote(unit)
    return f"systemctl enable -q -- {q} && systemctl restart -- {q}"


def _env_file(env: Mapping[str, str]) -> str:
    """``env`` (and systemd's PATH, unless it has one) as a shell script of exports."""
    return "".join(f"export {k}={quote(str(v))}\n" for k, v in {"PATH": PATH, **env}.items())


def _start_direct(argv: Sequence[str], env: Mapping[str, str], env_path: str, log: str) -> str:
    """Start ``argv`` in a session of its own with only ``env`` (and systemd's PATH), output to
    ``log`` (the previous one kept as ``.1``); sets ``p`` (its PID) and ``k`` (its start time).
    The environment comes on stdin (see :func:`_env_file`), kept in ``env_path``."""
    unset = " ".join(f"-u {name}" for name in _SHELL_ADDS if name not in env)
    run_with = quote(_RUN_WITH.format(unset=unset))
    q = quote(log)
    return (
        f"{_private(env_path, 'cat')} && "
        f"{{ [ ! -e {q} ] || mv -f -- {q} {q}.1; }} && cd / && "
        f"{{ setsid env -i /bin/sh -c {run_with} {quote(env_path)} "
        f"{' '.join(map(quote, argv))} </dev/null >{q} 2>&1 & }} && "
        "p=$! && k=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f20)"
    )


def _stop(unit: str, record: Record | None) -> str:
    """Stop the instance as it was started: systemd stops the unit; a direct one's session gets
    SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT` seconds."""
    if record is None or record.backend == "systemd":
        return f"systemctl stop -- {quote(unit)}"
    pid = record.pid
    return (
        f"kill -s TERM -- -{pid} 2>/dev/null; i=0; "
        f"while [ -e /proc/{pid} ] && [ $i -lt {STOP_TIMEOUT * 10} ]; do "
        "sleep 0.1; i=$((i+1)); done; "
        f"kill -s KILL -- -{pid} 2>/dev/null; true"
    )


@_names_unit
def instance_ready(
    ctx: OpContext,
    unit: str,
    url: str,
    model: str,
    timeout: float = 900.0,
    interval: float = 1.0,
    state_dir: str = STATE_DIR,
    log_dir: str = LOG_DIR,
) -> Result:
    """Wait until the instance ``unit`` answers ``url`` (its ``/v1/models``) with ``model`` among
    the served models; fail at once when it stops running, or after ``timeout`` seconds, with the
    tail of its log. ``data``: :class:`InstanceReady` (unit, backend, time_to_ready_s from its
    last start on the host's clock, load_s and load_source: its ``/metrics``
    ``fxkit_load_seconds``, else its log's line).

    Check mode probes once and does not wait, as :func:`fxkit.ops.wait.wait_for`.

    Example::

        host.instance_ready("vllm@tp4-0.service", "http://127.0.0.1:8000/v1/models", "llama")
    """
    check_url(url)
    if timeout <= 0 or interval <= 0:
        raise OpError(f"bad timeout {timeout!r} or interval {interval!r}", hint="seconds > 0")
    record_path, log = _paths(unit, state_dir, log_dir)
    record = Record.parse(ctx.get(record_path))
    tools = ctx.fact(Executables, *HTTP_TOOLS)
    if not tools:
        return failed(f"cannot probe {url}: the host has none of {', '.join(HTTP_TOOLS)}")
    seconds = max(1.0, min(PROBE_TIMEOUT, timeout))
    ready = http_condition(tools[0], url, 200, {"data": [{"id": model}]}, seconds)
    command = f"date +%s.%N; {_alive_command(unit, record)}; {ready.command}"
    deadline = time.monotonic() + timeout
    while True:
        result = ctx.read(command, timeout=seconds + 5)
        now, alive, rest = [*result.stdout.split("\n", 2), "", ""][:3]
        done, seen = ready.judge(RunResult(result.command, result.rc, rest, result.stderr))
        if done and record is not None:
            took = float(now) - record.started_at
            load_s, source = _load_time(ctx, unit, url, record, tools[0], log)
            where = f"; weights loaded in {load_s:.1f} s ({source})" if load_s is not None else ""
            report = InstanceReady(
                unit=unit,
                backend=record.backend,
                time_to_ready_s=round(took, 3),
                load_s=load_s,
                load_source=source,
            )
            return ok(f"{unit} serves {model} {took:.1f} s after its start{where}", **report.data())
        if ctx.check:
            return skipped(f"check mode: would wait up to {timeout:g} s for {ready.what}")
        if record is None:
            return failed(f"{unit} was never started by fxkit ({record_path} is missing)")
        if alive.strip() != "alive":
            return failed(
                f"{unit} stopped before it was ready ({float(now) - record.started_at:.1f} s "
                f"after its start); last lines of its log:\n{_log_tail(ctx, unit, record, log)}",
                seen=seen,
            )
        if time.monotonic() >= deadline:
            return failed(
                f"{unit} was not ready after {timeout:g} s (last seen: {seen}); last lines of "
                f"its log:\n{_log_tail(ctx, unit, record, log)}",
                seen=seen,
            )
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def _log_command(unit: str, record: Record, log: str) -> str:
    if record.backend == "systemd":
        since = f"@{int(record.started_at)}"
        return f"journalctl -u {quote(unit)} --since {quote(since)} -o cat --no-pager"
    return f"cat -- {quote(log)}"


def _log_tail(ctx: OpContext, unit: str, record: Record, log: str) -> str:
    out = ctx.read(f"{_log_command(unit, record, log)} 2>&1 | tail -n {TAIL}")
    return out.stdout.rstrip() or "(empty)"


def _load_time(
    ctx: OpContext, unit: str, url: str, record: Record, tool: str, log: str
) -> tuple[float | None, LoadSource]:
    """The instance's own account of its weights' load time: ``/metrics``, else its log."""
    metrics = re.sub(r"(https?://[^/]+).*", r"\1/metrics", url)
    answer = ctx.read(http_condition(tool, metrics, 200, None, PROBE_TIMEOUT).command)
    found = _METRIC.search(answer.stdout.rpartition("\n")[0])
    if found:
        return float(found[1]), "metrics"
    seconds = load_seconds(ctx.read(_log_command(unit, record, log)).stdout)
    return (seconds, "log") if seconds is not None else (None, "unknown")


def load_seconds(text: str) -> float | None:
    """The weights' load time in a server's log (its last such line), None when it says none."""
    for pattern in LOAD_LINES:
        hits = pattern.findall(text)
        if hits:
            return float(hits[-1])
    return None
