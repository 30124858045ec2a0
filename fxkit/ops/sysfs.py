"""sysfs and configfs attributes: read, compare, write (NIC, RDMA and block settings, nvmet).

An attribute is one small file the kernel answers: reading it shows the current setting,
writing a value sets it (until the next boot: persist it with a udev rule, a unit or a role that
runs at boot). Where the host cannot write it (a read-only /sys in a container, an attribute
without write permission, a device that is not there) the result is skipped with the reason.
"""

from __future__ import annotations

from shlex import quote

from fxkit.facts.sysfs import Attribute
from fxkit.facts.system import Mounts
from fxkit.ops.base import OpContext, OpError, Result, failed, ok, skipped
from fxkit.ops.files import check_path


def attribute(ctx: OpContext, path: str, value: str | int) -> Result:
    """Ensure the sysfs/configfs attribute ``path`` reads ``value``, writing it when it does
    not. Compared as the kernel prints it: without the trailing newline, and of a choice list
    such as ``none [mq-deadline] kyber`` only the selected word. After a write it is read back:
    a kernel that kept another value fails the operation. An attribute that cannot be read (a
    write-only trigger) is written every time.

    Example::

        host.attribute("/sys/block/nvme0n1/queue/scheduler", "none")
        host.attribute("/sys/kernel/config/nvmet/ports/1/addr_trtype", "rdma")
    """
    check_path(path)
    want = ("1" if value else "0") if isinstance(value, bool) else str(value).strip()
    if not want or "\n" in want:
        raise OpError(f"bad value {value!r} for {path}", hint="one line, not empty")
    info = ctx.fresh(Attribute, path)
    if not info.exists:
        return skipped(f"{path} does not exist on this host (no such device, driver or object)")
    current = info.value
    if current == want:
        return ok(f"{path} is {want}")
    shown = current if current is not None else f"unreadable ({info.error})"
    reason = _not_writable(ctx, path, info.mode)
    if reason:
        return skipped(f"{reason}: {path} stays {shown} (wanted {want})")
    if not info.writable:
        return failed(f"permission denied: cannot write {path}; run it as root (become)")
    result = ctx.change(
        f"printf '%s' {quote(want)} > {quote(path)}",
        would=f"set {path} to {want}",
        done=f"set {path} to {want}",
        diff=f"{path}: {shown} -> {want}\n",
    )
    if not result.changed or ctx.check:
        return result
    now = ctx.fresh(Attribute, path)
    if now.text is None:  # a write-only attribute (an "apply" trigger): written every run
        result.msg += "; it cannot be read back"
    elif now.value != want:
        return failed(
            f"wrote {want!r} to {path} but it reads {now.value!r}: the kernel stores this value "
            "differently, give it as it reads back",
            **result.data,
        )
    return result


def _not_writable(ctx: OpContext, path: str, mode: int) -> str:
    """Why this host cannot write ``path`` (root or not); empty when it can."""
    mounts = sorted(
        (m for m in ctx.fact(Mounts) if _under(path, m.path)), key=lambda m: len(m.path)
    )
    if mounts and mounts[-1].read_only:  # the last mounted of the longest: the one that counts
        return f"{mounts[-1].path} is mounted read-only on this host"
    if not mode & 0o222:
        return f"the attribute is read-only (mode {mode:04o})"
    return ""


def _under(path: str, mount: str) -> bool:
    return mount == "/" or path == mount or path.startswith(mount.rstrip("/") + "/")
