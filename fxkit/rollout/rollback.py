"""Rolling a failed batch back: each instance started again exactly as it ran before.

Before a batch replaces an instance, its command line and environment are read from its
running process (``/proc/PID/cmdline`` and ``environ``, whole, as base64): that is the previous
revision, ``FXKIT_REVISION`` included. Rolling back restarts the instance with them through the
same instance operations the roles use (:func:`fxkit.ops.instances.instance`, then
:func:`~fxkit.ops.instances.instance_ready`), so it is recorded as any start is.

Under systemd the unit runs the instance, from its files: the batch rewrites them, so the run
also keeps them (:attr:`Previous.files`): the instance's environment file (the one systemd
reads, ``EnvironmentFiles``) and its unit's text, from its revision's record on the host
(``<folder>/<revision>.json``, ``inputs.unit``: the text the role wrote for that revision).
Rolling back writes both back, the unit as the instance's own unit file
(``/etc/systemd/system/<unit>``, which systemd prefers to the template for that instance:
systemd.unit(5)), reloads systemd and restarts the unit.

Each run so read is also kept beside its revision's record (``<folder>/<revision>.run/
<instance>.json``, 0600: the environment holds secrets, as the instance's own files do), for
``fxkit rollout undo``; pruning a revision removes them with it.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass, field, replace
from shlex import quote

from fxkit.connection import Connection
from fxkit.engine.runner import shielded
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, Result, failed
from fxkit.ops.instances import PATH, STATE_DIR, Record, instance, instance_ready
from fxkit.ops.systemd import UNIT_DIR, systemd_missing
from fxkit.rollout.revision import ENV_VAR


@dataclass(frozen=True)
class Previous:
    """How an instance ran before its batch."""

    argv: list[str]
    env: dict[str, str]
    #: Under systemd, the files that made the run, path -> text: its environment file and its
    #: own unit file (its revision's unit text); written back before a restart.
    files: dict[str, str] = field(default_factory=dict)

    @property
    def revision(self) -> str:
        return self.env.get(ENV_VAR, "")


def _words(encoded: str) -> list[str]:
    raw = base64.b64decode(encoded, validate=True)
    return [w.decode(errors="surrogateescape") for w in raw.split(b"\0") if w]


def capture(conn: Connection, become: bool, unit: str, folder: str = "") -> Previous | None:
    """The running instance's command line and environment (and under systemd its files, the
    unit's text read from its revision's record in ``folder``); None when it does not run."""
    record = Record.parse(conn.get(f"{STATE_DIR}/{unit}.json", become=become))
    if record is None:
        return None
    q, pid = quote(unit), f"{record.pid}"
    systemd = record.backend == "systemd"
    if systemd:  # the unit's main process and the environment file it was started with
        pid = f"$(systemctl show -p MainPID --value -- {q})"
    elif not record.pid:
        return None
    out = conn.run(
        f'p={pid}; [ "${{p:-0}}" != 0 ] && base64 -w0 /proc/$p/cmdline && echo && '
        "base64 -w0 /proc/$p/environ && echo"
        + (f" && systemctl show -p EnvironmentFiles --value -- {q}" if systemd else ""),
        become=become,
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
    if not argv:
        return None
    files = {}
    if systemd:
        env_file = lines[2].split(" (")[0].strip() if len(lines) > 2 else ""
        text = conn.get(env_file, become=become) if env_file else None
        if text is not None:
            files[env_file] = text.decode(errors="surrogateescape")
        unit_text = _unit_text(conn, become, folder, env.get(ENV_VAR, ""))
        if unit_text:
            files[f"{UNIT_DIR}/{unit}"] = unit_text
    return Previous(argv, env, files)


def _unit_text(conn: Connection, become: bool, folder: str, revision: str) -> str:
    """The unit text revision ``revision``'s record keeps ("" where there is none)."""
    if not folder or not revision:
        return ""
    try:
        record = json.loads(conn.get(f"{folder}/{revision}.json", become=become) or b"")
        text = record["inputs"]["unit"]
    except (ValueError, KeyError, TypeError):
        return ""
    return text if isinstance(text, str) else ""


