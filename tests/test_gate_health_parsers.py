"""The parsers of G1's prerequisite, health and firmware checks, against real output
(tests/data/gate/health/, each file's source in tests/data/gate/SOURCES.md), and the ones this
machine can run for real (lsmem, /etc/os-release, dpkg-query, /proc/cmdline).

AMD's MI300X checklist (system-acceptance-docs, docs/gpus/mi300x.md) and CVS's host checks
(cvs/tests/platform/host_configs_cvs.py) say what each reads; docs/GATES.md maps them to checks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache
from fxkit.gate import rules
from fxkit.gate.measure import KINDS, MeasuredHost, MeasureError
from fxkit.gate.measures.amd_smi import parse_firmware, parse_monitor, parse_topology
from fxkit.gate.measures.platform import (
    KernelLogParams,
    parse_dmidecode,
    parse_dpkg_query,
    parse_kernel_args,
    parse_kernel_log,
    parse_lsmem,
    parse_lspci,
    parse_os_release,
    slot_path,
)

DATA = Path(__file__).parent / "data" / "gate" / "health"
MI300X = "1002:74a1"


def read(name: str) -> str:
    return (DATA / name).read_text()


def local() -> MeasuredHost:
    conn = LocalConnection("localhost")
    return MeasuredHost("localhost", conn, FactCache(conn), HostVars("localhost", []))


# -- amd-smi ---------------------------------------------------------------------------------------


def test_monitor_of_an_mi300x_node_older_columns() -> None:
    """The ROCm blog's real `amd-smi monitor -putm` of 8 MI300X (GPU_TEMP, GFX_UTIL...)."""
    got = parse_monitor(read("amd_smi_monitor_putm_mi300x_blog.txt"))
    assert got["count"] == 8
    assert got["gpus"]["0"] == {
        "power_w": 182,
        "gpu_temp_c": 42,
        "mem_temp_c": 41,
        "gfx_util_pct": 83,
        "gfx_clock_mhz": 1613,
        "mem_util_pct": 0,
        "mem_clock_mhz": 1230,
    }
    # Two GPUs were busy when it was captured: AMD's idle rule (GFX% 0) fails them, by name.
    verdict = rules.evaluate({"<=": 0}, {g: v["gfx_util_pct"] for g, v in got["gpus"].items()})
    assert (
        not verdict.passed
        and verdict.reason == "0: 83 is not <= 0; 1: 13 is not <= 0; 3: 1 is not <= 0"
    )


def test_monitor_newer_columns_as_amds_acceptance_page_shows_them() -> None:
    """GPU POWER PWR_CAP GPU_T MEM_T GFX_CLK GFX% MEM% MEM_CLOCK (health-checks.md's idle row)."""
    got = parse_monitor(read("amd_smi_monitor_putm_acceptance_docs.txt"))
    assert got["gpus"] == {
        "0": {
            "power_w": 251,
            "power_cap_w": 1000,
            "gpu_temp_c": 55,
            "mem_temp_c": 43,
            "gfx_clock_mhz": 144,
            "gfx_util_pct": 0,
            "mem_util_pct": 0,
            "mem_clock_mhz": 1900,
        }
    }


def test_monitor_na_cells_are_none_and_xcp_rows_count_once() -> None:
    text = "GPU  XCP  POWER  GPU_T\n  0    0    N/A     40 °C\n  0    1    N/A     41 °C\n"
    got = parse_monitor(text)
    assert got == {"count": 1, "gpus": {"0": {"power_w": None, "gpu_temp_c": 40}}}
    with pytest.raises(rules.RuleError, match="no value"):
        rules.evaluate({"<=": 500}, {"0": got["gpus"]["0"]["power_w"]})
    with pytest.raises(MeasureError, match="no table"):
        parse_monitor("amd-smi: command not found")


