"""Facts about the host as a whole: OS release, kernel, CPU, memory, mounts, init system."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError


@dataclass(frozen=True)
class OsInfo:
    id: str
    id_like: tuple[str, ...]
    version_id: str
    pretty_name: str
    #: ``VERSION_CODENAME`` (``noble``), else ``UBUNTU_CODENAME``; empty when neither is set.
    codename: str = ""

    @property
    def family(self) -> str:
        """``debian``, ``redhat`` or the OS id itself when it is neither."""
        for name in (self.id, *self.id_like):
            if name in ("debian", "ubuntu"):
                return "debian"
            if name in ("rhel", "fedora", "centos"):
                return "redhat"
        return self.id


class OsRelease(Fact[OsInfo]):
    """``/etc/os-release`` (os-release(5))."""

    stable = True

    cmd = "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release"

    def parse(self, result: RunResult) -> OsInfo:
        if not result.ok:
            raise FactError.from_result("OS release", result)
        fields: dict[str, str] = {}
        for line in result.stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.startswith("#"):
                words = shlex.split(value)
                fields[key.strip()] = words[0] if words else ""
        return OsInfo(
            id=fields.get("ID", "linux"),
            id_like=tuple(fields.get("ID_LIKE", "").split()),
            version_id=fields.get("VERSION_ID", ""),
            pretty_name=fields.get("PRETTY_NAME", ""),
            codename=fields.get("VERSION_CODENAME") or fields.get("UBUNTU_CODENAME", ""),
        )


class Kernel(Fact[str]):
    """The running kernel's release (``uname -r``)."""

    stable = True

    cmd = "uname -r"

    def parse(self, result: RunResult) -> str:
        if not result.ok:
            raise FactError.from_result("kernel", result)
        return result.stdout.strip()


@dataclass(frozen=True)
class CpuInfo:
    count: int
    model: str


class Cpu(Fact[CpuInfo]):
    """Online CPUs (``nproc``) and the first CPU's model name."""

    stable = True

    cmd = "nproc && grep -m1 '^model name' /proc/cpuinfo || true"

    def parse(self, result: RunResult) -> CpuInfo:
        lines = result.stdout.splitlines()
        if not lines or not lines[0].strip().isdigit():
            raise FactError.from_result("CPU", result)
        model = lines[1].partition(":")[2].strip() if len(lines) > 1 else ""
        return CpuInfo(int(lines[0]), model)


@dataclass(frozen=True)
class MemoryInfo:
    """``/proc/meminfo`` in bytes: ``fields`` holds every line, keyed as in the file."""

    fields: dict[str, int]

    @property
    def total(self) -> int:
        return self.fields["MemTotal"]

    @property
    def available(self) -> int:
        return self.fields.get("MemAvailable", self.fields.get("MemFree", 0))


class Memory(Fact[MemoryInfo]):
    cmd = "cat /proc/meminfo"

    def parse(self, result: RunResult) -> MemoryInfo:
        fields = {}
        for line in result.stdout.splitlines():
            key, _, rest = line.partition(":")
            words = rest.split()
            if words and words[0].isdigit():
                unit = 1024 if words[1:] == ["kB"] else 1
                fields[key] = int(words[0]) * unit
        if "MemTotal" not in fields:
            raise FactError.from_result("memory", result)
        return MemoryInfo(fields)


class SessionMemory(Fact[dict[int, int]]):
    """The resident anonymous memory (bytes) of the processes of each session given by its
    leader's PID (a service's whole process tree: systemd and a direct start both make each
    instance a session of its own): the sum of ``RssAnon`` in their ``/proc/PID/status``
    (proc(5)), the session's processes listed by ``ps``. A session with no process (or a
    kernel without ``RssAnon``, before 4.5) is left out; a host without ps or awk fails the
    fact. Memory a driver maps into a process (pinned GPU host buffers) may not count in it."""

    def command(self, *sessions: int) -> str:
        want = " ".join(str(int(s)) for s in sessions)
        # ps reads each process's session itself (procps): a command name with a space, a
        # ")" or a newline cannot pass another process off as one of the session's.
        select = f'awk -v w={shlex.quote(f" {want} ")} \'index(w, " " $2 " ") {{print $1, $2}}\''
        return (
            "command -v ps >/dev/null && command -v awk >/dev/null && "
            f"ps -e -o pid= -o sid= | {select} | while read -r p s; do "
            "r=$(grep -s '^RssAnon:' /proc/$p/status) || continue; "
            'echo "$s $r"; done'
        )

    def parse(self, result: RunResult, *sessions: int) -> dict[int, int]:
        if not result.ok:
            raise FactError.from_result("session memory", result)
        found: dict[int, int] = {}
        for line in result.stdout.splitlines():
            words = line.replace(":", " ").split()  # SID RssAnon: N kB
            if len(words) == 4 and words[0].isdigit() and words[2].isdigit():
                found[int(words[0])] = found.get(int(words[0]), 0) + int(words[2]) * 1024
        return found


@dataclass(frozen=True)
class Mount:
    device: str
    path: str
    fstype: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


class Mounts(Fact[list[Mount]]):
    """Mounted filesystems from ``/proc/mounts``, in mount order."""

    cmd = "cat /proc/mounts"

    def parse(self, result: RunResult) -> list[Mount]:
        if not result.ok:
            raise FactError.from_result("mounts", result)
        mounts = []
        for line in result.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 4:
                device, path, fstype, options = (_unescape(f) for f in fields[:4])
                mounts.append(Mount(device, path, fstype, tuple(options.split(","))))
        return mounts


class InitSystem(Fact[str]):
    """``systemd`` when systemd runs the host (sd_booted(3): /run/systemd/system exists), else
    the name of PID 1 (a container's shell, tini, ...)."""

    stable = True
    cmd = "if [ -d /run/systemd/system ]; then echo systemd; else cat /proc/1/comm; fi"

    def parse(self, result: RunResult) -> str:
        return result.stdout.strip() or "unknown"
