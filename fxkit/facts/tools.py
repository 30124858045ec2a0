"""Which of some commands a host has."""

from __future__ import annotations

from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact


class Executables(Fact[tuple[str, ...]]):
    """Those of ``names`` that the host's shell finds (``command -v``), in the order given."""

    def command(self, *names: str) -> str:
        words = " ".join(quote(n) for n in names)
        return f'for t in {words}; do command -v -- "$t" >/dev/null 2>&1 && echo "$t"; done; true'

    def parse(self, result: RunResult, *names: str) -> tuple[str, ...]:
        found = set(result.stdout.split())
        return tuple(n for n in names if n in found)
