"""G1's system validation (RVS) and performance benchmarks: the parsers against recorded real
output (tests/data/gate/, SOURCES.md names each file's origin), the platform profiles
(gates/platforms/), and an unset threshold being ERROR that names its variable.

- RVS: AMD's published log lines of each module (ROCm/system-acceptance-docs,
  docs/common/system-validation.md, MI300X), copied verbatim (``rvs_*_mi300x_amd.txt``).
- TransferBench a2a, p2p and example.cfg, rccl-tests ``all_reduce_perf -b 8 -e 8G -f 2 -g 8``:
  a public MI350X bring-up write-up (TransferBench v1.62).
- BabelStream: its README's example run (v5.0, CUDA build: the same table as the HIP build).
- rocblas-bench: no recorded run was found; its result line is checked with the format rocBLAS's
  client prints (a CSV header holding ``rocblas-Gflops``, the values under it), as the lab's
  stand-in prints it (not a capture: said so in SOURCES.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fxkit.connection.local import LocalConnection
from fxkit.engine.variables import HostVars, Layer
from fxkit.facts.base import FactCache
from fxkit.gate import platforms, rules, spec
from fxkit.gate.measure import KINDS, MeasuredHost, MeasureError
from fxkit.gate.measures.bench import parse_all_reduce
from fxkit.gate.measures.perf import (
    parse_babelstream,
    parse_rocblas_bench,
    parse_transferbench_a2a,
    parse_transferbench_p2p,
    parse_transferbench_tests,
)
from fxkit.gate.measures.validation import parse_rvs

DATA = Path(__file__).parent / "data" / "gate"
ACCEPTANCE_DOCS = Path("/work/refs/system-acceptance-docs")
MI300X_PAGE = ACCEPTANCE_DOCS / "docs/gpus/mi300x.md"


def text(name: str) -> str:
    return (DATA / name).read_text()


# -- RVS ------------------------------------------------------------------------------------------


def test_gst_met_true_with_its_gflops_and_target() -> None:
    got = parse_rvs(text("rvs_gst_mi300x_amd.txt"))
    assert got["actions"] == {"gst-1215Tflops-4K4K8K-rand-fp8": "gst"}
    assert got["verdicts"] == {"gst-1215Tflops-4K4K8K-rand-fp8 GPU 28851": True}
    assert got["gflops"] == {"gst-1215Tflops-4K4K8K-rand-fp8 GPU 28851": 1687129.0}
    assert got["gpus"] == ["28851"] and got["all_passed"] is True


def test_gst_met_false_is_a_failed_verdict() -> None:
    failing = text("rvs_gst_mi300x_amd.txt").replace("met: TRUE", "met: FALSE")
    got = parse_rvs(failing)
    assert got["verdicts"] == {"gst-1215Tflops-4K4K8K-rand-fp8 GPU 28851": False}
    assert got["all_passed"] is False


def test_iet_pass_per_gpu_and_every_gpu_named() -> None:
    got = parse_rvs(text("rvs_iet_mi300x_amd.txt"))
    assert list(got["actions"]) == ["iet-620W-1K-rand-dgemm", "iet-wait-750W-28K-rand-dgemm"]
    assert got["verdicts"] == {
        f"iet-620W-1K-rand-dgemm GPU {g}": True for g in ("29122", "23018", "28851")
    }
    assert got["gpus"] == ["23018", "28851", "29122"]


def test_mem_tests_pass_and_test_11_bandwidth_of_each_gpu() -> None:
    got = parse_rvs(text("rvs_mem_mi300x_amd.txt"))
    assert got["verdicts"] == {f"action_1 test 1 #{n}": True for n in range(1, 9)}
    bandwidth = got["bandwidth_gbps"]
    assert len(bandwidth) == 8 and bandwidth["action_1 test 11 #1"] == 2003.01709
    assert got["min_bandwidth_gbps"] == 1994.768433


def test_pebb_distances_name_every_gpu_and_bandwidths_are_read() -> None:
    got = parse_rvs(text("rvs_pebb_mi300x_amd.txt"))
    assert got["gpu_count"] == 8
    assert got["bandwidth_gbps"] == {
        "d2h-sequential-64MB CPU 0 -> GPU 28851": 56.298,
        "d2h-sequential-64MB CPU 1 -> GPU 28851": 55.664,
        "d2h-sequential-64MB CPU 1 -> GPU 63738": 56.334,
    }


def test_peqt_true_per_action() -> None:
    got = parse_rvs(text("rvs_peqt_mi300x_amd.txt"))
    assert got["verdicts"] == {"pcie_act_1": True, "pcie_act_17": True}
    failing = parse_rvs(
        text("rvs_peqt_mi300x_amd.txt").replace("pcie_act_17] peqt true", "pcie_act_17] peqt false")
    )
    assert failing["verdicts"]["pcie_act_17"] is False


def test_pbqt_peers_and_throughput() -> None:
    got = parse_rvs(text("rvs_pbqt_mi300x_amd.txt"))
    assert got["verdicts"] == {
        "p2p-unidir-sequential-64MB GPU 28851 -> 23018": True,
        "p2p-unidir-sequential-64MB GPU 28851 -> 29122": True,
    }
    assert got["bandwidth_gbps"]["p2p-unidir-parallel-64MB GPU 28851 -> 22683"] == 48.577


def test_gpup_lists_gpus_and_error_lines_fail() -> None:
    got = parse_rvs(text("rvs_gpup_mi300x_amd.txt"))
    assert got["gpus"] == ["28851"] and got["error_count"] == 0
    broken = text("rvs_gpup_mi300x_amd.txt") + "[ERROR ] [54433.8] gpup cannot read properties\n"
    got = parse_rvs(broken)
    assert got["error_count"] == 1 and got["all_passed"] is False
    assert list(got["verdicts"]) == ["error 1: gpup cannot read properties"]


def test_output_that_is_not_rvs_is_an_error() -> None:
    with pytest.raises(MeasureError, match="no action and no result"):
        parse_rvs("rvs: error while loading shared libraries: libamd_smi.so\n")


# -- TransferBench, RCCL, BabelStream, rocblas-bench ----------------------------------------------


def test_transferbench_a2a_average() -> None:
    got = parse_transferbench_a2a(text("transferbench_a2a_mi350x.txt"))
    assert got == {"average_gbps": 51.417, "aggregate_gbps": 2879.354}


def test_transferbench_p2p_gpu_to_gpu_averages() -> None:
    got = parse_transferbench_p2p(text("transferbench_p2p_mi350x.txt"))
    assert (got["unidir_gbps"], got["bidir_gbps"]) == (57.32, 54.32)
    assert got["averages"]["UniDir"]["CPU->CPU"] == 103.69


def test_transferbench_example_cfg_tests_one_to_six() -> None:
    tests = parse_transferbench_tests(text("transferbench_examplecfg_mi350x.txt"))["tests"]
    got = {n: [t["gbps"] for t in test["transfers"]] for n, test in tests.items()}
    assert got == {
        "1": [56.309],
        "2": [60.973],
        "3": [37.857, 46.304],
        "4": [1493.789],
        "5": [37.756],
        "6": [58.327],
    }
    assert tests["3"]["transfers"][1]["path"] == "G1 -> G001:008 -> G0"


def test_transferbench_without_results_is_an_error() -> None:
    with pytest.raises(MeasureError, match="Average bandwidth"):
        parse_transferbench_a2a("[ERROR] HIP Error: invalid resource handle\n")
    with pytest.raises(MeasureError, match="Averages"):
        parse_transferbench_p2p(text("transferbench_a2a_mi350x.txt"))
    with pytest.raises(MeasureError, match="Test N"):
        parse_transferbench_tests("TransferBench v1.62.00\n[ERROR] HIP Error\n")


def test_rccl_in_place_bus_bandwidth_at_8g() -> None:
    got = parse_all_reduce(text("rccl_all_reduce_mi350x_1node_g8.txt"))
    assert got["sizes"]["8589934592"]["in_place_busbw"] == 367.51
    assert got["sizes"]["8589934592"]["busbw"] == 360.97


def test_babelstream_kernels_in_mbytes_per_second() -> None:
    got = parse_babelstream(text("babelstream_cuda_a100_v5.txt"))
    assert got["copy"] == 1709360.8 and got["dot"] == 1586905.948
    assert got["device"] == "NVIDIA A100-SXM4-80GB"
    with pytest.raises(MeasureError, match="no row for dot"):
        parse_babelstream(text("babelstream_cuda_a100_v5.txt").rsplit("Dot", 1)[0])


def test_rocblas_bench_result_line() -> None:
    out = (
        "rocBLAS info: lab stand-in\n"
        "transA,transB,M,N,K,alpha,lda,beta,ldb,ldc,rocblas-Gflops,us\n"
        "N,T,4000,4000,4000,1,4000,0,4000,4000,94123.4,1359.9\n"
    )
    got = parse_rocblas_bench(out)
    assert got["gflops"] == 94123.4 and got["fields"]["M"] == "4000"
    with pytest.raises(MeasureError, match="no rocblas-Gflops"):
        parse_rocblas_bench("hipErrorNoDevice\n")


def test_the_benchmark_kinds_need_their_tools() -> None:
    conn = LocalConnection("localhost")
    node = MeasuredHost("localhost", conn, FactCache(conn), HostVars("localhost", []))
    for kind, params in (
        ("rvs", {"conf": "gst_single.conf", "binary": "fxkit-no-rvs"}),
        ("transferbench", {"run": "a2a", "binary": "fxkit-no-tb"}),
        ("rocblas", {"args": "-f gemm", "binary": "fxkit-no-rocblas"}),
        ("babelstream", {"binary": "fxkit-no-stream"}),
    ):
        with pytest.raises(MeasureError, match="not found on localhost"):
            KINDS[kind].measure(node, KINDS[kind].parse(params))


# -- platform profiles and unset thresholds -------------------------------------------------------


def test_mi300x_thresholds_are_amds_figures_on_the_lines_they_cite() -> None:
    """Each figure of the mi300x profile stands on the line of docs/gpus/mi300x.md it cites."""
    if not MI300X_PAGE.is_file():
        pytest.skip(f"{MI300X_PAGE} (ROCm/system-acceptance-docs) is not unpacked here")
    platform, _ = platforms.load("mi300x")
    cited = 0
    for name, threshold in platform.thresholds.items():
        if name.endswith("_conf") or name == "g1_rvs_mem_bandwidth_min_gbps":
            continue
        found = re.match(r"(docs/\S+\.md):(\d+)", threshold.source)
        assert found, (name, threshold.source)
        page = ACCEPTANCE_DOCS.joinpath(found[1]).read_text().splitlines()
        line = page[int(found[2]) - 1]
        figure = f"{threshold.value:,}".replace(",", "")
        assert figure in line.replace(",", ""), (name, line)
        cited += 1
    assert cited == 19
    values = platforms.variables(platform)
    assert values["g1_rccl_busbw_min_gbps"] == 304
    assert values["g1_transferbench_a2a_min_gbps"] == 32.9
    assert values["g1_rocblas_bf16_min_gflops"] == 130600


def test_mi308x_leaves_compute_and_bandwidth_to_the_site() -> None:
    platform, _ = platforms.load("mi308x")
    values = platforms.variables(platform)
    assert values["g1_rvs_gst_conf"] == "MI308X/gst_single.conf"
    assert "336,441" in platform.thresholds["g1_rvs_gst_conf"].source
    unset = {n for n, v in values.items() if str(v).startswith(rules.UNSET)}
    assert unset == {n for n in values if not n.endswith("_conf")}
    assert values["g1_rocblas_bf16_min_gflops"].startswith("unset: set g1_rocblas_bf16_min_gflops")
    # Both platforms set the same variables: a site copies one to add a platform.
    assert set(values) == set(platforms.variables(platforms.load("mi300x")[0]))


def test_every_threshold_of_the_gate_has_a_figure_on_every_platform() -> None:
    """The g1 checks' rules use only variables that a platform (or the gate) defines."""
    gate = spec.load("g1")
    rules_text = yaml.safe_dump([c.rule for c in gate.spec.checks])
    for name in platforms.names():
        for variable in platforms.variables(platforms.load(name)[0]):
            if not variable.endswith("_conf"):
                assert variable in rules_text, (name, variable)


