"""sysctl, module and kernel_cmdline with temp files for everything they persist; the live part
against a fake /proc/sys tree (plain files, as sysctl -w writes them) or the real one read-only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts import FactCache
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.kernel import kernel_cmdline, module, sysctl


def make_ctx(check: bool = False, diff: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


@pytest.fixture
def proc_sys(tmp_path: Path) -> Path:
    root = tmp_path / "proc_sys"
    (root / "vm").mkdir(parents=True)
    (root / "vm" / "swappiness").write_text("60\n")
    return root


def test_sysctl_persists_and_applies(tmp_path: Path, proc_sys: Path) -> None:
    conf = tmp_path / "90-fxkit.conf"
    conf.write_text("# tuned by fxkit\nvm.swappiness=30\n")
    args = {"file": str(conf), "proc_sys": str(proc_sys)}
    result = sysctl(make_ctx(check=True, diff=True), "vm.swappiness", 10, **args)
    assert result.changed and result.msg.endswith("would set vm.swappiness = 10")
    assert "+vm.swappiness = 10" in result.diff and "vm.swappiness: 60 -> 10" in result.diff
    assert conf.read_text().endswith("=30\n") and (proc_sys / "vm/swappiness").read_text() == "60\n"
    result = sysctl(make_ctx(), "vm.swappiness", 10, **args)
    assert result.changed and result.msg == f"updated {conf}; set vm.swappiness = 10"
    assert conf.read_text() == "# tuned by fxkit\nvm.swappiness = 10\n"
    assert (proc_sys / "vm/swappiness").read_text() == "10\n"
    assert sysctl(make_ctx(), "vm.swappiness", "10", **args).status is Status.OK


def test_sysctl_live_value_already_right(tmp_path: Path, proc_sys: Path) -> None:
    conf = tmp_path / "s.conf"
    result = sysctl(make_ctx(), "vm.swappiness", 60, file=str(conf), proc_sys=str(proc_sys))
    assert result.changed and result.msg == f"created {conf}; vm.swappiness is 60"


def test_sysctl_missing_key_is_persisted_and_skipped(tmp_path: Path, proc_sys: Path) -> None:
    conf = tmp_path / "s.conf"
    args = {"file": str(conf), "proc_sys": str(proc_sys)}
    result = sysctl(make_ctx(), "net.core.rmem_max", 1 << 20, **args)
    assert result.status is Status.CHANGED
    assert result.msg.endswith(
        "persisted; applies at boot: net.core.rmem_max does not exist on this host"
    )
    again = sysctl(make_ctx(), "net.core.rmem_max", 1 << 20, **args)
    assert again.status is Status.SKIPPED and "applies at boot" in again.msg


def test_sysctl_real_proc_sys_read_only(tmp_path: Path) -> None:
    """Against the real /proc/sys in check mode: nothing is written to the kernel."""
    current = Path("/proc/sys/vm/swappiness").read_text().strip()
    conf = tmp_path / "s.conf"
    result = sysctl(make_ctx(check=True), "vm.swappiness", current, file=str(conf))
    assert result.msg == f"would create {conf}; vm.swappiness is {current}"
    other = str(int(current) + 1)
    result = sysctl(make_ctx(check=True), "vm.swappiness", other, file=str(conf))
    assert result.changed and not conf.exists()
    assert Path("/proc/sys/vm/swappiness").read_text().strip() == current


def test_sysctl_bad_input(tmp_path: Path) -> None:
    with pytest.raises(OpError, match="bad sysctl name"):
        sysctl(make_ctx(), "vm.x; rm -rf /", 1, file=str(tmp_path / "f"))
    with pytest.raises(OpError, match="bad value"):
        sysctl(make_ctx(), "vm.swappiness", "1\nkernel.x=2", file=str(tmp_path / "f"))


def test_module_persisted_and_loaded_state(tmp_path: Path) -> None:
    load_dir, options_dir = tmp_path / "modules-load.d", tmp_path / "modprobe.d"
    load_dir.mkdir()
    options_dir.mkdir()
    dirs = {"modules_load_dir": str(load_dir), "modprobe_dir": str(options_dir)}
    loaded = sorted(os.listdir("/sys/module"))[0]  # built in or loaded: nothing to load
    result = module(make_ctx(check=True), loaded, {"debug": 1}, **dirs)
    assert result.changed and not list(load_dir.iterdir())
    result = module(make_ctx(), loaded, {"debug": 1}, **dirs)
    assert result.changed and result.msg.endswith("new options apply when it is next loaded")
    assert (load_dir / f"{loaded}.conf").read_text() == f"{loaded}\n"
    assert (options_dir / f"{loaded}.conf").read_text() == f"options {loaded} debug=1\n"
    assert module(make_ctx(), loaded, {"debug": 1}, **dirs).status is Status.OK


def test_module_cannot_load_here_is_skipped(tmp_path: Path) -> None:
    if any(Path(d, "modprobe").exists() for d in os.environ["PATH"].split(":")):
        pytest.skip("this machine can load modules; the lab tests loading")
    dirs = {"modules_load_dir": str(tmp_path), "modprobe_dir": str(tmp_path)}
    result = module(make_ctx(), "nvme_fabrics", **dirs)
    assert result.changed and result.msg.endswith(
        "persisted; loads at boot: modprobe is not installed"
    )
    again = module(make_ctx(), "nvme_fabrics", **dirs)
    assert again.status is Status.SKIPPED
    with pytest.raises(OpError):
        module(make_ctx(), "nvme; reboot", **dirs)


GRUB = """\
# If you change this file, run 'update-grub' afterwards
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=off"
GRUB_CMDLINE_LINUX=""
"""


def test_kernel_cmdline(tmp_path: Path) -> None:
    grub = tmp_path / "grub"
    grub.write_text(GRUB)
    args = ["iommu=pt", "amd_iommu=on", "pci=realloc=off"]
    result = kernel_cmdline(make_ctx(check=True, diff=True), args, grub_file=str(grub))
    assert result.changed and result.data["reboot_required"] is True
    assert (
        '+GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt amd_iommu=on pci=realloc=off"' in result.diff
    )
    assert grub.read_text() == GRUB
    result = kernel_cmdline(make_ctx(), args, grub_file=str(grub), update_grub=False)
    assert result.changed and result.data["reboot_required"]
    assert "reboot required (boot config not regenerated)" in result.msg
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt amd_iommu=on pci=realloc=off"\n' in (
        grub.read_text()
    )
    assert 'GRUB_CMDLINE_LINUX=""' in grub.read_text()
    again = kernel_cmdline(make_ctx(), args, grub_file=str(grub), update_grub=False)
    assert again.status is Status.OK and again.data == {}


def test_kernel_cmdline_in_grub_cmdline_linux_keeps_each_pci_option(tmp_path: Path) -> None:
    """AMD's kernel-parameters.md puts the arguments in GRUB_CMDLINE_LINUX; ``pci=`` takes
    several options (``pci=realloc=off`` and ``pci=bfsort`` are two arguments, as AMD's grubby
    line gives them), each replacing only its own old value."""
    grub = tmp_path / "grub"
    grub.write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX="pci=realloc=on"\n')
    args = ["pci=realloc=off", "pci=bfsort", "iommu=pt"]
    result = kernel_cmdline(
        make_ctx(), args, grub_file=str(grub), update_grub=False, variable="GRUB_CMDLINE_LINUX"
    )
    assert result.changed
    assert grub.read_text() == (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
        'GRUB_CMDLINE_LINUX="pci=realloc=off pci=bfsort iommu=pt"\n'
    )
    again = kernel_cmdline(
        make_ctx(), args, grub_file=str(grub), update_grub=False, variable="GRUB_CMDLINE_LINUX"
    )
    assert again.status is Status.OK
    with pytest.raises(OpError, match="bad GRUB variable"):
        kernel_cmdline(make_ctx(), args, grub_file=str(grub), variable="GRUB_TIMEOUT")


def test_kernel_cmdline_missing_file_and_bad_args(tmp_path: Path) -> None:
    result = kernel_cmdline(make_ctx(), ["quiet"], grub_file=str(tmp_path / "none"))
    assert result.failed and "does not exist" in result.msg
    with pytest.raises(OpError, match="bad kernel arguments"):
        kernel_cmdline(make_ctx(), ['a"; reboot; "'], grub_file=str(tmp_path / "none"))


def test_module_and_sysctl_create_a_missing_config_directory(
    tmp_path: Path, proc_sys: Path
) -> None:
    # Found on a lab host: a system without kmod has no /etc/modprobe.d and writing failed.
    options_dir = tmp_path / "etc" / "modprobe.d"
    dirs = {"modules_load_dir": str(tmp_path / "modules-load.d"), "modprobe_dir": str(options_dir)}
    preview = module(make_ctx(check=True), "nvme_fabrics", {"debug": 1}, **dirs)
    assert preview.changed and not (tmp_path / "etc").exists()
    result = module(make_ctx(), "nvme_fabrics", {"debug": 1}, **dirs)
    assert not result.failed and f"created {options_dir}" in result.msg
    assert (options_dir / "nvme_fabrics.conf").read_text() == "options nvme_fabrics debug=1\n"
    assert not module(make_ctx(), "nvme_fabrics", {"debug": 1}, **dirs).changed

    conf = tmp_path / "sysctl.d" / "90-fxkit.conf"
    result = sysctl(make_ctx(), "vm.swappiness", 60, file=str(conf), proc_sys=str(proc_sys))
    assert result.changed and conf.read_text() == "vm.swappiness = 60\n"
