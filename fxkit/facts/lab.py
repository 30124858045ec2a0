"""Whether a host is a lab host (``fxkit lab up``), and which simulated hardware it has.

Every lab host has ``/etc/fxkit-lab/host.json``: ``{"lab": true, "profile": "mi308x"}`` (profile
null on a plain lab host). A profile means the host's hardware tools are stand-ins (test doubles,
see docs/lab.md): facts about hardware report ``simulated`` so that no report mistakes them for
the real thing. Hardware facts read the marker in their own command: :func:`marked` builds it,
:func:`split_marked` takes it apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError

LAB_MARKER = "/etc/fxkit-lab/host.json"
#: Printed by :func:`marked` between the marker's content and the script's output.
SEPARATOR = "--- fxkit: tool output ---"


@dataclass(frozen=True)
class LabInfo:
    lab: bool = False
    #: The simulated hardware profile (``mi308x``), None on a plain lab host or a real one.
    profile: str | None = None

    @property
    def simulated(self) -> bool:
        return self.profile is not None


class LabHost(Fact[LabInfo]):
    """What ``/etc/fxkit-lab/host.json`` says; a host without it is not a lab host."""

    cmd = f"cat {LAB_MARKER} 2>/dev/null; true"
    stable = True

    def parse(self, result: RunResult, *args: object) -> LabInfo:
        return parse_marker(result.stdout)


def parse_marker(text: str) -> LabInfo:
    """The marker file's content (empty: not a lab host)."""
    if not text.strip():
        return LabInfo()
    try:
        data = json.loads(text)
        profile = data.get("profile")
        if not isinstance(data.get("lab"), bool) or not isinstance(profile, str | None):
            raise ValueError("wants {'lab': bool, 'profile': str or null}")
    except (ValueError, AttributeError) as exc:
        raise FactError(f"{LAB_MARKER} is not what `fxkit lab up` writes: {exc}") from None
    return LabInfo(data["lab"], profile)


def marked(script: str) -> str:
    """``script`` preceded by the lab marker's content and :data:`SEPARATOR`, in one command."""
    return f"cat {LAB_MARKER} 2>/dev/null; echo; echo {quote(SEPARATOR)}; {script}"


def split_marked(result: RunResult, fact: str) -> tuple[LabInfo, str]:
    """(the lab marker, the script's stdout) of a command made by :func:`marked`."""
    marker, sep, rest = result.stdout.partition(f"{SEPARATOR}\n")
    if not sep:
        raise FactError.from_result(fact, result)
    return parse_marker(marker), rest
