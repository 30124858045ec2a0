"""``fxkit gate g2``, ``g3 --baseline`` and ``g4`` end to end on lab hosts, over real SSH.

G4: a 20 s soak of a real fio job on each plain lab host: the workload's failures are counted
(a host whose workload fails now and then FAILs), the latency check passes, and the NVMe, RDMA
and GPU counters, which a plain lab host does not have, are ERROR with the reason. G2 -> G3:
``vllm bench serve`` result files with vLLM's own key set (read from its source:
tests/test_gate_serving_fidelity.py) on the hosts; G2 records their TTFT and throughput (its
load checks are ERROR: fxkit is not installed on a lab host), G3 judges a second file against
them (one host inside the band, one outside), and ``fxkit gate evaluate`` re-judges the G3
results against an edited band without touching the hosts.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sync_helpers import SAFETY, Meeting
from test_gate_serving_fidelity import vllm_result
from test_play_lab import FXKIT

from fxkit import paths
from fxkit.gate.measures.soak import RDMA_ERRORS
from fxkit.lab import profile

pytestmark = pytest.mark.lab

FIO = (
    "fio --name=g4 --filename=/var/tmp/g4.fio --size=8M --rw=read --bs=1M --ioengine=psync "
    "--output-format=terse"
)
#: A latency tolerance no run reaches: the check is of the measurement, not of the speed of this
#: shared machine (its load changes in the middle of a soak).
ANY = 1000000


def gate(*args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [str(FXKIT), "gate", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    return proc.returncode, proc.stdout + proc.stderr


def results(folder: Path) -> dict[str, dict[str, Any]]:
    """``{host: {check id: check}}`` of a result.json."""
    data = json.loads((folder / "result.json").read_text())
    assert data["schema"] == "fxkit-gate-result/1"
    return {h: {c["id"]: c for c in host["checks"]} for h, host in data["hosts"].items()}


def with_host_vars(fleet: Any, path: Path, **host_vars: dict[str, Any]) -> Path:
    data = yaml.safe_load(fleet.inventory.read_text())
    for name, values in host_vars.items():
        data["all"]["children"]["lab"]["hosts"][name].update(values)
    path.write_text(yaml.safe_dump(data))
    return path


def test_g4_soak_on_plain_lab_hosts(lab_fleet: Any, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="gates")
    flaky = "n=$(($(cat /var/tmp/g4.n 2>/dev/null || echo 0) + 1)); echo $n > /var/tmp/g4.n; "
    flaky += f"[ $((n % 2)) -ne 0 ] && {FIO}"  # every second iteration fails
    inv = with_host_vars(
        fleet, tmp_path / "inv.yml", lab01={"g4_workload": FIO}, lab02={"g4_workload": flaky}
    )
    with fleet.connect("lab02") as conn:
        conn.run("rm -f /var/tmp/g4.n")
    code, out = gate(
        "g4", "-i", str(inv), "--out", str(tmp_path / "g4"),
        "-e", "g4_duration=20s", "-e", "g4_interval=5s", "-e", f"g4_latency_tolerance={ANY}",
    )  # fmt: skip
    assert code == 1, out
    checks = results(tmp_path / "g4")
    for host in ("lab01", "lab02"):
        c = checks[host]
        assert "no NVMe controllers on" in c["nvme_errors"]["reason"]
        assert (
            f"no RDMA devices on {host} (/sys/class/infiniband is empty)"
            == c["rdma_errors"]["reason"]
        )
        assert f"amd-smi not found on {host}" in c["gpu_errors"]["reason"]
        assert {c[i]["status"] for i in ("nvme_errors", "rdma_errors", "gpu_errors")} == {"ERROR"}
        assert c["latency_degradation"]["status"] == "PASS", c["latency_degradation"]
    assert checks["lab01"]["soak_workload_errors"]["status"] == "PASS"
    failed = checks["lab02"]["soak_workload_errors"]
    assert failed["status"] == "FAIL" and failed["value"] >= 1
    data = json.loads((tmp_path / "g4/result.json").read_text())
    soak = data["hosts"]["lab01"]["measurements"][0]["data"]
    # On until 20 s had passed, then ended (the last iteration may run over: a bound far off).
    assert soak["iterations"] >= 2 and 20 <= soak["duration_s"] <= 120
    assert soak["latency"]["source"] == "wall" and soak["latency"]["first_ms"] > 0
    # At the start, after the first iteration past each 5 s from the last sample, at the end.
    times = [sample["t_s"] for sample in soak["samples"]]
    assert times[0] == 0 and times[-1] == soak["duration_s"] and len(times) >= 3
    between = times[:-1]  # the end comes at any time
    assert all(later - earlier >= 4.9 for earlier, later in itertools.pairwise(between))
    with fleet.connect("lab02") as conn:
        runs = int(conn.run("cat /var/tmp/g4.n").stdout)
    lab02 = data["hosts"]["lab02"]["measurements"][0]["data"]
    assert lab02["iterations"] == runs and lab02["workload_errors"] == runs // 2


def put_json(fleet: Any, host: str, path: str, data: dict[str, Any]) -> None:
    with fleet.connect(host) as conn:
        conn.put(path, json.dumps(data).encode())


def test_g2_baseline_then_g3_inside_and_outside_the_band(lab_fleet: Any, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="gates")
    inv = str(fleet.inventory)
    g2_file = vllm_result(median_ttft_ms=1000.0, p99_ttft_ms=2400.0, output_throughput=1000.0)
    for host in ("lab01", "lab02"):
        put_json(fleet, host, "/var/tmp/g2.json", g2_file)
    # lab01: TTFT -30 %, throughput +35 %: passes; lab02: TTFT -20 %, throughput +50 %: fails
    put_json(fleet, "lab01", "/var/tmp/g3.json",
             vllm_result(median_ttft_ms=700.0, output_throughput=1350.0))  # fmt: skip
    put_json(fleet, "lab02", "/var/tmp/g3.json",
             vllm_result(median_ttft_ms=800.0, output_throughput=1500.0))  # fmt: skip

    code, out = gate(
        "g2", "-i", inv, "--out", str(tmp_path / "g2"),
        "-e", "g2_model=/srv/models/m", "-e", "g2_vllm_result=/var/tmp/g2.json",
    )  # fmt: skip
    assert code == 1, out  # the load checks are ERROR: fxkit is not on the lab hosts
    g2 = results(tmp_path / "g2")
    for host in ("lab01", "lab02"):
        assert (
            g2[host]["ttft_median"]["status"] == "PASS"
            and g2[host]["ttft_median"]["value"] == 1000.0
        )
        assert g2[host]["ttft_p99"]["value"] == 2400.0
        assert g2[host]["output_throughput"]["value"] == 1000.0
        load = g2[host]["load_time_nfs"]
        assert load["status"] == "ERROR" and f"fxkit not found on {host}" in load["reason"]

    code, out = gate("g3", "-i", inv, "--out", str(tmp_path / "g3"),
                     "--baseline", str(tmp_path / "g2/result.json"),
                     "-e", "g3_vllm_result=/var/tmp/g3.json")  # fmt: skip
    assert code == 1, out
    g3 = results(tmp_path / "g3")
    assert g3["lab01"]["ttft_reduction"]["status"] == "PASS"
    assert g3["lab01"]["ttft_reduction"]["change"] == pytest.approx(-0.30)
    assert g3["lab01"]["throughput_gain"]["status"] == "PASS"
    assert g3["lab01"]["throughput_gain"]["baseline_value"] == 1000.0
    assert g3["lab02"]["ttft_reduction"]["status"] == "FAIL"
    assert "-20.0%" in g3["lab02"]["ttft_reduction"]["reason"]
    assert g3["lab02"]["throughput_gain"]["status"] == "FAIL"
    assert g3["lab02"]["throughput_gain"]["change"] == pytest.approx(0.50)

    # The band, edited in a copy of the gate file: re-judged without touching the hosts.
    edited = tmp_path / "g3-site.yml"
    text = (paths.builtin("gates") / "g3.yml").read_text()
    text = text.replace('g3_throughput_change_max: "40%"', 'g3_throughput_change_max: "55%"')
    edited.write_text(text.replace('g3_ttft_change_max: "-25%"', 'g3_ttft_change_max: "-15%"'))
    fleet.down()  # nothing is measured again: the hosts are not even there
    try:
        code, out = gate("evaluate", str(tmp_path / "g3/result.json"), "--gate", str(edited),
                         "--out", str(tmp_path / "g3-edited"))  # fmt: skip
        assert code == 0, out
        again = results(tmp_path / "g3-edited")
        assert {c["status"] for h in again.values() for c in h.values()} == {"PASS"}
        assert (
            again["lab02"]["throughput_gain"]["expected"] == "change 29%..55% vs output_throughput"
        )
        code, out = gate(
            "evaluate", str(tmp_path / "g3/result.json"),
            "-e", "g3_throughput_change_min=36%", "--out", str(tmp_path / "g3-e"),
        )  # fmt: skip
        assert code == 1, out
        narrow = results(tmp_path / "g3-e")
        assert narrow["lab01"]["throughput_gain"]["status"] == "FAIL"  # +35 % < +36 %
        assert narrow["lab01"]["ttft_reduction"]["status"] == "PASS"
    finally:
        fleet.up(2)


def test_g4_on_the_mi308x_profile_counts_a_gpu_fault(lab_fleet: Any, tmp_path: Path) -> None:
    """The profile's RDMA ports have their error counters (all 0: PASS) and its amd-smi answers
    ``metric --ecc --json``; the workload injects an uncorrectable ECC error on GPU 3 in its first
    iteration, after the soak's first reading (the stand-in's state), which the soak counts:
    gpu_errors FAILs, naming it."""
    fleet = lab_fleet(1, name="g4-mi308x", profile="mi308x")
    with fleet.connect("lab01") as conn:
        conn.run(f"rm -f /var/tmp/g4.n {profile.STATE_DIR}/ecc.json; mkdir -p {profile.STATE_DIR}")
    fault = json.dumps({"3": {"total_uncorrectable_count": 1}})
    work = "n=$(($(cat /var/tmp/g4.n 2>/dev/null || echo 0) + 1)); echo $n > /var/tmp/g4.n; "
    work += f"if [ $n -eq 1 ]; then echo '{fault}' > {profile.STATE_DIR}/ecc.json; fi; {FIO}"
    code, out = gate(
        "g4", "-i", str(fleet.inventory), "--out", str(tmp_path / "g4"),
        "-e", "g4_duration=12s", "-e", "g4_interval=4s", "-e", f"g4_latency_tolerance={ANY}",
        "-e", json.dumps({"g4_workload": work}),
    )  # fmt: skip
    assert code == 1, out
    checks = results(tmp_path / "g4")["lab01"]
    assert checks["rdma_errors"]["status"] == "PASS" and checks["rdma_errors"]["value"] == 0
    assert checks["gpu_errors"]["status"] == "FAIL" and checks["gpu_errors"]["value"] == 1
    assert checks["soak_workload_errors"]["status"] == "PASS"
    assert checks["latency_degradation"]["status"] == "PASS"
    assert "no NVMe controllers on lab01" in checks["nvme_errors"]["reason"]
    data = json.loads((tmp_path / "g4/result.json").read_text())
    soak = data["hosts"]["lab01"]["measurements"][0]["data"]
    assert soak["gpu"]["deltas"] == {"gpu3/total_uncorrectable_count": 1}
    assert soak["gpu"]["counters"] == 8 * 3
    ports = len(profile.load("mi308x")["rdma"]["ports"])
    watched = set(RDMA_ERRORS) & {*profile.PORT_COUNTERS, *profile.HW_COUNTERS}
    assert soak["rdma"]["counters"] == ports * len(watched) and soak["rdma"]["deltas"] == {}


def test_ctrl_c_ends_a_long_soak_with_what_it_measured(lab_fleet: Any, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="gates")
    with fleet.connect("lab01") as conn:
        conn.run("rm -f /var/tmp/g4.n")
        meeting = Meeting(conn)
        # The third iteration tells the test it runs (then goes on): Ctrl-C comes in it.
        work = "n=$(($(cat /var/tmp/g4.n 2>/dev/null || echo 0) + 1)); echo $n > /var/tmp/g4.n; "
        work += f"if [ $n -eq 3 ]; then {meeting.reach}; fi; {FIO}"
        command = [
            str(FXKIT), "gate", "g4", "-i", str(fleet.inventory), "--limit", "lab01",
            "--out", str(tmp_path / "g4"), "-e", "g4_duration=72h", "-e", "g4_interval=2s",
            "-e", json.dumps({"g4_workload": work}),
        ]  # fmt: skip
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            meeting.wait()
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=SAFETY)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, out
    data = json.loads((tmp_path / "g4/result.json").read_text())
    assert data["interrupted"] is True
    soak = data["hosts"]["lab01"]["measurements"][0]["data"]
    assert soak["interrupted"] is True and soak["iterations"] >= 3
    assert soak["planned_s"] == 72 * 3600
    checks = {c["id"]: c for c in data["hosts"]["lab01"]["checks"]}
    assert checks["soak_workload_errors"]["status"] == "PASS"
