"""A lab host where systemd runs: a Debian tree booted by ``systemd-nspawn``, systemd its PID 1.

The lab fleet's hosts (fxkit.lab) have no init, so the systemd paths of fxkit (units, instances,
rollback under systemd) need a host of their own. This one is:

- a Debian tree of this machine's release (``debootstrap --variant=minbase`` with systemd,
  dbus, openssh-server, python3 and its venv module, procps), made once under
  ``.cache/systemd-lab/`` and reused (made again when that list changes);
- booted with ``systemd-nspawn --ephemeral`` (a throwaway copy: nothing a test writes stays),
  ``--private-network`` (a loopback interface only: the host reaches nothing outside) and
  ``--register=no --keep-unit`` (no systemd runs on this machine to register with), in a cgroup
  of its own made for it and removed after;
- reached as the lab's hosts are: a relay (``socat``) on a 127.x address of this machine
  connects each client to sshd inside the container's network namespace; the host key and the
  client key are made per host and verified (known_hosts).

Tests are skipped, with the reason, where this cannot run: not root, no ``systemd-nspawn`` or
``debootstrap`` (Debian: systemd-container, debootstrap; scripts/install-system-deps.sh), or no
Debian mirror to make the tree from.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from fxkit.connection import ConnectOptions
from fxkit.connection.ssh import SSHConnection

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "systemd-lab"
MIRROR = "http://deb.debian.org/debian"
#: python3-venv: the serving role makes its virtualenvs there; procps: ps, for the rollout.
PACKAGES = "systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,procps"
#: Inside the tree: where the per-host keys are bound (read-only).
KEYS = "/etc/fxkit-lab"
SSHD = f"""# fxkit's systemd lab host (tests/systemd_host.py)
HostKey {KEYS}/ssh_host_ed25519_key
AuthorizedKeysFile {KEYS}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""
#: Units a test host does not need (consoles, timers of apt and logs).
MASKED = (
    "getty@.service", "console-getty.service", "apt-daily.timer", "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer", "e2scrub_all.timer", "fstrim.timer", "systemd-tmpfiles-clean.timer",
)  # fmt: skip


class Unavailable(Exception):
    """A systemd host cannot run on this machine (the reason is the message)."""


