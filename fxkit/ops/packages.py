"""System packages with the host's own manager: apt (Debian family) or dnf (RHEL family)."""

from __future__ import annotations

import re
from shlex import quote

from fxkit.facts.packages import InstalledPackages
from fxkit.facts.system import OsRelease
from fxkit.ops.base import OpContext, OpError, Result, check_state, failed, ok

_SPEC = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9.+_:-]*)(?:=(?P<version>[A-Za-z0-9.+~:_-]+))?")

APT = (
    "DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=120 "
    "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
)
MANAGERS = {
    # family: (refresh the index, install, remove, how a pinned version is written)
    "debian": ("apt-get update -q", f"{APT} install", f"{APT} remove", "{name}={version}"),
    "redhat": ("dnf -y -q makecache", "dnf -y -q install", "dnf -y -q remove", "{name}-{version}"),
}


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"curl"`` -> ("curl", None); ``"curl=7.88.1-10"`` -> ("curl", "7.88.1-10")."""
    match = _SPEC.fullmatch(spec)
    if not match:
        raise OpError(f"bad package name {spec!r}", hint="write name or name=version")
    return match["name"], match["version"]


def version_matches(installed: str, wanted: str) -> bool:
    """A pin matches the full version, or the upstream part (``1.2`` matches ``1.2-3``)."""
    bare = installed.split(":", 1)[-1]
    return wanted in (installed, bare) or bare.startswith((f"{wanted}-", f"{wanted}+"))


def packages(
    ctx: OpContext,
    names: str | list[str],
    state: str = "present",
    update_cache: bool = False,
) -> Result:
    """Ensure packages are installed (``name`` or pinned ``name=version``) or absent.

    One command reads the installed versions (dpkg-query / rpm); one more installs or removes
    only the packages that differ. ``update_cache`` refreshes the index before an install.

    Example::

        host.packages(["nvme-cli", "rdma-core=48.0-1"], update_cache=True)
    """
    check_state(state, ("present", "absent"))
    specs = [parse_spec(s) for s in ([names] if isinstance(names, str) else names)]
    os_info = ctx.fact(OsRelease)
    if os_info.family not in MANAGERS:
        return failed(f"no package manager support for {os_info.id} (apt or dnf families only)")
    refresh, install, remove, pin = MANAGERS[os_info.family]
    installed = ctx.fresh(InstalledPackages, *(name for name, _ in specs))

    if state == "absent":
        todo = [name for name, _ in specs if name in installed]
        changes = [(name, installed[name], "absent") for name in todo]
        command = f"{remove} {' '.join(quote(n) for n in todo)}"
        verb, done = "remove", "removed"
    else:
        wrong = [
            (name, version)
            for name, version in specs
            if name not in installed or (version and not version_matches(installed[name], version))
        ]
        todo = [pin.format(name=n, version=v) if v else n for n, v in wrong]
        changes = [(n, installed.get(n, "absent"), v or "present") for n, v in wrong]
        command = f"{install} {' '.join(quote(s) for s in todo)}"
        if update_cache:
            command = f"{refresh} && {command}"
        verb, done = "install", "installed"
    if not todo:
        return ok(f"packages {state}")
    diff = "".join(f"{n}: {a} -> {b}\n" for n, a, b in changes)
    names = ", ".join(todo)
    return ctx.change(command, would=f"{verb} {names}", done=f"{done} {names}", diff=diff)
