"""rocm_host: ROCm 7.2 on Ubuntu 22.04 / 24.04, tuned for MI300X-class GPUs, then verified.

1. the repo.radeon.com signing key (downloaded by the host, pinned by sha256) dearmored into
   /etc/apt/keyrings/rocm.gpg; the rocm and graphics sources (rocm.list), the amdgpu driver
   source (amdgpu.list) and the apt pin rocm-pin-600;
2. amdgpu-dkms and rocm, at the versions asked for; users in render and video;
3. the kernel command line (pci=realloc=off iommu=pt) and kernel.numa_balancing=0; a reboot when
   one is due and ``rocm_host_reboot`` is on, else the reason it is due;
4. the GPUs, read back with amd-smi (or rocm-smi, or rocminfo): count, model and memory.
"""

from __future__ import annotations

import posixpath
import re
from shlex import quote

from fxkit.engine.role import Host
from fxkit.engine.rolevars import var_error, words
from fxkit.engine.variables import HostVars, truthy
from fxkit.facts.commands import CommandOutput
from fxkit.facts.files import FileStat
from fxkit.facts.gpu import GpuInventory, Gpus
from fxkit.facts.kernel import KernelCmdline
from fxkit.facts.packages import InstalledPackages
from fxkit.facts.system import OsRelease
from fxkit.ops.base import OpContext, Result, ok, skipped
from fxkit.ops.packages import version_matches

#: The Ubuntu releases ROCm 7.2 supports, by codename.
UBUNTU = {"jammy": "22.04", "noble": "24.04"}

_URL = re.compile(r"(https?|file)://[^\s\"'#\[\]]+")
_REPO_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")
_APT_VERSION = re.compile(r"([0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[a-z_][a-z0-9_-]*\$?")
_WORD = re.compile(r"[^\s\"'`$\\]+")


def validate(v: HostVars) -> None:
    """The variables, before any host is touched: URL, versions, key digest, users and groups,
    kernel settings, the expected GPUs."""
    if not isinstance(v.rocm_repo_base, str) or not _URL.fullmatch(v.rocm_repo_base):
        raise var_error(
            v,
            "rocm_repo_base",
            f"{v.rocm_repo_base!r} is not a URL",
            "https://repo.radeon.com, or your mirror: http(s)://host/path or file:///path",
        )
    for var in ("rocm_host_rocm_repo", "rocm_host_graphics_repo", "rocm_host_amdgpu_repo"):
        if not _REPO_VERSION.fullmatch(str(v[var])):
            raise var_error(
                v, var, f"{v[var]!r} is not a repository version", "e.g. 7.2.2, 7.2.1, 30.30"
            )
    for var in ("rocm_host_amdgpu_dkms_version", "rocm_host_rocm_version"):
        if v[var] and not _APT_VERSION.fullmatch(str(v[var])):
            raise var_error(
                v,
                var,
                f"{v[var]!r} is not an apt version",
                'the full version as `apt-cache policy` shows it, or "" for the candidate',
            )
    if not _SHA256.fullmatch(str(v.rocm_host_key_sha256).lower().removeprefix("sha256:")):
        raise var_error(
            v,
            "rocm_host_key_sha256",
            f"{v.rocm_host_key_sha256!r} is not a sha256",
            f"fetch {v.rocm_host_key_url}, check its fingerprint (gpg --show-keys), then "
            "give its sha256sum: fxkit keeps the key only if it has that digest",
        )
    words(v, "rocm_host_users", _NAME, "user names", "e.g. [vllm, alice]")
    words(v, "rocm_host_groups", _NAME, "group names", "e.g. [render, video]")
    if not isinstance(v.rocm_host_sysctl, dict):
        raise var_error(
            v,
            "rocm_host_sysctl",
            f"{v.rocm_host_sysctl!r} is not a mapping",
            "name: value, e.g. {kernel.numa_balancing: 0}",
        )
    words(
        v,
        "rocm_host_kernel_args",
        _WORD,
        "kernel arguments",
        "e.g. [pci=realloc=off, iommu=pt]: no spaces, quotes, $, ` or \\",
    )
    for var in ("rocm_host_gpu_count", "rocm_host_gpu_vram_gib"):
        if isinstance(v[var], bool) or not isinstance(v[var], int) or v[var] < 1:
            raise var_error(v, var, f"{v[var]!r} is not a number >= 1", "e.g. 8 GPUs, 192 GiB")
    if not isinstance(v.rocm_host_gpu_model, str) or not _WORD.fullmatch(v.rocm_host_gpu_model):
        raise var_error(v, "rocm_host_gpu_model", "wants a model name", "e.g. MI308X or MI300X")
    if not _WORD.fullmatch(str(v.rocm_host_apt_arch)):
        raise var_error(v, "rocm_host_apt_arch", "wants a Debian architecture", "e.g. amd64")


def not_run(ctx: OpContext, step: str, reason: str) -> Result:
    """A step that is due but does not run here, with the reason (never ok or changed)."""
    return skipped(f"{step}: {reason}")


def verified(ctx: OpContext, what: str) -> Result:
    """A verification that ran and found what was wanted."""
    return ok(what)


