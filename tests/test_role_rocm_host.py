"""roles/rocm_host on real lab hosts of the mi308x profile, through ``fxkit play``: the apt flow
for real, the boot settings read back from the stand-ins.

The hosts get a signed mirror laid out like repo.radeon.com (fxkit/lab/mirror.py: stand-in
``amdgpu-dkms`` and ``rocm`` packages built with dpkg-deb, InRelease signed by a key made for
the run), an Ubuntu archive with the running kernel's headers and extra modules, and an
/etc/os-release of Ubuntu (their /etc is an overlay of their own): lab01 noble, lab02 jammy
with a GRUB config as Ubuntu's cloud images have it, lab03 stays Debian. The role downloads the
key (pinned by sha256), dearmors it, writes the sources and the pin, and apt installs the
headers, then the candidate amdgpu-dkms (whose postinst has the stand-in ``dkms`` build amdgpu
for the running kernel, which needs those headers) and the pinned rocm. The profile's stand-ins
answer ``lscpu`` (an EPYC: amd_iommu=on), ``dkms`` and ``update-grub`` (it writes
/boot/grub/grub.cfg); its sysfs says the loaded amdgpu is 6.19.14. /proc/cmdline is this
machine's and lab hosts cannot reboot: a reboot stays pending, and is reported so. A host not
marked as a lab host fails what it lacks instead.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fxkit.connection.base import Connection
from fxkit.errors import VarError
from fxkit.lab import Fleet, calls
from fxkit.lab.mirror import (
    KERNEL,
    PACKAGES,
    REPOS,
    Mirror,
    add_ubuntu_archive,
    build,
    dkms_version,
    install,
)
from tests.gpg_helpers import SigningKey, signing_key
from tests.lab_helpers import events_of, sh, snapshot
from tests.test_play_lab import Run, cli_play, write_inventory

pytestmark = pytest.mark.lab

HOSTS = ["lab01", "lab02"]
CODENAMES = {"lab01": "noble", "lab02": "jammy"}
KEYRING = "/etc/apt/keyrings/rocm.gpg"
ROCM_LIST = "/etc/apt/sources.list.d/rocm.list"
AMDGPU_LIST = "/etc/apt/sources.list.d/amdgpu.list"
PIN = "/etc/apt/preferences.d/rocm-pin-600"
GRUB = "/etc/default/grub"
GRUB_CFG = "/boot/grub/grub.cfg"
CLOUDIMG = "/etc/default/grub.d/50-cloudimg-settings.cfg"
PINNED_ROCM = PACKAGES["rocm"][1][0]  # the older one: a pin must win over the candidate
NEWEST_DKMS = PACKAGES["amdgpu-dkms"][1][-1]
MACHINE = os.uname().machine  # dkms names the architecture as uname does
DKMS = dkms_version(NEWEST_DKMS)  # 6.19.14-30301: the profile's loaded amdgpu is 6.19.14
#: AMD's required arguments, the IOMMU one of the profile's EPYC, the NUMA option (defaults).
ARGS = "pci=realloc=off pci=bfsort iommu=pt amd_iommu=on numa_balancing=disable"
#: /etc/default/grub as Ubuntu ships it (the lines that matter), and the drop-in of Ubuntu's
#: cloud images (AWS EC2 user guide, "Configure GRUB", Ubuntu; Ubuntu's cloud image build):
#: it sets GRUB_CMDLINE_LINUX_DEFAULT, which is why the role writes GRUB_CMDLINE_LINUX.
GRUB_TEXT = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX=""\n'
CLOUDIMG_TEXT = (
    "# Cloud Image specific Grub settings for Generic Cloud Images\n"
    "# CLOUD_IMG: This file was created/modified by the Cloud Image build process\n\n"
    "# Set the recordfail timeout\nGRUB_RECORDFAIL_TIMEOUT=0\n\n"
    "# Do not wait on grub prompt\nGRUB_TIMEOUT=0\n\n"
    '# Set the default commandline\nGRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n\n'
    "# Set the grub console type\nGRUB_TERMINAL=console\n"
)
#: /etc/os-release as Ubuntu writes it.
OS_RELEASE = (
    'PRETTY_NAME="Ubuntu {version} LTS"\nNAME="Ubuntu"\nVERSION_ID="{version}"\n'
    'VERSION="{version} LTS"\nVERSION_CODENAME={codename}\nID=ubuntu\nID_LIKE=debian\n'
    "UBUNTU_CODENAME={codename}\n"
)


@dataclass
class Lab:
    fleet: Fleet
    key: SigningKey
    mirror: Mirror
    arch: str
    folder: Path

    def play(self, *args: str, **variables: object) -> Run:
        # `fxkit lab up` marks its hosts fxkit_lab: true (issue 9); said here too, for fleets
        # started before it did.
        common = {
            "fxkit_lab": True,
            "rocm_repo_base": self.mirror.url,
            "rocm_host_key_sha256": self.mirror.key_sha256,
            "rocm_host_apt_arch": self.arch,
            "rocm_host_rocm_version": PINNED_ROCM,
            "rocm_host_users": ["rocmuser"],
        }
        inventory = write_inventory(
            self.fleet, self.folder / "inventory.yml", **{**common, **variables}
        )
        return cli_play(self.folder / "rocm.yml", inventory, self.folder / "events.json", *args)


@pytest.fixture(scope="module")
def lab(lab_fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    fleet: Fleet = lab_fleet(3, name="rocm", profile="mi308x")  # apt state, users, os-release
    with fleet.connect("lab01") as conn:
        tools = sh(conn, "for t in apt-get dpkg curl; do command -v $t; done").split()
        if len(tools) < 3:
            pytest.skip("needs apt-get, dpkg and curl on the lab hosts")
        arch = sh(conn, "dpkg --print-architecture").strip()
    folder = tmp_path_factory.mktemp("rocm")
    (folder / "rocm.yml").write_text("- hosts: all\n  roles: [rocm_host]\n")
    with signing_key("fxkit lab rocm mirror") as key:
        mirror = build(key, arch, tuple(CODENAMES.values()))
        for name in ("lab01", "lab02", "lab03"):
            with fleet.connect(name) as conn:
                install(conn, mirror)
                sh(conn, "id rocmuser >/dev/null 2>&1 || useradd rocmuser")
                if name in CODENAMES:
                    version = {"jammy": "22.04", "noble": "24.04"}[CODENAMES[name]]
                    sh(conn, "rm -f /etc/os-release")
                    text = OS_RELEASE.format(version=version, codename=CODENAMES[name])
                    conn.put("/etc/os-release", text.encode())
                    add_ubuntu_archive(conn, mirror, arch, key.dearmored())
        with fleet.connect("lab02") as conn:
            conn.put(GRUB, GRUB_TEXT.encode())
            sh(conn, "mkdir -p /etc/default/grub.d")
            conn.put(CLOUDIMG, CLOUDIMG_TEXT.encode())
        yield Lab(fleet, key, mirror, arch, folder)


def test_check_then_apply_then_nothing_more(lab: Lab) -> None:
    before = {h: snapshot(lab.fleet, h) for h in HOSTS}
    check = lab.play("--check", "--diff", "--limit", "lab01,lab02")
    assert check.code == 0, check.output
    assert {h: snapshot(lab.fleet, h) for h in HOSTS} == before  # not a byte, mode or mtime
    assert all(n > 5 for n in check.counts("changed").values()), check.counts("changed")
    assert f"+deb [arch={lab.arch} signed-by={KEYRING}] {lab.mirror.url}/rocm/apt/" in check.output
    assert "+Pin: release o=repo.radeon.com" in check.output

    first = lab.play("--limit", "lab01,lab02")
    assert first.code == 0, first.output
    for host in HOSTS:
        codename = CODENAMES[host]
        with lab.fleet.connect(host) as conn:
            assert conn.get(KEYRING) == lab.key.dearmored()
            assert (
                conn.get(ROCM_LIST)
                == (
                    f"deb [arch={lab.arch} signed-by={KEYRING}] {lab.mirror.url}/rocm/apt/"
                    f"{REPOS['rocm']} {codename} main\n"
                    f"deb [arch={lab.arch} signed-by={KEYRING}] {lab.mirror.url}/graphics/"
                    f"{REPOS['graphics']}/ubuntu {codename} main\n"
                ).encode()
            )
            assert (
                conn.get(AMDGPU_LIST)
                == (
                    f"deb [arch={lab.arch} signed-by={KEYRING}] {lab.mirror.url}/amdgpu/"
                    f"{REPOS['amdgpu']}/ubuntu {codename} main\n"
                ).encode()
            )
            assert (
                conn.get(PIN) == b"Package: *\nPin: release o=repo.radeon.com\nPin-Priority: 600\n"
            )
            versions = sh(conn, "dpkg-query -W -f '${Package} ${Version}\\n' rocm amdgpu-dkms")
            assert versions == f"amdgpu-dkms {NEWEST_DKMS}\nrocm {PINNED_ROCM}\n"
            # apt checked the signature with the dearmored key and ranks the mirror at 600.
            policy = sh(conn, "apt-cache policy rocm")
            assert f"600 file:{lab.mirror.root}/rocm/apt/{REPOS['rocm']} {codename}/main" in policy
            assert set(sh(conn, "id -nG rocmuser").split()) >= {"render", "video"}
            assert "kernel.numa_balancing = 0\n" in sh(conn, "cat /etc/sysctl.d/90-fxkit.conf")
            key_sum = hashlib.sha256(conn.get("/etc/apt/keyrings/rocm.gpg.key") or b"")
            assert key_sum.hexdigest() == lab.mirror.key_sha256

            # The headers first: amdgpu-dkms's postinst built amdgpu against them.
            assert sh(conn, "dkms status") == f"amdgpu/{DKMS}, {KERNEL}, {MACHINE}: installed\n"
            env = sh(conn, "cat /etc/environment")
            assert "HIP_FORCE_DEV_KERNARG=1\nHSA_OVERRIDE_CPU_AFFINITY_DEBUG=0\n" in env
        assert dict(events_of(first, host, "ok"))["loaded amdgpu"] == (
            "/sys/module/amdgpu/version is 6.19.14: the DKMS build"
        )
        assert dict(events_of(first, host, "ok"))["amdgpu DKMS build"] == (
            f"amdgpu/{DKMS} installed for {KERNEL} (dkms status)"
        )

    # lab01: no GRUB, no reboot. lab02: GRUB's config changed, the running kernel not.
    skipped = dict(events_of(first, "lab01", "skipped"))
    assert skipped["kernel command line"] == (
        f"kernel command line: {GRUB} does not exist (no GRUB here)"
    )
    assert skipped["reboot"] == (
        "reboot: needed (amdgpu-dkms was installed); rocm_host_reboot is false: reboot the host"
    )
    with lab.fleet.connect("lab02") as conn:
        grub = sh(conn, f"cat {GRUB}")
        grub_cfg = sh(conn, f"cat {GRUB_CFG}")
        update_grub = [c for c in calls(conn) if c["argv"][0] == "update-grub"]
        assert sh(conn, f"cat {CLOUDIMG}") == CLOUDIMG_TEXT  # left as it is
    assert f'GRUB_CMDLINE_LINUX="{ARGS}"\n' in grub
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n' in grub
    # update-grub once; its default entry has them (and the cloud image's console settings).
    assert len(update_grub) == 1
    assert f"ro {ARGS} console=tty1 console=ttyS0\n" in grub_cfg
    assert dict(events_of(first, "lab02", "ok"))["grub.cfg"] == (
        f"the default entry of {GRUB_CFG} has {ARGS}"
    )
    lacking = f"the running kernel lacks {ARGS}"
    skipped = dict(events_of(first, "lab02", "skipped"))
    assert skipped["reboot"] == (
        f"reboot: needed ({lacking}; amdgpu-dkms was installed); rocm_host_reboot is false: "
        "reboot the host"
    )
    assert skipped["running kernel command line"] == (
        f"running kernel command line: /proc/cmdline lacks {ARGS}: a reboot is pending"
    )
    for host in HOSTS:
        assert dict(events_of(first, host, "ok"))["verify GPUs"] == (
            "8x MI308X with 192 GiB each (source: amd-smi static --json, simulated lab host)"
        )

    converged = {h: snapshot(lab.fleet, h) for h in HOSTS}
    again = lab.play("--limit", "lab01,lab02")
    assert again.code == 0, again.output
    assert again.counts("changed") == dict.fromkeys(HOSTS, 0)
    assert {h: snapshot(lab.fleet, h) for h in HOSTS} == converged
    assert "reboot" not in dict(events_of(again, "lab01", "skipped"))
    assert dict(events_of(again, "lab02", "skipped"))["reboot"] == (
        f"reboot: needed ({lacking}); rocm_host_reboot is false: reboot the host"
    )
    assert lab.play("--check", "--limit", "lab01,lab02").counts("changed") == dict.fromkeys(
        HOSTS, 0
    )
    with lab.fleet.connect("lab02") as conn:
        assert len([c for c in calls(conn) if c["argv"][0] == "update-grub"]) == 1
        assert sh(conn, f"cat {GRUB_CFG}") == grub_cfg


def test_a_host_not_marked_as_lab_fails_the_missing_grub(lab: Lab) -> None:
    assert lab.play("--limit", "lab01").code == 0  # converged (a no-op when it already is)
    assert lab.play("--limit", "lab01", fxkit_lab=False, rocm_host_grub=False).code == 0
    run = lab.play("--limit", "lab01", fxkit_lab=False)
    assert dict(events_of(run, "lab01", "failed"))["fail"].startswith(
        f"kernel command line: {GRUB} does not exist (no GRUB here) (this host is not marked"
    )


def test_verification_reads_the_gpus_and_says_what_it_found(lab: Lab) -> None:
    """The profile's amd-smi answers 8 MI308X: other expectations fail, naming what it found."""
    wrong = lab.play("--limit", "lab01", rocm_host_gpu_count=4, rocm_host_gpu_model="MI300X")
    assert wrong.code == 1
    assert dict(events_of(wrong, "lab01", "failed"))["fail"].startswith(
        "verify GPUs: wanted 4x MI300X with 192 GiB each, found 8, not as wanted: "
        "GPU 0: AMD Instinct MI308X (0x74a2), 192 GiB; GPU 1: "
    )


