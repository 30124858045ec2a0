"""Users and groups."""

from __future__ import annotations

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
