"""``load_bench`` and ``vllm_bench`` on this machine, over a local connection.

``load_bench`` runs the real ``fxkit bench load`` (this checkout's, from the virtual environment)
on a small model written here, and its parser reads docs/bench/local_cold.json, a real report
of that command (docs/BENCHMARKS.md). ``vllm_bench`` reads and runs result files with vLLM's
own key set (read from vLLM's source: tests/test_gate_serving_fidelity.py).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_gate_serving_fidelity import vllm_result

from fxkit.connection.local import LocalConnection
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache
from fxkit.gate import spec
from fxkit.gate.measure import MeasuredHost, MeasureError
from fxkit.gate.measures.serving import (
    LoadBenchParams,
    VllmBenchParams,
    load_bench,
    parse_load_report,
    parse_vllm_result,
    vllm_bench,
)

ROOT = Path(__file__).resolve().parent.parent
FXKIT = Path(sys.executable).with_name("fxkit")


def node() -> MeasuredHost:
    conn = LocalConnection("localhost")
    return MeasuredHost("localhost", conn, FactCache(conn), HostVars("localhost", []), timeout=300,
                 stop=threading.Event())  # fmt: skip


def test_a_real_bench_load_report_as_load_times() -> None:
    text = (ROOT / "docs/bench/local_cold.json").read_text()
    report = json.loads(text)
    data = parse_load_report(text, report["model"])
    by = {s["method"]: s for s in report["summaries"]}
    nbytes = 1975856168
    assert data["load_time_nfs_s"] == pytest.approx(nbytes / by["baseline"]["gbps_median"] / 1e9)
    assert data["load_time_fxkit_s"] == pytest.approx(nbytes / by["fxkit"]["gbps_median"] / 1e9)
    assert data["speedup"] == by["fxkit"]["vs_baseline"]  # fxkit's own within-round ratio
    assert data["nbytes"] == 1975856168 and data["cold"] is True


def test_a_report_without_fxkit_runs_is_an_error() -> None:
    report = json.loads((ROOT / "docs/bench/local_cold.json").read_text())
    for s in report["summaries"]:
        if s["method"] == "fxkit":
            s.update(gbps_median=None, errors=["LoaderError: short read"])
    with pytest.raises(MeasureError, match=r"no fxkit runs \(LoaderError: short read\)"):
        parse_load_report(json.dumps(report), "/m")
    with pytest.raises(MeasureError, match="not its JSON report"):
        parse_load_report("Traceback ...", "/m")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    for s in range(2):
        save_file({f"w{s}": torch.arange(400_000 + s, dtype=torch.float32)},
                  root / f"model-{s + 1:05d}-of-00002.safetensors")  # fmt: skip
    return root


def test_load_bench_runs_fxkit_bench_load_on_the_host(model: Path) -> None:
    params = LoadBenchParams(model=str(model), runs=1, cold=False, fxkit=str(FXKIT))
    data = load_bench(node(), params)
    assert data["nbytes"] == sum(f.stat().st_size for f in model.glob("*.safetensors"))
    assert data["load_time_nfs_s"] > 0 and data["load_time_fxkit_s"] > 0
    assert data["speedup"] > 0 and data["rounds"] == 1 and data["cold"] is False


def test_load_bench_with_the_baseline_on_another_folder(model: Path, tmp_path: Path) -> None:
    nfs = tmp_path / "nfs-copy"
    nfs.mkdir()
    for f in model.glob("*.safetensors"):
        (nfs / f.name).write_bytes(f.read_bytes())
    params = LoadBenchParams(model=str(model), nfs_model=str(nfs), runs=1, cold=False,
                             fxkit=str(FXKIT))  # fmt: skip
    data = load_bench(node(), params)
    assert data["speedup"] == pytest.approx(data["load_time_nfs_s"] / data["load_time_fxkit_s"])


def test_load_bench_without_fxkit_or_a_model_says_so(model: Path) -> None:
    with pytest.raises(MeasureError, match="fxkit-nowhere not found on localhost"):
        load_bench(node(), LoadBenchParams(model=str(model), fxkit="fxkit-nowhere"))
    with pytest.raises(MeasureError, match="no model folder"):
        load_bench(node(), LoadBenchParams(model=""))
    with pytest.raises(MeasureError, match="exited"):
        load_bench(node(), LoadBenchParams(model="/nonexistent/m", fxkit=str(FXKIT)))


def test_vllm_bench_reads_a_result_file(tmp_path: Path) -> None:
    path = tmp_path / "g2.json"
    path.write_text(json.dumps(vllm_result(median_ttft_ms=900.0, output_throughput=1500.0)))
    data = vllm_bench(node(), VllmBenchParams(result=str(path)))
    assert data["ttft_median_ms"] == 900.0 and data["output_throughput"] == 1500.0
    with pytest.raises(MeasureError, match="no vLLM benchmark result"):
        vllm_bench(node(), VllmBenchParams(result=str(tmp_path / "none.json")))


def test_vllm_bench_appended_results_are_read_last_first(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"  # --append-result: one JSON object a line
    lines = [json.dumps(vllm_result(median_ttft_ms=v)) for v in (700.0, 650.0)]
    path.write_text("\n".join(lines))
    assert parse_vllm_result(path.read_text(), str(path))["ttft_median_ms"] == 650.0


def test_vllm_bench_runs_the_command_and_refuses_a_stale_file(tmp_path: Path) -> None:
    path = tmp_path / "g3.json"
    content = json.dumps(vllm_result(median_ttft_ms=600.0))
    writes = f"printf '%s' {shlex.quote(content)} > {shlex.quote(str(path))}"
    data = vllm_bench(node(), VllmBenchParams(result=str(path), run=writes))
    assert data["ttft_median_ms"] == 600.0
    old = tmp_path / "old.json"
    old.write_text(content)
    os.utime(old, (1_000_000_000, 1_000_000_000))
    with pytest.raises(MeasureError, match="did not write"):
        vllm_bench(node(), VllmBenchParams(result=str(old), run="true"))
    with pytest.raises(MeasureError, match="exited 3"):
        vllm_bench(node(), VllmBenchParams(result=str(old), run="echo no server >&2; exit 3"))


def test_a_run_with_no_completed_request_is_an_error() -> None:
    text = json.dumps(vllm_result(completed=0, failed=100))
    with pytest.raises(MeasureError, match=r"no request completed \(100 failed\)"):
        parse_vllm_result(text, "g2.json")


CHECK_IDS = {
    "g2": ["load_time_nfs", "load_time_fxkit", "load_speedup", "ttft_median", "ttft_p99",
           "output_throughput", "kv_read_bandwidth", "kv_read_x_fio"],
    "g3": ["ttft_reduction", "throughput_gain"],
    "g4": ["soak_workload_errors", "nvme_errors", "rdma_errors", "gpu_errors",
           "latency_degradation"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CHECK_IDS))
def test_the_gates_have_the_check_ids_the_estimator_reads(name: str) -> None:
    gate = spec.load(name)
    assert [c.id for c in gate.spec.checks] == CHECK_IDS[name]
    assert gate.spec.baseline == ("g2" if name == "g3" else None)


@pytest.mark.parametrize(
    ("name", "variable"), [("g2", "g2_model"), ("g3", "g3_vllm_result"), ("g4", "g4_workload")]
)
def test_a_gate_without_its_required_variable_stops_before_any_host(
    name: str, variable: str
) -> None:
    proc = subprocess.run(
        [str(FXKIT), "gate", name, "-i", "nohost.invalid,"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"undefined variable {variable!r}" in proc.stdout + proc.stderr