def test_a_key_with_another_digest_is_not_kept_and_nothing_is_written(lab: Lab) -> None:
    with lab.fleet.connect("lab03") as conn:
        sh(conn, "rm -f /etc/os-release")
        conn.put("/etc/os-release", OS_RELEASE.format(version="24.04", codename="noble").encode())
    wrong = "0" * 64
    run = lab.play("--limit", "lab03", rocm_host_key_sha256=wrong)
    assert run.code == 1
    failure = dict(events_of(run, "lab03", "failed"))
    [msg] = failure.values()
    assert f"not the expected {wrong}" in msg
    with lab.fleet.connect("lab03") as conn:
        for path in (KEYRING, "/etc/apt/keyrings/rocm.gpg.key", ROCM_LIST, AMDGPU_LIST, PIN):
            assert conn.get(path) is None, path


def test_not_ubuntu_fails_before_any_change(lab: Lab) -> None:
    with lab.fleet.connect("lab03") as conn:
        saved = conn.get("/etc/os-release")
        sh(conn, "rm -f /etc/os-release")
        conn.put(
            "/etc/os-release",
            b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_CODENAME=bookworm\n',
        )
        try:
            run = lab.play("--limit", "lab03")
        finally:
            sh(conn, "rm -f /etc/os-release")
            conn.put("/etc/os-release", saved or b"")
    assert run.code == 1 and run.counts("changed") == {"lab03": 0}
    assert dict(events_of(run, "lab03", "failed"))["fail"] == (
        "ROCm 7.2 is for Ubuntu 22.04 (jammy) and 24.04 (noble); this host runs "
        "Debian GNU/Linux 12 (bookworm) (bookworm)"
    )