def test_firmware_text_of_an_mi300x_node() -> None:
    """The ROCm blog's real `amd-smi firmware` (MI300X, GPU 0)."""
    got = parse_firmware(read("amd_smi_firmware_mi300x_blog.txt"))
    assert got["count"] == 1
    assert got["gpus"]["0"][:2] == ["CP_MEC1=147", "CP_MEC2=147"]
    assert "TA_XGMI=20.00.01.13" in got["gpus"]["0"] and len(got["gpus"]["0"]) == 10


def test_firmware_json_as_amdsmi_cli_writes_it() -> None:
    """`amd-smi firmware --json`: amdsmi_cli/amdsmi_commands.py firmware() renames fw_name to
    fw_id and keeps fw_version (ROCm/amdsmi at 0ceca28f); newer amd-smi wraps the list in
    gpu_data. The values are CVS's pinned MI300X matrix (cvs/input/config_file/platform)."""
    records = [{"gpu": 0, "fw_list": [{"fw_id": "CP_MEC1", "fw_version": "32945"},
                                      {"fw_id": "PM", "fw_version": "07.85.11.01"}]}]  # fmt: skip
    for text in (json.dumps(records), json.dumps({"gpu_data": records})):
        got = parse_firmware(text)
        assert got == {"count": 1, "gpus": {"0": ["CP_MEC1=32945", "PM=07.85.11.01"]}}
    pinned = ["CP_MEC1=32945", "PM=07.85.11.02"]
    verdict = rules.evaluate({"contains": pinned}, got["gpus"])
    assert not verdict.passed and verdict.reason == "0: lacks [PM=07.85.11.02]"
    with pytest.raises(MeasureError, match="no firmware list"):
        parse_firmware(json.dumps([{"gpu": 0, "fw_list": "N/A"}]))


def test_topology_links_that_are_not_xgmi_are_named() -> None:
    """amdsmi's CHANGELOG: `amd-smi topology -a -t --json` of two GPUs joined over PCIe."""
    got = parse_topology(read("amd_smi_topology_a_t_json_changelog.json"))
    assert got["gpus"]["0"] == {
        "bdf": "0000:08:00.0",
        "peers": 1,
        "not_xgmi": ["1 (0000:44:00.0): PCIE DISABLED"],
    }
    verdict = rules.evaluate({"==": []}, {g: v["not_xgmi"] for g, v in got["gpus"].items()})
    assert not verdict.passed


# -- lspci -----------------------------------------------------------------------------------------


def test_lspci_endpoint_block() -> None:
    """hwloc#653's real `lspci -nn -vvv` block (A100): ids, DevSta's FatalErr-, no LnkSta yet."""
    got = parse_lspci(read("lspci_vvv_a100_hwloc_653.txt"))
    assert list(got) == ["0000:da:00.0"]
    dev = got["0000:da:00.0"]
    assert dev["ids"] == "10de:20b0" and dev["path"] == [] and dev["fatal_err"] == "FatalErr-"
    assert dev["speed_gts"] is None and dev["acs_src_valid"] is False


