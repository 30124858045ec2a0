"""rocm_host: ROCm 7.2 on Ubuntu 22.04 / 24.04, tuned for MI300X-class GPUs, then verified.

1. the repo.radeon.com signing key (downloaded by the host, pinned by sha256) dearmored into
   /etc/apt/keyrings/rocm.gpg; the rocm and graphics sources (rocm.list), the amdgpu driver
   source (amdgpu.list) and the apt pin rocm-pin-600;
2. the running kernel's headers and extra modules, then amdgpu-dkms and rocm, at the versions
   asked for; users in render and video;
3. OS tuning (AMD's system-acceptance-docs os-tuning.md): kernel.numa_balancing=0, the ROCm
   environment variables;
4. the kernel command line AMD's kernel-parameters.md asks for (the IOMMU argument from the
   CPU vendor) in GRUB_CMDLINE_LINUX, checked against /etc/default/grub.d/*.cfg, update-grub
   when it changed; a reboot when one is due and ``rocm_host_reboot`` is on, else the reason;
5. read back: /proc/cmdline, amdgpu built by DKMS for the running kernel and loaded, the GPUs
   (amd-smi, rocm-smi or rocminfo): count, model and memory.
"""

from __future__ import annotations

import posixpath
from itertools import pairwise
from shlex import quote
from typing import Annotated, Literal

from pydantic import Field

