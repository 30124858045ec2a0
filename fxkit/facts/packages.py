"""Installed system packages, from dpkg (Debian family) or rpm (RHEL family)."""

from __future__ import annotations

from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError

DPKG_FORMAT = r"${Package}\t${Version}\t${db:Status-Status}\n"
RPM_FORMAT = r"%{NAME}\t%{VERSION}-%{RELEASE}\tinstalled\n"


class InstalledPackages(Fact[dict[str, str]]):
    """``{name: version}`` of the installed packages among ``names`` (all of them without names).

    Packages that are unknown or removed (config files left) are simply not in the result.
    """

    def command(self, *names: str) -> str:
        words = " ".join(quote(n) for n in names)
        dpkg = f"dpkg-query -W -f {quote(DPKG_FORMAT)} -- {words}"
        rpm = (
            f"rpm -q --qf {quote(RPM_FORMAT)} -- {words}"
            if names
            else f"rpm -qa --qf {quote(RPM_FORMAT)}"
        )
        return (
            f"if command -v dpkg-query >/dev/null; then {dpkg}; "
            f"elif command -v rpm >/dev/null; then {rpm}; "
            "else echo 'neither dpkg-query nor rpm found' >&2; exit 127; fi"
        )

    def parse(self, result: RunResult, *names: str) -> dict[str, str]:
        if result.rc == 127:
            raise FactError.from_result("installed packages", result)
        installed = {}
        for line in result.stdout.splitlines():
            fields = line.split("\t")
            if len(fields) == 3 and fields[2] == "installed":
                installed[fields[0]] = fields[1]
        return installed
