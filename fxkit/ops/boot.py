"""Rebooting a host and waiting for it to come back.

The boot id (``/proc/sys/kernel/random/boot_id``, new at every boot) is read before; the reboot
is started in the background so that its command returns before sshd goes; then the controller
reconnects, with a growing pause between tries, until the host answers with another boot id or
the timeout passes. Every fact about the host is dropped afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from shlex import quote

from fxkit.connection.local import LocalConnection
from fxkit.errors import ConnectionFailed
from fxkit.facts.system import InitSystem
from fxkit.ops.base import OpContext, OpError, Result, changed, failed, ok, skipped

BOOT_ID = "/proc/sys/kernel/random/boot_id"
CAP_SYS_BOOT = 22  # linux/capability.h
#: The init systems that reboot a host, and how they are asked to.
_REBOOT = {"systemd": "systemctl reboot", "init": "shutdown -r now"}
_LONGEST_PAUSE = 10.0


def reboot(
    ctx: OpContext,
    required_by: Result | Sequence[Result] | None = None,
    timeout: float = 600.0,
) -> Result:
    """Reboot the host and wait until it is back (a new boot id), at most ``timeout`` seconds.

    With ``required_by`` (a result or several, e.g. of :func:`~fxkit.ops.kernel.kernel_cmdline`)
    it reboots only when one of them says ``reboot_required``. A host whose PID 1 is not an init
    that can reboot it, or that lacks CAP_SYS_BOOT (a container), is skipped with the reason.

    Example::

        host.reboot(required_by=host.kernel_cmdline(["iommu=pt"]), timeout=900)
    """
    if timeout <= 0:
        raise OpError(f"bad timeout {timeout!r}", hint="seconds > 0")
    if required_by is not None:
        causes = [required_by] if isinstance(required_by, Result) else list(required_by)
        if not any(r.data.get("reboot_required") for r in causes):
            return ok("no reboot required")
    command, reason = _how_to_reboot(ctx)
    if reason:
        return skipped(f"cannot reboot this host: {reason}")
    before = _boot_id(ctx)
    started = ctx.change(
        f"nohup sh -c {quote(f'sleep 1; {command}')} >/dev/null 2>&1 </dev/null &",
        would=f"reboot ({command})",
        done="reboot started",
    )
    if not started.changed or ctx.check:
        return started
    ctx.facts.clear()
    return _wait_back(ctx, before, timeout)


def _how_to_reboot(ctx: OpContext) -> tuple[str, str]:
    """The command that reboots this host, or why none can."""
    if isinstance(ctx.conn, LocalConnection):
        return "", "it is the machine fxkit runs on"
    init = ctx.fact(InitSystem)
    reasons = [] if init in _REBOOT else [f"PID 1 is {init}, not an init system"]
    capabilities = ctx.read("grep '^CapBnd:' /proc/self/status").stdout.split()
    bounding = int(capabilities[1], 16) if len(capabilities) == 2 else 0
    if not bounding >> CAP_SYS_BOOT & 1:
        reasons.append("no CAP_SYS_BOOT (a container)")
    return _REBOOT.get(init, ""), "; ".join(reasons)


def _boot_id(ctx: OpContext) -> str:
    result = ctx.read(f"cat {BOOT_ID}", timeout=10)
    return result.stdout.strip() if result.ok else ""


def _wait_back(ctx: OpContext, before: str, timeout: float) -> Result:
    """Reconnect until the host has a boot id other than ``before``."""
    start = time.monotonic()
    pause, last = 1.0, "it did not go down"
    while time.monotonic() - start < timeout:
        time.sleep(min(pause, max(0.0, timeout - (time.monotonic() - start))))
        ctx.conn.close()
        try:
            ctx.conn.open()
            now = _boot_id(ctx)
        except ConnectionFailed as exc:
            last, pause = f"unreachable: {exc.message}", min(pause * 2, _LONGEST_PAUSE)
            continue
        if now and now != before:
            elapsed = time.monotonic() - start
            return changed(f"rebooted in {elapsed:.0f} s", boot_id=now, previous_boot_id=before)
        last = f"it answers with {'the same' if now else 'no'} boot id: it has not rebooted"
    return failed(
        f"the host was not back with a new boot id after {timeout:g} s: {last}",
        previous_boot_id=before,
    )