def test_lspci_link_and_acs_lines() -> None:
    """Each real line form: LnkSta with (ok) (AMD's page) and (downgraded) (sbc-reviews#50),
    DevSta (AMD's page), ACSCtl SrcValid+ and SrcValid- (nccl#606)."""
    header = "0000:00:01.1/01:00.0/05:00.0 Processing accelerators [1200]: AMD [1002:74a1]\n"
    ok = parse_lspci(header + read("lspci_devsta_lnksta_acceptance_docs.txt"))["0000:05:00.0"]
    assert (ok["speed_gts"], ok["width"], ok["link_status"]) == (32.0, 16, "ok")
    assert ok["fatal_err"] == "FatalErr-" and ok["path"] == ["0000:00:01.1", "0000:01:00.0"]
    low = parse_lspci(header + read("lspci_lnksta_downgraded_sbc_reviews_50.txt"))
    assert (low["0000:05:00.0"]["speed_gts"], low["0000:05:00.0"]["width"]) == (5.0, 2)
    assert low["0000:05:00.0"]["link_status"] == "downgraded"
    first, second = read("lspci_acsctl_nccl_606.txt").splitlines()
    assert parse_lspci(header + first + "\n")["0000:05:00.0"]["acs_src_valid"] is True
    assert parse_lspci(header + second + "\n")["0000:05:00.0"]["acs_src_valid"] is False
    # AMD's failing case, FatalErr+ (not NonFatalErr's bit, which comes first on the line).
    fatal = "DevSta: CorrErr- NonFatalErr- FatalErr+ UnsupReq- AuxPwr- TransPend-\n"
    assert parse_lspci(header + fatal)["0000:05:00.0"]["fatal_err"] == "FatalErr+"
    nonfatal = "DevSta: CorrErr- NonFatalErr+ FatalErr- UnsupReq- AuxPwr- TransPend-\n"
    assert parse_lspci(header + nonfatal)["0000:05:00.0"]["fatal_err"] == "FatalErr-"
    plain = "LnkSta:\tSpeed 32GT/s, Width x16\n"  # lspci before the (ok) notes
    assert parse_lspci(header + plain)["0000:05:00.0"]["link_status"] == "ok"


def test_lspci_paths_of_amds_topology_page() -> None:
    """`lspci -d 1002:74a1 -PP` (system-acceptance-docs, docs/network/topology-mapping.md)."""
    lines = read("lspci_pp_mi300x_topology_mapping.txt").splitlines()
    path = slot_path(lines[0].split()[0])
    assert path[0] == "0000:00:01.1" and path[-1] == "0000:05:00.0" and len(path) == 6
    assert slot_path("0001:18:01.1/19:00.0")[1] == "0001:19:00.0"


def test_lspci_without_root_is_an_error() -> None:
    with pytest.raises(MeasureError, match="needs root"):
        parse_lspci("0000:05:00.0 Processing accelerators [1200]: AMD [1002:74a1]\n"
                    "\tCapabilities: <access denied>\n")  # fmt: skip


# -- kernel log ------------------------------------------------------------------------------------


def test_kernel_log_of_a_healthy_mi300x_boot_has_no_flagged_line() -> None:
    """legacy-rocm-build#4454's real MI300X boot lines: amdgpu and mlx5 start, nothing flagged."""
    got = parse_kernel_log(read("dmesg_mi300x_boot_excerpt.txt"), KernelLogParams())
    assert got["flagged_count"] == got["amdgpu_error_count"] == 0 and got["lines"] == 15


def test_kernel_log_amdgpu_init_failure() -> None:
    """legacy-rocm-build#3856's real MI300X amdgpu failure: AMD's driver errors, and flagged."""
    got = parse_kernel_log(read("dmesg_mi300x_amdgpu_init_failure.txt"), KernelLogParams())
    assert got["amdgpu_error_count"] == 3
    assert got["amdgpu_errors"][0].startswith("[drm:amdgpu_discovery_set_ip_blocks")
    assert "amdgpu: probe of 0000:05:00.0 failed with error -22" in got["amdgpu_errors"]
    assert got["flagged_count"] == 3


def test_kernel_log_allow_list_keeps_the_reason() -> None:
    """enarx#2263's real EPYC line `ccp ...: SEV: failed to INIT`: noise where SEV is unused."""
    text = read("dmesg_epyc_sev_noise.txt")
    assert parse_kernel_log(text, KernelLogParams())["flagged_count"] == 1
    allow = {"match": r"ccp \S+: SEV: failed to INIT", "reason": "SEV is not used on this node"}
    got = parse_kernel_log(text, KernelLogParams.model_validate({"allow": [allow]}))
    assert got["flagged_count"] == 0
    assert got["allowed"] == [
        {
            "line": "ccp 0000:54:00.1: SEV: failed to INIT error 0x1, rc -5",
            "reason": allow["reason"],
        }
    ]


