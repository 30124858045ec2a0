"""``fxkit gate g1`` end to end on lab hosts (the CLI, over real sshd):

- **plain** lab hosts: fio really reads a file on each host's disk (made and removed by the
  check); the GPU and RDMA checks are ERROR ("amd-smi not found", "no RDMA devices"), never
  PASS; result.json is written and valid; the exit code is 1.
- the **mi308x** profile (stand-in amd-smi, rdma, ibv_devinfo, nvme; PCIe links in its sysfs),
  after the NVMe-oF namespace is connected (``nvme connect``, as roles/nvmeof_initiator runs it)
  and the RoCE netdevs have the MTU roles/roce_nic sets: every hardware check PASSes;
- its variants (fxkit/lab/profiles/mi308x-gpu-missing, mi308x-rdma-down, and those of AMD's
  checklist: a GPU link at x8, FatalErr+, an amdgpu error in dmesg, a firmware version off the
  pinned matrix, ACS on) fail exactly their checks, and every other check's status is the same
  as on the mi308x host. The checks of AMD's checklist get the site's figures (SITE); without
  them, on the plain hosts, each check that ``requires`` one is ERROR naming it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import junitparser
import pytest
import xmlschema
import yaml
from test_gate_report import page_of
from test_play_lab import FXKIT

from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache
from fxkit.gate import spec
from fxkit.gate.html import screenshot
from fxkit.gate.measure import MeasuredHost
from fxkit.gate.measures import facts
from fxkit.gate.verdicts import SCHEMA, load_results
from fxkit.lab import profile as profiles

PROFILES = profiles.PROFILES_DIR
pytestmark = pytest.mark.lab

JUNIT_SCHEMA = Path(__file__).parent / "data" / "junit" / "junit-10.xsd"

#: Small and short: the run checks that fio runs and is read, not the disk's speed.
FIO = {
    "g1_fio_size": "32M",
    "g1_fio_runtime": 1,
    "g1_storage_read_min_gbps": 0.001,
    "g1_storage_read_latency_max_ms": 10_000,
}
HARDWARE = (
    "rocm_version",
    "gpu_count",
    "gpu_model",
    "gpu_vram",
    "gpu_pcie_speed",
    "gpu_pcie_width",
    "rdma_active_count",
    "rdma_state",
    "rdma_link_layer",
    "rdma_mtu",
    "nvmeof_namespaces",
    "nvmeof_namespace_size",
    "fabric_link_speed",
    "fabric_gid_index",
    "fabric_gpu_nic_bandwidth",
)
#: The RVS checks that every GPU is listed (rocm_host_gpu_count of them).
RVS_GPUS = ("rvs_gpup_gpus", "rvs_gst_gpus", "rvs_iet_gpus", "rvs_pebb_gpus")
#: The checks of AMD's MI300X checklist (docs/GATES.md): all PASS on the mi308x profile, given
#: the site's figures; os_point_release reads this machine's /etc/os-release (not Ubuntu).
CHECKLIST = (
    "system_manufacturer",
    "bios_version",
    "required_packages",
    "gpu_firmware",
    "kernel_args_amd",
    "amdgpu_dmesg_errors",
    "memory_online",
    "gpu_pci_count",
    "gpu_link_speed",
    "gpu_link_width",
    "gpu_fatal_error",
    "pcie_acs_gpu",
    "pcie_acs_nic",
    "nic_link_speed",
    "nic_link_width",
    "xgmi_links",
    "gpu_idle_gfx_util",
    "gpu_idle_mem_util",
    "gpu_idle_temperature",
    "gpu_idle_mem_temperature",
    "gpu_idle_power",
    "gpu_idle_gfx_clock",
    "kernel_log_clean",
)
#: What only the site can say: its server and BIOS, its memory figure (AMD: 2.0 TB for MI308X,
#: prerequisites.md), idle limits, the firmware it pins (here CVS's fw_dict, which the profile
#: runs), and a package every lab host has (this machine's dpkg database).
SITE = {
    "g1_system_manufacturers": ["Supermicro"],
    "g1_bios_versions": ["1.7"],
    "g1_memory_online_min_gib": 2048,
    "g1_idle_power_max_w": 300,
    "g1_idle_gfx_clock_max_mhz": 200,
    "g1_required_packages": ["dpkg"],
    "g1_gpu_firmware": json.loads((PROFILES / "mi308x" / "profile.json").read_text())["gpus"][
        "firmware"
    ],
}
REQUIRES = {
    "system_manufacturer": "g1_system_manufacturers",
    "bios_version": "g1_bios_versions",
    "gpu_firmware": "g1_gpu_firmware",
    "memory_online": "g1_memory_online_min_gib",
    "gpu_idle_power": "g1_idle_power_max_w",
    "gpu_idle_gfx_clock": "g1_idle_gfx_clock_max_mhz",
}
#: Each variant and the checks it fails (FAIL; WARN where the check is a warning).
VARIANTS = {
    # RVS lists the GPUs it can use: the missing one is missing there too.
    # Seven GPUs: the eighth NIC's GPU (--use_rocm=7) is not there, so its path fails too.
    "mi308x-gpu-missing": {
        "gpu_count": "FAIL",
        **dict.fromkeys(RVS_GPUS, "FAIL"),
        "fabric_gpu_nic_bandwidth": "FAIL",
    },
    # The NIC without a link fails its GPU to NIC test too (ib_write_bw cannot connect).
    "mi308x-rdma-down": {
        "rdma_active_count": "FAIL",
        "rdma_state": "FAIL",
        "fabric_gpu_nic_bandwidth": "FAIL",
    },
    # A backend port at 200G: its speed fails; its bandwidth is judged against its own link
    # speed (97.5 % of 200G), which it carries.
    "mi308x-nic-half": {"fabric_link_speed": "FAIL"},
    # The sysfs link is x8 too: G1's older warning on it says so as well.
    "mi308x-gpu-link-x8": {"gpu_link_width": "FAIL", "gpu_pcie_width": "WARN"},
    "mi308x-gpu-fatal-err": {"gpu_fatal_error": "FAIL"},
    # An amdgpu error is also an error line of the kernel log.
    "mi308x-amdgpu-error": {"amdgpu_dmesg_errors": "FAIL", "kernel_log_clean": "FAIL"},
    "mi308x-firmware-off": {"gpu_firmware": "FAIL"},
    # The root port above GPU 0000:05:00.0 is also above NIC ens6np0.
    "mi308x-acs-enabled": {"pcie_acs_gpu": "FAIL", "pcie_acs_nic": "FAIL"},
}
#: A variant that changes no check: a front-end bond beside the backend ports.
BOND = "mi308x-frontend-bond"
NQN = "nqn.2024-01.com.example:models"
CONNECTION = {
    "nqn": NQN,
    "transport": "rdma",
    "address": "192.168.100.10",
    "service_id": 4420,
    "namespaces": 1,
    "size": "10G",
}


def gpu_nodes(fleet, out: Path) -> list[str]:
    """``-i`` options: the fleet's inventory and a file making its hosts (group ``lab``) G1's
    ``gpu_nodes``."""
    groups = out.with_suffix(".gpu_nodes.yml")
    groups.write_text(
        yaml.safe_dump({"all": {"children": {"gpu_nodes": {"children": {"lab": {}}}}}})
    )
    return ["-i", str(fleet.inventory), "-i", str(groups)]


def run_g1(fleet, out: Path, extra: dict) -> tuple[subprocess.CompletedProcess[str], dict]:
    extra_file = out.with_suffix(".vars.yml")
    extra_file.write_text(yaml.safe_dump(extra))
    done = subprocess.run(
        [
            FXKIT,
            "gate",
            "g1",
            *gpu_nodes(fleet, out),
            "--out",
            str(out),
            "-e",
            f"@{extra_file}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (out / "result.json").is_file(), done.stdout + done.stderr
    return done, json.loads((out / "result.json").read_text())


def statuses(result: dict, host: str = "lab01") -> dict[str, str]:
    return {c["id"]: c["status"] for c in result["hosts"][host]["checks"]}


def check(result: dict, check_id: str, host: str = "lab01") -> dict:
    return next(c for c in result["hosts"][host]["checks"] if c["id"] == check_id)


def test_g1_on_plain_lab_hosts(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="g1-plain")  # exactly two hosts: G1 runs on all of them
    done, result = run_g1(fleet, tmp_path / "plain", FIO)
    assert done.returncode == 1, done.stdout + done.stderr
    assert result["schema"] == SCHEMA and result["gate"] == "g1"
    assert load_results(tmp_path / "plain" / "result.json").verdict == result["verdict"] == "FAIL"
    ids = [c.id for c in spec.load("g1").spec.checks]
    for host in ("lab01", "lab02"):
        got = statuses(result, host)
        assert list(got) == ids
        for gpu in ("gpu_count", "gpu_model", "gpu_vram", "gpu_pcie_speed", "gpu_pcie_width"):
            assert got[gpu] == "ERROR" and "amd-smi not found" in check(result, gpu, host)["reason"]
        for port in ("rdma_active_count", "rdma_state", "rdma_link_layer", "rdma_mtu"):
            assert got[port] == "ERROR" and "no RDMA devices" in check(result, port, host)["reason"]
        assert got["nvmeof_namespaces"] == "ERROR"
        assert (
            got["rocm_version"] == "ERROR"
            and "ROCm not found" in check(result, "rocm_version", host)["reason"]
        )
        assert "PASS" not in {got[i] for i in HARDWARE}
        for check_id, variable in REQUIRES.items():  # the site's figures: none given here
            assert got[check_id] == "ERROR", check(result, check_id, host)
            assert check(result, check_id, host)["reason"].startswith(f"{variable} not set")
        for check_id in ("gpu_pci_count", "gpu_link_width", "pcie_acs_nic"):
            assert "lspci not found" in check(result, check_id, host)["reason"]
        for check_id in ("xgmi_links", "gpu_idle_gfx_util"):
            assert "amd-smi not found" in check(result, check_id, host)["reason"]
        # fio read a file on the host's disk for real, once for both storage checks, and the
        # file is gone again.
        index = check(result, "storage_read_bandwidth", host)["measurement"]
        assert check(result, "storage_read_latency", host)["measurement"] == index
        fio = result["hosts"][host]["measurements"][index]
        assert fio["error"] is None, fio
        assert fio["data"]["created"] is True and fio["data"]["target"] == "/var/tmp/fxkit-g1.fio"
        assert fio["data"]["io_bytes"] >= 32 << 20 and fio["data"]["read_gbps"] > 0
        assert got["storage_read_bandwidth"] == "PASS"
        assert got["storage_read_latency"] == "PASS"
        # AMD's checklist runs RCCL on every node: without the tool it is ERROR, never PASS.
        assert got["rccl_all_reduce_busbw"] == "ERROR"
        assert "all_reduce_perf not found" in check(result, "rccl_all_reduce_busbw", host)["reason"]
        for fabric in ("fabric_link_speed", "fabric_gid_index"):
            assert (
                got[fabric] == "ERROR"
                and "no RDMA devices" in check(result, fabric, host)["reason"]
            )
        for tool, fabric_ids in (
            ("ib_write_bw", ("fabric_gpu_nic_bandwidth", "fabric_nic_nic_bandwidth")),
            ("ibv_rc_pingpong", ("fabric_rc_pingpong",)),
        ):
            for fabric in fabric_ids:
                reason = check(result, fabric, host)["reason"]
                assert got[fabric] == "ERROR" and f"{tool} not found on {host}" in reason
        # Both hosts read alone (one target port: one node at a time), then together.
        assert fio["data"]["at_once"] == 1 and fio["data"]["read_with"] == [host]
        fleet_read = result["hosts"][host]["measurements"][
            check(result, "storage_fleet_read_bandwidth", host)["measurement"]
        ]
        assert fleet_read["data"]["nodes"] == 2 and got["storage_fleet_read_bandwidth"] == "PASS"
        with fleet.connect(host) as conn:
            assert not conn.run("test -e /var/tmp/fxkit-g1.fio").ok
    reports_are_valid(tmp_path / "plain", result)


def reports_are_valid(out: Path, result: dict) -> None:
    """G1's report files: JUnit valid for Jenkins with the run's counts, the HTML parses and
    renders in headless Chromium (tests/test_gate_report*.py test them in depth)."""
    xmlschema.XMLSchema(JUNIT_SCHEMA).validate(out / "junit.xml")
    suites = list(junitparser.JUnitXml.fromfile(str(out / "junit.xml")))
    assert len(suites) == len(result["hosts"])
    assert sum(s.errors for s in suites) == result["summary"]["ERROR"]
    assert sum(s.failures for s in suites) == result["summary"]["FAIL"]
    assert sum(s.skipped for s in suites) == result["summary"]["SKIP"]
    page = page_of(out / "report.html")
    assert page.open == [] and "storage_read_bandwidth" in " ".join(page.text)
    assert "G1 arrival acceptance" in (out / "report.md").read_text()
    screenshot(out / "report.html", out / "report.png", (1280, 1600))
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def backend(profile: str) -> list[dict[str, str]]:
    """roce_nic_interfaces of a profile's node: its ConnectX ports, not the front-end bond."""
    ports = profiles.load(profile)["rdma"]["ports"]
    return [{"name": p["netdev"], "device": p["dev"]} for p in ports if "bond" not in p["dev"]]


