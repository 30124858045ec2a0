"""The state of one path: type, mode, owner, group and (for regular files) the content's sha256."""

from __future__ import annotations

import hashlib
import shlex
import stat
from dataclasses import dataclass
from typing import Any

from fxkit.connection.base import PathStat, RunResult
from fxkit.errors import ConnectionFailed, FxkitError
from fxkit.facts.base import Fact, FactCache, FactError

#: Largest file whose sha256 :meth:`FileStat.direct` takes without a command (the host-side
#: helper hashes it, or the controller reads it over SFTP); a larger one is hashed by the command.
DIRECT_HASH_LIMIT = 4 << 20

_TYPES = {
    "regular file": "file",
    "regular empty file": "file",
    "directory": "directory",
    "symbolic link": "link",
}


@dataclass(frozen=True)
class FileInfo:
    """What :class:`FileStat` found; ``type`` is file, directory, link or other."""

    exists: bool
    type: str = ""
    mode: int = 0
    owner: str = ""
    uid: int = -1
    group: str = ""
    gid: int = -1
    size: int = 0
    sha256: str = ""

    def owned_by(self, owner: str | int) -> bool:
        return str(owner) in (self.owner, str(self.uid))

    def grouped(self, group: str | int) -> bool:
        return str(group) in (self.group, str(self.gid))


ABSENT = FileInfo(exists=False)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return "link" if stat.S_ISLNK(mode) else "other"


#: What :class:`AccountNames` holds: the size and mtime of /etc/passwd and /etc/group when they
#: were read (None: read by a command), user names by id, group names by id.
Accounts = tuple[tuple[float, ...] | None, dict[int, str], dict[int, str]]
_ACCOUNT_FILES = ("/etc/passwd", "/etc/group")


class AccountNames(Fact[Accounts]):
    """User and group names by id, from /etc/passwd and /etc/group (where :class:`FileStat`
    finds the names of a file's owner and group without a command). Kept across changes: each
    use checks the two files' size and mtime (:func:`account_names`)."""

    cmd = "cat /etc/passwd && echo --- && cat /etc/group"
    stable = True

    def parse(self, result: RunResult) -> Accounts:
        if not result.ok:
            raise FactError.from_result("account names", result)
        users, _, groups = result.stdout.partition("\n---\n")
        return None, _names(users), _names(groups)

    def direct(self, facts: FactCache, *args: Any, become: bool) -> Accounts | None:
        if facts.conn.needs_sudo(become):
            return None  # a read through sudo is a command: the command is as good
        signature = _signature(facts, become)
        users, groups = (facts.conn.get(f, become=become) for f in _ACCOUNT_FILES)
        if signature is None or users is None or groups is None:
            return None
        text = [users.decode(errors="replace"), groups.decode(errors="replace")]
        return signature, _names(text[0]), _names(text[1])


def _signature(facts: FactCache, become: bool) -> tuple[float, ...] | None:
    found = [facts.conn.stat(f, become=become) for f in _ACCOUNT_FILES]
    return tuple(x for f in found for x in (f.size, f.mtime)) if all(found) else None  # type: ignore[union-attr]


def account_names(facts: FactCache, become: bool) -> tuple[dict[int, str], dict[int, str]]:
    """:class:`AccountNames`, read again when /etc/passwd or /etc/group changed since."""
    signature, users, groups = facts.get(AccountNames, become=become)
    if signature is None or signature != _signature(facts, become):
        facts.forget(AccountNames)
        signature, users, groups = facts.get(AccountNames, become=become)
    return users, groups


def _names(table: str) -> dict[int, str]:
    """``id -> name`` of a passwd or group file (``name:x:id:...`` lines)."""
    names: dict[int, str] = {}
    for line in table.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit():
            names.setdefault(int(fields[2]), fields[0])
    return names


class FileStat(Fact[FileInfo]):
    """One command: ``stat`` of the path (not following links), plus ``sha256sum`` of a file."""

    def command(self, path: str) -> str:
        return (
            f"p={shlex.quote(path)}; "
            'if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo absent; exit 0; fi; '
            "stat --printf '%F|%a|%U|%u|%G|%g|%s\\n' -- \"$p\" && "
            '{ [ -L "$p" ] || [ ! -f "$p" ] || sha256sum -- "$p"; }'
        )

    def direct(self, facts: FactCache, *args: Any, become: bool) -> FileInfo | None:
        """In one step where the connection can (:meth:`Connection.inspect`: the host-side
        helper, or fxkit's own process), else over SFTP: ``lstat``, the owner's names from
        :class:`AccountNames` and the content hashed here. Either way a file larger than
        :data:`DIRECT_HASH_LIMIT` is hashed by the command. None (the command runs) where an id
        has no name or anything fails."""
        (path,) = args
        try:
            state = facts.conn.inspect(path, become=become, hash_limit=DIRECT_HASH_LIMIT)
        except NotImplementedError:
            return self._composed(facts, path, become)
        except ConnectionFailed:
            raise
        except FxkitError:
            return None
        if state is None:
            return ABSENT
        if not state.owner or not state.group or state.sha256 is None:
            return None
        kind = _kind(state.stat.st_mode)
        return _info(state.stat, kind, state.owner, state.group, state.sha256)

    def _composed(self, facts: FactCache, path: str, become: bool) -> FileInfo | None:
        """:meth:`direct` over SFTP: a stat, the account names, the content."""
        conn = facts.conn
        try:
            found = conn.stat(path, become=become)
            if found is None:
                return ABSENT
            kind = _kind(found.st_mode)
            if kind == "file" and found.size > DIRECT_HASH_LIMIT:
                return None
            users, groups = account_names(facts, become)
            if found.uid not in users or found.gid not in groups:
                return None
            digest = ""
            if kind == "file":
                content = conn.get(path, become=become)
                if content is None:
                    return None
                digest = hashlib.sha256(content).hexdigest()
        except ConnectionFailed:
            raise
        except (FxkitError, NotImplementedError):
            return None
        return _info(found, kind, users[found.uid], groups[found.gid], digest)

    def parse(self, result: RunResult, path: str) -> FileInfo:
        lines = result.stdout.splitlines()
        if result.ok and lines == ["absent"]:
            return ABSENT
        if not result.ok or not lines or lines[0].count("|") != 6:
            raise FactError.from_result(f"stat of {path}", result)
        kind, mode, owner, uid, group, gid, size = lines[0].split("|")
        # sha256sum escapes odd file names with a leading backslash.
        digest = lines[1].lstrip("\\").split()[0] if len(lines) > 1 else ""
        return FileInfo(
            exists=True,
            type=_TYPES.get(kind, "other"),
            mode=int(mode, 8),
            owner=owner,
            uid=int(uid),
            group=group,
            gid=int(gid),
            size=int(size),
            sha256=digest,
        )


def _info(found: PathStat, kind: str, owner: str, group: str, digest: str) -> FileInfo:
    return FileInfo(
        exists=True,
        type=kind,
        mode=stat.S_IMODE(found.st_mode),
        owner=owner,
        uid=found.uid,
        group=group,
        gid=found.gid,
        size=found.size,
        sha256=digest,
    )
