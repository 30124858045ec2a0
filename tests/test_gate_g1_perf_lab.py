"""G1's system validation (RVS) and performance checks end to end on lab hosts of the mi308x
profile (the CLI over real sshd; stand-ins rvs, TransferBench, rocblas-bench, hip-stream,
all_reduce_perf answer: fxkit/lab/standins/rvs.py, perf.py; SOURCES.md of the profile):

- healthy hosts: every RVS and benchmark check PASSes once the site gives the mi308x platform's
  unset thresholds, and the measured figures differ from host to host;
- without them, each benchmark check is ERROR naming the variable to set, never PASS;
- mi308x-rvs-met-false fails exactly rvs_gst; mi308x-slow passes everything, 30 % below.

The lab hosts have no GPU: the figures are the stand-ins' (illustrative, not measured here).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from test_gate_g1_lab import FIO, check, run_g1, statuses
from test_play_lab import FXKIT

from fxkit.gate import outliers, spec
from fxkit.gate.verdicts import GateResult
from fxkit.lab import profile as profiles

pytestmark = pytest.mark.lab

#: The site's thresholds for the mi308x platform (it publishes none): about half the stand-ins'
#: figures, so that the slow variant (0.7) passes too.
SITE = {
    "g1_rvs_mem_bandwidth_min_gbps": 1000,
    "g1_transferbench_a2a_min_gbps": 18,
    "g1_transferbench_p2p_unidir_min_gbps": 18,
    "g1_transferbench_p2p_bidir_min_gbps": 24,
    "g1_transferbench_test1_min_gbps": 25,
    "g1_transferbench_test2_min_gbps": 25,
    "g1_transferbench_test3_0to1_min_gbps": 17,
    "g1_transferbench_test3_1to0_min_gbps": 20,
    "g1_transferbench_test4_min_gbps": 650,
    "g1_transferbench_test6_min_gbps": 25,
    "g1_rccl_busbw_min_gbps": 150,
    "g1_rocblas_fp32_min_gflops": 17000,
    "g1_rocblas_bf16_min_gflops": 23000,
    "g1_rocblas_int8_min_gflops": 29000,
    "g1_babelstream_copy_min_mbps": 2100000,
    "g1_babelstream_mul_min_mbps": 2000000,
    "g1_babelstream_add_min_mbps": 2000000,
    "g1_babelstream_triad_min_mbps": 2000000,
    "g1_babelstream_dot_min_mbps": 1800000,
}
#: The six tests of TransferBench's examples/example.cfg (ROCm/TransferBench), one a line.
EXAMPLE_CFG = (
    "1 4 (G0->G0->G1)\n1 1 (G0->D0->G1)\n-2 (G0->G0->G1 4 1M) (G1->G1->G0 8 2M)\n"
    "1 32 (N0->G0->G0)\n1 4 (C0->C0->N0)\n1 16 (G0->G0->G0G1)\n"
)
STAGES = ("validation", "performance")
OURS = [c.id for c in spec.load("g1").spec.checks if c.stage in STAGES]
BENCHMARKS = [c.id for c in spec.load("g1").spec.checks if c.stage == "performance"]


def fleet_of(lab_fleet, name: str, profile: str, count: int = 1):
    """A fleet whose hosts have TransferBench where g1 looks for it (a checkout built with
    `CC=hipcc make`: the binary, here the stand-in, and examples/example.cfg)."""
    fleet = lab_fleet(count, name=name, profile=profile)
    for n in range(1, count + 1):
        with fleet.connect(f"lab{n:02d}") as conn:
            folder = "/opt/TransferBench"
            assert conn.run(f"mkdir -p {folder}/examples").ok
            assert conn.run(f"ln -sf /usr/local/bin/TransferBench {folder}/TransferBench").ok
            conn.put(f"{folder}/examples/example.cfg", EXAMPLE_CFG.encode())
    return fleet


@pytest.fixture(scope="module")
def runs(lab_fleet, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("g1perf")
    healthy = fleet_of(lab_fleet, "g1perf", "mi308x", 2)
    got = {"healthy": run_g1(healthy, out / "healthy", {**FIO, **SITE})[1]}
    got["unset"] = run_g1(healthy, out / "unset", FIO)[1]
    got["mi300x"] = run_g1(healthy, out / "mi300x", {**FIO, "g1_platform": "mi300x"})[1]
    got["out"] = out
    for variant in ("mi308x-rvs-met-false", "mi308x-slow"):
        fleet = fleet_of(lab_fleet, f"g1perf-{variant}", variant)
        got[variant] = run_g1(fleet, out / variant, {**FIO, **SITE})[1]
    return got


def ours(result: dict, host: str = "lab01") -> dict[str, str]:
    return {k: v for k, v in statuses(result, host).items() if k in OURS}


def test_every_check_passes_on_healthy_hosts_with_figures_of_their_own(runs) -> None:
    result = runs["healthy"]
    for host in ("lab01", "lab02"):
        got = ours(result, host)
        assert set(got.values()) == {"PASS"}, {k: v for k, v in got.items() if v != "PASS"}
        assert len(got) == 31
    assert check(result, "rvs_gst_gpus")["value"] == 8
    assert check(result, "rvs_peqt")["value"] == {f"pcie_act_{n}": True for n in range(1, 18)}
    assert len(check(result, "rvs_gst")["value"]) == 9 * 8  # MI308X gst_single.conf: 9 actions
    for check_id in BENCHMARKS:
        one, two = check(result, check_id, "lab01"), check(result, check_id, "lab02")
        assert one["value"] != two["value"], check_id


def test_an_unset_threshold_is_error_naming_its_variable(runs) -> None:
    got = ours(runs["unset"])
    unset = {c for c, status in got.items() if status == "ERROR"}
    assert unset == {*BENCHMARKS, "rvs_mem_bandwidth"}
    assert "PASS" not in {got[c] for c in unset}
    reason = check(runs["unset"], "rocblas_bf16")["reason"]
    assert reason.startswith("threshold unset: set g1_rocblas_bf16_min_gflops (platform mi308x")
    for check_id in unset - {"rvs_mem_bandwidth"}:
        assert "threshold unset: set g1_" in check(runs["unset"], check_id)["reason"]
    # The RVS checks judge RVS's own met/pass against the MI308X configuration's targets.
    assert {got[c] for c in got if c not in unset} == {"PASS"}


def test_the_site_gives_its_figures_afterwards(runs, tmp_path: Path) -> None:
    """The unset run judged again with the site's figures (no host touched): all PASS."""
    extra = tmp_path / "site.yml"
    extra.write_text(yaml.safe_dump(SITE))
    result = runs["out"] / "unset" / "result.json"
    again_dir = tmp_path / "again"
    done = subprocess.run(
        [FXKIT, "gate", "evaluate", str(result), "--out", str(again_dir), "-e", f"@{extra}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    again = json.loads((again_dir / "result.json").read_text())
    assert set(ours(again).values()) == {"PASS"}, done.stdout + done.stderr


def test_the_mi300x_platform_judges_by_amds_figures(runs) -> None:
    """g1_platform=mi300x: AMD's published figures. The lab's MI308X stand-ins reach the xGMI
    ones and not the compute ones; RVS has no MI300X configuration files on the lab host."""
    result = runs["mi300x"]
    assert check(result, "transferbench_a2a")["expected"] == ">= 32.9"
    assert check(result, "transferbench_a2a")["status"] == "PASS"
    bf16 = check(result, "rocblas_bf16")
    assert bf16["status"] == "FAIL" and bf16["expected"] == ">= 130600"
    assert check(result, "rccl_all_reduce_busbw")["expected"] == ">= 304"
    gst = check(result, "rvs_gst")
    assert gst["status"] == "ERROR" and "MI300X/gst_single.conf" in gst["reason"]
    assert (
        result["hosts"]["lab01"]["var_sources"]["g1_rocblas_bf16_min_gflops"] == "platform mi300x"
    )


def test_met_false_fails_exactly_rvs_gst(runs) -> None:
    base, got = ours(runs["healthy"]), ours(runs["mi308x-rvs-met-false"])
    changed = {c for c in base if base[c] != got[c]}
    assert changed == {"rvs_gst"} and got["rvs_gst"] == "FAIL"
    reason = check(runs["mi308x-rvs-met-false"], "rvs_gst")["reason"]
    assert reason == "gst-336Tflops-4K4K8K-trig-fp8 GPU 22683: False is not == True"


def test_the_slow_node_passes_thirty_percent_below(runs) -> None:
    """The same hostname (lab01) as the healthy fleet's first host: the same spread, times 0.7."""
    assert set(ours(runs["mi308x-slow"]).values()) == {"PASS"}
    for check_id in BENCHMARKS:
        fast = check(runs["healthy"], check_id)["value"]
        slow = check(runs["mi308x-slow"], check_id)["value"]
        pairs = (
            zip(fast.values(), slow.values(), strict=True)
            if isinstance(fast, dict)
            else [(fast, slow)]
        )
        for f, s in pairs:
            assert s == pytest.approx(0.7 * f, rel=0.01), check_id
    # RVS judges itself: a slow node is still within its targets.
    base = check(runs["healthy"], "rvs_gst")["value"]
    assert check(runs["mi308x-slow"], "rvs_gst")["value"] == base


def test_the_slow_node_is_the_fleets_outlier(runs) -> None:
    """The slow node's results beside the healthy fleet's two (one results file, as from a rack):
    it passes, and the fleet view flags it, and only it, on the benchmarks."""
    data = json.loads(json.dumps(runs["healthy"]))
    data["hosts"]["lab03"] = runs["mi308x-slow"]["hosts"]["lab01"]
    result = GateResult.from_json(data, "three hosts")
    view = outliers.view(result, outliers.settings(spec.load("g1").spec.vars))
    flagged = {check_id: {o.host for o in view[check_id].outliers} for check_id in BENCHMARKS}
    assert flagged == {check_id: {"lab03"} for check_id in BENCHMARKS}
    assert {c.status.value for c in result.hosts["lab03"].checks if c.id in BENCHMARKS} == {"PASS"}


def test_the_variants_are_profiles() -> None:
    assert {"mi308x-rvs-met-false", "mi308x-slow"} <= set(profiles.names())
    assert profiles.load("mi308x-slow")["perf"] == {"scale": 0.7}