def restore(
    conn: Connection,
    become: bool,
    unit: str,
    previous: Previous,
    ready_url: str,
    served_name: str,
    timeout: float,
) -> Result:
    """Start ``unit`` again as ``previous`` ran it (under systemd: its files written back and
    systemd reloaded first), and wait until it serves."""
    ctx = OpContext(conn=conn, facts=FactCache(conn), check=False, diff=False, become=become)
    if not systemd_missing(ctx):
        if f"{UNIT_DIR}/{unit}" not in previous.files or len(previous.files) < 2:
            return failed(
                f"{unit} runs under systemd, and its run of {previous.revision or 'before'} "
                "kept no unit text and environment file to restore (kept by an earlier fxkit, "
                "or its revision's record is gone)"
            )
        problem = _write_files(conn, become, previous.files)
        if problem:
            return failed(f"{unit}: cannot write its files back: {problem}")
    with shielded():  # never a restart cut in half: the old process stopped, the new unrecorded
        started = instance(ctx, unit, previous.argv, previous.env, state="restarted")
    if started.failed:
        return started
    return instance_ready(ctx, unit, ready_url, served_name, timeout=timeout)


def _write_files(conn: Connection, become: bool, files: dict[str, str]) -> str:
    """Write each file whole (a temp file, renamed; the text on stdin, never in a command
    line): a unit 0644, anything else 0600 (an environment file holds secrets); then reload
    systemd. What went wrong ("": nothing)."""
    for path, text in files.items():
        q = quote(path)
        mode = "0644" if path.startswith(f"{UNIT_DIR}/") else "0600"
        done = conn.run(
            f"(umask 077 && cat > {q}.tmp) && chmod {mode} -- {q}.tmp && mv -f -- {q}.tmp {q}",
            become=become,
            stdin=text.encode(errors="surrogateescape"),
        )
        if not done.ok:
            return f"{path}: {done.stderr.strip()}"
    reloaded = conn.run("systemctl daemon-reload", become=become)
    return "" if reloaded.ok else f"systemctl daemon-reload: {reloaded.stderr.strip()}"


def moved(run: Previous, unit: str, env_file: str) -> Previous:
    """``run`` (the command line and environment of another instance ``unit``, a surge copy of
    an earlier revision, with the files of the instance it copies) with those files made the
    copy's: under systemd the unit text as ``unit``'s own file, the environment file at
    ``env_file``, each name it sets given ``run.env``'s value (:func:`env_assignment`)."""
    if not run.files:
        return run
    files = {}
    for path, text in run.files.items():
        if path.startswith(f"{UNIT_DIR}/"):
            files[f"{UNIT_DIR}/{unit}"] = text
            continue
        lines = []
        for line in text.splitlines(keepends=True):
            name = line.partition("=")[0].strip()
            value = run.env.get(name)
            if line.lstrip().startswith("#") or "=" not in line or value is None:
                lines.append(line)
            else:
                lines.append(env_assignment(name, value))
        files[env_file] = "".join(lines)
    return replace(run, files=files)


def env_assignment(name: str, value: str) -> str:
    """One line of an EnvironmentFile that systemd reads back as ``value`` (systemd.exec(5)):
    single-quoted, nothing expanded; a value holding a single quote double-quoted instead, with
    a backslash before each double quote, backslash, backtick and dollar sign (the escapes
    systemd undoes there)."""
    if "'" not in value:
        return f"{name}='{value}'\n"
    escaped = "".join("\\" + c if c in '"\\`$' else c for c in value)
    return f'{name}="{escaped}"\n'


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
        return Previous(list(data["argv"]), dict(data["env"]), dict(data.get("files", {})))
    except (ValueError, KeyError, TypeError):
        return None
