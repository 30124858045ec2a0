"""What the next boot and the running driver are made of: the CPU vendor (which IOMMU argument
applies), GRUB's defaults as update-grub reads them, the boot config it generated, DKMS's
modules and the loaded module's version."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError

#: lscpu's "Vendor ID" (the kernel's /proc/cpuinfo vendor_id): the x86 vendor strings.
AMD, INTEL = "AuthenticAMD", "GenuineIntel"


class CpuVendor(Fact[str]):
    """The CPU vendor as ``lscpu`` prints it (``Vendor ID:``), else /proc/cpuinfo's
    ``vendor_id``; ``""`` when neither names one."""

    stable = True
    cmd = (
        "if command -v lscpu >/dev/null; then LC_ALL=C lscpu; "
        "else sed -n 's/^vendor_id[[:space:]]*:/Vendor ID:/p' /proc/cpuinfo; fi"
    )

    def parse(self, result: RunResult) -> str:
        if not result.ok:
            raise FactError.from_result("CPU vendor", result)
        for line in result.stdout.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == "Vendor ID":
                return value.strip()
        return ""


@dataclass(frozen=True)
class GrubSource:
    """One file update-grub sources, and the two command-line variables after it."""

    path: str
    linux: str
    linux_default: str


class GrubDefaults(Fact[tuple[GrubSource, ...]]):
    """GRUB's defaults as grub-mkconfig reads them: ``grub_file``, then every
    ``dropin_dir/*.cfg`` in the shell's order, each sourced in turn (by ``sh``, as
    grub-mkconfig does), with GRUB_CMDLINE_LINUX and GRUB_CMDLINE_LINUX_DEFAULT after each.
    Empty when ``grub_file`` does not exist. Sourcing runs those files as update-grub would."""

    def command(self, grub_file: str, dropin_dir: str) -> str:
        show = 'printf "%s\\0%s\\0%s\\0" "$f" "${GRUB_CMDLINE_LINUX-}" '
        show += '"${GRUB_CMDLINE_LINUX_DEFAULT-}"'
        script = (
            f'f={quote(grub_file)}; [ -f "$f" ] || exit 0; . "$f" >/dev/null; {show}; '
            f"for f in {quote(dropin_dir)}/*.cfg; do "
            f'if [ -e "$f" ]; then . "$f" >/dev/null; {show}; fi; done'
        )
        return f"sh -c {quote(script)}"

    def parse(self, result: RunResult, grub_file: str, dropin_dir: str) -> tuple[GrubSource, ...]:
        if not result.ok:
            raise FactError.from_result(f"GRUB defaults ({grub_file}, {dropin_dir}/*.cfg)", result)
        fields = result.stdout.split("\0")[:-1]
        if len(fields) % 3:
            raise FactError.from_result(f"GRUB defaults ({grub_file})", result)
        return tuple(GrubSource(*fields[i : i + 3]) for i in range(0, len(fields), 3))


class BootEntry(Fact[tuple[str, ...] | None]):
    """The kernel arguments of the first ``linux`` line of the generated boot config
    (grub.cfg: the default entry, update-grub's 10_linux writes it first); None when the file
    does not exist or has no such line."""

    def command(self, grub_cfg: str) -> str:
        return f'f={quote(grub_cfg)}; if [ -f "$f" ]; then grep -m1 -E \'^\\s*linux\\s\' "$f"; fi'

    def parse(self, result: RunResult, grub_cfg: str) -> tuple[str, ...] | None:
        if result.rc not in (0, 1):
            raise FactError.from_result(f"boot config {grub_cfg}", result)
        words = result.stdout.split()
        return tuple(words[2:]) if len(words) >= 2 else None


@dataclass(frozen=True)
class DkmsModule:
    """One line of ``dkms status``: ``amdgpu/6.14.14-2204008.24.04, 6.14.0-29-generic,
    x86_64: installed`` (an ``added`` module has no kernel and no architecture)."""

    name: str
    version: str
    kernel: str
    arch: str
    state: str

    @property
    def module_version(self) -> str:
        """The version the built module carries: the DKMS version up to its first ``-``
        (ROCmValidationSuite's getAmdGpuDriverVersion reads it from ``dkms status`` so)."""
        return self.version.split("-", 1)[0]


#: dkms 3's ``name/version, kernel, arch: state`` and dkms 2's ``name, version, kernel, arch:
#: state``; the state may carry a note in parentheses (``installed (original_module exists)``).
_DKMS_LINE = re.compile(
    r"(?P<name>[^/,\s]+)(?:/|, )(?P<version>[^,:\s]+)"
    r"(?:, (?P<kernel>[^,:\s]+), (?P<arch>[^,:\s]+))?: (?P<state>\w+)"
)


class DkmsStatus(Fact[tuple[DkmsModule, ...] | None]):
    """``dkms status``: every module DKMS knows, per kernel; None when dkms is not installed."""

    cmd = "if command -v dkms >/dev/null; then dkms status; else echo 'no dkms' >&2; exit 3; fi"

    def parse(self, result: RunResult) -> tuple[DkmsModule, ...] | None:
        if result.rc == 3 and result.stderr.strip() == "no dkms":
            return None
        if not result.ok:
            raise FactError.from_result("dkms status", result)
        modules = []
        for line in result.stdout.splitlines():
            found = _DKMS_LINE.match(line.strip())
            if found:
                groups = {k: v or "" for k, v in found.groupdict().items()}
                modules.append(DkmsModule(**groups))
        return tuple(modules)


class ModuleVersion(Fact[str | None]):
    """``/sys/module/NAME/version``: what a loaded module says it is (an out-of-tree build
    such as amdgpu-dkms's sets one, the kernel's own amdgpu does not); ``""`` when it has
    none, None when the module is not loaded."""

    def command(self, name: str) -> str:
        folder = quote(f"/sys/module/{name}")
        return f"if [ -d {folder} ]; then echo loaded; cat {folder}/version 2>/dev/null; fi; true"

    def parse(self, result: RunResult, name: str) -> str | None:
        lines = result.stdout.splitlines()
        if not lines:
            return None
        return lines[1].strip() if len(lines) > 1 else ""


def kernel_words(text: str) -> tuple[str, ...]:
    """A command line split as the kernel and GRUB quote it (``name="a b"`` is one word)."""
    try:
        return tuple(shlex.split(text))
    except ValueError:
        return tuple(text.split())