def missing() -> str | None:
    """Why a systemd host cannot run here; None when it can."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn)"
    for tool, package in (("systemd-nspawn", "systemd-container"), ("debootstrap", "debootstrap"),
                          ("socat", "socat"), ("nsenter", "util-linux")):  # fmt: skip
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install {package})"
    if not _cgroup_roots():
        return "no cgroup hierarchy to give the container a cgroup of its own"
    return None


def _codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.partition("=")[2].strip('"')
    return "bookworm"


def tree(cache: Path = CACHE) -> Path:
    """The Debian tree, made once (``debootstrap``, about a minute) and reused."""
    root = cache / "root"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = root / ".fxkit-ready"
        if ready.exists() and ready.read_text() == PACKAGES:
            return root
        making = cache / "root.tmp"
        shutil.rmtree(making, ignore_errors=True)
        try:
            made = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", _codename(),
                 str(making), MIRROR],
                capture_output=True, text=True, timeout=480,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(making, ignore_errors=True)
            raise Unavailable(f"debootstrap from {MIRROR} took over {exc.timeout:.0f} s") from exc
        if made.returncode != 0:
            shutil.rmtree(making, ignore_errors=True)
            tail = (made.stdout + made.stderr).strip().splitlines()[-3:]
            raise Unavailable(f"debootstrap from {MIRROR} failed: {' | '.join(tail)}")
        (making / KEYS.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (making / "etc/ssh/sshd_config.d/fxkit-lab.conf").write_text(SSHD)
        (making / "etc/hostname").write_text("fxkit-systemd\n")
        for unit in MASKED:
            link = making / "etc/systemd/system" / unit
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")
        (making / ".fxkit-ready").write_text(PACKAGES)
        shutil.rmtree(root, ignore_errors=True)
        making.rename(root)
    return root


def _cgroup_roots() -> list[Path]:
    """The hierarchies a process is placed in: systemd's named v1 one and the unified one
    (hybrid), or the unified one alone."""
    hybrid = [Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified")]
    found = [p for p in hybrid if (p / "cgroup.procs").exists()]
    if found:
        return found
    return [Path("/sys/fs/cgroup")] if Path("/sys/fs/cgroup/cgroup.procs").exists() else []


def _keygen(path: Path) -> str:
    """An Ed25519 key pair at ``path`` (and ``.pub``); its public line."""
    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    path.chmod(0o600)
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    Path(f"{path}.pub").write_text(f"{public}\n")
    return public


class SystemdHost:
    """One booted container; :meth:`up`, :meth:`connect`, :meth:`down`."""

    def __init__(self, folder: Path, address: str, name: str = "fxkit-systemd") -> None:
        self.folder, self.address, self.name = folder, address, name
        self.keys = folder / "keys"
        self.client_key = folder / "client_key"
        self.known_hosts = folder / "known_hosts"
        self.log = folder / "nspawn.log"
        self.cgroups = [root / f"fxkit-{name}-{os.getpid()}" for root in _cgroup_roots()]
        self.nspawn: subprocess.Popen[bytes] | None = None
        self.relay: subprocess.Popen[bytes] | None = None

    def up(self, timeout: float = 90.0) -> None:
        """Boot the container and wait until its sshd takes a login."""
        root = tree()
        self.keys.mkdir(parents=True, exist_ok=True)
        host_key = _keygen(self.keys / "ssh_host_ed25519_key")
        (self.keys / "authorized_keys").write_text(_keygen(self.client_key) + "\n")
        self.known_hosts.write_text(f"{self.address} {host_key}\n")
        for cgroup in self.cgroups:
            cgroup.mkdir(exist_ok=True)
        join = "; ".join(f"echo $$ > {c}/cgroup.procs" for c in self.cgroups)
        argv = [
            "systemd-nspawn", "-D", str(root), "--ephemeral", "-b", "--register=no",
            "--keep-unit", "--private-network", "-M", self.name, "--console=read-only",
            f"--bind-ro={self.keys}:{KEYS}",
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.nspawn = subprocess.Popen(
                ["sh", "-c", f'{join}; exec "$@"', "sh", *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        init = self._init(timeout)
        inside = f"nsenter --net=/proc/{init}/ns/net socat STDIO TCP:127.0.0.1:22"
        self.relay = subprocess.Popen(
            ["socat", f"TCP-LISTEN:22,bind={self.address},reuseaddr,fork",
             f'EXEC:"{inside}",nofork'],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self._wait_for_login(timeout)

    def _init(self, timeout: float) -> int:
        """The container's PID 1 (systemd), a child of systemd-nspawn."""
        assert self.nspawn is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise Unavailable(f"systemd-nspawn exited: {self._log_tail()}")
            children = Path(f"/proc/{self.nspawn.pid}/task/{self.nspawn.pid}/children")
            with contextlib.suppress(OSError):
                for pid in children.read_text().split():
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                        return int(pid)
            time.sleep(0.05)
        raise Unavailable(f"no systemd in the container after {timeout:.0f} s: {self._log_tail()}")

    def _wait_for_login(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, 22), timeout=2) as sock:
                    if sock.recv(4).startswith(b"SSH-"):
                        with self.connect() as conn:
                            if conn.run("systemctl is-system-running --wait").stdout.strip():
                                return
            except Exception as exc:  # booting: try again
                error = exc
            time.sleep(0.2)
        raise Unavailable(f"no login after {timeout:.0f} s ({error}): {self._log_tail()}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-4:])
        return "(no log)"

    def hostvars(self) -> dict[str, object]:
        return {
            "ansible_host": self.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.client_key),
        }

    def connect(self) -> SSHConnection:
        """An (unopened) SSH connection to the host, its key verified."""
        return SSHConnection(
            "systemd-host", self.hostvars(), ConnectOptions(known_hosts=str(self.known_hosts))
        )

    def down(self) -> None:
        """Stop the relay (its whole session: each connection is a process of it), power the
        container off (SIGTERM: a clean shutdown; SIGKILL after 90 s), kill what is left in
        its cgroups and remove them."""
        for proc, grace in ((self.relay, 2.0), (self.nspawn, 90.0)):
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for cgroup in self.cgroups:
            if not cgroup.is_dir():
                continue
            folders = [p for p in cgroup.rglob("*") if p.is_dir()]
            for folder in sorted([cgroup, *folders], key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError, ValueError):
                    for pid in (folder / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                for _ in range(50):  # the killed leave their cgroup as they are reaped
                    try:
                        folder.rmdir()
                        break
                    except OSError:
                        time.sleep(0.02)
