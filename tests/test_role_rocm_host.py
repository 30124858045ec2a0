"""roles/rocm_host on real lab hosts, through ``fxkit play``: the apt flow for real.

The hosts get a signed mirror laid out like repo.radeon.com (tests/rocm_mirror.py: stand-in
``amdgpu-dkms`` and ``rocm`` packages built with dpkg-deb, InRelease signed by a key made for
the run) and an /etc/os-release of Ubuntu (their /etc is an overlay of their own): lab01 noble,
lab02 jammy with a GRUB config, lab03 stays Debian. The role downloads the key (pinned by
sha256), dearmors it, writes the sources and the pin, and apt installs the pinned rocm version
and the candidate amdgpu-dkms from the signed mirror. Plain lab hosts have no GPU, no GRUB
(lab01) and cannot reboot: those steps are skipped with their reasons. A host not marked as a
lab host fails them instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fxkit.errors import VarError
from fxkit.lab import Fleet
from tests.gpg_helpers import SigningKey, signing_key
from tests.lab_helpers import events_of, sh, snapshot
from tests.rocm_mirror import PACKAGES, REPOS, Mirror, build, install
from tests.test_play_lab import Run, cli_play, write_inventory

pytestmark = pytest.mark.lab

HOSTS = ["lab01", "lab02"]
CODENAMES = {"lab01": "noble", "lab02": "jammy"}
KEYRING = "/etc/apt/keyrings/rocm.gpg"
ROCM_LIST = "/etc/apt/sources.list.d/rocm.list"
AMDGPU_LIST = "/etc/apt/sources.list.d/amdgpu.list"
PIN = "/etc/apt/preferences.d/rocm-pin-600"
GRUB = "/etc/default/grub"
PINNED_ROCM = PACKAGES["rocm"][1][0]  # the older one: a pin must win over the candidate
NEWEST_DKMS = PACKAGES["amdgpu-dkms"][1][-1]
NO_TOOL = "no GPU tool found (amd-smi, rocm-smi, rocminfo)"
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
    fleet: Fleet = lab_fleet(3, name="rocm")  # of its own: apt state, users, os-release
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
        with fleet.connect("lab02") as conn:
            conn.put(GRUB, b'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n')
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

    # lab01: no GRUB, no GPU, no reboot. lab02: GRUB's config changed, the running kernel not.
    skipped = dict(events_of(first, "lab01", "skipped"))
    assert skipped["kernel command line"] == (
        f"kernel command line: {GRUB} does not exist (no GRUB here)"
    )
    assert skipped["reboot"] == (
        "reboot: needed (amdgpu-dkms was installed); rocm_host_reboot is false: reboot the host"
    )
    assert skipped["verify GPUs"] == (
        f"verify GPUs: {NO_TOOL}; a reboot is needed first (amdgpu-dkms was installed)"
    )
    with lab.fleet.connect("lab02") as conn:
        grub = sh(conn, f"cat {GRUB}")
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash pci=realloc=off iommu=pt"\n' in grub
    changed = dict(events_of(first, "lab02", "changed"))
    assert "reboot required" in changed["kernel_cmdline"]
    lacking = "the running kernel lacks pci=realloc=off iommu=pt"
    assert dict(events_of(first, "lab02", "skipped"))["reboot"] == (
        f"reboot: needed ({lacking}; amdgpu-dkms was installed); rocm_host_reboot is false: "
        "reboot the host"
    )

    converged = {h: snapshot(lab.fleet, h) for h in HOSTS}
    again = lab.play("--limit", "lab01,lab02")
    assert again.code == 0, again.output
    assert again.counts("changed") == dict.fromkeys(HOSTS, 0)
    assert {h: snapshot(lab.fleet, h) for h in HOSTS} == converged
    assert dict(events_of(again, "lab01", "skipped"))["verify GPUs"] == f"verify GPUs: {NO_TOOL}"
    assert "reboot" not in dict(events_of(again, "lab01", "skipped"))
    assert dict(events_of(again, "lab02", "skipped"))["verify GPUs"] == (
        f"verify GPUs: {NO_TOOL}; a reboot is needed first ({lacking})"
    )
    assert lab.play("--check", "--limit", "lab01,lab02").counts("changed") == dict.fromkeys(
        HOSTS, 0
    )


def test_a_host_not_marked_as_lab_fails_the_missing_gpu_and_grub(lab: Lab) -> None:
    assert lab.play("--limit", "lab01").code == 0  # converged (a no-op when it already is)
    run = lab.play("--limit", "lab01", fxkit_lab=False, rocm_host_kernel_args=[])
    assert run.code == 1
    assert dict(events_of(run, "lab01", "failed"))["fail"] == (
        f"verify GPUs: {NO_TOOL} (this host is not marked as a lab host, so this is a failure)"
    )
    run = lab.play("--limit", "lab01", fxkit_lab=False)
    assert dict(events_of(run, "lab01", "failed"))["fail"].startswith(
        f"kernel command line: {GRUB} does not exist (no GRUB here) (this host is not marked"
    )


def test_verification_reads_the_gpus_and_says_what_it_found(lab: Lab) -> None:
    """A stand-in amd-smi that prints the reference fixture (one MI300X; SOURCES.md: a test
    fixture of amd-smi static on MI300X, shortened): the role compares and reports."""
    fixture = Path(__file__).parent / "data" / "reference"
    fixture /= "amd_smi_static_mi300x_FIXTURE_shortened.json"
    with lab.fleet.connect("lab01") as conn:
        conn.put("/usr/local/share/amd-smi-static.json", fixture.read_bytes())
        conn.put(
            "/usr/local/bin/amd-smi",
            b'#!/bin/sh\n[ "$*" = "static --json" ] || exit 2\n'
            b"exec cat /usr/local/share/amd-smi-static.json\n",
        )
        sh(conn, "chmod 755 /usr/local/bin/amd-smi")
    try:
        wrong = lab.play("--limit", "lab01")
        assert wrong.code == 1
        assert dict(events_of(wrong, "lab01", "failed"))["fail"] == (
            "verify GPUs: wanted 8x MI308X with 192 GiB each, found 1, not as wanted: "
            "GPU 0: AMD Instinct MI300X (0x74a1), 192 GiB (source: amd-smi static --json)"
        )
        right = lab.play("--limit", "lab01", rocm_host_gpu_count=1, rocm_host_gpu_model="MI300X")
        assert right.code == 0, right.output
        assert dict(events_of(right, "lab01", "ok"))["verify GPUs"] == (
            "1x MI300X with 192 GiB each (source: amd-smi static --json)"
        )
    finally:
        with lab.fleet.connect("lab01") as conn:
            sh(conn, "rm -f /usr/local/bin/amd-smi /usr/local/share/amd-smi-static.json")


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
    assert skipped["verify GPUs"].startswith(
        f"verify GPUs: {NO_TOOL}; a reboot is needed first (the running kernel lacks "
        "pci=realloc=off iommu=pt"
    )