def prepare(fleet, host: str = "lab01") -> dict:
    """Connect the NVMe-oF namespace and set the RoCE MTU on the backend ports, as the roles
    do; the host's variables for the gate (its own kernel command line words as the expected
    ones, the backend ports as roce_nic_interfaces)."""
    with fleet.connect(host) as conn:
        args = " ".join(["-t", "rdma", "-a", "192.168.100.10", "-s", "4420", "-n", NQN])
        assert conn.run(f"nvme list-subsys -o json | grep -q {NQN} || nvme connect {args}").ok
        for port in backend(fleet.profile):
            assert conn.run(f"ip link set dev {port['name']} mtu 9000").ok
        cmdline = conn.run("cat /proc/cmdline").stdout.split()
        numa = conn.run("cat /proc/sys/kernel/numa_balancing").stdout.strip()
    return {
        **FIO,
        **SITE,
        "roce_nic_interfaces": backend(fleet.profile),
        "nvmeof_initiator_connections": [CONNECTION],
        "rocm_host_kernel_args": cmdline[:2],
        # The lab's kernel is this machine's: its own words stand for AMD's arguments.
        "g1_kernel_args_required": [[word] for word in cmdline[:2]],
        "numa_balancing": numa,
    }


@pytest.fixture(scope="module")
def mi308x_runs(lab_fleet, tmp_path_factory) -> dict[str, dict]:
    """g1 on one host of the mi308x profile and of each variant."""
    runs = {}
    for name in ("mi308x", *VARIANTS, BOND):
        fleet = lab_fleet(1, name=f"g1-{name}", profile=name)
        extra = prepare(fleet)
        numa = extra.pop("numa_balancing")
        out = tmp_path_factory.mktemp("g1") / name
        done, result = run_g1(fleet, out, extra)
        runs[name] = {"done": done, "result": result, "numa": numa, "out": out}
    return runs


