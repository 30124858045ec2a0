"""Rolling a failed batch back: each instance started again exactly as it ran before.

Before a batch replaces an instance, its command line and environment are read from its
running process (``/proc/PID/cmdline`` and ``environ``, whole, as base64): that is the previous
revision, ``FXKIT_REVISION`` included. Rolling back restarts the instance with them through the
same instance operations the roles use (:func:`fxkit.ops.instances.instance`, then
:func:`~fxkit.ops.instances.instance_ready`), so it is recorded as any start is.

Each run so read is also kept beside its revision's record (``<folder>/<revision>.run/
<instance>.json``, 0600: the environment holds secrets, as the instance's own files do), for
``fxkit rollout undo``; pruning a revision removes them with it.

Only an instance started directly (no systemd on the host: the lab, containers) can be rolled
back so: under systemd the unit and its environment file were rewritten by the batch, and
restoring them is not done yet; such an instance is reported as not rolled back.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass
from shlex import quote

from fxkit.connection import Connection
from fxkit.engine.runner import shielded
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, Result
from fxkit.ops.instances import PATH, STATE_DIR, Record, instance, instance_ready
from fxkit.rollout.revision import ENV_VAR


@dataclass(frozen=True)
class Previous:
    """How an instance ran before its batch."""

    argv: list[str]
    env: dict[str, str]

    @property
    def revision(self) -> str:
        return self.env.get(ENV_VAR, "")


def _words(encoded: str) -> list[str]:
    raw = base64.b64decode(encoded, validate=True)
    return [w.decode(errors="surrogateescape") for w in raw.split(b"\0") if w]


def capture(conn: Connection, become: bool, unit: str) -> Previous | None:
    """The running instance's command line and environment; None when it does not run, or
    runs under systemd (see the module's docstring)."""
    record = Record.parse(conn.get(f"{STATE_DIR}/{unit}.json", become=become))
    if record is None or record.backend != "direct" or not record.pid:
        return None
    proc = f"/proc/{record.pid}"
    out = conn.run(
        f"base64 -w0 {proc}/cmdline && echo && base64 -w0 {proc}/environ && echo", become=become
    )
    lines = out.stdout.split("\n")
    if not out.ok or len(lines) < 2:
        return None
    try:
        argv, pairs = _words(lines[0]), _words(lines[1])
    except (binascii.Error, ValueError):
        return None
    env = dict(pair.partition("=")[::2] for pair in pairs)
    if env.get("PATH") == PATH:  # what a direct start adds itself
        del env["PATH"]
    return Previous(argv, env) if argv else None


def restore(
    conn: Connection,
    become: bool,
    unit: str,
    previous: Previous,
    ready_url: str,
    served_name: str,
    timeout: float,
) -> Result:
    """Start ``unit`` again as ``previous`` ran it, and wait until it serves."""
    ctx = OpContext(conn=conn, facts=FactCache(conn), check=False, diff=False, become=become)
    with shielded():  # never a restart cut in half: the old process stopped, the new unrecorded
        started = instance(ctx, unit, previous.argv, previous.env, state="restarted")
    if started.failed:
        return started
    return instance_ready(ctx, unit, ready_url, served_name, timeout=timeout)


def run_path(folder: str, revision: str, name: str) -> str:
    """Where a revision's run of instance ``name`` is kept."""
    return f"{folder}/{revision}.run/{name}.json"


def keep(conn: Connection, become: bool, folder: str, name: str, previous: Previous) -> None:
    """Keep ``previous`` as its revision's run of instance ``name`` (nothing without one)."""
    if not previous.revision:
        return
    path = quote(run_path(folder, previous.revision, name))
    conn.run(
        f"mkdir -p -- $(dirname {path}) && (umask 077 && cat > {path}.tmp) && "
        f"mv -f -- {path}.tmp {path}",
        become=become,
        stdin=json.dumps(asdict(previous)).encode(),
    )


def load(conn: Connection, become: bool, folder: str, revision: str, name: str) -> Previous | None:
    """A revision's kept run of instance ``name``; None when the host keeps none."""
    raw = conn.get(run_path(folder, revision, name), become=become)
    try:
        data = json.loads(raw or b"")
        return Previous(list(data["argv"]), dict(data["env"]))
    except (ValueError, KeyError, TypeError):
        return None