def apply(host: Host, v: HostVars) -> None:
    os_info = host.fact(OsRelease)
    if os_info.id != "ubuntu" or os_info.codename not in UBUNTU:
        supported = " and ".join(f"{n} ({c})" for c, n in UBUNTU.items())
        host.fail(
            f"ROCm 7.2 is for Ubuntu {supported}; this host runs "
            f"{os_info.pretty_name or os_info.id} ({os_info.codename or 'no codename'})"
        )
    repositories(host, v, os_info.codename)
    dkms = packages(host, v)
    for group in v.rocm_host_groups:
        host.group(group, system=True)
    for user in v.rocm_host_users:
        host.group_member(user, v.rocm_host_groups)
    for name, value in v.rocm_host_sysctl.items():
        host.sysctl(name, value, file=v.rocm_host_sysctl_file)
    due, lacking = reboot_due(host, v, dkms)
    if due and truthy(v.rocm_host_reboot):
        rebooted = host.reboot(timeout=v.rocm_host_reboot_timeout)
        if rebooted.changed and not host.check:  # back, with every fact read anew
            still = [a for a in lacking if a not in host.fact(KernelCmdline)]
            if still:
                host.fail(
                    f"rebooted, but the running kernel lacks {' '.join(still)} "
                    "(/proc/cmdline): is the boot loader's config regenerated (update-grub)?"
                )
            due = ""
    elif due:
        host.task("reboot").call(
            not_run, "reboot", f"needed ({due}); rocm_host_reboot is false: reboot the host"
        )
    verify(host, v, host.fact(Gpus), due)


def repositories(host: Host, v: HostVars, codename: str) -> None:
    """The signing key, the sources and the pin, as AMD's install guide writes them."""
    base = v.rocm_repo_base.rstrip("/")
    host.directory(posixpath.dirname(v.rocm_host_keyring), mode="0755")
    host.download(v.rocm_host_key_url, v.rocm_host_key_file, v.rocm_host_key_sha256, mode="0644")
    # Check mode on a new host: nothing downloaded, so only the source files can be previewed.
    key = host.fact(CommandOutput, f"cat -- {quote(v.rocm_host_key_file)}")
    sources = {
        "rocm": [
            f"{base}/rocm/apt/{v.rocm_host_rocm_repo}",
            f"{base}/graphics/{v.rocm_host_graphics_repo}/ubuntu",
        ],
        "amdgpu": [f"{base}/amdgpu/{v.rocm_host_amdgpu_repo}/ubuntu"],
    }
    for name, uris in sources.items():
        host.apt_repository(
            name,
            uris,
            codename,
            "main",
            key=key.stdout if key.ok and name == "rocm" else None,
            keyring=v.rocm_host_keyring,
            architectures=v.rocm_host_apt_arch,
            style="one-line",
            update=True,
        )
    host.apt_pin("rocm-pin-600", f"release o={v.rocm_host_pin_origin}", v.rocm_host_pin_priority)


def packages(host: Host, v: HostVars) -> Result:
    """amdgpu-dkms, then rocm, each at its pinned version (or the candidate); the installed
    versions read back. Returns amdgpu-dkms's result (a new driver needs a reboot)."""
    wanted = {"amdgpu-dkms": v.rocm_host_amdgpu_dkms_version, "rocm": v.rocm_host_rocm_version}
    results = {
        name: host.packages(f"{name}={version}" if version else name)
        for name, version in wanted.items()
    }
    installed = host.fact(InstalledPackages, *wanted)
    for name, version in wanted.items():
        found = installed.get(name)
        if not host.check and (found is None or (version and not version_matches(found, version))):
            host.fail(f"{name}: wanted {version or 'installed'}, dpkg has {found or 'nothing'}")
    return results["amdgpu-dkms"]


def reboot_due(host: Host, v: HostVars, dkms: Result) -> tuple[str, list[str]]:
    """Why the host needs a reboot ("" when it does not), and the kernel arguments it is to
    bring: they are in GRUB's config but not in the running kernel, or amdgpu-dkms was
    installed in this run."""
    reasons, lacking = [], []
    if v.rocm_host_kernel_args:
        grub = host.fact(FileStat, v.rocm_host_grub_file)
        if host.needs(
            grub.exists,
            "kernel command line",
            f"{v.rocm_host_grub_file} does not exist (no GRUB here)",
        ):
            host.kernel_cmdline(v.rocm_host_kernel_args, grub_file=v.rocm_host_grub_file)
            running = host.fact(KernelCmdline)
            lacking = [a for a in v.rocm_host_kernel_args if a not in running]
            if lacking:
                reasons.append(f"the running kernel lacks {' '.join(lacking)}")
    if dkms.changed:
        reasons.append("amdgpu-dkms was installed")
    return "; ".join(reasons), lacking


def verify(host: Host, v: HostVars, gpus: GpuInventory, due: str) -> None:
    """The expected count, model and memory of the GPUs, as the tools report them."""
    step = "verify GPUs"
    if not gpus.count and due:
        host.task(step).call(not_run, step, f"{gpus.missing}; a reboot is needed first ({due})")
        return
    if not host.needs(gpus.count, step, gpus.missing):
        return
    count, model, gib = v.rocm_host_gpu_count, v.rocm_host_gpu_model, v.rocm_host_gpu_vram_gib
    wrong = [
        g
        for g in gpus.gpus
        if not g.is_model(model) or g.vram_gib is None or round(g.vram_gib) != gib
    ]
    simulated = ", simulated lab host" if gpus.simulated else ""
    source = f"(source: {gpus.source}{simulated})"
    if gpus.count != count or wrong:
        found = "; ".join(f"GPU {g.index}: {g.describe()}" for g in (wrong or gpus.gpus))
        host.fail(
            f"{step}: wanted {count}x {model} with {gib} GiB each, found {gpus.count}"
            f"{', not as wanted: ' if wrong else ': '}{found} {source}"
        )
    host.task(step).call(verified, f"{count}x {model} with {gib} GiB each {source}")
