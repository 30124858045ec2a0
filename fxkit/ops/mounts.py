"""Filesystem mounts: the fstab(5) entry, and whether the filesystem is mounted now.

The entry converges on every host. Mounting and unmounting need CAP_SYS_ADMIN: where the host
lacks it (a container, a lab host) that step is reported as skipped with the reason, and the
entry applies at the next boot.
"""

from __future__ import annotations

import re
from shlex import quote

from fxkit.facts.capabilities import CAP_SYS_ADMIN, Capabilities
from fxkit.facts.system import Mounts
from fxkit.ops.base import (
    OpContext,
    OpError,
    Result,
    Status,
    check_state,
    combine,
    ok,
    skipped,
)
from fxkit.ops.files import directory, edit_file
from fxkit.ops.lines import by_lines

#: Characters fstab(5) fields cannot hold as they are, written as octal escapes (``\040``).
_ESCAPES = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}
_OPTION = re.compile(r"[^\s,]+")


def escape(field: str) -> str:
    """A value as an fstab field: space, tab, newline and backslash as octal escapes."""
    return "".join(_ESCAPES.get(c, c) for c in field)


def unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def fstab_line(src: str, path: str, fstype: str, options: list[str], dump: int, passno: int) -> str:
    return " ".join([escape(src), escape(path), fstype, ",".join(options), str(dump), str(passno)])


def entry_path(line: str) -> str | None:
    """The mount point of an fstab line; None for comments and blank lines."""
    fields = line.split()
    if len(fields) < 2 or fields[0].startswith("#"):
        return None
    return unescape(fields[1])


def updated_fstab(lines: list[str], path: str, entry: str | None) -> list[str]:
    """``lines`` with the entries for ``path`` replaced by ``entry`` (at the first one's place,
    or at the end), or removed when ``entry`` is None. An entry with the same fields is kept as
    written (alignment, spacing)."""
    out: list[str] = []
    placed = False
    for line in lines:
        if entry_path(line) != path:
            out.append(line)
        elif entry is not None and not placed:
            out.append(line if line.split() == entry.split() else entry)
            placed = True
    if entry is not None and not placed:
        out.append(entry)
    return out


def _options(opts: str | list[str]) -> list[str]:
    options = opts.split(",") if isinstance(opts, str) else list(opts)
    if not options or any(not isinstance(o, str) or not _OPTION.fullmatch(o) for o in options):
        raise OpError(
            f"bad mount options {opts!r}",
            hint="comma-separated, no spaces, e.g. 'defaults,_netdev,nofail'",
        )
    return options


def mount(
    ctx: OpContext,
    path: str,
    src: str | None = None,
    fstype: str | None = None,
    opts: str | list[str] = "defaults",
    dump: int = 0,
    passno: int = 0,
    state: str = "mounted",
    fstab: str = "/etc/fstab",
) -> Result:
    """Ensure ``fstab`` mounts ``src`` (``UUID=...``, a device, ``server:/export``) at ``path``
    with ``fstype`` and ``opts``, and the filesystem's state now: ``mounted`` (the mount point
    made and mounted; remounted when mounted and the entry changed, which applies new options,
    not a new source or type: unmount for those), ``present`` (the entry only), ``unmounted``
    (the entry kept, unmounted now) or ``absent`` (the entry removed, unmounted now).

    Example::

        host.mount("/mnt/models", "UUID=0b3c4f5e-8d4a-4c7e-9f1a-2a6e3c1d9b7f", "xfs",
                   opts="defaults,_netdev,nofail")
    """
    check_state(state, ("mounted", "present", "unmounted", "absent"))
    if not path.startswith("/") or "\0" in path or (path != "/" and path.endswith("/")):
        raise OpError(f"bad mount point {path!r}", hint="an absolute path, no trailing '/'")
    entry = None
    if state != "absent":
        if not src or not fstype:
            raise OpError(f"mount {path}: state={state} needs src and fstype")
        if not re.fullmatch(r"\S+", fstype) or "\0" in src or not src.strip():
            raise OpError(f"mount {path}: bad src {src!r} or fstype {fstype!r}")
        for name, value in (("dump", dump), ("passno", passno)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise OpError(f"mount {path}: bad {name} {value!r}", hint="0, 1 or 2 (fstab(5))")
        entry = fstab_line(src, path, fstype, _options(opts), dump, passno)

    def edit(lines: list[str] | None) -> list[str] | Result:
        if lines is None and entry is None:
            return ok(f"{fstab} absent")
        return updated_fstab(lines or [], path, entry)

    persisted = edit_file(ctx, fstab, by_lines(edit))
    if persisted.failed:
        return persisted
    if persisted.status is Status.OK:
        persisted.msg = f"{fstab} entry {'absent' if entry is None else 'as wanted'}"
    live = _live(ctx, path, state, fstab, remount=persisted.changed)
    return combine(persisted, live)


def _live(ctx: OpContext, path: str, state: str, fstab: str, remount: bool) -> Result:
    """Mount or unmount ``path`` now, as ``state`` wants (mount reads the entry from ``fstab``)."""
    if state == "present":
        return ok("")
    mounted = any(m.path == path for m in ctx.fresh(Mounts))
    q = quote(path)
    table = "" if fstab == "/etc/fstab" else f"--fstab {quote(fstab)} "
    if state == "mounted":
        if mounted and not remount:
            return ok(f"{path} mounted")
        command, verb = (
            (f"mount {table}-o remount -- {q}", "remount")
            if mounted
            else (f"mount {table}-- {q}", "mount")
        )
    else:
        if not mounted:
            return ok(f"{path} not mounted")
        command, verb = f"umount -- {q}", "unmount"
    if CAP_SYS_ADMIN not in ctx.fact(Capabilities):
        return skipped(
            f"{verb} {path} skipped: this host lacks CAP_SYS_ADMIN (a container?); "
            "the fstab entry applies at boot"
        )
    steps = []
    if verb == "mount":
        point = directory(ctx, path)
        if point.failed:
            return point
        if point.changed:
            steps.append(point)
    after = "mounted" if state == "mounted" else "not mounted"
    steps.append(
        ctx.change(
            command,
            would=f"{verb} {path}",
            done=f"{verb}ed {path}",
            diff=f"{path}: {'mounted' if mounted else 'not mounted'} -> {after}\n",
        )
    )
    return combine(*steps)