def test_wrong_variables_are_named_before_any_host_is_touched(lab: Lab) -> None:
    """Through the CLI; every variable's wrong values: tests/test_role_rocm_host_vars.py."""
    before = snapshot(lab.fleet, "lab03")
    for variables, named in [
        ({"rocm_host_key_sha256": ""}, "lab03: rocm_host_key_sha256"),
        ({"rocm_host_kernel_args": ["iommu=pt quiet"]}, "lab03: rocm_host_kernel_args"),
        ({"rocm_host_kernel_args": ["iommu=pt", "iommu=off"]}, "lab03: rocm_host_kernel_args"),
        (
            {"rocm_host_kernel_args": ["transparent_hugepage=never"]}
            | {"rocm_host_transparent_hugepage": "always"},
            "lab03: rocm_host_transparent_hugepage",
        ),
        ({"rocm_host_iommu_arg": "on"}, "lab03: rocm_host_iommu_arg"),
        ({"rocm_host_environment": {"A B": "1"}}, "lab03: rocm_host_environment"),
    ]:
        with pytest.raises(VarError) as caught:
            lab.play("--limit", "lab03", **variables)
        assert str(caught.value).startswith(named), caught.value
    assert snapshot(lab.fleet, "lab03") == before


def test_an_opt_in_reboot_that_cannot_happen_is_skipped_with_the_reason(lab: Lab) -> None:
    run = lab.play("--limit", "lab02", rocm_host_reboot=True)
    assert run.code == 0, run.output
    skipped = dict(events_of(run, "lab02", "skipped"))
    assert skipped["reboot"].startswith("cannot reboot this host: PID 1 is sshd"), skipped
    assert dict(events_of(run, "lab02", "skipped"))["running kernel command line"] == (
        f"running kernel command line: /proc/cmdline lacks {ARGS}: a reboot is pending"
    )


