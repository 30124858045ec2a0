"""The parsers of G1's benchmarks, against real output, and the measurements on this machine:

- fio's JSON: fio runs here (sequential read, 1 MiB, QD32, O_DIRECT, libaio) on a file it
  makes; the ``fio`` kind makes and removes its file, and leaves an existing one alone.
- perftest: real ``ib_write_bw --report_gbits`` output (tests/data/gate/, SOURCES.md names the
  repository and file).
- rccl-tests: real ``all_reduce_perf`` output of two 8 x MI308X nodes
  (/work/shared/reference/rccl_tests_all_reduce_mi308x_2node_rocm720.txt).

The ``rccl`` kind's command is checked with a test double of the tool (a shell script first on
PATH that logs its arguments and prints the real output above): this machine has no GPU, so its
numbers are the recorded ones, not measured here. The perftest kinds need RDMA devices: their
commands run against the lab's stand-ins (tests/test_gate_g1_lab.py, test_gate_fabric_lab.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache
from fxkit.gate import spec
from fxkit.gate.measure import KINDS, MeasuredHost, MeasureError
from fxkit.gate.measures import fabric
from fxkit.gate.measures.bench import parse_all_reduce, parse_fio, parse_ib_write_bw
from fxkit.gate.measures.fabric import plan_pairs
from fxkit.gate.measures.facts import parse_pcie_links

DATA = Path(__file__).parent / "data" / "gate"
PERFTEST = Path(__file__).parents[1] / "fxkit" / "lab" / "profiles" / "mi308x" / "perftest"
REFERENCE = Path("/work/shared/reference")
RCCL = REFERENCE / "rccl_tests_all_reduce_mi308x_2node_rocm720.txt"
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")


def local_probe() -> MeasuredHost:
    conn = LocalConnection("localhost")
    return MeasuredHost("localhost", conn, FactCache(conn), HostVars("localhost", []), timeout=120)


def measure(kind: str, params: dict) -> object:
    return KINDS[kind].measure(local_probe(), KINDS[kind].parse(params))


# -- fio ------------------------------------------------------------------------------------------


@needs_fio
def test_fio_json_of_a_real_run(tmp_path: Path) -> None:
    argv = ["fio", "--name=t", f"--filename={tmp_path / 'f'}", "--rw=read", "--bs=1M",
            "--iodepth=32", "--direct=1", "--ioengine=libaio", "--size=16M", "--runtime=1",
            "--time_based", "--output-format=json"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    raw = json.loads(out)["jobs"][0]["read"]
    got = parse_fio(out)
    assert got["read_gbps"] == round(raw["bw_bytes"] / 1e9, 4) > 0
    assert got["iops"] == pytest.approx(raw["bw_bytes"] / (1 << 20), rel=0.05)
    assert got["clat_mean_ms"] == round(raw["clat_ns"]["mean"] / 1e6, 4)
    assert got["clat_p99_ms"] >= got["clat_mean_ms"] * 0.5
    assert got["io_bytes"] == raw["io_bytes"] >= 16 << 20
    assert got["fio_version"].startswith("fio-")
    # fio may print a warning line before its JSON: the JSON is still read.
    assert parse_fio("fio: note: some warning\n" + out) == got


def test_fio_output_that_is_not_a_read_job() -> None:
    with pytest.raises(MeasureError, match="did not print the JSON of a read job"):
        parse_fio("fio: failed to open file\n")
    with pytest.raises(MeasureError, match="did not print the JSON"):
        parse_fio('{"jobs": []}')


@needs_fio
def test_the_fio_kind_makes_its_file_and_removes_it(tmp_path: Path) -> None:
    target = tmp_path / "g1.fio"
    got = measure("fio", {"target": str(target), "size": "16M", "runtime": 1})
    assert isinstance(got, dict) and got["created"] is True and got["read_gbps"] > 0
    assert not target.exists()
    target.write_bytes(b"\1" * (8 << 20))  # an existing file is read as it is, and kept
    got = measure("fio", {"target": str(target), "size": "64M", "runtime": 1})
    assert isinstance(got, dict) and got["created"] is False and got["read_gbps"] > 0
    assert target.read_bytes() == b"\1" * (8 << 20)


@needs_fio
def test_the_fio_kind_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(MeasureError, match=r"no folder .*missing"):
        measure("fio", {"target": str(tmp_path / "missing" / "f")})
    with pytest.raises(MeasureError, match="no block device /dev/fxkit-none"):
        measure("fio", {"target": "/dev/fxkit-none"})


# -- perftest -------------------------------------------------------------------------------------


def test_ib_write_bw_report_of_a_real_run() -> None:
    got = parse_ib_write_bw((DATA / "ib_write_bw_roce_report_gbits.txt").read_text())
    assert got["unit"] == "Gb/s" and got["link_type"] == "Ethernet"
    assert got["device"] == "rocep1s0f0" and got["qps"] == 1 and got["mtu"] == "1024[B]"
    assert len(got["rows"]) == 5
    assert got["rows"][0] == {
        "bytes": 65536,
        "iterations": 882805,
        "bw_peak": 0.0,
        "bw_average": 92.57,
        "msg_rate_mpps": 0.176554,
    }
    assert [r["bw_average"] for r in got["rows"]] == [92.57, 92.57, 92.57, 92.56, 92.57]


def test_ib_write_bw_without_report_gbits_or_a_table() -> None:
    text = (DATA / "ib_write_bw_roce_report_gbits.txt").read_text()
    with pytest.raises(MeasureError, match="MB/sec, not Gb/sec"):
        parse_ib_write_bw(text.replace("[Gb/sec]", "[MB/sec]"))
    with pytest.raises(MeasureError, match="no bandwidth table"):
        parse_ib_write_bw(text.split(" #bytes")[0])
    warned = text.replace(
        " 65536      882802", "Conflicting CPU frequency values detected\n 65536      882802"
    )
    assert parse_ib_write_bw(warned) == parse_ib_write_bw(text)
    with pytest.raises(MeasureError, match="cannot read the row"):
        parse_ib_write_bw(text.replace("92.56", "n/a"))


def stand_in(folder: Path, name: str, script: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A test double of a tool, first on PATH: logs its arguments to ``folder/calls``."""
    (folder / "bin").mkdir(exist_ok=True)
    tool = folder / "bin" / name
    tool.write_text(f'#!/bin/sh\necho "$*" >> {folder / "calls"}\n{script}\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    return folder / "calls"


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_bidirectional_run_between_two_400g_nodes(side: str) -> None:
    """The recorded real ``ib_write_bw -b -q 4 -F -a --report_gbits`` pair the lab's stand-in
    answers from (fxkit/lab/profiles/mi308x/SOURCES.md): both sides print the same table."""
    text = (PERFTEST / f"ib_write_bw_b_{side}.txt").read_text()
    got = parse_ib_write_bw(text)
    assert got["qps"] == 4 and got["link_type"] == "Ethernet" and len(got["rows"]) == 23
    assert max(r["bw_average"] for r in got["rows"]) == 779.21
    assert got["rows"][-1]["bytes"] == 8388608


def test_a_pair_is_judged_on_its_lower_side_against_its_slower_port() -> None:
    """Both sides' reports of one NIC pair (the recorded 400G run): the pair's figure is the
    lower one, in percent of both directions of the slower port's link speed; a side that
    failed fails the pair's test with its reason."""
    server = (PERFTEST / "ib_write_bw_b_server.txt").read_text()
    client = (PERFTEST / "ib_write_bw_b_client.txt").read_text()
    # as a port at 200G would report: every figure of 100 Gb/s and more halved
    half = re.sub(r"\b(\d{3}\.\d\d)\b", lambda m: f"{float(m[1]) / 2:.2f}", client)

    def side(host: str, speed: int) -> fabric._Side:
        port = fabric.Backend("mlx5_0/1", "mlx5_0", "ens6np0", "ACTIVE")
        params = fabric.PairParams(address=host)
        return fabric._Side(host, local_probe(), params, [port], {"mlx5_0/1": speed})

    fast, slow = side("a", 400000), side("b", 200000)
    got = fabric._bw_judge((0, server), (0, half), fast, slow, 0)
    assert got["bw_gbps"] == 389.61 and got["speed_mbps"] == 200000  # 779.21 / 2
    assert got["line_rate_pct"] == 97.4  # of 2 x 200G
    assert (
        fabric._bw_judge((0, server), (0, client), fast, side("c", 400000), 0)["line_rate_pct"]
        == 97.4
    )  # 779.21 of 2 x 400G
    failed = fabric._bw_judge((0, server), (1, "Couldn't connect"), fast, slow, 0)
    assert failed["bw_gbps"] == 0.0 and "client exited 1" in failed["error"]


@pytest.mark.parametrize("count", range(1, 8))
def test_g1_pairs_every_node_once_no_node_twice_in_a_round(count: int) -> None:
    hosts = [f"n{i}" for i in range(count)]
    rounds = plan_pairs(hosts)
    pairs = [frozenset(pair) for pairs in rounds for pair in pairs]
    if count == 1:
        assert rounds == []
        return
    assert len(pairs) == len(set(pairs))  # each pair once
    assert {h for pair in pairs for h in pair} == set(hosts)  # every node measured
    for pairs_of_round in rounds:  # a node, so each of its NICs, in one test at a time
        nodes = [h for pair in pairs_of_round for h in pair]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) == (1 if count % 2 == 0 else 2)