from fxkit.engine.role import Host
from fxkit.engine.rolevars import AbsolutePath, RoleVars, Text, Whole, pattern
from fxkit.facts.boot import (
    AMD,
    INTEL,
    BootEntry,
    CpuVendor,
    DkmsStatus,
    GrubDefaults,
    GrubSource,
    ModuleVersion,
)
from fxkit.facts.commands import CommandOutput
from fxkit.facts.files import FileStat
from fxkit.facts.gpu import GpuInventory, Gpus
from fxkit.facts.kernel import KernelCmdline
from fxkit.facts.packages import InstalledPackages
from fxkit.facts.system import Kernel, OsRelease
from fxkit.ops.base import OpContext, Result, ok, skipped
from fxkit.ops.kernel import arg_key
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
EnvName = Annotated[str, pattern(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name")]
EnvValue = Annotated[str, pattern(r"[^\s\"'`$\\#]*", "a value without spaces or quotes")]
#: The IOMMU argument for each CPU vendor (kernel-parameters.md, "Required Kernel Parameters";
#: mi300x.md, "Check kernel boot arguments": amd_iommu=on or intel_iommu=on).
IOMMU = {AMD: "amd_iommu=on", INTEL: "intel_iommu=on"}
GRUB_VARIABLE = "GRUB_CMDLINE_LINUX"


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
    rocm_host_kernel_headers: bool = Field(
        True,
        description="install `linux-headers-$(uname -r)` and `linux-modules-extra-$(uname -r)` "
        "before amdgpu-dkms, which DKMS builds against them (amdgpu-docs prerequisites.rst, "
        '"Kernel headers")',
    )
    rocm_host_grub: bool = Field(
        True, description="manage the kernel command line (false: leave GRUB alone)"
    )
    rocm_host_kernel_args: list[KernelArg] = Field(
        ["pci=realloc=off", "pci=bfsort", "iommu=pt"],
        description="the kernel arguments of every node, AMD's required ones first "
        '(kernel-parameters.md, "Required Kernel Parameters"); add others here (`nokaslr`, '
        "`pcie_aspm=off`, ... from its optional table)",
        examples=[["pci=realloc=off", "pci=bfsort", "iommu=pt"]],
    )
    rocm_host_iommu_arg: Literal["cpu", "amd_iommu=on", "intel_iommu=on", ""] = Field(
        "cpu",
        description='`cpu`: `amd_iommu=on` or `intel_iommu=on` as lscpu\'s "Vendor ID" says '
        '(mi300x.md, "Check kernel boot arguments"); `""`: neither',
    )
    rocm_host_numa_balancing_arg: bool = Field(
        True,
        description='`numa_balancing=disable` on the command line (os-tuning.md, "NUMA '
        'Configuration"; kernel-parameters.md marks it optional), beside the sysctl',
    )
    rocm_host_max_cstate_arg: bool = Field(
        False,
        description='`processor.max_cstate=0`: the CPU stays in C0 (os-tuning.md, "C-states '
        'Configuration": the command line is the preferred way; kernel-parameters.md: '
        '"highly recommended when prioritizing performance", at a cost in power)',
    )
    rocm_host_transparent_hugepage: Literal["", "always", "madvise", "never"] = Field(
        "",
        description='`transparent_hugepage=` on the command line (`""`: the kernel\'s default; '
        "kernel-parameters.md: required `always` on MI300A only, optional on MI300X-class)",
    )
    rocm_host_grub_file: AbsolutePath = Field("/etc/default/grub", description="GRUB's config")
    rocm_host_grub_dropins: AbsolutePath = Field(
        "/etc/default/grub.d",
        description="the folder of `*.cfg` files update-grub sources after it (cloud images "
        "ship some)",
    )
    rocm_host_grub_dropin_override: Literal["fail", "edit"] = Field(
        "fail",
        description="a `*.cfg` there that sets GRUB_CMDLINE_LINUX without keeping the value "
        "before it, so that the arguments would not reach grub.cfg: `fail` names it; `edit` "
        "puts the arguments into it too",
    )
    rocm_host_grub_cfg: AbsolutePath = Field(
        "/boot/grub/grub.cfg", description="the boot config update-grub writes, read back"
    )
    rocm_host_sysctl: dict[str, str | int] = Field(
        {"kernel.numa_balancing": 0},
        description='kernel settings, name: value (os-tuning.md, "NUMA Configuration": 0, '
        "disabled)",
        examples=[{"kernel.numa_balancing": 0}],
    )
    rocm_host_sysctl_file: AbsolutePath = Field(
        "/etc/sysctl.d/90-fxkit.conf", description="where they persist (node_base's file too)"
    )
    rocm_host_environment: dict[EnvName, EnvValue] = Field(
        {"HIP_FORCE_DEV_KERNARG": "1", "HSA_OVERRIDE_CPU_AFFINITY_DEBUG": "0"},
        description='`NAME=value` lines of /etc/environment (os-tuning.md, "Critical ROCm/HIP '
        'Environment Variables"; `{}`: none)',
        examples=[{"HSA_OVERRIDE_CPU_AFFINITY_DEBUG": "0"}],
    )
    rocm_host_environment_file: AbsolutePath = Field(
        "/etc/environment", description="where they are set for every login (pam_env)"
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


def validate(v: Vars) -> None:
    """Two arguments for one kernel setting (``iommu=pt`` and ``iommu=off``; a list entry and
    an option) would leave the kernel to pick the last: refused."""
    options = [
        ("rocm_host_iommu_arg", a) for a in IOMMU.values() if v.rocm_host_iommu_arg in ("cpu", a)
    ]
    options += [("rocm_host_numa_balancing_arg", "numa_balancing=disable")] * int(
        v.rocm_host_numa_balancing_arg
    )
    options += [("rocm_host_max_cstate_arg", "processor.max_cstate=0")] * int(
        v.rocm_host_max_cstate_arg
    )
    if v.rocm_host_transparent_hugepage:
        thp = f"transparent_hugepage={v.rocm_host_transparent_hugepage}"
        options.append(("rocm_host_transparent_hugepage", thp))
    seen: dict[str, tuple[str, str]] = {}
    for variable, arg in [("rocm_host_kernel_args", a) for a in v.rocm_host_kernel_args] + options:
        key = arg_key(arg)
        if key in seen and seen[key][1] != arg:
            first, other = seen[key]
            raise v.wrong(
                variable,
                f"{variable} gives {arg}, {first} gives {other}: two values for {key}",
                hint="keep one (the kernel reads the last one, GRUB keeps both)",
            )
        seen.setdefault(key, (variable, arg))


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
    args = kernel_args(host, v)
    repositories(host, v, os_info.codename)
    dkms = packages(host, v)
    for group in v.rocm_host_groups:
        host.group(group, system=True)
    for user in v.rocm_host_users:
        host.group_member(user, v.rocm_host_groups)
    for name, value in v.rocm_host_sysctl.items():
        host.sysctl(name, value, file=v.rocm_host_sysctl_file)
    for name, text in v.rocm_host_environment.items():
        host.line(
            v.rocm_host_environment_file, f"{name}={text}", regexp=rf"^\s*(export\s+)?{name}="
        )
    if args:
        grub(host, v, args)
    due = reboot_due(host, v, args, dkms)
    if due and v.rocm_host_reboot:
        rebooted = host.reboot(timeout=v.rocm_host_reboot_timeout)
        if rebooted.changed and not host.check:  # back, with every fact read anew
            due = ""
            still = reboot_due(host, v, args, None)
            if still:
                host.fail(f"rebooted, but {still}")
    elif due:
        host.task("reboot").call(
            not_run, "reboot", f"needed ({due}); rocm_host_reboot is false: reboot the host"
        )
    verify_boot(host, v, args, due)
    verify(host, v, host.fact(Gpus), due)


def kernel_args(host: Host, v: Vars) -> list[str]:
    """Every argument the kernel is to run with: the list, the IOMMU one of this CPU's vendor,
    the options; [] when the role leaves GRUB alone."""
    if not v.rocm_host_grub:
        return []
    args = list(v.rocm_host_kernel_args)
    iommu: str = v.rocm_host_iommu_arg
    if iommu == "cpu":
        vendor = host.fact(CpuVendor)
        if vendor not in IOMMU:
            host.fail(
                f"rocm_host_iommu_arg is cpu, but lscpu names no vendor it knows ({vendor!r}, "
                f"not {' or '.join(IOMMU)}): set it to amd_iommu=on or intel_iommu=on"
            )
        iommu = IOMMU[vendor]
    options = {
        iommu: bool(iommu),
        "numa_balancing=disable": v.rocm_host_numa_balancing_arg,
        "processor.max_cstate=0": v.rocm_host_max_cstate_arg,
        f"transparent_hugepage={v.rocm_host_transparent_hugepage}": bool(
            v.rocm_host_transparent_hugepage
        ),
    }
    return args + [a for a, wanted in options.items() if wanted and a not in args]


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
    """The running kernel's headers and extra modules (DKMS builds amdgpu against them), then
    amdgpu-dkms, then rocm, each at its pinned version (or the candidate); the installed
    versions read back. Returns amdgpu-dkms's result (a new driver needs a reboot)."""
    if v.rocm_host_kernel_headers:
        release = host.fact(Kernel)
        host.packages([f"linux-headers-{release}", f"linux-modules-extra-{release}"])
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


def grub(host: Host, v: Vars, args: list[str]) -> None:
    """The arguments in GRUB_CMDLINE_LINUX of GRUB's config, where AMD's kernel-parameters.md
    puts them (cloud images set GRUB_CMDLINE_LINUX_DEFAULT in a grub.d file, which would win
    over /etc/default/grub's); a grub.d file that drops them is named, or edited too; then
    update-grub, when a file changed or grub.cfg's default entry lacks them, and grub.cfg read
    back."""
    step = "kernel command line"
    grub_file = v.rocm_host_grub_file
    if not host.needs(
        host.fact(FileStat, grub_file).exists, step, f"{grub_file} does not exist (no GRUB here)"
    ):
        return
    edits = [
        host.kernel_cmdline(args, grub_file=grub_file, update_grub=False, variable=GRUB_VARIABLE)
    ]
    culprits = dropping_files(host.fact(GrubDefaults, grub_file, v.rocm_host_grub_dropins), args)
    if culprits and v.rocm_host_grub_dropin_override == "fail":
        host.fail(
            f"{step}: {', '.join(culprits)} sets {GRUB_VARIABLE} without keeping the value "
            f"before it, so the arguments do not reach grub.cfg: write it as "
            f'{GRUB_VARIABLE}="${GRUB_VARIABLE} ...", or set rocm_host_grub_dropin_override: edit'
        )
    for path in culprits:
        edits.append(
            host.kernel_cmdline(args, grub_file=path, update_grub=False, variable=GRUB_VARIABLE)
        )
    entry = host.fact(BootEntry, v.rocm_host_grub_cfg)
    stale = entry is not None and not set(args) <= set(entry)
    if not any(e.changed for e in edits) and not stale:
        return
    tool = host.fact(CommandOutput, "command -v update-grub").stdout.strip()
    if not host.needs(tool, "update-grub", "update-grub is not installed: regenerate grub.cfg"):
        return
    host.task("update-grub").command("update-grub")
    if host.check:
        return
    entry = host.fact(BootEntry, v.rocm_host_grub_cfg)
    lacking = [a for a in args if entry is None or a not in entry]
    if lacking:
        host.fail(
            f"update-grub ran, but the default entry of {v.rocm_host_grub_cfg} lacks "
            f"{' '.join(lacking)}"
        )
    host.task("grub.cfg").call(
        verified, f"the default entry of {v.rocm_host_grub_cfg} has {' '.join(args)}"
    )


def dropping_files(sources: tuple[GrubSource, ...], args: list[str]) -> list[str]:
    """The grub.d files after which GRUB_CMDLINE_LINUX lacks arguments it had before them."""
    wanted = set(args)
    return [
        now.path
        for before, now in pairwise(sources)
        if wanted <= set(before.linux.split()) and not wanted <= set(now.linux.split())
    ]


def amdgpu_built(host: Host) -> tuple[str, str]:
    """The DKMS version of amdgpu installed for the running kernel (``dkms status``), and why
    there is none."""
    release = host.fact(Kernel)
    modules = host.fact(DkmsStatus)
    if modules is None:
        return "", "dkms is not installed"
    for module in modules:
        if module.name == "amdgpu" and module.kernel == release and module.state == "installed":
            return module.version, ""
    found = "; ".join(
        " ".join(w for w in (f"{m.name}/{m.version}", m.kernel, m.state) if w) for m in modules
    )
    return (
        "",
        f"dkms status shows no amdgpu installed for the running kernel {release} "
        f"({found or 'nothing'})",
    )


def reboot_due(host: Host, v: Vars, args: list[str], dkms: Result | None) -> str:
    """Why the host needs a reboot ("" when it does not): the running kernel (/proc/cmdline)
    lacks arguments GRUB now has, amdgpu-dkms was installed in this run, or the loaded amdgpu
    is not the DKMS build."""
    reasons = []
    if args and host.fact(FileStat, v.rocm_host_grub_file).exists:
        running = host.fact(KernelCmdline)
        lacking = [a for a in args if a not in running]
        if lacking:
            reasons.append(f"the running kernel lacks {' '.join(lacking)}")
    if dkms is not None and dkms.changed:
        reasons.append("amdgpu-dkms was installed")
    else:
        version, _ = amdgpu_built(host)
        loaded = host.fact(ModuleVersion, "amdgpu")
        if version and loaded != version.split("-", 1)[0]:
            reasons.append(f"amdgpu is {describe(loaded)}, not the DKMS build {version}")
    return "; ".join(reasons)


def verify_boot(host: Host, v: Vars, args: list[str], due: str) -> None:
    """Read back what the running kernel shows: its command line, and amdgpu built by DKMS for
    it and loaded (amdgpu-docs post-install.rst: ``dkms status``; /sys/module/amdgpu/version).
    A reboot still due is reported as such, never as done."""
    if args and host.fact(FileStat, v.rocm_host_grub_file).exists:
        step = "running kernel command line"
        running = host.fact(KernelCmdline)
        lacking = [a for a in args if a not in running]
        if lacking:
            host.task(step).call(
                not_run, step, f"/proc/cmdline lacks {' '.join(lacking)}: a reboot is pending"
            )
        else:
            host.task(step).call(verified, f"/proc/cmdline has {' '.join(args)}")
    step = "amdgpu DKMS build"
    if host.check and not host.fact(InstalledPackages, "amdgpu-dkms").get("amdgpu-dkms"):
        host.task(step).call(not_run, step, "check mode: amdgpu-dkms is not installed yet")
        return
    version, missing = amdgpu_built(host)
    if not host.needs(version, step, missing):
        return
    host.task(step).call(
        verified, f"amdgpu/{version} installed for {host.fact(Kernel)} (dkms status)"
    )
    step = "loaded amdgpu"
    loaded = host.fact(ModuleVersion, "amdgpu")
    if loaded == version.split("-", 1)[0]:
        host.task(step).call(verified, f"/sys/module/amdgpu/version is {loaded}: the DKMS build")
    elif due:
        host.task(step).call(
            not_run, step, f"amdgpu is {describe(loaded)}; a reboot is pending ({due})"
        )
    else:
        host.needs(False, step, f"amdgpu is {describe(loaded)}, not the DKMS build {version}")


def describe(loaded: str | None) -> str:
    """The loaded amdgpu, in words (/sys/module/amdgpu/version)."""
    if loaded is None:
        return "not loaded"
    return f"{loaded} (loaded)" if loaded else "the kernel's own (loaded, no version)"


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
