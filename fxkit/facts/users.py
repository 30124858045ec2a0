"""Users and groups."""

from __future__ import annotations

from dataclasses import dataclass
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError


class GroupMembership(Fact[frozenset[str] | None]):
    """The groups ``user`` belongs to (``id -nG``), or None when there is no such user."""

    def command(self, user: str) -> str:
        return f"getent passwd -- {quote(user)} >/dev/null || exit 2; id -nG -- {quote(user)}"

    def parse(self, result: RunResult, user: str) -> frozenset[str] | None:
        if result.rc == 2:
            return None
        if not result.ok:
            raise FactError.from_result(f"groups of {user}", result)
        return frozenset(result.stdout.split())


@dataclass(frozen=True)
class UserInfo:
    """An account as ``getent passwd`` and ``id`` see it."""

    name: str
    uid: int
    gid: int
    #: The name of the primary group (its gid when it has no name).
    group: str
    #: Supplementary groups, the primary one not included.
    groups: frozenset[str]
    home: str
    shell: str


class User(Fact[UserInfo | None]):
    """The account ``user`` (``getent passwd``, its groups by ``id``), None when there is none."""

    def command(self, user: str) -> str:
        q = quote(user)
        return (
            f"getent passwd -- {q} || exit 2; "
            f"id -gn -- {q} 2>/dev/null || id -g -- {q}; id -nG -- {q} 2>/dev/null || id -G -- {q}"
        )

    def parse(self, result: RunResult, user: str) -> UserInfo | None:
        if result.rc == 2:
            return None
        lines = result.stdout.splitlines()
        fields = lines[0].split(":") if result.ok and len(lines) == 3 else []
        if len(fields) != 7:
            raise FactError.from_result(f"account {user}", result)
        group = lines[1].strip()
        return UserInfo(
            name=fields[0],
            uid=int(fields[2]),
            gid=int(fields[3]),
            group=group,
            groups=frozenset(lines[2].split()) - {group},
            home=fields[5],
            shell=fields[6],
        )


@dataclass(frozen=True)
class GroupInfo:
    name: str
    gid: int
    members: tuple[str, ...]


class Group(Fact[GroupInfo | None]):
    """The group ``name`` or gid (``getent group``), None when there is none."""

    def command(self, group: str) -> str:
        return f"getent group -- {quote(group)} || exit 2"

    def parse(self, result: RunResult, group: str) -> GroupInfo | None:
        if result.rc == 2:
            return None
        fields = result.stdout.strip().split(":")
        if not result.ok or len(fields) != 4:
            raise FactError.from_result(f"group {group}", result)
        return GroupInfo(fields[0], int(fields[2]), tuple(filter(None, fields[3].split(","))))
