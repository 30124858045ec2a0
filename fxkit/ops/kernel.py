"""Kernel settings: sysctl keys, kernel modules and kernel command-line arguments.

Each is persisted in a file (so it survives a reboot) and applied to the running kernel where this
host allows it; where it does not (read-only /proc/sys in a container, no modprobe), the persisted
part still happens and the live part is reported as skipped with the reason.
"""

from __future__ import annotations

import re
import shlex
from shlex import quote

from fxkit.facts.kernel import ModuleState, SysctlState, normalize_sysctl, sysctl_path
from fxkit.ops import files
from fxkit.ops.base import (
    OpContext,
    OpError,
    Result,
    combine,
    failed,
    ok,
    skipped,
)
from fxkit.ops.lines import by_lines, line

_SYSCTL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*")
_MODULE_NAME = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE_IN_GRUB = set('"$`\\\n')
#: The variables of /etc/default/grub that hold kernel arguments.
GRUB_VARIABLES = ("GRUB_CMDLINE_LINUX_DEFAULT", "GRUB_CMDLINE_LINUX")


def sysctl(
    ctx: OpContext,
    name: str,
    value: str | int,
    file: str = "/etc/sysctl.d/90-fxkit.conf",
    proc_sys: str = "/proc/sys",
) -> Result:
    """Persist ``name = value`` in ``file`` and set it in the running kernel (``proc_sys``).

    Example::

        host.sysctl("net.core.rmem_max", 268435456)
    """
    if not _SYSCTL_NAME.fullmatch(name):
        raise OpError(f"bad sysctl name {name!r}", hint="e.g. 'net.core.rmem_max'")
    want = normalize_sysctl(str(value))
    if not want or "\n" in str(value):
        raise OpError(f"bad value {value!r} for sysctl {name}")
    persisted = files.in_directory(
        ctx, file, lambda: line(ctx, file, f"{name} = {want}", regexp=rf"^\s*{re.escape(name)}\s*=")
    )
    if persisted.failed:
        return persisted
    live = ctx.fresh(SysctlState, name, proc_sys)
    if live.value == want:
        return combine(persisted, ok(f"{name} is {want}"))
    if not live.writable:
        return combine(persisted, skipped(f"persisted; applies at boot: {live.reason}"))
    path = quote(sysctl_path(name, proc_sys))
    live_change = ctx.change(
        f"printf '%s\\n' {quote(want)} > {path}",
        would=f"set {name} = {want}",
        done=f"set {name} = {want}",
        diff=f"{name}: {live.value} -> {want}\n",
    )
    return combine(persisted, live_change)


def module(
    ctx: OpContext,
    name: str,
    params: dict[str, str | int] | None = None,
    modules_load_dir: str = "/etc/modules-load.d",
    modprobe_dir: str = "/etc/modprobe.d",
) -> Result:
    """Load kernel module ``name`` (with ``params``) and persist it: ``modules_load_dir/name.conf``
    loads it at boot, ``modprobe_dir/name.conf`` holds its options.

    Example::

        host.module("nvme_rdma")
    """
    if not _MODULE_NAME.fullmatch(name):
        raise OpError(f"bad kernel module name {name!r}")
    params = params or {}
    options = [f"{k}={v}" for k, v in params.items()]
    if any(not _MODULE_NAME.fullmatch(k) or re.search(r"\s", str(v)) for k, v in params.items()):
        raise OpError(f"bad parameters {params!r} for module {name}", hint="key=value, no spaces")
    steps = [_config_file(ctx, f"{modules_load_dir}/{name}.conf", f"{name}\n")]
    if options:
        content = f"options {name} {' '.join(options)}\n"
        steps.append(_config_file(ctx, f"{modprobe_dir}/{name}.conf", content))
    if any(step.failed for step in steps):
        return combine(*steps)
    state = ctx.fresh(ModuleState, name)
    if state.loaded:
        note = "; new options apply when it is next loaded" if steps[-1].changed and options else ""
        return combine(*steps, ok(f"{name} is loaded{note}"))
    if state.cannot_load:
        return combine(*steps, skipped(f"persisted; loads at boot: {state.cannot_load}"))
    load = ctx.change(
        f"modprobe -- {quote(name)} {' '.join(quote(o) for o in options)}",
        would=f"load {name}",
        done=f"loaded {name}",
    )
    return combine(*steps, load)