def test_kernel_log_allow_entries_need_a_regex_and_a_reason() -> None:
    kind = KINDS["kernel_log"]
    with pytest.raises(Exception, match="reason"):
        kind.parse({"allow": [{"match": "x"}]})
    with pytest.raises(Exception, match="not a regex"):
        kind.parse({"allow": [{"match": "(", "reason": "r"}]})


# -- lsmem, os-release, dmidecode, packages, cmdline ----------------------------------------------


def test_lsmem_human_sizes_and_bytes() -> None:
    """util-linux#4055's real lsmem (15.8G online) and the -b form."""
    got = parse_lsmem(read("lsmem_util_linux_4055.txt"))
    assert got["online_gib"] == 15.8 and got["offline_bytes"] == 0
    assert parse_lsmem("Total online memory: 2199023255552\n")["online_gib"] == 2048.0
    assert parse_lsmem("Total online memory:     1.5T\n")["online_gib"] == 1536.0


@pytest.mark.skipif(shutil.which("lsmem") is None, reason="lsmem (util-linux) is not installed")
def test_lsmem_runs_here() -> None:
    got = KINDS["lsmem"].measure(local(), KINDS["lsmem"].parse({}))
    meminfo = Path("/proc/meminfo").read_text().split()
    total_gib = int(meminfo[meminfo.index("MemTotal:") + 1]) / (1 << 20)
    # Online memory blocks hold all the kernel manages and what it reserved.
    assert got["online_gib"] >= total_gib and got["simulated"] is False


def test_os_point_release() -> None:
    """Ubuntu's VERSION carries the point release (AMD's example: 22.04.5 LTS)."""
    text = 'NAME="Ubuntu"\nVERSION_ID="22.04"\nVERSION="22.04.5 LTS (Jammy Jellyfish)"\nID=ubuntu\n'
    assert parse_os_release(text)["release"] == "ubuntu 22.04.5"
    here = KINDS["os_point_release"].measure(local(), KINDS["os_point_release"].parse({}))
    assert here["release"].split()[0] == parse_os_release(Path("/etc/os-release").read_text())["id"]


def test_dmidecode_answers_and_a_missing_one() -> None:
    text = "system-manufacturer\tSupermicro\nsystem-product-name\tAS -8125GS-TNMR2\n"
    text += "bios-version\t1.7\nbios-release-date\t05/06/2024\n"
    assert parse_dmidecode(text)["system_manufacturer"] == "Supermicro"
    with pytest.raises(MeasureError, match="bios-version"):
        parse_dmidecode("system-manufacturer\tX\nsystem-product-name\tY\nbios-release-date\tZ\n")


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian-family system")
def test_packages_here() -> None:
    """dpkg-query on this machine: dpkg is installed, a made-up name is missing."""
    params = KINDS["packages"].parse({"names": ["dpkg", "fxkit-no-such-package"]})
    got = KINDS["packages"].measure(local(), params)["packages"]
    assert got["fxkit-no-such-package"] == "missing" and got["dpkg"][0].isdigit()
    assert parse_dpkg_query("rocm\trc \t7.2.0\n", ("rocm",)) == {"rocm": "missing"}


def test_kernel_args_whole_words() -> None:
    cmdline = "BOOT_IMAGE=/boot/vmlinuz ro pci=realloc=off amd_iommu=on iommu=pt"
    groups = (("pci=realloc=off",), ("amd_iommu=on", "intel_iommu=on"), ("iommu=pt",))
    assert set(parse_kernel_args(cmdline, groups)["present"].values()) == {True}
    got = parse_kernel_args("ro amd_iommu=pt", groups)["present"]
    assert got == {"pci=realloc=off": False, "amd_iommu=on or intel_iommu=on": False,
                   "iommu=pt": False}  # fmt: skip