def test_the_rccl_kind_reads_the_bus_bandwidth_of_its_size(tmp_path, monkeypatch) -> None:
    """With a test double of all_reduce_perf that prints the real MI308X output."""
    calls = stand_in(tmp_path, "all_reduce_perf", f"cat {RCCL}", monkeypatch)
    got = measure("rccl", {"size": 2147483648, "max_bytes": "2G"})
    assert isinstance(got, dict) and got["busbw_gbps"] == 314.17 and got["avg_busbw_gbps"] == 95.233
    assert calls.read_text().strip() == "-b 1K -e 2G -f 2 -g 8 -n 20 -w 5"
    with pytest.raises(MeasureError, match="no row for 8589934592 bytes"):
        measure("rccl", {})


def test_rccl_needs_its_tool() -> None:
    with pytest.raises(MeasureError, match="fxkit-no-such-rccl not found on localhost"):
        measure("rccl", {"binary": "fxkit-no-such-rccl"})


# -- rccl-tests -----------------------------------------------------------------------------------


def test_all_reduce_perf_of_a_real_run() -> None:
    got = parse_all_reduce(RCCL.read_text())
    assert got["avg_busbw_gbps"] == 95.233
    assert got["rccl_version"] == "2.27.7-HEAD:0d2c4fd"
    assert len(got["sizes"]) == 22 and got["errors"] == 0
    sizes = list(got["sizes"])
    assert (sizes[0], sizes[-1]) == ("1024", "2147483648")
    assert got["sizes"]["2147483648"] == {
        "time_us": 12816.0,
        "algbw": 167.56,
        "busbw": 314.17,
        "in_place_busbw": 313.87,
        "wrong": 0,
    }
    assert got["max_busbw_gbps"] == 332.54  # 512 MiB, out of place


