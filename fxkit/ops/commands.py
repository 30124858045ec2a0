"""Arbitrary shell commands, with the guards that make them idempotent."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.ops.base import OpContext, OpError, Result, Status, changed, failed_run, ok

ChangedWhen = bool | Callable[[RunResult], bool] | None

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def command(
    ctx: OpContext,
    cmd: str,
    creates: str | None = None,
    removes: str | None = None,
    changed_when: ChangedWhen = None,
    chdir: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> Result:
    """Run ``cmd`` with ``sh -c``.

    A bare command always reports *changed*, as in Ansible: guard it so a second run reports ok.
    ``creates``: skip when this path exists; ``removes``: skip when it does not; ``changed_when``:
    a bool, or a function of the :class:`RunResult` that decides. The guard and the command run in
    one round trip. Check mode runs only the guard. ``data`` holds ``rc``, ``stdout``, ``stderr``;
    rc != 0 fails with the tail of stderr.
    """
    guard = _guard(creates, removes)
    if ctx.check:
        if guard and ctx.run(guard).rc == 0:
            return ok(_skip_reason(creates, removes))
        return changed(f"would run: {cmd}")
    token = f"FXKIT-GUARD-{secrets.token_hex(8)}"
    script = _script(cmd, chdir, env)
    if guard:
        script = f"if {guard}; then echo {token}; exit 0; fi; {script}"
    result = ctx.run(script, timeout=timeout)
    if guard and result.ok and result.stdout.strip() == token:
        return ok(_skip_reason(creates, removes))
    data = {"rc": result.rc, "stdout": result.stdout, "stderr": result.stderr}
    if not result.ok:
        return failed_run(f"command {cmd!r}", result)
    did_change = changed_when(result) if callable(changed_when) else changed_when
    status = Status.OK if did_change is False else Status.CHANGED
    return Result(status, f"ran: {cmd}", data=data)


def _guard(creates: str | None, removes: str | None) -> str:
    """A shell test that is true when the command must NOT run."""
    tests = []
    if creates is not None:
        tests.append(f"[ -e {quote(creates)} ]")
    if removes is not None:
        tests.append(f"[ ! -e {quote(removes)} ]")
    return " || ".join(tests)


def _skip_reason(creates: str | None, removes: str | None) -> str:
    return f"{creates} exists" if creates is not None else f"{removes} does not exist"


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
