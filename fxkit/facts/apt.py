"""apt's own state: the packages on hold."""

from __future__ import annotations

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError


class HeldPackages(Fact[set[str]]):
    """The packages ``apt-mark showhold`` lists (apt-mark(8)), names without architecture."""

    cmd = "apt-mark showhold"

    def parse(self, result: RunResult) -> set[str]:
        if not result.ok:
            raise FactError.from_result("held packages", result)
        return {line.strip().split(":")[0] for line in result.stdout.splitlines() if line.strip()}