def test_all_reduce_perf_output_without_results() -> None:
    head = RCCL.read_text().split("#       size")[0]
    with pytest.raises(MeasureError, match="no result table"):
        parse_all_reduce(head)


# -- sysfs PCIe links, the gate file --------------------------------------------------------------


def test_pcie_links_as_sysfs_writes_them() -> None:
    got = parse_pcie_links(
        "0000:05:00.0\t32.0 GT/s PCIe\t16\t32.0 GT/s PCIe\t16\n"
        "0000:26:00.0\t16.0 GT/s PCIe\t8\t32.0 GT/s PCIe\t16\n"
        "0000:46:00.0\tUnknown\t0\t32.0 GT/s PCIe\t16\n"
        "0000:65:00.0\tabsent\n"
    )
    assert got["0000:05:00.0"] == {
        "speed_gts": 32.0,
        "width": 16,
        "max_speed_gts": 32.0,
        "max_width": 16,
    }
    assert got["0000:26:00.0"]["speed_gts"] == 16.0 and got["0000:26:00.0"]["width"] == 8
    assert got["0000:46:00.0"]["speed_gts"] == 0.0
    assert got["0000:65:00.0"] is None


def test_facts_of_this_machine() -> None:
    os_data = measure("fact", {"name": "os"})
    kernel = measure("fact", {"name": "kernel"})
    assert isinstance(os_data, dict) and isinstance(kernel, dict)
    assert os_data["release"] == f"{os_data['id']} {os_data['version_id']}".strip()
    assert (
        kernel["release"]
        == subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    )
    assert kernel["cmdline"] == Path("/proc/cmdline").read_text().split()
    value = Path("/proc/sys/kernel/numa_balancing").read_text().strip()
    got = measure("fact", {"name": "sysctl", "names": ["kernel.numa_balancing", "fxkit.none"]})
    assert got == {
        "values": {"kernel.numa_balancing": value, "fxkit.none": None},
        "settings": [f"kernel.numa_balancing={value}", "fxkit.none (absent)"],
    }
    with pytest.raises(MeasureError, match="sysctl needs names"):
        measure("fact", {"name": "sysctl"})


