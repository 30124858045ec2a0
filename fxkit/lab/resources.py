"""What a lab host may use of this machine: memory and processes (a cgroup per host) and the size
of each of its tmpfs mounts.

A host's cgroup is ``fxkit-lab/FLEET.HOST`` in the hierarchy of each controller, ``memory`` and
``pids``: cgroup v2 where its root offers them (under that root, since a v2 cgroup that holds
processes cannot hand limits to children), else the v1 hierarchy of the controller (under the
controller's own cgroup there, so the hosts also count in any limit it runs under). host-init.sh
moves the host into it before the host's cgroup namespace is made. Where neither is there, the
hosts run with their tmpfs sizes capped only (:class:`Unavailable` says why).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from fxkit.errors import FxkitError

GiB = 2**30
#: The least a host is given: sshd and a session or two.
MIN_MEMORY, MIN_PIDS = 64 * 2**20, 16
CONTROLLERS = ("memory", "pids")
#: The file that holds the limit, and the one that says what is used: (cgroup v2, v1).
LIMIT_FILES = {"memory": ("memory.max", "memory.limit_in_bytes"), "pids": ("pids.max",) * 2}
USAGE_FILES = {"memory": ("memory.current", "memory.usage_in_bytes"), "pids": ("pids.current",) * 2}
FOLDER = "fxkit-lab"


class Unavailable(FxkitError):
    """This machine gives the lab no cgroup with memory and pids limits."""


@dataclass(frozen=True)
class Limits:
    """A host's limits: ``memory`` in bytes (what its processes and tmpfs files hold), ``pids``
    (processes and threads); each of its tmpfs mounts holds half its memory at most."""

    memory: int = 6 * GiB  # a venv with torch (1.4 GB in /opt) and two serving instances fit
    pids: int = 2000

    @property
    def tmpfs(self) -> int:
        return self.memory // 2

    def __str__(self) -> str:
        return f"{self.memory / GiB:.1f} GiB of memory and {self.pids} processes"

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def placement(mountinfo: str | None = None, cgroups: str | None = None) -> dict[str, Path]:
    """The folder each controller's host cgroups go under; :class:`Unavailable` if one has none.
    ``mountinfo`` and ``cgroups``: the text of /proc/self/mountinfo and /proc/self/cgroup."""
    mounts = _cgroup_mounts(_read(Path("/proc/self/mountinfo")) if mountinfo is None else mountinfo)
    v2 = next((point for fstype, _, point, _ in mounts if fstype == "cgroup2"), None)
    offered = _read(v2 / "cgroup.controllers").split() if v2 else []
    own = _own_cgroups(_read(Path("/proc/self/cgroup")) if cgroups is None else cgroups)
    found: dict[str, Path] = {}
    for controller in CONTROLLERS:
        if v2 and controller in offered:
            found[controller] = v2
            continue
        for fstype, root, point, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                with contextlib.suppress(ValueError):  # our cgroup is outside this mount
                    found[controller] = point / Path(own[controller]).relative_to(root)
                    break
        if controller not in found:
            raise Unavailable(
                f"this machine has no {controller} controller for the lab's cgroups (cgroup v2 "
                f"at {v2 or '(none)'} offers {' '.join(offered) or 'none'}; no v1 hierarchy)"
            )
    return found


def create(key: str, limits: Limits) -> list[str]:
    """Make the cgroup ``key`` with ``limits`` in each hierarchy; its folders (one in v2, one
    per controller in v1). :class:`Unavailable` when the machine does not allow it."""
    folders: list[str] = []
    try:
        for controller, parent in placement().items():
            v2 = (parent / "cgroup.controllers").exists()
            folder = parent / FOLDER / key
            _make(folder, v2)
            value = limits.memory if controller == "memory" else limits.pids
            (folder / LIMIT_FILES[controller][not v2]).write_text(str(value))
            if str(folder) not in folders:
                folders.append(str(folder))
    except OSError as exc:
        remove(folders, timeout=0)
        raise Unavailable(f"cannot make the lab's cgroups: {exc}") from None
    return folders


def usage(folders: Iterable[str]) -> dict[str, int]:
    """What the cgroups' processes use now: ``memory`` (bytes), ``pids``; empty when gone."""
    found = {}
    for folder in map(Path, folders):
        v2 = (folder / "cgroup.controllers").exists()
        for controller, files in USAGE_FILES.items():
            with contextlib.suppress(OSError, ValueError):
                found[controller] = int(_read(folder / files[not v2]))
    return found


def remove(folders: Iterable[str], timeout: float = 3.0) -> None:
    """Remove the cgroups once their last process has gone (the kernel ends a host's processes
    after its PID 1, not at once), and the lab's folder above them when it is empty."""
    deadline = time.monotonic() + timeout
    for folder in map(Path, folders):
        while _read(folder / "cgroup.procs").strip() and time.monotonic() < deadline:
            time.sleep(0.01)
        for path in (folder, folder.parent):
            with contextlib.suppress(OSError):  # gone, still in use, or another fleet's
                path.rmdir()


def _make(folder: Path, v2: bool) -> None:
    """Make ``folder`` and the lab's folder above it; again if another fleet's :func:`remove`
    takes the lab's folder away in between (the third time that happens fails)."""
    for last in (False, False, True):
        try:
            # A v2 cgroup hands limits to its children only for the controllers it enables.
            if v2:
                _enable(folder.parent.parent)
            folder.parent.mkdir(exist_ok=True)
            if v2:
                _enable(folder.parent)
            folder.mkdir(exist_ok=True)
            return
        except FileNotFoundError:
            if last:
                raise


def _enable(folder: Path) -> None:
    """Enable the memory and pids controllers for ``folder``'s children (cgroup v2)."""
    enabled = _read(folder / "cgroup.subtree_control").split()
    missing = " ".join(f"+{c}" for c in CONTROLLERS if c not in enabled)
    if missing:
        (folder / "cgroup.subtree_control").write_text(missing)


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, str, Path, set[str]]]:
    """(type, root in the hierarchy, mount point, super options) of each cgroup file system."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        after = fields[fields.index("-") + 1 :]
        if after[0] in ("cgroup", "cgroup2"):
            point = Path(_unescape(fields[4]))
            mounts.append((after[0], _unescape(fields[3]), point, set(after[2].split(","))))
    return mounts


def _own_cgroups(cgroups: str) -> dict[str, str]:
    """The controller's own cgroup in each v1 hierarchy, by controller (/proc/self/cgroup)."""
    own = {}
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                own[controller] = path
    return own


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
