"""Kernel tunables and modules: a sysctl key's value and whether this host can change it, and
whether a module is loaded or can be loaded."""

from __future__ import annotations

from dataclasses import dataclass
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError


def sysctl_path(name: str, proc_sys: str = "/proc/sys") -> str:
    """``net.ipv4.ip_forward`` -> ``/proc/sys/net/ipv4/ip_forward`` (``/`` in a name is a ``.``)."""
    return f"{proc_sys}/" + name.translate(str.maketrans("./", "/."))


@dataclass(frozen=True)
class SysctlInfo:
    """``value`` is None when the key does not exist here; ``reason`` says why it is not
    writable (empty when it is)."""

    value: str | None
    reason: str = ""

    @property
    def writable(self) -> bool:
        return self.value is not None and not self.reason


class SysctlState(Fact[SysctlInfo]):
    """One command: whether the key exists and is writable (and why not), then its value."""

    def command(self, name: str, proc_sys: str = "/proc/sys") -> str:
        return (
            f"f={quote(sysctl_path(name, proc_sys))}; "
            'if [ ! -e "$f" ]; then echo missing; exit 0; fi; '
            'if [ -w "$f" ]; then echo rw; '
            f"elif awk -v d={quote(proc_sys)} "
            "'$2 == d && $4 ~ /(^|,)ro(,|$)/ {found=1} END {exit !found}' /proc/mounts; "
            "then echo ro-mount; else echo denied; fi; "
            'cat -- "$f"'
        )

    def parse(self, result: RunResult, name: str, proc_sys: str = "/proc/sys") -> SysctlInfo:
        state, _, value = result.stdout.partition("\n")
        if state == "missing":
            return SysctlInfo(None, f"{name} does not exist on this host")
        if not result.ok or state not in ("rw", "ro-mount", "denied"):
            raise FactError.from_result(f"sysctl {name}", result)
        reason = {
            "rw": "",
            "ro-mount": f"{proc_sys} is read-only",
            "denied": f"{name} is not writable here",
        }[state]
        return SysctlInfo(normalize_sysctl(value), reason)


def normalize_sysctl(value: str) -> str:
    """The kernel separates multi-value keys with tabs; compare them with single spaces."""
    return " ".join(value.split())


@dataclass(frozen=True)
class ModuleInfo:
    loaded: bool
    #: Why modules cannot be loaded on this host; empty when modprobe can run.
    cannot_load: str = ""


class ModuleState(Fact[ModuleInfo]):
    """Whether a kernel module is loaded (``/sys/module/<name>``, built-ins included) and whether
    this host can load one (modprobe present, /sys writable: not in a container)."""

    def command(self, name: str) -> str:
        return (
            f"if [ -d /sys/module/{quote(name.replace('-', '_'))} ]; "
            "then echo loaded; else echo absent; fi; "
            "if ! command -v modprobe >/dev/null; then echo 'modprobe is not installed'; "
            "elif [ ! -w /sys/module ]; then echo '/sys/module is read-only'; "
            "elif [ ! -e /proc/modules ]; then echo 'the kernel has no loadable modules'; fi"
        )

    def parse(self, result: RunResult, name: str) -> ModuleInfo:
        lines = result.stdout.splitlines()
        if not lines or lines[0] not in ("loaded", "absent"):
            raise FactError.from_result(f"module {name}", result)
        return ModuleInfo(lines[0] == "loaded", lines[1] if len(lines) > 1 else "")
