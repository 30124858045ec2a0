"""Connections to hosts: SSH (Fabric/paramiko) and local, behind one interface."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fxkit.connection.base import Connection, RunResult
from fxkit.errors import ConnectionFailed

__all__ = ["ConnectOptions", "Connection", "RunResult", "connect"]

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass
class ConnectOptions:
    """Run-wide connection settings (from the CLI); per-host settings come from host variables."""

    connect_timeout: float = 10.0
    command_timeout: float | None = None
    #: fxkit's own known_hosts file (read, and written when accepting new keys).
    known_hosts: str | None = None
    #: Accept an unknown host key on first use and record it; a changed key is always refused.
    accept_new_host_keys: bool = False
    #: sudo's password for ``become`` (host variables ansible_become_password win); never shown.
    become_password: str | None = field(default=None, repr=False)
    #: Further attempts to connect (with backoff: 0.5 s, 1 s, 2 s...); commands are never retried.
    connect_retries: int = 2
    #: The ssh config file to read instead of ~/.ssh/config and /etc/ssh/ssh_config (``ssh -F``);
    #: ``$FXKIT_SSH_CONFIG`` when not given; ``-F`` in a host's ssh arguments wins.
    ssh_config: str | None = None


def connect(name: str, hostvars: Mapping[str, Any], options: ConnectOptions) -> Connection:
    """Return an unopened connection for inventory host ``name`` with its merged variables.
    A lab rehearsal's inventory (``fxkit_lab_only``) refuses every host that is not a lab host,
    before anything connects: a real node, or this machine."""
    if hostvars.get("fxkit_lab_only") and not hostvars.get("fxkit_lab"):
        raise ConnectionFailed(
            "not a lab host: this run rehearses on the lab (fxkit_lab_only), and the lab has no "
            "host of this name, so fxkit does not connect to its real address",
            where=f"host {name}",
            hint="--limit the run to the lab's hosts (`fxkit lab status`), or add it with "
            "`fxkit lab up --like INVENTORY`",
        )
    kind = hostvars.get("ansible_connection") or ("local" if name in LOCAL_NAMES else "ssh")
    if kind == "local":
        from fxkit.connection.become import become_settings
        from fxkit.connection.local import LocalConnection

        user, password = become_settings(name, hostvars, options.become_password)
        return LocalConnection(name, become_user=user, become_password=password)
    if kind in ("ssh", "paramiko"):
        from fxkit.connection.ssh import SSHConnection

        return SSHConnection(name, hostvars, options)
    raise ConnectionFailed(
        f"unknown connection type {kind!r}",
        where=f"host {name}, variable ansible_connection",
        hint="use 'ssh' or 'local'",
    )
