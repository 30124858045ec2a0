"""Python environments on the host."""

from __future__ import annotations

import re
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: ``Foo_Bar.baz`` and ``foo-bar-baz`` name the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


class VenvPackages(Fact[dict[str, str] | None]):
    """``{canonical name: version}`` installed in the virtualenv at ``path`` (pip's own view), or
    None when there is no virtualenv there."""

    def command(self, path: str) -> str:
        return (
            f'p={quote(path)}/bin/python; [ -x "$p" ] || exit 3; '
            '"$p" -m pip list --format=freeze --disable-pip-version-check'
        )

    def parse(self, result: RunResult, path: str) -> dict[str, str] | None:
        if result.rc == 3:
            return None
        if not result.ok:
            raise FactError.from_result(f"pip list in {path}", result)
        packages = {}
        for line in result.stdout.splitlines():
            name, sep, version = line.partition("==")
            if sep:
                packages[canonical_name(name.strip())] = version.strip()
        return packages