SITE_CFG = "/etc/default/grub.d/60-site.cfg"


def update_grub_calls(conn: Connection) -> int:
    return len([c for c in calls(conn) if c["argv"][0] == "update-grub"])


def test_a_grub_d_file_that_drops_the_arguments_is_named_or_edited(lab: Lab) -> None:
    """A drop-in that assigns GRUB_CMDLINE_LINUX (sourced after /etc/default/grub, as
    update-grub does) would drop the arguments: the role names it; with ``edit`` it puts them
    there too, then runs update-grub once and reads grub.cfg back."""
    assert lab.play("--limit", "lab02").code == 0
    with lab.fleet.connect("lab02") as conn:
        conn.put(SITE_CFG, b'GRUB_CMDLINE_LINUX="console=ttyS1"\n')
        grub_cfg, runs = sh(conn, f"cat {GRUB_CFG}"), update_grub_calls(conn)
    try:
        before = snapshot(lab.fleet, "lab02")
        refused = lab.play("--limit", "lab02")
        assert refused.code == 1
        assert dict(events_of(refused, "lab02", "failed"))["fail"] == (
            f"kernel command line: {SITE_CFG} sets GRUB_CMDLINE_LINUX without keeping the value "
            'before it, so the arguments do not reach grub.cfg: write it as GRUB_CMDLINE_LINUX="'
            '$GRUB_CMDLINE_LINUX ...", or set rocm_host_grub_dropin_override: edit'
        )
        check = lab.play("--check", "--diff", "--limit", "lab02", **EDIT)
        assert check.code == 0, check.output
        assert f'+GRUB_CMDLINE_LINUX="console=ttyS1 {ARGS}"' in check.output
        assert check.counts("changed") == {"lab02": 2}  # the drop-in and update-grub
        assert snapshot(lab.fleet, "lab02") == before
        with lab.fleet.connect("lab02") as conn:  # update-grub was not run, grub.cfg as it was
            assert update_grub_calls(conn) == runs and sh(conn, f"cat {GRUB_CFG}") == grub_cfg

        edited = lab.play("--limit", "lab02", **EDIT)
        assert edited.code == 0, edited.output
        with lab.fleet.connect("lab02") as conn:
            assert sh(conn, f"cat {SITE_CFG}") == f'GRUB_CMDLINE_LINUX="console=ttyS1 {ARGS}"\n'
            assert f"ro console=ttyS1 {ARGS} console=tty1 console=ttyS0\n" in sh(
                conn, f"cat {GRUB_CFG}"
            )
            assert update_grub_calls(conn) == runs + 1
        again = lab.play("--limit", "lab02", **EDIT)
        assert again.code == 0 and again.counts("changed") == {"lab02": 0}
    finally:
        with lab.fleet.connect("lab02") as conn:
            sh(conn, f"rm -f {SITE_CFG}")
            conn.put(GRUB_CFG, grub_cfg.encode())


