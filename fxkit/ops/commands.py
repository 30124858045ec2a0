"""Arbitrary shell commands, with the guards that make them idempotent."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.ops.base import OpContext, OpError, Result, Status, ok

ChangedWhen = bool | Callable[[RunResult], bool] | None

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def command(
    ctx: OpContext,
    cmd: str,
    creates: str | None = None,
    removes: str | None = None,
    unless: str | None = None,
    only_if: str | None = None,
    changed_when: ChangedWhen = None,
    chdir: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> Result:
    """Run ``cmd`` with ``sh -c``; a bare command always reports *changed*, as in Ansible.

    Guards make a second run report ok: ``creates`` skips when this path exists, ``removes``
    when it does not; ``unless`` skips when that command succeeds, ``only_if`` unless it does.
    ``changed_when`` (a bool, or a function of the :class:`RunResult`) decides what a run that
    went through reports. Guards and command run in one round trip; check mode runs the guards
    only (they must change nothing). ``creates`` and ``removes`` are looked up first without a
    command where the connection can (the host-side helper, SFTP): a command they skip costs
    no process on the host. ``data`` holds ``rc``, ``stdout``, ``stderr``; rc != 0
    fails with the tail of stderr. To read a command's output, also in check mode, use the
    facts :class:`~fxkit.facts.CommandOutput` and :class:`~fxkit.facts.CommandJSON`.

    Example::

        host.command("nvme connect-all", unless="nvme list | grep -q FX100")
    """
    token = f"FXKIT-GUARD-{secrets.token_hex(8)}"
    given = {"creates": creates, "removes": removes, "unless": unless, "only_if": only_if}
    guards = {name: value for name, value in given.items() if value is not None}
    for name, holds in (("creates", True), ("removes", False)):
        path = guards.get(name)
        if path is not None and ctx.exists(path) is holds:  # no command needed to skip
            return ok(_GUARDS[name][1].format(path))
    test = _guard_script(token, guards)
    if ctx.check and guards:
        skip = _skipped_by(ctx.read(f"{test}exit 0").stdout, token, guards)
        if skip:
            return ok(skip)
    script = f"{test}{_script(cmd, chdir, env)}"
    result = ctx.change(script, would=f"run: {cmd}", done=f"ran: {cmd}", timeout=timeout)
    if not result.changed or ctx.check:
        return result
    skip = _skipped_by(result.data["stdout"], token, guards)
    if skip:
        return ok(skip)
    outcome = RunResult(cmd, result.data["rc"], result.data["stdout"], result.data["stderr"])
    if changed_when is False or (callable(changed_when) and not changed_when(outcome)):
        result.status = Status.OK
    return result


#: guard -> (shell test that is true when the command must not run, why it did not run)
_GUARDS = {
    "creates": ("[ -e {} ]", "{} exists"),
    "removes": ("[ ! -e {} ]", "{} does not exist"),
    "unless": ("sh -c {} >/dev/null 2>&1", "unless: `{}` succeeded"),
    "only_if": ("! sh -c {} >/dev/null 2>&1", "only_if: `{}` failed"),
}


def _guard_script(token: str, guards: Mapping[str, str]) -> str:
    """Shell lines that print ``token`` and the guard's name, then exit, when a guard holds."""
    return "".join(
        f"if {_GUARDS[name][0].format(quote(value))}; then echo {token} {name}; exit 0; fi; "
        for name, value in guards.items()
    )


def _skipped_by(stdout: str, token: str, guards: Mapping[str, str]) -> str:
    """Why a guard stopped the command ("" when none did)."""
    lines = stdout.strip().splitlines()
    last = lines[-1].split() if lines else []
    if len(last) != 2 or last[0] != token or last[1] not in guards:
        return ""
    return _GUARDS[last[1]][1].format(guards[last[1]])


def _script(cmd: str, chdir: str | None, env: Mapping[str, str] | None) -> str:
    parts = []
    if chdir is not None:
        parts.append(f"cd -- {quote(chdir)} &&")
    for name, value in (env or {}).items():
        if not _ENV_NAME.fullmatch(name):
            raise OpError(f"bad environment variable name {name!r} for command {cmd!r}")
        parts.append(f"{name}={quote(str(value))}")
    parts.append(f"sh -c {quote(cmd)}")
    return " ".join(parts)
