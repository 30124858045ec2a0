"""Kernel tunables and modules: a sysctl key's value and whether this host can change it, and
whether a module is loaded or can be loaded."""

from __future__ import annotations

import shlex
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


@dataclass(frozen=True)
class CmdlineInfo:
    """The running kernel's command line, word by word (``/proc/cmdline``)."""

    args: tuple[str, ...]

    def __contains__(self, arg: object) -> bool:
        return arg in self.args

    def value(self, key: str) -> str | None:
        """The last ``key=value``'s value (the kernel reads the last one), ``""`` for a bare
        ``key``, None when absent."""
        found = None
        for arg in self.args:
            name, sep, value = arg.partition("=")
            if name == key:
                found = value if sep else ""
        return found


class KernelCmdline(Fact[CmdlineInfo]):
    """``/proc/cmdline``: what the running kernel was booted with (a change to the boot
    loader's config shows here only after a reboot)."""

    stable = True
    cmd = "cat /proc/cmdline"

    def parse(self, result: RunResult) -> CmdlineInfo:
        if not result.ok:
            raise FactError.from_result("kernel command line", result)
        try:
            words = shlex.split(result.stdout)  # the kernel's own quoting: name="a b"
        except ValueError:
            words = result.stdout.split()
        return CmdlineInfo(tuple(words))


@dataclass(frozen=True)
class LoadedModule:
    name: str
    size: int
    #: How many users the module has (``-`` in /proc/modules: unknown, shown as -1).
    refcount: int
    #: The modules that use this one.
    used_by: tuple[str, ...]
    #: ``Live``, ``Loading`` or ``Unloading``.
    state: str


class LoadedModules(Fact[dict[str, LoadedModule]]):
    """The loadable modules in the running kernel (``/proc/modules``), by name; built-in ones
    are not listed there (:class:`ModuleState` sees those too). Empty when the kernel has no
    loadable modules (no /proc/modules)."""

    cmd = "if [ -e /proc/modules ]; then cat /proc/modules; fi"

    def parse(self, result: RunResult) -> dict[str, LoadedModule]:
        if not result.ok:
            raise FactError.from_result("loaded modules", result)
        modules = {}
        for number, line in enumerate(result.stdout.splitlines(), 1):
            fields = line.split()
            if len(fields) < 5 or not fields[1].isdigit():
                raise FactError(
                    f"/proc/modules line {number} is not `name size refcount users state ...`: "
                    f"{line[:80]!r}"
                )
            name, size, refcount, users, state = fields[:5]
            modules[name] = LoadedModule(
                name,
                int(size),
                int(refcount) if refcount.isdigit() else -1,
                tuple(u for u in users.split(",") if u and u != "-"),
                state,
            )
        return modules
