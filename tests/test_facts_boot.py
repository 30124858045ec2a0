"""Boot facts (fxkit.facts.boot) on the tools' real outputs, and GRUB's defaults as a real shell
sources them.

- lscpu: util-linux's own expected outputs of real dumps (tests/data/reference/SOURCES.md):
  an Intel Xeon (Dell R710) here, an AMD EPYC 7451 in the mi308x lab profile;
- dkms status: AMD's sample (amdgpu-docs post-install.rst), RVS's example, and dkms 2 lines of
  public ROCm issues (tests/data/reference/dkms_status_amdgpu.txt).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.connection.base import RunResult
from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache, FactError
from fxkit.facts.boot import (
    AMD,
    INTEL,
    BootEntry,
    CpuVendor,
    DkmsModule,
    DkmsStatus,
    GrubDefaults,
    GrubSource,
    ModuleVersion,
)

REFERENCE = Path(__file__).parent / "data" / "reference"
PROFILE = Path(__file__).resolve().parents[1] / "fxkit" / "lab" / "profiles" / "mi308x"


def ran(stdout: str, rc: int = 0, stderr: str = "") -> RunResult:
    return RunResult("cmd", rc, stdout, stderr)


@pytest.mark.parametrize(
    "path, vendor",
    [
        (REFERENCE / "lscpu_x86_64_dellr710.txt", INTEL),
        (PROFILE / "lscpu_epyc_7451.txt", AMD),
    ],
)
def test_the_cpu_vendor_of_real_lscpu_output(path: Path, vendor: str) -> None:
    assert CpuVendor().parse(ran(path.read_text())) == vendor


def test_the_cpu_vendor_of_this_machine_from_lscpu_or_cpuinfo() -> None:
    vendor = FactCache(LocalConnection("localhost")).get(CpuVendor)
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert f"vendor_id\t: {vendor}\n" in cpuinfo


def test_dkms_status_of_both_formats() -> None:
    modules = DkmsStatus().parse(ran((REFERENCE / "dkms_status_amdgpu.txt").read_text()))
    assert modules is not None
    assert modules[0] == DkmsModule(
        "amdgpu", "6.14.14-2204008.24.04", "6.14.0-29-generic", "x86_64", "installed"
    )
    assert modules[0].module_version == "6.14.14"  # as RVS reads it
    assert modules[2] == DkmsModule(
        "amdgpu", "1.9-211.el7", "3.10.0-862.11.6.el7.x86_64", "x86_64", "installed"
    )
    assert modules[3] == DkmsModule("amdgpu", "18.50-756341.el7", "", "", "added")
    assert [m.state for m in modules] == ["installed"] * 3 + ["added", "installed"]


def test_dkms_missing_and_failing() -> None:
    assert DkmsStatus().parse(ran("", 3, "no dkms\n")) is None
    assert DkmsStatus().parse(ran("")) == ()
    with pytest.raises(FactError):
        DkmsStatus().parse(ran("", 1, "Error! something\n"))


def test_module_version_loaded_unversioned_absent() -> None:
    assert ModuleVersion().parse(ran("loaded\n6.19.14\n"), "amdgpu") == "6.19.14"
    assert ModuleVersion().parse(ran("loaded\n"), "amdgpu") == ""
    assert ModuleVersion().parse(ran(""), "amdgpu") is None


def test_boot_entry_reads_the_first_linux_line(tmp_path: Path) -> None:
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(
        "menuentry 'Ubuntu' {\n\tlinux\t/boot/vmlinuz-6.8.0-50-generic root=UUID=x ro "
        "iommu=pt quiet\n}\nmenuentry 'recovery' {\n\tlinux\t/boot/vmlinuz ro recovery\n}\n"
    )
    cache = FactCache(LocalConnection("localhost"))
    assert cache.get(BootEntry, str(cfg)) == ("root=UUID=x", "ro", "iommu=pt", "quiet")
    assert cache.get(BootEntry, str(tmp_path / "none")) is None


def test_grub_defaults_sourced_in_update_grubs_order(tmp_path: Path) -> None:
    """A drop-in that appends keeps the value; one that assigns replaces it (sh sources them)."""
    grub, dropins = tmp_path / "grub", tmp_path / "grub.d"
    dropins.mkdir()
    grub.write_text('GRUB_CMDLINE_LINUX="iommu=pt"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    (dropins / "40-append.cfg").write_text('GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX nokaslr"\n')
    (dropins / "50-cloudimg-settings.cfg").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n'
    )
    (dropins / "60-site.cfg").write_text('GRUB_CMDLINE_LINUX="console=ttyS1"\n')
    (dropins / "70-not-a-cfg.txt").write_text('GRUB_CMDLINE_LINUX="never"\n')
    cache = FactCache(LocalConnection("localhost"))
    got = cache.get(GrubDefaults, str(grub), str(dropins))
    assert got == (
        GrubSource(str(grub), "iommu=pt", "quiet"),
        GrubSource(str(dropins / "40-append.cfg"), "iommu=pt nokaslr", "quiet"),
        GrubSource(
            str(dropins / "50-cloudimg-settings.cfg"),
            "iommu=pt nokaslr",
            "console=tty1 console=ttyS0",
        ),
        GrubSource(str(dropins / "60-site.cfg"), "console=ttyS1", "console=tty1 console=ttyS0"),
    )
    assert cache.get(GrubDefaults, str(tmp_path / "no"), str(dropins)) == ()
