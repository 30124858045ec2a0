"""GPU facts (fxkit.facts.gpu) on the tools' real outputs, and host-state facts of the kernel.

Outputs are the files of tests/data/reference/ (copies of /work/shared/reference/; SOURCES.md
there says where each came from):

- amd_smi_static_mi300x_FIXTURE_shortened.json: a test fixture labelled ``amd-smi static --asic
  --vram --driver --bus --json`` on an MI300X, shortened (NOT a raw capture);
- rocm_smi_showproductname_mi300x_RECONSTRUCTED.json: reconstructed from product-identity
  assertions of public parsers, key order as rocm-smi prints it;
- rocm_smi_showmeminfo_vram_mi300x_FIXTURE.json: the value seen in several public parsers;
- rocminfo_mi300x_x4.txt: real rocminfo output embedded in thamada/nvidia-smi gls/MI300X_x4_*.py
  (an SR-IOV guest with 4 MI300X);
- amdgpu_ids_instinct_excerpt.txt: libdrm data/amdgpu.ids, the Instinct lines.

Every parser is also fed every file of its kind found there, and malformed or cut-off output,
which must give a FactError, never another exception. The Gpus command itself runs in a real
shell with stand-in tools (scripts printing those files) on PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from fxkit.connection.base import RunResult
from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache, FactError
from fxkit.facts.gpu import (
    INSTINCT_IDS,
    AmdSmiList,
    AmdSmiStatic,
    Gpu,
    Gpus,
    RocmInfo,
    RocmSmi,
    parse_amd_smi_list,
    parse_amd_smi_static,
    parse_rocm_smi,
    parse_rocminfo,
)
from fxkit.facts.kernel import KernelCmdline, LoadedModules
from fxkit.facts.lab import LAB_MARKER
from fxkit.facts.system import OsRelease

REFERENCE = Path(__file__).parent / "data" / "reference"
STATIC = REFERENCE / "amd_smi_static_mi300x_FIXTURE_shortened.json"
PRODUCT = REFERENCE / "rocm_smi_showproductname_mi300x_RECONSTRUCTED.json"
MEMINFO = REFERENCE / "rocm_smi_showmeminfo_vram_mi300x_FIXTURE.json"
ROCMINFO = REFERENCE / "rocminfo_mi300x_x4.txt"
MI300X = "AMD Instinct MI300X"


def text(path: Path) -> str:
    return path.read_text()


def every(pattern: str) -> list[Path]:
    found = sorted(REFERENCE.glob(pattern))
    assert found, f"no {pattern} in {REFERENCE}"
    return found


# -- amd-smi ---------------------------------------------------------------------------------


def test_amd_smi_static_fixture() -> None:
    (gpu,) = parse_amd_smi_static(text(STATIC))
    assert gpu == Gpu(
        index=0,
        market_name=MI300X,
        device_id=0x74A1,
        gfx_target="gfx942",
        vram_bytes=196592 << 20,  # amd-smi's "MB" is MiB: the library divides bytes by 1024²
        driver_version="6.19.14",
        bdf="0000:83:00.0",
    )
    assert gpu.is_model("MI300X") and not gpu.is_mi308x
    assert round(gpu.vram_gib or 0) == 192 and gpu.describe() == f"{MI300X} (0x74a1), 192 GiB"


@pytest.mark.parametrize("path", every("amd_smi_static_*.json"), ids=lambda p: p.name)
def test_every_amd_smi_static_file_both_shapes(path: Path) -> None:
    wrapped = json.loads(text(path))
    bare = wrapped["gpu_data"] if isinstance(wrapped, dict) else wrapped
    gpus = parse_amd_smi_static(json.dumps({"gpu_data": bare}))
    assert gpus == parse_amd_smi_static(json.dumps(bare)) == parse_amd_smi_static(text(path))
    assert gpus and all(g.name and g.device_id and g.gfx_target and g.vram_bytes for g in gpus)


def test_amd_smi_static_older_and_partial_forms() -> None:
    entry = json.loads(text(STATIC))["gpu_data"][0]
    # Human-readable sizes ("196592 MB") and plain numbers (MB) as older versions print them.
    for size in ("196592 MB", 196592, {"value": "196592", "unit": "MB"}):
        gpu = {**entry, "vram": {"size": size}}
        assert parse_amd_smi_static(json.dumps([gpu]))[0].vram_bytes == 196592 << 20
    # N/A and missing sections are unknown, not errors; the device id may be decimal.
    sparse = {"gpu": 3, "asic": {"market_name": "N/A", "device_id": 29858}, "vram": {}}
    (gpu,) = parse_amd_smi_static(json.dumps([sparse]))
    assert gpu == Gpu(index=3, device_id=0x74A2) and gpu.is_mi308x
    assert gpu.name == "AMD Instinct MI308X" and gpu.vram_gib is None
    assert parse_amd_smi_static("[]") == () and parse_amd_smi_static('{"gpu_data": []}') == ()


def test_amd_smi_list_both_shapes() -> None:
    # Keys as amdsmi_cli/amdsmi_commands.py list() stores them (ROCm/amdsmi).
    entries = [
        {"gpu": i, "bdf": f"0000:{b}:00.0", "uuid": f"u-{i}", "kfd_id": 1, "node_id": i + 2,
         "partition_id": 0}
        for i, b in enumerate(("0c", "22", "38", "5c"))
    ]  # fmt: skip
    for shape in (entries, {"gpu_data": entries}):
        gpus = parse_amd_smi_list(json.dumps(shape))
        assert [(g.index, g.bdf, g.uuid) for g in gpus] == [
            (0, "0000:0c:00.0", "u-0"),
            (1, "0000:22:00.0", "u-1"),
            (2, "0000:38:00.0", "u-2"),
            (3, "0000:5c:00.0", "u-3"),
        ]


# -- rocm-smi and rocminfo -------------------------------------------------------------------


def test_rocm_smi_product_name_and_vram() -> None:
    (gpu,) = parse_rocm_smi(text(PRODUCT), text(MEMINFO))
    assert gpu == Gpu(
        index=0, market_name=MI300X, device_id=0x74A1, gfx_target="gfx942",
        vram_bytes=206158430208,
    )  # fmt: skip
    assert gpu.vram_gib == 192.0
    # Older rocm-smi writes "Card series" / "Card model"; other top-level keys are not cards.
    old = {"card1": {"Card series": MI300X, "Card model": "0x74a1"}, "system": {"x": "1"}}
    assert parse_rocm_smi(json.dumps(old)) == (Gpu(1, MI300X, 0x74A1),)


@pytest.mark.parametrize("path", every("rocm_smi_showproductname_*.json"), ids=lambda p: p.name)
def test_every_rocm_smi_product_file(path: Path) -> None:
    for meminfo in [None, *every("rocm_smi_showmeminfo_vram_*.json")]:
        gpus = parse_rocm_smi(text(path), text(meminfo) if meminfo else None)
        assert gpus and all(g.market_name and g.device_id and g.gfx_target for g in gpus)
        assert all((g.vram_bytes is None) == (meminfo is None) for g in gpus)


def test_rocminfo_four_mi300x() -> None:
    gpus = parse_rocminfo(text(ROCMINFO))
    # The same capture's rocm-smi --showallinfo lists 4 GPUs [0x74a1 : 0x00], AMD Instinct MI300X.
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert {(g.market_name, g.device_id, g.gfx_target) for g in gpus} == {
        (MI300X, 0x74A1, "gfx942")
    }
    # The first coarse-grained global pool: 201310208 KB, the HBM less what the driver keeps.
    assert {g.vram_bytes for g in gpus} == {201310208 << 10}
    assert all(round(g.vram_gib or 0) == 192 for g in gpus)


@pytest.mark.parametrize("path", every("rocminfo_*.txt"), ids=lambda p: p.name)
def test_every_rocminfo_file(path: Path) -> None:
    gpus = parse_rocminfo(text(path))
    assert gpus and all(g.market_name and g.device_id and g.gfx_target for g in gpus)
    assert all(g.vram_bytes for g in gpus)


# -- ids -------------------------------------------------------------------------------------


def test_instinct_ids_are_libdrms_and_mi308x_is_known_by_id_and_name() -> None:
    listed = {}
    for line in text(REFERENCE / "amdgpu_ids_instinct_excerpt.txt").splitlines():
        if line and not line.startswith("#"):
            device, _, name = (f.strip() for f in line.split(","))
            listed[int(device, 16)] = name
    assert listed == INSTINCT_IDS
    for device in (0x74A2, 0x74B6, 0x74A8):
        assert Gpu(0, device_id=device).is_mi308x
        assert Gpu(0, device_id=device).is_model("MI308X")
    for device in (0x74A1, 0x74A9, 0x74B5, None):
        assert not Gpu(0, device_id=device).is_mi308x
    assert Gpu(0, market_name="AMD Instinct MI308X").is_mi308x  # an id amdgpu.ids lacks
    assert not Gpu(0, market_name="AMD Instinct MI308XT").is_model("MI308X")
    assert Gpu(0, device_id=0x74B5).is_model("MI300X") and not Gpu(0).is_model("MI300X")


# -- malformed output ------------------------------------------------------------------------

PARSERS: dict[str, Callable[[str], tuple[Gpu, ...]]] = {
    "amd-smi static --json": parse_amd_smi_static,
    "amd-smi list --json": parse_amd_smi_list,
    "rocm-smi --showproductname --json": parse_rocm_smi,
    "rocminfo": parse_rocminfo,
}
MALFORMED = {
    "amd-smi static --json": [
        "", "  \n", "WARNING: no GPU found\n", '{"gpu_data": {}}', '"text"', "[1, 2]",
        '{"gpus": []}', '[{"gpu": "x"}]', '[{"gpu": 0, "asic": []}]',
        '[{"gpu": 0, "vram": {"size": "lots"}}]', '[{"gpu": 0, "asic": {"device_id": "ab"}}]',
        '[{"gpu": 0, "vram": {"size": {"value": 1, "unit": "parsecs"}}}]', '[{"gpu": 0',
    ],
    "amd-smi list --json": ["", "null", '{"gpu_data": "none"}', '[{"gpu": -1}]', "[[]]"],
    "rocm-smi --showproductname --json": ["", "[]", '{"card0": "MI300X"}', "{card0: 1}"],
    "rocminfo": [
        "", "ROCk module is NOT loaded, possibly no GPU devices\n", "HSA Agents\n*******\n"
        "Agent 1\n*******\n  Device Type: GPU\n  Chip ID: zero\n",
        "HSA Agents\n*******\nAgent 1\n*******\n  Device Type: GPU\n    Pool 1\n"
        "      Segment: GLOBAL; FLAGS: COARSE GRAINED\n      Size: big\n",
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("command", "output"),
    [(c, o) for c, outputs in MALFORMED.items() for o in outputs],
    ids=lambda x: x[:30] if isinstance(x, str) else x,
)
def test_malformed_output_is_a_fact_error_naming_the_command(command: str, output: str) -> None:
    with pytest.raises(FactError) as caught:
        PARSERS[command](output)
    assert command.split()[0] in str(caught.value)


def test_rocm_smi_bad_vram_total() -> None:
    with pytest.raises(FactError, match="bad VRAM total 'lots' for card0"):
        parse_rocm_smi(text(PRODUCT), '{"card0": {"VRAM Total Memory (B)": "lots"}}')


@pytest.mark.parametrize(
    ("parse", "path"),
    [(parse_amd_smi_static, STATIC), (parse_rocm_smi, PRODUCT), (parse_rocminfo, ROCMINFO)],
    ids=["amd-smi", "rocm-smi", "rocminfo"],
)
def test_cut_off_output_parses_or_is_a_fact_error(
    parse: Callable[[str], tuple[Gpu, ...]], path: Path
) -> None:
    """Output cut anywhere (a tool killed mid-print): a FactError or GPUs, never a crash."""
    whole = text(path)
    for end in range(0, len(whole), max(1, len(whole) // 300)):
        with contextlib.suppress(FactError):
            parse(whole[:end])


# -- the Gpus command in a real shell, with stand-in tools on PATH ---------------------------


def tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def gather(fact: type[Gpus] | type[AmdSmiStatic], bin_dir: Path, marker: Path) -> object:
    """The fact's command, run by the local shell with only ``bin_dir`` and the system's
    folders on PATH, and the lab marker read from ``marker``."""
    command = fact().command().replace(LAB_MARKER, str(marker))
    result = LocalConnection("local").run(f"PATH={bin_dir}:/usr/bin:/bin; export PATH\n{command}")
    return fact().parse(result)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("amd-smi", "rocm-smi", "rocminfo"):
        assert not any((Path(d) / name).exists() for d in ("/usr/bin", "/bin")), name
    return folder


def test_gpus_asks_amd_smi_first(bin_dir: Path, tmp_path: Path) -> None:
    tool(bin_dir, "amd-smi", f'[ "$*" = "static --json" ] && exec cat {STATIC}; exit 2')
    tool(bin_dir, "rocminfo", "echo should not run >&2; exit 3")
    found = gather(Gpus, bin_dir, tmp_path / "none.json")
    assert found.source == "amd-smi static --json" and found.missing == ""
    assert found.gpus == parse_amd_smi_static(text(STATIC)) and not found.simulated


def test_gpus_falls_back_to_rocm_smi_then_rocminfo(bin_dir: Path, tmp_path: Path) -> None:
    tool(bin_dir, "amd-smi", "echo 'AMDSMI_STATUS_DRM_ERROR - 26' >&2; exit 1")
    tool(
        bin_dir,
        "rocm-smi",
        f'case "$*" in "--showproductname --json") cat {PRODUCT};; '
        f'"--showmeminfo vram --json") cat {MEMINFO};; *) exit 2;; esac',
    )
    marker = tmp_path / "host.json"
    marker.write_text('{"lab": true, "profile": "mi308x"}')
    found = gather(Gpus, bin_dir, marker)
    assert (
        found.source == "rocm-smi --showproductname --json and rocm-smi --showmeminfo vram --json"
    )
    assert found.gpus == parse_rocm_smi(text(PRODUCT), text(MEMINFO)) and found.simulated

    os.unlink(bin_dir / "rocm-smi")
    tool(bin_dir, "rocminfo", f"cat {ROCMINFO}")
    found = gather(Gpus, bin_dir, marker)
    assert found.source == "rocminfo" and found.count == 4


def test_gpus_says_why_there_is_no_answer(bin_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "host.json"
    marker.write_text('{"lab": true, "profile": null}')
    nothing = gather(Gpus, bin_dir, marker)
    assert nothing.count == 0 and not nothing.simulated
    assert nothing.missing == "no GPU tool found (amd-smi, rocm-smi, rocminfo)"
    assert gather(AmdSmiStatic, bin_dir, marker).missing == "no GPU tool found (amd-smi)"

    tool(bin_dir, "amd-smi", "echo 'ERROR: AMDSMI_STATUS_NOT_INIT' >&2; exit 1")
    tool(bin_dir, "rocminfo", "echo 'ROCk module is NOT loaded, possibly no GPU devices'; exit 1")
    failing = gather(Gpus, bin_dir, marker)
    assert failing.missing == (
        "`amd-smi static --json` exited 1: ERROR: AMDSMI_STATUS_NOT_INIT; "
        "`rocminfo` exited 1: ROCk module is NOT loaded, possibly no GPU devices"
    )
    tool(bin_dir, "amd-smi", "echo '[]'")
    assert gather(Gpus, bin_dir, marker).missing == "`amd-smi static --json` lists no GPU"


def test_gpus_malformed_answer_is_a_fact_error(bin_dir: Path, tmp_path: Path) -> None:
    tool(bin_dir, "amd-smi", "echo 'Traceback (most recent call last):'")
    with pytest.raises(FactError, match="amd-smi static --json` did not print JSON"):
        gather(Gpus, bin_dir, tmp_path / "none.json")
    marker = tmp_path / "host.json"
    marker.write_text("lab")
    with pytest.raises(FactError, match="is not what `fxkit lab up` writes"):
        gather(Gpus, bin_dir, marker)


def test_each_tool_fact_asks_only_its_tool(bin_dir: Path, tmp_path: Path) -> None:
    entries = [{"gpu": 0, "bdf": "0000:0c:00.0", "uuid": "u"}]
    tool(
        bin_dir,
        "amd-smi",
        f'[ "$*" = "list --json" ] && echo {json.dumps(json.dumps(entries))} && exit 0; exit 9',
    )
    marker = tmp_path / "none.json"
    assert gather(AmdSmiList, bin_dir, marker).gpus == (Gpu(0, bdf="0000:0c:00.0", uuid="u"),)
    assert "exited 9" in gather(AmdSmiStatic, bin_dir, marker).missing
    for fact, name in ((RocmSmi, "rocm-smi"), (RocmInfo, "rocminfo")):
        assert gather(fact, bin_dir, marker).missing == f"no GPU tool found ({name})"


# -- host state: kernel command line, loaded modules, OS codename ----------------------------


def test_kernel_cmdline_of_this_machine_and_quoted_values() -> None:
    facts = FactCache(LocalConnection("local"))
    running = facts.get(KernelCmdline)
    assert list(running.args) == Path("/proc/cmdline").read_text().split()
    line = 'BOOT_IMAGE=/vmlinuz ro quiet iommu=on iommu=pt dyndbg="file x.c +p" pci=realloc=off\n'
    info = KernelCmdline().parse(RunResult("cat /proc/cmdline", 0, line, ""))
    assert "pci=realloc=off" in info and "iommu=pt" in info and "dyndbg=file x.c +p" in info
    assert info.value("iommu") == "pt" and info.value("quiet") == "" and info.value("x") is None
    with pytest.raises(FactError):
        KernelCmdline().parse(RunResult("cat /proc/cmdline", 1, "", "Permission denied"))


def test_loaded_modules() -> None:
    # /proc/modules lines as the kernel prints them (kernel/module/procfs.c): name, size,
    # users, the modules using it (or -), state, address.
    listing = (
        "amdgpu 19513344 128 - Live 0xffffffffc1c00000\n"
        "ib_core 507904 8 rdma_ucm,nvme_rdma,ib_uverbs,rdma_cm,iw_cm,ib_cm,mlx5_ib, Live 0x0\n"
        "nvme_tcp 57344 - - Loading 0x0 (OE)\n"
    )
    modules = LoadedModules().parse(RunResult("cat /proc/modules", 0, listing, ""))
    assert list(modules) == ["amdgpu", "ib_core", "nvme_tcp"]
    assert modules["amdgpu"].size == 19513344 and modules["amdgpu"].refcount == 128
    assert modules["ib_core"].used_by[:2] == ("rdma_ucm", "nvme_rdma")
    assert modules["nvme_tcp"].refcount == -1 and modules["nvme_tcp"].state == "Loading"
    assert LoadedModules().parse(RunResult("", 0, "", "")) == {}  # no /proc/modules
    with pytest.raises(FactError, match="line 1"):
        LoadedModules().parse(RunResult("", 0, "amdgpu lots\n", ""))
    here = FactCache(LocalConnection("local")).get(LoadedModules)
    proc = Path("/proc/modules")
    assert set(here) == ({line.split()[0] for line in proc.open()} if proc.exists() else set())


def test_os_release_codename() -> None:
    noble = 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n'
    assert OsRelease().parse(RunResult("", 0, noble, "")).codename == "noble"
    mint = 'ID=linuxmint\nID_LIKE="ubuntu debian"\nUBUNTU_CODENAME=jammy\n'
    assert OsRelease().parse(RunResult("", 0, mint, "")).codename == "jammy"
