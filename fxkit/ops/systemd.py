"""systemd units: install unit files, enable/disable and start/stop services.

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

_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+\.(service|socket|timer|mount|target|path|slice)")
#: is-enabled states in which ``enabled=True`` has nothing to do.
_ENABLED = {"enabled", "enabled-runtime", "static", "alias", "indirect", "generated"}
_RUNNING = {"active", "activating", "reloading"}
_ALWAYS = {"restarted": "restart", "reloaded": "reload"}


def systemd_missing(ctx: OpContext) -> str:
    """Why systemd cannot be asked to do anything on this host; empty when it can."""
    init = ctx.fact(InitSystem)
    return "" if init == "systemd" else f"systemd is not running on this host (PID 1 is {init})"


def _check_name(name: str) -> None:
    if not _UNIT.fullmatch(name):
        raise OpError(f"bad unit name {name!r}", hint="give the full name, e.g. 'vllm.service'")


def unit(
    ctx: OpContext,
    name: str,
    content: str,
    unit_dir: str = "/etc/systemd/system",
) -> Result:
    """Install the unit file ``unit_dir/name``; run ``systemctl daemon-reload`` when it changed.

    Example::

        host.unit("vllm@.service", content=unit_text)
    """
    _check_name(name)
    path = f"{unit_dir}/{name}"
    result = in_directory(ctx, path, lambda: file(ctx, path, content, mode="0644"))
    if not result.changed:
        return result
    reason = systemd_missing(ctx)
    if reason:
        result.msg += f"; daemon-reload skipped: {reason}"
        return result
    reload = ctx.change("systemctl daemon-reload", would="daemon-reload", done="daemon-reload done")
    return combine(result, reload)


def service(
    ctx: OpContext,
    name: str,
    enabled: bool | None = None,
    state: str | None = None,
) -> Result:
    """Ensure a unit is enabled/disabled and started/stopped; ``restarted`` and ``reloaded``
    always act (use them from handlers). One command reads both states, one changes them.

    Example::

        host.service("nvmf-autoconnect.service", enabled=True, state="started")
    """
    _check_name(name)
    check_state(state, (None, "started", "stopped", "restarted", "reloaded"))
    reason = systemd_missing(ctx)
    if reason:
        return skipped(f"{reason}: {name} not managed")
    q = quote(name)
    current = ctx.read(
        f"e=$(systemctl is-enabled -- {q} 2>/dev/null | head -n1); "
        f'a=$(systemctl is-active -- {q} | head -n1); echo "$e|$a"'
    )
    is_enabled, _, is_active = current.stdout.strip().partition("|")
    steps: list[tuple[str, str]] = []  # (systemctl verb, diff line)
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
    verbs = ", ".join(verb for verb, _ in steps)
    diff = "".join(f"{line}\n" for _, line in steps)
    command = " && ".join(f"systemctl {verb} -- {q}" for verb, _ in steps)
    return ctx.change(command, would=f"{verbs} {name}", done=f"{verbs} {name}: done", diff=diff)