EDIT = {"rocm_host_grub_dropin_override": "edit"}


def test_options_are_added_then_changed_in_place_and_read_back(lab: Lab) -> None:
    """processor.max_cstate=0 (os-tuning.md, "C-states Configuration") and transparent_hugepage=
    (kernel-parameters.md's optional table): added; another THP value replaces the old one in
    GRUB_CMDLINE_LINUX (never two); update-grub runs for each change only; grub.cfg read back."""
    assert lab.play("--limit", "lab02").code == 0
    with lab.fleet.connect("lab02") as conn:
        runs = update_grub_calls(conn)
    for value, count in (("madvise", 1), ("always", 2), ("always", 2)):
        run = lab.play(
            "--limit",
            "lab02",
            rocm_host_transparent_hugepage=value,
            rocm_host_max_cstate_arg=True,
        )
        assert run.code == 0, run.output
        with lab.fleet.connect("lab02") as conn:
            grub, grub_cfg = sh(conn, f"cat {GRUB}"), sh(conn, f"cat {GRUB_CFG}")
            assert update_grub_calls(conn) == runs + count
        wanted = f"{ARGS} processor.max_cstate=0 transparent_hugepage={value}"
        assert f'GRUB_CMDLINE_LINUX="{wanted}"\n' in grub
        assert grub.count("transparent_hugepage=") == 1
        assert f"ro {wanted} console=tty1" in grub_cfg
        assert dict(events_of(run, "lab02", "skipped"))["running kernel command line"] == (
            f"running kernel command line: /proc/cmdline lacks {wanted}: a reboot is pending"
        )