def test_an_unset_threshold_is_an_error_naming_the_variable() -> None:
    platform, _ = platforms.load("mi308x")
    marker = platforms.variables(platform)["g1_rccl_busbw_min_gbps"]
    with pytest.raises(rules.RuleError, match="threshold unset: set g1_rccl_busbw_min_gbps"):
        rules.evaluate({">=": marker}, 400.0)
    with pytest.raises(rules.RuleError, match="set g1_rccl_busbw_min_gbps"):
        rules.evaluate({">=": marker}, {"0": 1.0, "1": 2.0})


def test_the_gate_picks_the_platform_its_variable_names() -> None:
    gate = spec.load("g1")
    base = [Layer("gate g1 vars", gate.spec.vars)]
    chosen = platforms.layer("g1", HostVars("n1", [*base, Layer("-e", {"g1_platform": "mi300x"})]))
    assert chosen is not None and chosen.values["g1_rccl_busbw_min_gbps"] == 304
    default = platforms.layer("g1", HostVars("n1", base))
    assert default is not None and default.source == "platform mi308x"
    assert platforms.layer("g1", HostVars("n1", [*base, Layer("-e", {"g1_platform": ""})])) is None
    with pytest.raises(platforms.PlatformError, match="no platform profile 'mi999x'"):
        platforms.layer("g1", HostVars("n1", [Layer("-e", {"g1_platform": "mi999x"})]))


def test_a_platform_file_without_sources_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "mi325x.yml"
    bad.write_text(
        "platform: mi325x\ntitle: t\ngate: g1\nthresholds:\n"
        "  g1_rccl_busbw_min_gbps: {value: 350, source: ''}\n"
    )
    with pytest.raises(platforms.PlatformError, match="names its source") as exc:
        platforms.load(str(bad))
    assert exc.value.where == f"{bad}:5"
