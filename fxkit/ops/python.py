"""Python virtualenvs with pinned packages, and git checkouts at a pinned commit."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from shlex import quote

from fxkit.facts.python import VenvPackages, canonical_name
from fxkit.ops.base import OpContext, OpError, Result, failed_run, ok

_PIN = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([A-Za-z0-9.+!_-]+))?\s*")
_HEX = re.compile(r"[0-9a-f]{7,40}")


def _pins(packages: Mapping[str, str] | Sequence[str]) -> list[tuple[str, str | None]]:
    if isinstance(packages, Mapping):
        return [(name, str(version) if version else None) for name, version in packages.items()]
    pins = []
    for spec in packages:
        match = _PIN.fullmatch(spec)
        if not match:
            raise OpError(f"bad package pin {spec!r}", hint="write name or name==version")
        pins.append((match[1], match[2]))
    return pins


def virtualenv(
    ctx: OpContext,
    path: str,
    packages: Mapping[str, str] | Sequence[str] = (),
    python: str = "python3",
    pip_args: Sequence[str] = (),
) -> Result:
    """Ensure a virtualenv at ``path`` (made with ``python -m venv``) has the pinned packages:
    ``{"vllm": "0.11.0"}`` or ``["vllm==0.11.0", "lmcache"]`` (a bare name: any version).

    One command reads ``pip list``; one creates the venv and installs only what differs.
    ``pip_args`` go to ``pip install`` (e.g. ``--index-url``).

    Example::

        host.virtualenv("/opt/vllm", {"vllm": "0.20.1+rocm721"}, pip_args=["--index-url", url])
    """
    pins = _pins(packages)
    installed = ctx.fresh(VenvPackages, path)
    have = installed or {}
    todo = [
        (name, version)
        for name, version in pins
        if canonical_name(name) not in have or (version and have[canonical_name(name)] != version)
    ]
    if installed is not None and not todo:
        return ok(f"virtualenv {path} as wanted")
    steps = [] if installed is not None else [f"{quote(python)} -m venv -- {quote(path)}"]
    lines = [] if installed is not None else [f"virtualenv: absent -> {path}"]
    if todo:
        specs = [f"{name}=={version}" if version else name for name, version in todo]
        args = " ".join(quote(a) for a in [*pip_args, *specs])
        steps.append(
            f"{quote(path)}/bin/python -m pip install -q --disable-pip-version-check {args}"
        )
        lines += [f"{n}: {have.get(canonical_name(n), 'absent')} -> {v or 'any'}" for n, v in todo]
    what = ", ".join(lines)
    result = ctx.change(
        " && ".join(steps),
        would=f"change {what}",
        done=f"changed {what}",
        diff="".join(f"{line}\n" for line in lines),
    )
    if result.changed:
        result.data["installed"] = [n for n, _ in todo]
    return result


def git(ctx: OpContext, repo: str, dest: str, version: str) -> Result:
    """Ensure ``dest`` is a checkout of ``repo`` at ``version`` (a commit, tag or branch of
    origin), detached; cloned when missing. ``data`` holds the commits before and after.

    A commit or tag already checked out costs one command (no network); a branch is compared
    with ``git ls-remote``.

    Example::

        host.git("https://github.com/LMCache/LMCache", "/opt/src/lmcache", version="0a1b2c3")
    """
    if not version or version.startswith("-"):
        raise OpError(f"bad git version {version!r} for {dest}")
    local = f"git rev-parse --verify -q {quote(f'refs/tags/{version}^{{commit}}')}"
    if _HEX.fullmatch(version):
        local += f" || git rev-parse --verify -q {quote(f'{version}^{{commit}}')}"
    remote = f"git ls-remote -- origin {quote(f'refs/heads/{version}')} | cut -f1 | grep ."
    state = ctx.read(
        f"cd -- {quote(dest)} 2>/dev/null || {{ echo absent; exit 0; }}; "
        "git rev-parse --verify -q HEAD || echo none; "
        f"{local} || {remote} || echo unknown"
    )
    lines = state.stdout.split()
    if not state.ok or len(lines) < (1 if lines[:1] == ["absent"] else 2):
        return failed_run(f"reading git checkout {dest}", state)
    before = None if lines[0] in ("absent", "none") else lines[0]
    target = lines[1] if len(lines) > 1 and lines[1] != "unknown" else None
    if before and before == target:
        return ok(f"{dest} is at {version} ({before[:12]})", before=before, after=before)
    missing = quote(f"{version}: no such commit, tag or branch in {repo}")
    resolve = (
        f"c=$(git rev-parse --verify -q {quote(f'origin/{version}^{{commit}}')} "
        f"|| git rev-parse --verify -q {quote(f'{version}^{{commit}}')}) "
        f'|| {{ echo {missing} >&2; exit 1; }}; git checkout -q --detach "$c" && echo "$c"'
    )
    fetch = f"cd -- {quote(dest)} && git fetch -q --tags origin"
    if lines[0] == "absent":
        fetch = f"git clone -q --no-checkout -- {quote(repo)} {quote(dest)} && cd -- {quote(dest)}"
    result = ctx.change(
        f"{fetch} && {resolve}",
        would=f"check out {version} in {dest}",
        done=f"checked out {version} in {dest}",
        diff=f"commit: {before or 'absent'} -> {version}\n",
    )
    result.data["before"] = before
    if result.changed and "stdout" in result.data:
        result.data["after"] = after = result.data["stdout"].split()[-1]
        result.msg += f" ({after[:12]})"
        if result.diff:
            result.diff = f"commit: {before or 'absent'} -> {after}\n"
    return result