def test_a_running_kernel_with_the_arguments_is_verified_from_proc_cmdline(lab: Lab) -> None:
    """Arguments this machine's kernel runs with (lab hosts share it): read back from
    /proc/cmdline, no reboot due."""
    with lab.fleet.connect("lab02") as conn:
        words = sh(conn, "cat /proc/cmdline").split()
    usable = [w for w in words if re.fullmatch(r"[A-Za-z0-9_.,:=-]+", w) and w != "--"][:2]
    if not usable:
        pytest.skip(f"this machine's kernel command line has no plain argument: {words}")
    run = lab.play(
        "--limit",
        "lab02",
        rocm_host_kernel_args=usable,
        rocm_host_iommu_arg="",
        rocm_host_numa_balancing_arg=False,
    )
    assert run.code == 0, run.output
    assert dict(events_of(run, "lab02", "ok"))["running kernel command line"] == (
        f"/proc/cmdline has {' '.join(usable)}"
    )
    assert "reboot" not in dict(events_of(run, "lab02", "skipped"))


def test_without_the_headers_dkms_cannot_build_amdgpu(lab: Lab) -> None:
    """amdgpu-docs prerequisites.rst: DKMS builds amdgpu against the running kernel's headers.
    Without them amdgpu-dkms installs, but ``dkms status`` has it only added: said so on a lab
    host, a failure on any other."""
    with lab.fleet.connect("lab03") as conn:
        sh(conn, "rm -f /etc/os-release")
        conn.put("/etc/os-release", OS_RELEASE.format(version="24.04", codename="noble").encode())
    run = lab.play("--limit", "lab03", rocm_host_kernel_headers=False)
    assert run.code == 0, run.output
    missing = (
        f"dkms status shows no amdgpu installed for the running kernel {KERNEL} "
        f"(amdgpu/{DKMS} added)"
    )
    skipped = dict(events_of(run, "lab03", "skipped"))
    assert skipped["amdgpu DKMS build"] == f"amdgpu DKMS build: {missing}"
    with lab.fleet.connect("lab03") as conn:
        assert sh(conn, "dkms status") == f"amdgpu/{DKMS}: added\n"
    strict = lab.play(
        "--limit", "lab03", rocm_host_kernel_headers=False, rocm_host_grub=False, fxkit_lab=False
    )
    assert dict(events_of(strict, "lab03", "failed"))["fail"].startswith(
        f"amdgpu DKMS build: {missing} (this host is not marked as a lab host"
    )


def test_an_intel_cpu_gets_intel_iommu_on(lab_fleet, lab: Lab) -> None:
    """The mi308x-intel-cpu variant's lscpu (util-linux's recorded Xeon) says GenuineIntel:
    the check-mode diff of GRUB's config has intel_iommu=on, not amd_iommu=on."""
    fleet: Fleet = lab_fleet(1, name="rocm-intel", profile="mi308x-intel-cpu")
    with fleet.connect("lab01") as conn:
        assert "Vendor ID:             GenuineIntel\n" in sh(conn, "lscpu")
        sh(conn, "id rocmuser >/dev/null 2>&1 || useradd rocmuser")
        sh(conn, "rm -f /etc/os-release")
        conn.put("/etc/os-release", OS_RELEASE.format(version="24.04", codename="noble").encode())
        conn.put(GRUB, GRUB_TEXT.encode())
        install(conn, lab.mirror)
    intel = Lab(fleet, lab.key, lab.mirror, lab.arch, lab.folder)
    check = intel.play("--check", "--diff", "--limit", "lab01")
    assert check.code == 0, check.output
    wanted = ARGS.replace("amd_iommu=on", "intel_iommu=on")
    assert f'+GRUB_CMDLINE_LINUX="{wanted}"' in check.output