def test_g1_hardware_checks_pass_on_the_mi308x_profile(mi308x_runs) -> None:
    run = mi308x_runs["mi308x"]
    result, got = run["result"], statuses(run["result"])
    for check_id in (*HARDWARE, *CHECKLIST):
        assert got[check_id] == "PASS", check(result, check_id)
    assert check(result, "gpu_count")["value"] == 8
    assert set(check(result, "gpu_model")["value"].values()) == {"AMD Instinct MI308X"}
    assert check(result, "gpu_pcie_speed")["value"]["0"] == 32.0
    assert check(result, "rdma_active_count")["value"] == 8
    assert check(result, "nvmeof_namespace_size")["value"] == {"/dev/nvme0n1": 10 << 30}
    assert check(result, "rocm_version")["value"] == "7.2.0"
    # Kernel settings are the real kernel's: the check says what it is.
    assert got["sysctl"] == ("PASS" if run["numa"] == "0" else "FAIL")
    assert got["kernel_cmdline"] == "PASS"
    assert got["storage_read_bandwidth"] == "PASS"
    # This machine is not Ubuntu 22.04/24.04: the lab host (its /usr, /etc) says so honestly.
    assert got["os_release"] in ("PASS", "FAIL")
    assert got["os_point_release"] in ("PASS", "FAIL")
    # AMD's checklist, as the stand-ins answer: 8 GPUs on the bus at Gen5 x16, 2 TiB online,
    # the allowed noise let through with its reason.
    assert check(result, "gpu_pci_count")["value"] == 8
    assert set(check(result, "gpu_link_width")["value"].values()) == {16}
    assert check(result, "memory_online")["value"] == 2048.0
    measured = result["hosts"]["lab01"]["measurements"][
        check(result, "kernel_log_clean")["measurement"]
    ]
    assert [a["line"][:9] for a in measured["data"]["allowed"]] == ["ccp 0000:"]
    assert set(check(result, "nic_link_speed")["value"]) == {
        p["netdev"] for p in profiles.load("mi308x")["rdma"]["ports"]
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_fails_exactly_its_checks(mi308x_runs, variant: str) -> None:
    failing = VARIANTS[variant]
    base = statuses(mi308x_runs["mi308x"]["result"])
    got = statuses(mi308x_runs[variant]["result"])
    changed = {check_id for check_id in base if got[check_id] != base[check_id]}
    assert changed == set(failing), {c: (base[c], got[c]) for c in changed | set(failing)}
    assert {c: got[c] for c in failing} == failing
    assert mi308x_runs[variant]["done"].returncode == 1
    result = mi308x_runs[variant]["result"]
    reasons = {c: check(result, c)["reason"] for c in failing}
    if variant == "mi308x-gpu-missing":
        assert check(result, "gpu_count")["value"] == 7
        assert "0000:65:00.0" not in json.dumps(check(result, "gpu_pcie_speed")["value"])
        assert check(result, "gpu_pci_count")["value"] == 8  # on the bus, whatever the driver
        gpu_nic = check(result, "fabric_gpu_nic_bandwidth")
        assert gpu_nic["reason"].startswith("mlx5_9/1: 0") and gpu_nic["value"]["mlx5_6/1"] > 97.5
    elif variant == "mi308x-nic-half":
        speed = check(result, "fabric_link_speed")
        assert (
            speed["reason"].startswith("mlx5_3/1: 200000") and speed["value"]["mlx5_0/1"] == 400000
        )
        bw = check(result, "fabric_gpu_nic_bandwidth")["value"]
        base = check(mi308x_runs["mi308x"]["result"], "fabric_gpu_nic_bandwidth")["value"]
        assert bw == base  # the same share of its (halved) line rate
    elif variant == "mi308x-rdma-down":
        assert check(result, "rdma_active_count")["value"] == 7
        assert reasons["rdma_state"].startswith("mlx5_3/1: DOWN")
    elif variant == "mi308x-gpu-link-x8":
        assert reasons["gpu_link_width"] == "0000:26:00.0: 8 is not >= 16"
    elif variant == "mi308x-gpu-fatal-err":
        assert reasons["gpu_fatal_error"] == "0000:a6:00.0: FatalErr+ is not == FatalErr-"
    elif variant == "mi308x-amdgpu-error":
        assert (
            "amdgpu: probe of 0000:05:00.0 failed with error -22" in reasons["amdgpu_dmesg_errors"]
        )
    elif variant == "mi308x-firmware-off":
        assert reasons["gpu_firmware"] == "3: lacks [PM=07.85.11.01]"
    else:
        assert reasons["pcie_acs_gpu"] == "0000:05:00.0: [0000:00:01.1] is not == []"
        assert reasons["pcie_acs_nic"] == "ens6np0: [0000:00:01.1] is not == []"


def test_a_front_end_bond_is_not_a_backend_port(mi308x_runs) -> None:
    """mlx5_bond_0 (ACTIVE, MTU 1500) beside the 8 backend ports changes no check: it is not
    declared in roce_nic_interfaces, so neither counted nor judged, and listed as such."""
    base = statuses(mi308x_runs["mi308x"]["result"])
    result = mi308x_runs[BOND]["result"]
    assert statuses(result) == base
    ports = result["hosts"]["lab01"]["measurements"][check(result, "rdma_mtu")["measurement"]]
    assert ports["data"]["not_counted"] == ["mlx5_bond_0/1"] and ports["data"]["count"] == 8


def test_the_variants_are_profiles() -> None:
    assert {"mi308x", *VARIANTS, BOND} <= set(profiles.names())
    done = subprocess.run([FXKIT, "lab", "up", "--help"], capture_output=True, text=True)
    assert all(variant in done.stdout for variant in VARIANTS)


def test_g1_results_are_judged_again_without_the_hosts(mi308x_runs, tmp_path: Path) -> None:
    """The thresholds derived from the roles' variables re-render from the values kept in the
    results: one GPU fewer expected fails gpu_count and gpu_pci_count (the bus's count), and
    nothing else changes."""
    run = mi308x_runs["mi308x"]
    done = subprocess.run(
        [FXKIT, "gate", "evaluate", str(run["out"] / "result.json"), "--out", str(tmp_path),
         "-e", "rocm_host_gpu_count=7", "-e", "g1_storage_read_min_gbps=1000"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    again = json.loads((tmp_path / "result.json").read_text())
    before, after = statuses(run["result"]), statuses(again)
    changed = {c for c in before if before[c] != after[c]}
    assert changed == {
        "gpu_count",
        "gpu_pci_count",
        *RVS_GPUS,
        "storage_read_bandwidth",
        "storage_fleet_read_bandwidth",
    }
    assert check(again, "gpu_count")["reason"] == "8 is not == 7"


def test_rdma_link_layer_from_sysfs_without_ibv_devinfo(mi308x_runs, lab_fleet) -> None:
    """Where ibv_devinfo is not installed the link layer is the kernel's (sysfs) and the MTU
    of the RDMA port is unknown; the states are rdma link's as before."""
    fleet = lab_fleet(1, name="g1-mi308x", profile="mi308x")
    with fleet.connect("lab01") as conn:
        assert conn.run("mv /usr/local/bin/ibv_devinfo /usr/local/bin/ibv_devinfo.away").ok
        try:
            node = MeasuredHost("lab01", conn, FactCache(conn), HostVars("lab01", []))
            got = facts.rdma(node)
        finally:
            conn.run("mv /usr/local/bin/ibv_devinfo.away /usr/local/bin/ibv_devinfo")
    assert got["ibv_devinfo"].startswith("ibv_devinfo not found")
    assert {p["link_layer"] for p in got["ports"].values()} == {"Ethernet"}
    assert {p["active_mtu"] for p in got["ports"].values()} == {None}
    assert got["active"] == 8 and got["simulated"] is True