def test_g1_has_the_checks_the_estimator_reads() -> None:
    gate = spec.load("g1")
    ids = [c.id for c in gate.spec.checks]
    read = [
        "os_release", "kernel_release", "rocm_version", "gpu_count", "gpu_model", "gpu_vram",
        "gpu_pcie_speed", "gpu_pcie_width", "rdma_active_count", "rdma_state", "rdma_link_layer",
        "rdma_mtu", "nvmeof_namespaces", "nvmeof_namespace_size", "kernel_cmdline", "sysctl",
        "storage_read_bandwidth", "storage_read_latency", "storage_fleet_read_bandwidth",
        "fabric_link_speed", "fabric_gid_index", "fabric_gpu_nic_bandwidth", "fabric_rc_pingpong",
        "fabric_nic_nic_bandwidth", "rccl_all_reduce_busbw",
        # AMD's MI300X checklist: prerequisites, basic health, firmware and platform
        "os_point_release", "system_manufacturer", "bios_version", "required_packages",
        "gpu_firmware", "kernel_args_amd", "amdgpu_dmesg_errors", "memory_online",
        "gpu_pci_count", "gpu_link_speed", "gpu_link_width", "gpu_fatal_error", "pcie_acs_gpu",
        "pcie_acs_nic", "nic_link_speed", "nic_link_width", "xgmi_links", "gpu_idle_gfx_util",
        "gpu_idle_mem_util", "gpu_idle_temperature", "gpu_idle_mem_temperature",
        "gpu_idle_power", "gpu_idle_gfx_clock", "kernel_log_clean",
    ]  # fmt: skip
    assert [i for i in ids if i in read] == read
    assert len(ids) == len(set(ids))
    assert all(c.why for c in gate.spec.checks)
    units = {c.id: c.unit for c in gate.spec.checks}
    assert units["storage_read_bandwidth"] == "GB/s" and units["storage_read_latency"] == "ms"
    assert units["rccl_all_reduce_busbw"] == "GB/s"


def test_every_g1_check_names_its_source_and_a_declared_stage() -> None:
    gate = spec.load("g1")
    declared = set(gate.spec.stages)
    for check in gate.spec.checks:
        assert check.source and check.source.strip(), f"{check.id} has no source"
        assert check.stage in declared, f"{check.id}: stage {check.stage!r} not declared"
