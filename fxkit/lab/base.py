"""The read-only base layer of a fleet's hosts: a sanitised copy of this machine's /etc and /var.

A lab host must run this machine's packages (its /usr) with a matching /etc and dpkg database,
but must not see the machine's secrets. The rule: a host gets only what every user of this machine
may already read. Files that are not world-readable are left out (directories stay, empty), as
are the SSH host keys; ``shadow``, ``gshadow`` and ``sudoers`` are written anew, with every
account locked but the lab's own sudo user. ``/root`` and ``/home`` start empty but for the lab's
authorized key. The hosts' overlays stack their own writable layer on top of this one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

#: What a host gets of /var: the package databases its /usr matches, without apt's downloaded
#: indexes (a host updates from its own sources).
VAR_TREES = ("lib", "cache/debconf")
#: Trees of /var/lib that belong to services of this machine, not to its packages.
VAR_SKIP = {"lib/docker", "lib/containerd", "lib/postgresql", "lib/mysql", "lib/libvirt"}
VAR_DIRS = {
    "log": 0o755,
    "tmp": 0o1777,
    "mail": 0o2775,
    "spool": 0o755,
    "local": 0o2775,
    "opt": 0o755,
    "backups": 0o755,
    "cache/apt/archives/partial": 0o700,
    "lib/apt/lists/partial": 0o700,
}
SUDOERS = """\
Defaults	env_reset
Defaults	mail_badpass
Defaults	secure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
Defaults	use_pty
root	ALL=(ALL:ALL) ALL
%sudo	ALL=(ALL:ALL) ALL
@includedir /etc/sudoers.d
"""
_REGENERATED = {"shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "subuid-", "subgid-"}


def build(base: Path, authorized_key: str, sudo_user: str | None) -> None:
    """Write the base layer into ``base`` (``etc/``, ``var/``, ``root/``, ``home/``);
    ``sudo_user`` is ``name:password-hash`` of the non-root user that may sudo, if any."""
    tmp = base.with_name(f".{base.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    _copy_readable(Path("/etc"), tmp / "etc", skip=_skip_in_etc)
    for tree in VAR_TREES:
        _copy_readable(Path("/var") / tree, tmp / "var" / tree, skip=_skip_in_var(tree))
    for name, mode in VAR_DIRS.items():
        (tmp / "var" / name).mkdir(parents=True, exist_ok=True)
        os.chmod(tmp / "var" / name, mode)
    os.symlink("/run", tmp / "var" / "run")
    os.symlink("/run/lock", tmp / "var" / "lock")
    _accounts(tmp, authorized_key, sudo_user)
    shutil.rmtree(base, ignore_errors=True)
    tmp.rename(base)


def _skip_in_etc(relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return (
        relative in _REGENERATED
        or relative.startswith("ssh/ssh_host_")
        or name.startswith(".pwd.lock")
    )


def _skip_in_var(tree: str) -> Callable[[str], bool]:
    def skip(relative: str) -> bool:
        path = f"{tree}/{relative}"
        return path.startswith("lib/apt/lists/") or path in VAR_SKIP

    return skip


def _copy_readable(src: Path, dst: Path, skip: Callable[[str], bool]) -> None:
    """Copy ``src`` to ``dst`` with owners and modes: symlinks as they are, files only when
    world-readable, directories always (empty when others may not list them)."""
    if not src.is_dir():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    _copy_dir_node(src, dst)
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        rel_dir = here.relative_to(src)
        keep = []
        for name in sorted(dirnames):
            rel = str(rel_dir / name).removeprefix("./")
            source = here / name
            if skip(rel):
                continue
            if source.is_symlink():
                _copy_symlink(source, dst / rel)
                continue
            _copy_dir_node(source, dst / rel)
            if os.lstat(source).st_mode & 0o005 == 0o005:
                keep.append(name)  # others may list it: its entries are public too
        dirnames[:] = keep
        for name in filenames:
            rel = str(rel_dir / name).removeprefix("./")
            if not skip(rel):
                _copy_entry(here / name, dst / rel)


def _copy_entry(source: Path, target: Path) -> None:
    info = os.lstat(source)
    if stat.S_ISLNK(info.st_mode):
        _copy_symlink(source, target)
    elif stat.S_ISREG(info.st_mode) and info.st_mode & 0o004:
        try:  # a hard link where it can (the layer is read-only to the hosts), else a copy
            os.link(source, target, follow_symlinks=False)
            return
        except OSError:
            shutil.copyfile(source, target, follow_symlinks=False)
        os.chown(target, info.st_uid, info.st_gid)
        os.chmod(target, stat.S_IMODE(info.st_mode))
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))


def _copy_dir_node(source: Path, target: Path) -> None:
    info = os.lstat(source)
    target.mkdir(exist_ok=True)
    os.chown(target, info.st_uid, info.st_gid)
    os.chmod(target, stat.S_IMODE(info.st_mode))


def _copy_symlink(source: Path, target: Path) -> None:
    info = os.lstat(source)
    os.symlink(os.readlink(source), target)
    with contextlib.suppress(OSError):
        os.chown(target, info.st_uid, info.st_gid, follow_symlinks=False)


def _accounts(base: Path, authorized_key: str, sudo_user: str | None) -> None:
    """Locked shadow entries for every account, the sudo user, sudoers and authorized keys."""
    etc = base / "etc"
    users = _entries(etc / "passwd")
    groups = _entries(etc / "group")
    home = base / "home"
    home.mkdir(mode=0o755)
    root_ssh = base / "root" / ".ssh"
    root_ssh.mkdir(parents=True, mode=0o700)
    os.chmod(base / "root", 0o700)
    _write(root_ssh / "authorized_keys", authorized_key, 0o600)
    shadow = [f"{u[0]}:*:19000:0:99999:7:::" for u in users]
    if sudo_user:
        name, hashed = sudo_user.strip().split(":", 1)
        uid = _free_id(int(u[2]) for u in users)
        gid = _free_id(int(g[2]) for g in groups)
        users.append([name, "x", str(uid), str(gid), "", f"/home/{name}", "/bin/sh"])
        groups.append([name, "x", str(gid), ""])
        shadow.append(f"{name}:{hashed}:19000:0:99999:7:::")
        user_ssh = home / name / ".ssh"
        user_ssh.mkdir(parents=True, mode=0o700)
        _write(user_ssh / "authorized_keys", authorized_key, 0o600)
        for path in (home / name, user_ssh, user_ssh / "authorized_keys"):
            os.chown(path, uid, gid)
        os.chmod(home / name, 0o755)
        (etc / "sudoers.d").mkdir(mode=0o750, exist_ok=True)
        _write(etc / "sudoers.d" / "fxkit-lab", f"{name} ALL=(ALL:ALL) ALL\n", 0o440)
    shadow_gid = next((int(g[2]) for g in groups if g[0] == "shadow"), 0)
    _write(etc / "passwd", "".join(":".join(u) + "\n" for u in users), 0o644)
    _write(etc / "group", "".join(":".join(g) + "\n" for g in groups), 0o644)
    _write(etc / "shadow", "".join(line + "\n" for line in shadow), 0o640, gid=shadow_gid)
    gshadow = "".join(f"{g[0]}:*::{g[3]}\n" for g in groups)
    _write(etc / "gshadow", gshadow, 0o640, gid=shadow_gid)
    _write(etc / "sudoers", SUDOERS, 0o440)


def _entries(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split(":") for line in path.read_text().splitlines() if line.count(":") >= 3]


def _free_id(taken: Iterable[int]) -> int:
    used = set(taken)
    return next(i for i in range(1000, 60000) if i not in used)


def _write(path: Path, text: str, mode: int, gid: int = 0) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chown(path, 0, gid)
    os.chmod(path, mode)