def _config_file(ctx: OpContext, path: str, content: str) -> Result:
    return files.in_directory(ctx, path, lambda: files.file(ctx, path, content, mode="0644"))


def kernel_cmdline(
    ctx: OpContext,
    args: list[str],
    grub_file: str = "/etc/default/grub",
    update_grub: bool = True,
    variable: str = "GRUB_CMDLINE_LINUX_DEFAULT",
) -> Result:
    """Ensure ``args`` (``flag`` or ``key=value``; a key's old value is replaced) are in
    ``variable`` of ``grub_file`` (GRUB_CMDLINE_LINUX_DEFAULT, or GRUB_CMDLINE_LINUX, which
    recovery entries get too), keeping the other arguments. A change needs a reboot
    (``data["reboot_required"]``); ``update_grub`` regenerates the boot config when the host has
    update-grub or grub2-mkconfig.

    Example::

        if host.kernel_cmdline(["iommu=pt", "amd_iommu=on"]).data.get("reboot_required"): ...
    """
    bad = [a for a in args if not a or _UNSAFE_IN_GRUB & set(a) or " " in a]
    if bad:
        raise OpError(f"bad kernel arguments {bad!r}", hint="no spaces, quotes, $, ` or \\")
    if variable not in GRUB_VARIABLES:
        raise OpError(f"bad GRUB variable {variable!r}", hint=" or ".join(GRUB_VARIABLES))

    def edit(lines: list[str] | None) -> list[str] | Result:
        if lines is None:
            return failed(f"{grub_file} does not exist on this host")
        new = _with_kernel_args(lines, args, variable)
        return ok("kernel arguments present") if new == lines else new

    result = files.edit_file(ctx, grub_file, by_lines(edit))
    if not result.changed:
        return result
    result.data["reboot_required"] = True
    if not update_grub:
        result.msg += "; reboot required (boot config not regenerated)"
        return result
    tool = ctx.read("command -v update-grub || command -v grub2-mkconfig").stdout.strip()
    if not tool:
        result.msg += "; update-grub not found: regenerate the boot config; reboot required"
        return result
    command = "update-grub" if tool.endswith("update-grub") else f"{tool} -o /boot/grub2/grub.cfg"
    regen = ctx.change(
        command,
        would="regenerate the boot config",
        done="boot config regenerated",
    )
    combined = combine(result, regen)
    combined.msg += "; reboot required"
    return combined


def arg_key(arg: str) -> str:
    """What an argument replaces: ``iommu=pt`` replaces ``iommu=...``; ``pci=`` takes several
    options, each its own (``pci=realloc=off`` replaces ``pci=realloc=on``, not ``pci=bfsort``)."""
    name, _, value = arg.partition("=")
    return f"{name}={value.partition('=')[0]}" if name == "pci" else name


def _with_kernel_args(lines: list[str], args: list[str], variable: str) -> list[str]:
    """The lines of a GRUB defaults file with ``args`` in its (last) ``variable``, added or
    replacing a key's old value."""
    key = f"{variable}="
    found = [i for i, text in enumerate(lines) if text.startswith(key)]
    current = shlex.split(lines[found[-1]][len(key) :], comments=True) if found else []
    words = (current[0] if current else "").split()
    for arg in args:
        same = [i for i, w in enumerate(words) if arg_key(w) == arg_key(arg)]
        if same:
            words[same[0]] = arg
        else:
            words.append(arg)
    new_line = f'{key}"{" ".join(words)}"'
    new = list(lines)
    if found:
        new[found[-1]] = new_line
    else:
        new.append(new_line)
    return new
