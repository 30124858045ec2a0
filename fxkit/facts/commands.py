"""The output of a command, as a fact: it runs in check mode too, so a role can read what a tool
reports (``amd-smi static --json``, ``nvme list -o json``, ``rdma -j link``) and decide from it.

The command must only read: facts never change a host. Its output is cached like any fact, until
an operation changes the host.
"""

from __future__ import annotations

import json
from typing import Any

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError


class CommandOutput(Fact[RunResult]):
    """A read-only command's :class:`RunResult` (rc, stdout, stderr); a non-zero rc is data here,
    not an error::

        found = host.fact(CommandOutput, "command -v amd-smi")
        if found.ok: ...
    """

    def command(self, cmd: str) -> str:
        return cmd

    def parse(self, result: RunResult, cmd: str) -> RunResult:
        return result


class CommandJSON(Fact[Any]):
    """A read-only command's stdout parsed as JSON (a dict or a list, as the tool prints it)::

        gpus = host.fact(CommandJSON, "amd-smi list --json")

    A non-zero exit, or output that is not JSON, is a :class:`FactError` naming the command.
    """

    def command(self, cmd: str) -> str:
        return cmd

    def parse(self, result: RunResult, cmd: str) -> Any:
        if not result.ok:
            raise FactError.from_result(f"`{cmd}`", result)
        try:
            return json.loads(result.stdout)
        except ValueError as exc:
            start = result.stdout.strip()[:80]
            raise FactError(
                f"`{cmd}` did not print JSON ({exc}); it printed: {start!r}",
                hint="give the tool's JSON option (--json, -o json, -j)",
            ) from None
