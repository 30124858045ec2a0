"""The state of one path: type, mode, owner, group and (for regular files) the content's sha256."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError

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


class FileStat(Fact[FileInfo]):
    """One command: ``stat`` of the path (not following links), plus ``sha256sum`` of a file."""

    def command(self, path: str) -> str:
        return (
            f"p={shlex.quote(path)}; "
            'if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo absent; exit 0; fi; '
            "stat --printf '%F|%a|%U|%u|%G|%g|%s\\n' -- \"$p\" && "
            '{ [ -L "$p" ] || [ ! -f "$p" ] || sha256sum -- "$p"; }'
        )

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
