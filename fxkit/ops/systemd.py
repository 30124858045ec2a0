"""systemd units: install unit files and drop-ins, enable/disable and start/stop services.

Unit names follow systemd.unit(5): ``name.type``, a template ``name@.type`` and its instances
``name@instance.type`` (the instance escaped as ``systemd-escape`` does: :func:`unit_instance`).

daemon-reload: a changed unit file or drop-in reloads systemd at once (``daemon_reload=True``,
the default). To change several files and reload once, pass ``daemon_reload=False`` to them: the
reload is then pending and runs exactly once, before the next :func:`service` call (in the same
command) or the next unit/drop-in with ``daemon_reload=True``; nothing changed, nothing reloads.

Where systemd is not PID 1 (a container, a lab host without an init), unit files are still
installed but enabling, starting and daemon-reload are reported as skipped with the reason.
"""

from __future__ import annotations

import re
from shlex import quote

from fxkit.facts.system import InitSystem
from fxkit.ops.base import (
    OpContext,
    OpError,
    Result,
    check_state,
    combine,
    ok,
    skipped,
)
from fxkit.ops.files import file, in_directory

_TYPES = "service|socket|timer|mount|automount|swap|target|path|slice|scope|device"
_CHAR = r"(?:[A-Za-z0-9:_.-]|\\x[0-9a-fA-F]{2})"
#: prefix, then ``@instance`` (empty for a template), then the type (systemd.unit(5)).
_UNIT = re.compile(rf"({_CHAR}+)(?:@((?:{_CHAR}|@)*))?\.({_TYPES})")
_DROPIN = re.compile(r"[A-Za-z0-9_.-]+")
_UNIT_MAX = 255
#: is-enabled states in which ``enabled=True`` has nothing to do.
_ENABLED = {"enabled", "enabled-runtime", "static", "alias", "indirect", "generated"}
_RUNNING = {"active", "activating", "reloading"}
_ALWAYS = {"restarted": "restart", "reloaded": "reload"}
_RELOAD = "daemon-reload"
_SAFE = re.compile(r"[A-Za-z0-9:_.]")


#: The system's folder of local units (systemd.unit(5), "Unit File Load Path").
UNIT_DIR = "/etc/systemd/system"


def systemd_missing(ctx: OpContext) -> str:
    """Why systemd cannot be asked to do anything on this host; empty when it can."""
    init = ctx.fact(InitSystem)
    return "" if init == "systemd" else f"systemd is not running on this host (PID 1 is {init})"


def unit_instance(template: str, instance: str) -> str:
    """The instance ``instance`` of ``template``, escaped as ``systemd-escape --template`` does::

    unit_instance("vllm@.service", "0") == "vllm@0.service"
    unit_instance("nvme@.service", "/dev/nvme0") == "nvme@-dev-nvme0.service"
    """
    match = check_unit_name(template)
    if match.group(2) != "":
        raise OpError(f"{template!r} is not a template unit", hint="e.g. 'vllm@.service'")
    escaped = "".join(_escape(c, first=i == 0) for i, c in enumerate(instance))
    return check_unit_name(f"{match.group(1)}@{escaped}.{match.group(3)}").string


def device_unit(interface: str) -> str:
    """systemd's device unit of a network interface, escaped as ``systemd-escape`` does::

    device_unit("ens6np0") == "sys-subsystem-net-devices-ens6np0.device"
    """
    escaped = "".join(_escape(c, first=i == 0) for i, c in enumerate(interface))
    return f"sys-subsystem-net-devices-{escaped}.device"


def _escape(char: str, first: bool) -> str:
    """One character as systemd-escape writes it: ``/`` becomes ``-``, anything but letters,
    digits, ``:``, ``_`` and a ``.`` that does not start the name becomes ``\\xHH`` per byte."""
    if char == "/":
        return "-"
    if _SAFE.fullmatch(char) and not (first and char == "."):
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode())


def check_unit_name(name: str) -> re.Match[str]:
    match = _UNIT.fullmatch(name)
    if not match or len(name) > _UNIT_MAX:
        raise OpError(
            f"bad unit name {name!r}",
            hint="give the full name, e.g. 'vllm.service', a template 'vllm@.service' or an "
            "instance 'vllm@0.service' (escape instances with unit_instance or systemd-escape)",
        )
    return match


def unit(
    ctx: OpContext,
    name: str,
    content: str,
    unit_dir: str = UNIT_DIR,
    daemon_reload: bool = True,
) -> Result:
    """Install the unit file ``unit_dir/name`` (a template ``name@.service`` too); when it
    changed, ``systemctl daemon-reload`` runs now, or with ``daemon_reload=False`` is left pending
    for the next :func:`service` call (see the module's docstring).

    Example::

        host.unit("vllm@.service", content=unit_text)
    """
    check_unit_name(name)
    return _unit_file(ctx, f"{unit_dir}/{name}", content, daemon_reload)


