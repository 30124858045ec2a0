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
from shlex import quote
from typing import Annotated

from pydantic import Field

from fxkit.engine.role import Host
from fxkit.engine.rolevars import AbsolutePath, RoleVars, Text, Whole, pattern
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


#: A word that goes into a shell command or an apt file as it is.
_WORD = r"[^\s\"'`$\\]+"
Url = Annotated[str, pattern(r"(https?|file)://[^\s\"'#\[\]]+", "an http(s):// or file:// URL")]
RepoVersion = Annotated[Text, pattern(r"\d+\.\d+(\.\d+)?", "a repository version")]
AptVersion = Annotated[Text, pattern(r"(([0-9]+:)?[0-9][A-Za-z0-9.+~-]*)?", 'an apt version or ""')]
Sha256 = Annotated[str, pattern(r"(?i)(sha256:)?[0-9a-f]{64}", "a sha256 (64 hex digits)")]
_ACCOUNT = r"[a-z_][a-z0-9_-]*\$?"
User = Annotated[str, pattern(_ACCOUNT, "a user name")]
Group = Annotated[str, pattern(_ACCOUNT, "a group name")]
KernelArg = Annotated[
    str, pattern(_WORD, "a kernel argument (no spaces, quotes, $, backquote or backslash)")
]


class Vars(RoleVars):
    rocm_repo_base: Url = Field(
        "https://repo.radeon.com",
        description="where the repositories are: repo.radeon.com or a mirror with its layout "
        "(`http(s)://` or `file:///`; an air-gapped site's mirror)",
        examples=["https://repo.radeon.com", "file:///srv/mirror/radeon"],
    )
    rocm_host_rocm_repo: RepoVersion = Field(
        "7.2.2", description="`{{ rocm_repo_base }}/rocm/apt/<this>`", examples=["7.2.2"]
    )
    rocm_host_graphics_repo: RepoVersion = Field(
        "7.2.1", description="`{{ rocm_repo_base }}/graphics/<this>/ubuntu`", examples=["7.2.1"]
    )
    rocm_host_amdgpu_repo: RepoVersion = Field(
        "30.30",
        description="`{{ rocm_repo_base }}/amdgpu/<this>/ubuntu` (the kernel driver; 30.30.x "
        "supports ROCm 7.2)",
        examples=["30.30"],
    )
    rocm_host_apt_arch: Annotated[str, pattern(_WORD, "a Debian architecture")] = Field(
        "amd64", description="the sources' `arch=`", examples=["amd64"]
    )
    rocm_host_key_url: Url = Field(
        "{{ rocm_repo_base }}/rocm/rocm.gpg.key",
        description="the armored signing key, downloaded by the host",
        examples=["https://repo.radeon.com/rocm/rocm.gpg.key"],
    )
    rocm_host_key_sha256: Sha256 = Field(
        description="its sha256: the key is kept only with this digest. No default: fetch the "
        "key once, check its fingerprint (`gpg --show-keys rocm.gpg.key`) against AMD's install "
        "guide, then give its `sha256sum`"
    )
    rocm_host_key_file: AbsolutePath = Field(
        "/etc/apt/keyrings/rocm.gpg.key",
        description="where the host keeps the armored key as downloaded",
    )
    rocm_host_keyring: AbsolutePath = Field(
        "/etc/apt/keyrings/rocm.gpg",
        description="the dearmored keyring apt reads, which the sources are signed by",
    )
    rocm_host_pin_origin: str = Field(
        "repo.radeon.com",
        min_length=1,
        description="the `o=` (Origin) the pin matches: apt prefers repo.radeon.com's packages "
        "over Ubuntu's own rocminfo, hipcc, ...",
    )
    rocm_host_pin_priority: Whole = Field(600, description="the pin's priority", examples=[600, -1])
    rocm_host_amdgpu_dkms_version: AptVersion = Field(
        "",
        description='amdgpu-dkms\'s apt version, installed exactly; `""`: the candidate',
        examples=["", "1:6.16.13.30300200-2278356.24.04"],
    )
    rocm_host_rocm_version: AptVersion = Field(
        "",
        description="rocm's apt version (as `apt-cache policy rocm` shows it), installed "
        'exactly; `""`: the candidate',
        examples=["", "7.2.2.70202-1~24.04"],
    )
    rocm_host_users: list[User] = Field(
        [],
        description="users who run GPU work: added to the groups below",
        examples=[["vllm", "alice"]],
    )
    rocm_host_groups: list[Group] = Field(
        ["render", "video"],
        description="the GPU device groups (created when missing)",
        examples=[["render", "video"]],
    )
    rocm_host_kernel_args: list[KernelArg] = Field(
        ["pci=realloc=off", "iommu=pt"],
        description="kernel command-line arguments (`[]`: leave it alone; MI300X-class tuning, "
        "ROCm's system optimization guide)",
        examples=[["pci=realloc=off", "iommu=pt"]],
    )
    rocm_host_grub_file: AbsolutePath = Field("/etc/default/grub", description="GRUB's config")
    rocm_host_sysctl: dict[str, str | int] = Field(
        {"kernel.numa_balancing": 0},
        description="kernel settings, name: value (ROCm's system optimization guide)",
        examples=[{"kernel.numa_balancing": 0}],
    )
    rocm_host_sysctl_file: AbsolutePath = Field(
        "/etc/sysctl.d/90-fxkit.conf", description="where they persist (node_base's file too)"
    )
    rocm_host_reboot: bool = Field(
        False,
        description="reboot when one is due (a new kernel command line or a new amdgpu-dkms), "
        "and wait",
    )
    rocm_host_reboot_timeout: Whole = Field(
        900, ge=1, description="seconds to wait for the host to come back"
    )
    rocm_host_gpu_count: Whole = Field(
        8, ge=1, description="GPUs the verification expects", examples=[8]
    )
    rocm_host_gpu_model: Annotated[str, pattern(_WORD, "a model name")] = Field(
        "MI308X", description="the model each must be", examples=["MI308X", "MI300X"]
    )
    rocm_host_gpu_vram_gib: Whole = Field(
        192,
        ge=1,
        description="GiB each must have (rounded: MI308X reports ~191.98)",
        examples=[192],
    )


def not_run(ctx: OpContext, step: str, reason: str) -> Result:
    """A step that is due but does not run here, with the reason (never ok or changed)."""
    return skipped(f"{step}: {reason}")


def verified(ctx: OpContext, what: str) -> Result:
    """A verification that ran and found what was wanted."""
    return ok(what)


def apply(host: Host, v: Vars) -> None:
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
    if due and v.rocm_host_reboot:
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


def repositories(host: Host, v: Vars, codename: str) -> None:
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


def packages(host: Host, v: Vars) -> Result:
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


def reboot_due(host: Host, v: Vars, dkms: Result) -> tuple[str, list[str]]:
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


def verify(host: Host, v: Vars, gpus: GpuInventory, due: str) -> None:
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
