"""SSH host key verification: known_hosts files, and the policy for keys not found there.

Keys are looked up in the system and user known_hosts files, the files a host's variables name
(``-o UserKnownHostsFile=...``) and fxkit's own file. An unknown key is refused unless the run
accepts new keys, which are then recorded in fxkit's own file. A key that differs from the
recorded one is always refused (paramiko raises BadHostKeyException before any policy runs).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import paramiko

from fxkit.errors import HostKeyError

SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "~/.ssh/known_hosts")
#: Serialises appends to fxkit's known_hosts file: many hosts connect at once.
_record_lock = threading.Lock()


def default_known_hosts() -> Path:
    """fxkit's own known_hosts file: ``$FXKIT_KNOWN_HOSTS`` or ~/.config/fxkit/known_hosts."""
    configured = os.environ.get("FXKIT_KNOWN_HOSTS")
    if configured:
        return Path(configured).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(config_home, "fxkit", "known_hosts").expanduser()


def fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as OpenSSH prints it: ``SHA256:...``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_host_name(address: str, port: int) -> str:
    """How known_hosts names ``address``: bare on port 22, ``[address]:port`` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


#: Parsed known_hosts files, by the files' paths and identities (inode, size, mtime): one
#: parse per process, not one per host (paramiko's parse is quadratic in the file's lines; at 128
#: lab hosts it took 14 ms per host).
_parsed: dict[tuple[tuple[str, int, int, int], ...], paramiko.HostKeys] = {}
_parsed_lock = threading.Lock()


def load_known_hosts(client: paramiko.SSHClient, extra_files: Iterable[str | Path]) -> None:
    """Give ``client`` every known_hosts file that exists (read-only: paramiko never saves).
    Clients given the same unchanged files share one parse of them, which paramiko only reads."""
    found = []
    for path in (*SYSTEM_KNOWN_HOSTS, *extra_files):
        path = Path(path).expanduser()
        try:
            info = path.stat()
        except OSError:
            continue
        if path.is_file():
            found.append((str(path), info.st_ino, info.st_size, info.st_mtime_ns))
    identity = tuple(found)
    with _parsed_lock:
        keys = _parsed.get(identity)
        if keys is None:
            keys = paramiko.HostKeys()
            for path_name, *_ in found:
                try:
                    keys.load(path_name)
                except (OSError, paramiko.SSHException) as exc:
                    raise HostKeyError(
                        f"cannot read known_hosts file: {exc}", where=path_name
                    ) from None
            _parsed.clear()  # only the latest set of files is kept
            _parsed[identity] = keys
    # SSHClient keeps the keys of load_system_host_keys() here and only looks them up.
    client._system_host_keys = keys  # type: ignore[attr-defined]


class RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    """The default: a host whose key is in no known_hosts file is refused."""

    def __init__(self, own_file: Path):
        self.own_file = own_file

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        address, _, port = hostname.removeprefix("[").partition("]:")
        keyscan = f"ssh-keyscan -t {key.get_name()} -p {port or 22} {address}"
        raise HostKeyError(
            f"unknown {key.get_name()} host key {fingerprint(key)} for {hostname}",
            where=f"host {hostname}",
            hint=(
                "check the fingerprint with the host's administrator, then add the key with "
                f"`{keyscan} >> {self.own_file}` (or to ~/.ssh/known_hosts), or run with "
                "--accept-new-host-keys to record keys of new hosts on first use"
            ),
        )


class AcceptNewKey(paramiko.MissingHostKeyPolicy):
    """Trust on first use: record an unknown key in fxkit's own known_hosts file and go on."""

    def __init__(self, own_file: Path):
        self.own_file = own_file

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _record_lock:
            self.own_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.own_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(line)


def changed_key_error(
    hostname: str, exc: paramiko.BadHostKeyException, files: list[str]
) -> HostKeyError:
    """The error for a host whose key differs from the recorded one: never accepted."""
    return HostKeyError(
        f"the host key of {hostname} CHANGED: it offers {exc.key.get_name()} "
        f"{fingerprint(exc.key)}, known_hosts records {fingerprint(exc.expected_key)}; "
        "this can mean someone is intercepting the connection",
        where=f"host {hostname}",
        hint=(
            "if the host was really reinstalled, remove its old line from the known_hosts file "
            f"that has it ({', '.join(files)}) after checking the new fingerprint"
        ),
    )