def dropin(
    ctx: OpContext,
    unit: str,
    name: str,
    content: str,
    unit_dir: str = UNIT_DIR,
    daemon_reload: bool = True,
) -> Result:
    """Install the drop-in ``unit_dir/<unit>.d/<name>.conf`` that overrides parts of ``unit``
    (``.conf`` is added when missing); daemon-reload as for :func:`unit`.

    Example::

        host.dropin("vllm@.service", "10-env", "[Service]\\nEnvironment=HF_HOME=/mnt/hf\\n")
    """
    check_unit_name(unit)
    base = name.removesuffix(".conf")
    if not _DROPIN.fullmatch(base) or base.startswith("."):
        raise OpError(f"bad drop-in name {name!r} for {unit}", hint="e.g. '10-override.conf'")
    return _unit_file(ctx, f"{unit_dir}/{unit}.d/{base}.conf", content, daemon_reload)


def _unit_file(ctx: OpContext, path: str, content: str, daemon_reload: bool) -> Result:
    result = in_directory(ctx, path, lambda: file(ctx, path, content, mode="0644"))
    if result.changed:
        ctx.pending.add(_RELOAD)
    if result.failed or _RELOAD not in ctx.pending:
        return result
    if not daemon_reload:
        result.msg += "; daemon-reload pending"
        return result
    return combine(result, _daemon_reload(ctx))


def _daemon_reload(ctx: OpContext) -> Result:
    """Run the pending daemon-reload now (skipped without systemd)."""
    ctx.pending.discard(_RELOAD)
    reason = systemd_missing(ctx)
    if reason:
        return skipped(f"daemon-reload skipped: {reason}")
    return ctx.change("systemctl daemon-reload", would="daemon-reload", done="daemon-reload done")


def service(
    ctx: OpContext,
    name: str,
    enabled: bool | None = None,
    state: str | None = None,
) -> Result:
    """Ensure a unit (an instance ``vllm@0.service`` too) is enabled/disabled and
    started/stopped; ``restarted`` and ``reloaded`` always act (use them from handlers). One
    command reads both states, one changes them, after a pending daemon-reload.

    Example::

        host.service("nvmf-autoconnect.service", enabled=True, state="started")
    """
    match = check_unit_name(name)
    check_state(state, (None, "started", "stopped", "restarted", "reloaded"))
    if match.group(2) == "" and state is not None:
        raise OpError(
            f"{name} is a template: it cannot be {state}",
            hint=f"name an instance, e.g. {match.group(1)}@0.{match.group(3)}",
        )
    reason = systemd_missing(ctx)
    if reason:
        ctx.pending.discard(_RELOAD)
        return skipped(f"{reason}: {name} not managed")
    q = quote(name)
    current = ctx.read(
        f"e=$(systemctl is-enabled -- {q} 2>/dev/null | head -n1); "
        f'a=$(systemctl is-active -- {q} | head -n1); echo "$e|$a"'
    )
    is_enabled, _, is_active = current.stdout.strip().partition("|")
    steps: list[tuple[str, str]] = []  # (systemctl verb, diff line)
    if _RELOAD in ctx.pending:
        steps.append((_RELOAD, "daemon-reload: unit files changed"))
    if enabled is True and is_enabled not in _ENABLED:
        steps.append(("enable", f"enabled: {is_enabled or 'unknown'} -> enabled"))
    if enabled is False and is_enabled in ("enabled", "enabled-runtime"):
        steps.append(("disable", f"enabled: {is_enabled} -> disabled"))
    if state == "started" and is_active not in _RUNNING:
        steps.append(("start", f"active: {is_active} -> active"))
    if state == "stopped" and is_active in _RUNNING:
        steps.append(("stop", f"active: {is_active} -> inactive"))
    if state in _ALWAYS:
        steps.append((_ALWAYS[state], f"{_ALWAYS[state]}: {name}"))
    if not steps:
        return ok(f"{name} is {is_enabled or 'unknown'} and {is_active or 'unknown'}")
    ctx.pending.discard(_RELOAD)
    verbs = ", ".join(verb for verb, _ in steps)
    diff = "".join(f"{line}\n" for _, line in steps)
    command = " && ".join(
        "systemctl daemon-reload" if verb == _RELOAD else f"systemctl {verb} -- {q}"
        for verb, _ in steps
    )
    return ctx.change(command, would=f"{verbs} {name}", done=f"{verbs} {name}: done", diff=diff)
