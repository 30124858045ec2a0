"""The capabilities the host's commands run with: what a container or a lab host withholds."""

from __future__ import annotations

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError

#: Bit number of CAP_SYS_ADMIN in capabilities(7) (mount, umount).
CAP_SYS_ADMIN = 21


class Capabilities(Fact[frozenset[int]]):
    """The effective capability bits of a command run on the host (``CapEff`` in
    ``/proc/self/status``, proc(5)); with ``become`` those of root's commands."""

    stable = True
    cmd = "grep '^CapEff:' /proc/self/status"

    def parse(self, result: RunResult) -> frozenset[int]:
        _, _, mask = result.stdout.partition(":")
        try:
            bits = int(mask.strip(), 16)
        except ValueError:
            raise FactError.from_result("capabilities", result) from None
        return frozenset(n for n in range(bits.bit_length()) if bits >> n & 1)
