"""The lab fleet: real, isolated SSH hosts on this machine, started and stopped by PID.

Each host is ``host-init.sh`` (see there, and docs/lab.md): its own user, PID, network, IPC, UTS,
cgroup and mount namespaces, a root file system of its own (overlays over /usr and over the
fleet's sanitised /etc and /var in ``base/``, see :mod:`fxkit.lab.base`), and a real sshd as PID 1
that listens in the host's network namespace. A relay (``socat``) on the host's loopback address
outside forwards each connection into that namespace: the controller reaches the host, the host
reaches nothing outside. The fleet's state directory holds the client key, ``base/``, one folder
per host (host key, logs), the inventory, the known_hosts file and ``lab.json`` (addresses and the
PIDs ``lab up`` started: hosts and relays).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from fxkit.connection import Connection, ConnectOptions
from fxkit.errors import ConnectionFailed, FxkitError
from fxkit.lab import base, hostfs, resources
from fxkit.lab import profile as profiles

DIR_ENV, PREFIX_ENV, PORT_ENV = "FXKIT_LAB_DIR", "FXKIT_LAB_PREFIX", "FXKIT_LAB_PORT"
DEFAULT_DIR, DEFAULT_PREFIX, DEFAULT_PORT = ".lab", "127.77.0", 22
INIT_SCRIPT = Path(__file__).with_name("host-init.sh")
#: Where sshd logs, inside a host (relative to its root).
SSHD_LOG = "var/log/sshd.log"
#: The non-root user every lab host gets when sudo is installed (for trying ``become``).
SUDO_USER = "fxkit"
MAX_HOSTS = 254
#: What a host's start needs on this machine, and the Debian package that has it.
TOOLS = {
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "nsenter": "util-linux",
    "pivot_root": "util-linux",
    "newuidmap": "uidmap",
    "newgidmap": "uidmap",
    "socat": "socat",
    "keyctl": "keyutils",
    "ip": "iproute2",
}
_YAMLDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class LabError(FxkitError):
    """The lab fleet cannot be started, inspected or stopped."""


class AddressInUse(LabError):
    """Something already listens on a lab host's address and port."""


@dataclass(frozen=True)
class HostStatus:
    """One lab host as ``lab status`` shows it."""

    name: str
    address: str
    port: int
    pid: int | None
    up: bool
    memory_bytes: int
    #: What its cgroups count now (``memory`` in bytes, ``pids``); empty without cgroups.
    used: dict[str, int]


def host_name(index: int) -> str:
    return f"lab{index:02d}"


def check_name(name: str) -> None:
    """Refuse a host name that cannot be a lab host's hostname and folder."""
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", name):
        raise LabError(
            f"{name!r} cannot be a lab host's name (letters, digits and '-', at most 63)",
            where=f"host {name}",
            hint="a host named like an address or with dots is left out with --limit",
        )


class Fleet:
    """A lab fleet kept in ``state_dir``; ``prefix`` (three octets of 127/8) and ``port`` pick
    the addresses. Both default to what the state directory recorded, then to 127.77.0 and 22."""

    def __init__(
        self, state_dir: str | os.PathLike, prefix: str | None = None, port: int | None = None
    ):
        self.dir = Path(state_dir).resolve()
        self.state_file = self.dir / "lab.json"
        self.inventory = self.dir / "inventory.yml"
        self.known_hosts = self.dir / "known_hosts"
        self.client_key = self.dir / "id_ed25519"
        self.become_password_file = self.dir / "become-password"
        state = self._load_state()
        self.prefix = _check_prefix(prefix or state.get("prefix") or DEFAULT_PREFIX)
        self.port = int(port or state.get("port") or DEFAULT_PORT)
        if state and (self.prefix, self.port) != (state["prefix"], state["port"]):
            raise LabError(
                f"this fleet runs on {state['prefix']}.x port {state['port']}, "
                f"not {self.prefix}.x port {self.port}",
                where=str(self.dir),
                hint="run `fxkit lab down` first, or use another --dir for a second fleet",
            )
        self.hosts: dict[str, dict] = state.get("hosts", {})
        #: The simulated hardware profile of the fleet's hosts (None: plain hosts).
        self.profile: str | None = state.get("profile")
        #: The inventory the hosts are shaped like (``lab up --like``); None: lab01..labNN.
        self.like: str | None = state.get("like")
        #: What the overlay of a fleet shaped like an inventory sets besides the connection.
        self.overlay: dict[str, Any] = state.get("overlay", {})
        #: What each host may use of this machine (fxkit.lab.resources).
        try:
            self.limits = resources.Limits(**state.get("limits", {}))
        except TypeError as exc:
            raise LabError(
                f"the fleet's limits are not readable: {exc}", where=str(self.state_file)
            ) from None
        #: Why the hosts started last have no cgroup (only their tmpfs sizes are capped).
        self.without_cgroups: str | None = None

    # -- public API -------------------------------------------------------------------------

    def up(
        self,
        count: int,
        timeout: float = 60.0,
        profile: str | None = None,
        limits: resources.Limits | None = None,
    ) -> list[str]:
        """Make sure hosts lab01..labNN run and accept logins; return the names it started.
        ``profile`` (one of :func:`fxkit.lab.profile.names`) gives every host of the fleet
        simulated hardware; a fleet has one profile (or none) while any of its hosts runs.
        ``limits`` (None: the fleet's, by default :class:`fxkit.lab.resources.Limits`) are what
        each host may use; they too change only while no host runs."""
        if not 1 <= count <= MAX_HOSTS:
            raise LabError(f"a fleet has 1 to {MAX_HOSTS} hosts, not {count}")
        if self.like is not None and self._running():
            raise LabError(
                f"this fleet's hosts are shaped like {self.like}",
                where=str(self.dir),
                hint="use `fxkit lab up --like` again, or `fxkit lab down` first",
            )
        self._check_unchanged(profile, limits)
        wanted = {host_name(i): profile for i in range(1, count + 1)}
        self.profile, self.like = profile, None
        return self._up(wanted, timeout, limits)

    def up_like(
        self,
        hosts: Mapping[str, str | None],
        source: str,
        timeout: float = 60.0,
        limits: resources.Limits | None = None,
        groups: Mapping[str, list[str]] | None = None,
        faults: Mapping[str, str] | None = None,
        overlay: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """Make sure the hosts named in ``hosts`` run, each with its profile (None: plain),
        shaped like the inventory ``source`` (each host's ``groups`` and ``faults`` are kept for
        ``lab status``); the inventory written is an overlay (see :meth:`_write_overlay`) with
        ``overlay``'s variables too. Hosts of the fleet not in ``hosts`` are stopped."""
        for name, profile in hosts.items():
            check_name(name)
            if profile is not None and profile not in profiles.names():
                raise LabError(
                    f"there is no lab profile {profile!r}",
                    where=f"host {name}",
                    hint=f"use one of: {', '.join(profiles.names())} (or none for plain hosts)",
                )
        if self._running() and self.like is None:
            raise LabError(
                "this fleet's hosts are lab01..labNN, not shaped like an inventory",
                where=str(self.dir),
                hint="`fxkit lab down` first, or another --dir (and --prefix) for a second fleet",
            )
        changed = [
            n
            for n, p in hosts.items()
            if n in self.hosts and self._pid(n) and self.profile_of(n) != p
        ]
        for name in [*changed, *(n for n in self.hosts if n not in hosts)]:
            self.stop(name)
            self.hosts.pop(name, None)
        self._check_unchanged(None, limits, profile_too=False)
        self.profile, self.like, self.overlay = None, source, dict(overlay or {})
        for name in hosts:
            self.hosts.setdefault(name, {}).update(
                groups=list((groups or {}).get(name, [])), fault=(faults or {}).get(name)
            )
        return self._up(dict(hosts), timeout, limits)

    def _up(
        self, wanted: dict[str, str | None], timeout: float, limits: resources.Limits | None
    ) -> list[str]:
        check_requirements()
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.client_key.exists():
            _keygen(self.client_key, "fxkit-lab-client")
        if (
            shutil.which("sudo")
            and shutil.which("openssl")
            and not self.become_password_file.exists()
        ):
            _write_private(self.become_password_file, secrets.token_urlsafe(16) + "\n")
        for name, profile in wanted.items():
            self.hosts.setdefault(name, {}).update(index=self._index(name), profile=profile)
        names = sorted(self.hosts)
        to_start = [name for name in wanted if self._pid(name) is None]
        for name in to_start:
            self._check_address_free(name)
        if not self.base_dir.exists():
            authorized = self.client_key.with_suffix(".pub").read_text()
            base.build(self.base_dir, authorized, self._sudo_user_line())
        self.limits = limits or self.limits
        for profile in {p for p in wanted.values() if p}:
            if not self.layer(profile).exists():
                profiles.build_layer(self.layer(profile), profile)
            self.shared_dir.mkdir(mode=0o755, exist_ok=True)
        try:
            for name in to_start:
                self._spawn(name, self._prepare(name))
            for name in to_start:
                self._start_relay(name)
            self._save_state()
            self._write_known_hosts(names)
            if self.like is None:
                self._write_inventory(names)
            else:
                self._write_overlay(names)
            self._wait_for_logins(list(wanted), timeout)
        except BaseException:
            for name in to_start:  # a fleet whose start fails leaves nothing running
                self.stop(name)
            self._save_state()
            raise
        return to_start

    def _running(self) -> bool:
        return any(self._pid(name) is not None for name in self.hosts)

    def _index(self, name: str) -> int:
        """The host's address's last octet: kept once given; lab01..labNN have their number;
        another name the lowest one free."""
        if "index" in self.hosts.get(name, {}):
            return int(self.hosts[name]["index"])
        if re.fullmatch(r"lab\d{2,3}", name):
            return int(name.removeprefix("lab"))
        taken = {int(h["index"]) for h in self.hosts.values() if "index" in h}
        free = next((i for i in range(1, MAX_HOSTS + 1) if i not in taken), None)
        if free is None:
            raise LabError(f"a fleet has at most {MAX_HOSTS} hosts", where=f"host {name}")
        return free

    def profile_of(self, name: str) -> str | None:
        """The simulated hardware of one host (None: a plain host)."""
        return self.hosts.get(name, {}).get("profile", self.profile)

    def status(self) -> list[HostStatus]:
        """Every host the state directory knows, running or not."""
        result = []
        for name in sorted(self.hosts):
            pid = self._pid(name)
            up = pid is not None and _port_open(self.address(name), self.port)
            processes = _descendants(pid) if pid else []
            relay = self._relay_pid(name)
            processes += _descendants(relay) if relay else []
            memory = sum(_pss(p) for p in processes)
            used = resources.usage(self.hosts[name].get("cgroups", [])) if pid else {}
            result.append(HostStatus(name, self.address(name), self.port, pid, up, memory, used))
        return result

    def down(self) -> list[str]:
        """Stop the hosts this fleet started (by PID) and remove the state directory's files."""
        with ThreadPoolExecutor(16) as pool:
            was_running = list(pool.map(self.stop, sorted(self.hosts)))
        stopped = [name for name, ran in zip(sorted(self.hosts), was_running, strict=True) if ran]
        for path in (self.inventory, self.known_hosts, self.state_file, self.become_password_file):
            path.unlink(missing_ok=True)
        for path in (self.client_key, self.client_key.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.dir / "hosts", ignore_errors=True)
        shutil.rmtree(self.dir / "host_vars", ignore_errors=True)
        shutil.rmtree(self.dir / "mirror", ignore_errors=True)
        shutil.rmtree(self.base_dir, ignore_errors=True)
        shutil.rmtree(self.dir / "profiles", ignore_errors=True)
        if self.dir.exists() and not any(self.dir.iterdir()):
            self.dir.rmdir()
        self.hosts = {}
        return stopped

    def stop(self, name: str, grace: float = 3.0) -> bool:
        """Stop one host (its relay, its sshd, then the unshare process) and remove its
        cgroups; True when it ran."""
        relay = self._relay_pid(name)
        if relay is not None:
            _signal(relay, signal.SIGTERM)
            if not _wait_gone(relay, grace):
                _signal(relay, signal.SIGKILL)
        pid = self._pid(name)
        if pid is not None:
            for child in _children(pid):
                _signal(child, signal.SIGTERM)  # sshd, PID 1 inside: the host goes with it
            if not _wait_gone(pid, grace):
                _signal(pid, signal.SIGKILL)  # --kill-child takes the host down with it
                _wait_gone(pid, grace)
        resources.remove(self.hosts.get(name, {}).get("cgroups", []), timeout=grace)
        return pid is not None

    def connect(
        self, name: str, options: ConnectOptions | None = None, **hostvars: Any
    ) -> Connection:
        """An (unopened) SSH connection to a lab host; ``hostvars`` override the inventory's."""
        from fxkit.connection.ssh import SSHConnection

        options = options or ConnectOptions(known_hosts=str(self.known_hosts))
        return SSHConnection(name, {**self.hostvars(name), **hostvars}, options)

    def address(self, name: str) -> str:
        return f"{self.prefix}.{self._index(name)}"

    def host_dir(self, name: str) -> Path:
        return self.dir / "hosts" / name

    def layer(self, profile: str) -> Path:
        """What host-init mounts into the hosts of ``profile`` (fxkit.lab.profile)."""
        return self.dir / "profiles" / profile

    @property
    def base_dir(self) -> Path:
        """The hosts' shared read-only layer (sanitised /etc and /var, see fxkit.lab.base)."""
        return self.dir / "base"

    @property
    def shared_dir(self) -> Path:
        """The folder every host of a profile sees (at /run/fxkit-lab/shared, host-init.sh)."""
        return self.base_dir / "shared"

    def sshd_log(self, name: str, limit: int = hostfs.MAX_READ) -> str:
        """The end (``limit`` bytes) of what the host's sshd logged, read inside the host as
        :mod:`fxkit.lab.hostfs` does; empty when the host is down or the log is not a file."""
        pid = self._pid(name)
        if pid is None:
            return ""
        for child in _children(pid):
            with contextlib.suppress(OSError), hostfs.root_of(child) as root:
                if child in _children(pid):  # the host's PID 1, not a reused PID
                    return hostfs.read_tail(root, SSHD_LOG, limit).decode(errors="replace")
        return ""

    def become_password(self) -> str | None:
        """The password of the lab's sudo user, when sudo is installed."""
        if not self.become_password_file.exists():
            return None
        return self.become_password_file.read_text().strip()

    # -- one host ---------------------------------------------------------------------------

    def _sudo_user_line(self) -> str | None:
        """``user:password-hash`` of the hosts' sudo user, when sudo is installed."""
        password = self.become_password()
        if not password:
            return None
        hashed = subprocess.run(
            ["openssl", "passwd", "-6", "-stdin"],
            input=password,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return f"{SUDO_USER}:{hashed}\n"

    def _prepare(self, name: str) -> list[str]:
        """The host's folder, key and cgroups (listed in its ``cgroups`` file for host-init)."""
        hdir = self.host_dir(name)
        (hdir / "rt").mkdir(parents=True, exist_ok=True)
        key = hdir / "ssh_host_ed25519_key"
        if not key.exists():
            _keygen(key, name)
        fleet = hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]
        try:
            cgroups = resources.create(f"{fleet}.{name}", self.limits)
        except resources.Unavailable as exc:
            cgroups, self.without_cgroups = [], exc.message
        (hdir / "cgroups").write_text("".join(f"{folder}\n" for folder in cgroups))
        return cgroups

    def _spawn(self, name: str, cgroups: list[str]) -> None:
        hdir = self.host_dir(name)
        argv = [
            "unshare", "--mount", str(INIT_SCRIPT), "outer", name, self.address(name),
            str(self.port), str(hdir), str(self.base_dir), str(self.limits.tmpfs),
        ]  # fmt: skip
        profile = self.profile_of(name)
        if profile:
            argv.append(str(self.layer(profile)))
        pid = _start_process(argv, hdir / "log")
        self.hosts[name].update(pid=pid, start=_start_time(pid), cgroups=cgroups)
        _wait_for_exec(pid, lambda: self._runs_our_init(pid, name))

    def _start_relay(self, name: str, timeout: float = 10.0) -> None:
        """Listen on the host's address here; connect, for each client, inside the host's network
        namespace (``nsenter`` on a descriptor of it, which keeps it from PID reuse)."""
        netns = self._host_netns(name, timeout)
        address, port = self.address(name), self.port
        inside = f"nsenter --net=/proc/self/fd/3 socat STDIO TCP:{address}:{port},nodelay"
        argv = [
            "socat", "-b", "65536",
            f"TCP-LISTEN:{port},bind={address},reuseaddr,fork,nodelay,backlog=512",
            f'EXEC:"{inside}",nofork',
        ]  # fmt: skip
        try:
            pid = _start_process(argv, self.host_dir(name) / "relay.log", extra_fd=netns)
        finally:
            os.close(netns)
        self.hosts[name]["relay"] = {"pid": pid, "start": _start_time(pid)}
        _wait_for_exec(pid, lambda: self._relay_pid(name) is not None)

    def _host_netns(self, name: str, timeout: float) -> int:
        """A descriptor of the host's network namespace, once its PID 1 runs in it."""
        own = os.stat("/proc/self/ns/net").st_ino
        deadline = time.monotonic() + timeout
        pid, started = self.hosts[name]["pid"], self.hosts[name]["start"]
        while True:
            _reap(pid)
            if _start_time(pid) != started:  # not _pid(): the command line changes on exec
                raise LabError(
                    f"lab host {name} exited while starting: {self._log_tail(name)}",
                    where=str(self.host_dir(name) / "log"),
                )
            for child in _children(pid):
                with contextlib.suppress(OSError):
                    fd = os.open(f"/proc/{child}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                    if os.fstat(fd).st_ino != own:
                        return fd
                    os.close(fd)
            if time.monotonic() > deadline:
                raise LabError(f"lab host {name} has no network namespace after {timeout:.0f} s")
            time.sleep(0.005)

    def _relay_pid(self, name: str) -> int | None:
        """The PID of the host's relay when it is still the one this fleet started."""
        relay = self.hosts.get(name, {}).get("relay")
        if not relay:
            return None
        pid = relay["pid"]
        _reap(pid)
        if _start_time(pid) != relay["start"]:
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        listen = f"TCP-LISTEN:{self.port},bind={self.address(name)},".encode()
        return pid if any(arg.startswith(listen) for arg in cmdline) else None

    def _pid(self, name: str) -> int | None:
        """The PID of the host's unshare process when it is still the one this fleet started."""
        info = self.hosts.get(name, {})
        pid = info.get("pid")
        if pid is None:
            return None
        _reap(pid)
        if _start_time(pid) != info["start"]:
            return None
        return pid if self._runs_our_init(pid, name) else None

    def _runs_our_init(self, pid: int, name: str) -> bool:
        """Whether ``pid`` runs this fleet's host-init for ``name`` (not a reused PID)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return str(INIT_SCRIPT).encode() in cmdline and str(self.host_dir(name)).encode() in cmdline

    def _check_unchanged(
        self, profile: str | None, wanted: resources.Limits | None, profile_too: bool = True
    ) -> None:
        """Refuse another profile or other limits while hosts of this fleet run."""
        if profile_too and profile is not None and profile not in profiles.names():
            raise LabError(
                f"there is no lab profile {profile!r}",
                hint=f"use one of: {', '.join(profiles.names())} (or none for plain hosts)",
            )
        if not self._running():
            return
        if profile_too and profile != self.profile:
            option = f"--profile {self.profile}" if self.profile else "no --profile"
            raise LabError(
                f"this fleet's hosts run with {_said(self.profile)}, not {_said(profile)}",
                where=str(self.dir),
                hint=f"use {option} to keep it, `fxkit lab down` first to change it, "
                "or another --dir (and --prefix) for a second fleet",
            )
        if wanted is not None and wanted != self.limits:
            raise LabError(
                f"this fleet's hosts run with {self.limits}, not {wanted}",
                where=str(self.dir),
                hint="leave out --memory and --pids to keep them, `fxkit lab down` first to "
                "change them, or another --dir (and --prefix) for a second fleet",
            )

    def _check_address_free(self, name: str) -> None:
        if _port_open(self.address(name), self.port):
            raise AddressInUse(
                f"{self.address(name)} port {self.port} is already in use (another fleet?)",
                where=f"host {name}",
                hint=f"pick other addresses with --prefix or ${PREFIX_ENV} (e.g. 127.78.0)",
            )

    def _wait_for_logins(self, names: Iterable[str], timeout: float) -> None:
        options = ConnectOptions(
            connect_timeout=2.0, known_hosts=str(self.known_hosts), connect_retries=0
        )
        deadline = time.monotonic() + timeout

        def login(name: str) -> None:
            while True:
                if self._pid(name) is None:
                    raise LabError(
                        f"lab host {name} exited while starting: {self._log_tail(name)}",
                        where=str(self.host_dir(name) / "log"),
                    )
                if self._relay_pid(name) is None:
                    raise LabError(
                        f"the relay of lab host {name} exited: {self._log_tail(name, 'relay.log')}",
                        where=str(self.host_dir(name) / "relay.log"),
                    )
                try:
                    if not self._sshd_listens(name):  # else the relay takes it, and hangs up
                        raise ConnectionFailed(f"sshd does not listen yet on {name}")
                    with self.connect(name, options) as conn:
                        conn.run("true")
                    return
                except ConnectionFailed as exc:
                    if time.monotonic() > deadline:
                        sshd = " | ".join(self.sshd_log(name).strip().splitlines()[-3:])
                        raise LabError(
                            f"lab host {name} does not accept logins after {timeout:.0f} s: {exc}; "
                            f"log: {self._log_tail(name)}; sshd: {sshd or '(empty log)'}",
                            where=str(self.host_dir(name) / "log"),
                        ) from None
                    time.sleep(0.02)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(login, names))

    def _sshd_listens(self, name: str) -> bool:
        """Whether a socket listens on the port in the host's network namespace."""
        pid = self._pid(name)
        for child in _children(pid) if pid else []:
            with contextlib.suppress(OSError):
                lines = Path(f"/proc/{child}/net/tcp").read_text().splitlines()[1:]
                port = f":{self.port:04X}"
                return any(f[1].endswith(port) and f[3] == "0A" for f in map(str.split, lines))
        return False

    def _log_tail(self, name: str, file: str = "log") -> str:
        log = self.host_dir(name) / file
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        return " | ".join(lines[-3:]) or "(empty log)"

    # -- files ------------------------------------------------------------------------------

    def hostvars(self, name: str) -> dict[str, object]:
        """The inventory variables of one host (what the inventory file says)."""
        return {
            "ansible_host": self.address(name),
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.client_key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts}",
        }

    def _write_inventory(self, names: list[str]) -> None:
        common = self.hostvars(names[0])
        hosts = {n: {"ansible_host": self.address(n), "ansible_port": self.port} for n in names}
        group_vars = {k: v for k, v in common.items() if k not in ("ansible_host", "ansible_port")}
        lab_vars: dict[str, object] = {"fxkit_lab": True}
        if self.profile:
            lab_vars["fxkit_lab_profile"] = self.profile
        lab = {"hosts": hosts, "vars": lab_vars}
        inventory = {"all": {"vars": group_vars, "children": {"lab": lab}}}
        header = f"# The lab fleet in {self.dir}, written by `fxkit lab up`.\n"
        _write_if_changed(
            self.inventory, header + yaml.dump(inventory, Dumper=_YAMLDumper, sort_keys=False)
        )

    def _write_overlay(self, names: list[str]) -> None:
        """The inventory of a fleet shaped like another (``lab up --like``), to give after it
        (``-i INVENTORY -i .lab/inventory.yml``). It sets only what the lab changes, each host's
        in ``host_vars/`` beside it (which beat the first inventory's host_vars/ files): the
        address, port, user, key and known_hosts file, ``fxkit_lab``, the host's profile and,
        where it has one, the lab mirror's address and key (:mod:`fxkit.lab.node`).
        ``fxkit_lab_only`` (for all) makes a host of the first inventory that is not in the lab
        refuse to connect, so that the rehearsal never reaches a real node."""
        folder = self.dir / "host_vars"
        folder.mkdir(exist_ok=True)
        for stale in folder.glob("*.yml"):
            if stale.stem not in names:
                stale.unlink()
        header = f"# Lab host of the fleet in {self.dir}, written by `fxkit lab up --like`.\n"
        for name in names:
            hostvars = {
                **self.hostvars(name),
                "fxkit_lab": True,
                "fxkit_lab_profile": self.profile_of(name),
                **(self.overlay if self.profile_of(name) else {}),
            }
            text = header + yaml.dump(hostvars, Dumper=_YAMLDumper, sort_keys=False)
            _write_if_changed(folder / f"{name}.yml", text)
        overlay = {"all": {"vars": {"fxkit_lab_only": True}, "hosts": dict.fromkeys(names)}}
        header = (
            f"# The lab fleet in {self.dir}, shaped like {self.like} (`fxkit lab up --like`).\n"
            f"# Give it after your inventory: -i {self.like} -i {self.inventory}\n"
        )
        _write_if_changed(
            self.inventory, header + yaml.dump(overlay, Dumper=_YAMLDumper, sort_keys=False)
        )

    def _write_known_hosts(self, names: list[str]) -> None:
        lines = []
        for name in names:
            pub = (self.host_dir(name) / "ssh_host_ed25519_key.pub").read_text().split()
            target = (
                self.address(name) if self.port == 22 else f"[{self.address(name)}]:{self.port}"
            )
            lines.append(f"{target} {pub[0]} {pub[1]}\n")
        _write_if_changed(self.known_hosts, "".join(lines))

    def _load_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except (ValueError, OSError) as exc:
            raise LabError(
                f"cannot read the fleet's state: {exc}", where=str(self.state_file)
            ) from None

    def _save_state(self) -> None:
        state = {
            "prefix": self.prefix,
            "port": self.port,
            "profile": self.profile,
            "like": self.like,
            "overlay": self.overlay,
            "limits": self.limits.as_dict(),
            "hosts": self.hosts,
        }
        _write_if_changed(self.state_file, json.dumps(state, indent=1, sort_keys=True) + "\n")


def check_requirements() -> None:
    """Raise :class:`LabError` saying what is missing (root, the tools in TOOLS, sshd)."""
    if os.geteuid() != 0:
        raise LabError(
            "the lab fleet needs root (namespaces, overlayfs, sshd)",
            hint="run it as root, e.g. `sudo fxkit lab up 4`",
        )
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        packages = " ".join(sorted({TOOLS[tool] for tool in missing}))
        raise LabError(
            f"missing {', '.join(missing)}",
            hint=f"apt-get install {packages} (or run scripts/install-system-deps.sh)",
        )
    if not Path("/usr/sbin/sshd").exists():
        raise LabError(
            "the lab's hosts run OpenSSH's sshd, which is not installed",
            hint="apt-get install openssh-server (or run scripts/install-system-deps.sh)",
        )
    for path in ("/etc/subuid", "/etc/subgid"):
        if not Path(path).exists():
            raise LabError(
                f"{path} does not exist (each host maps its uids with newuidmap, which reads it)",
                hint=f"create it empty: `touch {path}` (the lab changes it only in its own mount "
                "namespace)",
            )


def _said(profile: str | None) -> str:
    return f"profile {profile}" if profile else "no profile"


def _check_prefix(prefix: str) -> str:
    if not re.fullmatch(r"127\.(\d{1,3})\.(\d{1,3})", prefix) or any(
        int(octet) > 255 for octet in prefix.split(".")
    ):
        raise LabError(
            f"address prefix {prefix!r} is not three octets of 127.0.0.0/8",
            hint="use for example 127.77.0 (hosts get 127.77.0.1, .2, ...)",
        )
    return prefix


def _keygen(path: Path, comment: str) -> None:
    """Write an Ed25519 key pair as ssh-keygen would (``path`` and ``path.pub``), in-process."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    _write_private(path, private.decode())
    Path(f"{path}.pub").write_text(f"{public.decode()} {comment}\n")


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _write_if_changed(path: Path, text: str) -> None:
    """Write atomically (temp file + rename), and not at all when the content is the same."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _start_process(argv: list[str], log: Path, extra_fd: int | None = None) -> int:
    """Start ``argv`` in a session of its own: stdin /dev/null, stdout and stderr to ``log``
    (a file outside the hosts), ``extra_fd`` as descriptor 3; nothing else is inherited."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, out, 1),
               (os.POSIX_SPAWN_DUP2, out, 2)]  # fmt: skip
    if extra_fd is not None:
        actions.append((os.POSIX_SPAWN_DUP2, extra_fd, 3))
    try:
        return os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions, setsid=True)
    finally:
        os.close(out)
        os.close(devnull)


def _wait_for_exec(pid: int, started: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``started()`` (the child has exec'd its command) or the child is gone. Until
    then its command line is still ours, and it would pass for a stranger; a busy machine can
    stretch that moment out."""
    deadline = time.monotonic() + timeout
    while not started() and time.monotonic() < deadline:
        _reap(pid)
        if _start_time(pid) is None:
            return
        time.sleep(0.002)


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (tells a reused PID apart); None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our child (lab up and down in one process)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(_children(current))
    return found


def _pss(pid: int) -> int:
    """Proportional set size of a process in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        _reap(pid)
        if _start_time(pid) is None:
            _reap(pid)  # it may have exited since the first reap: no zombie left behind
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
