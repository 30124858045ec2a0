"""``fxkit estimate`` end to end: the seed example's verdicts and orders of magnitude against the
field's figures (MISSION.md), the worked example of docs/ESTIMATOR.md checked row by row,
``--from-results`` with a real ``fxkit bench load`` JSON and gate fixtures, and clear errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fxkit.cli import cli
from fxkit.estimate import collect
from fxkit.estimate.errors import EstimateError
from fxkit.estimate.inputs import FIELDS
from fxkit.estimate.render import text
from fxkit.estimate.summary import estimate
from fxkit.kvbench import missing

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "estimate" / "qwen3-coder-480b-tp8.yml"
DOC = ROOT / "docs" / "ESTIMATOR.md"
DATA = ROOT / "tests" / "data" / "estimate"
# A real `fxkit bench load --json` run (docs/BENCHMARKS.md).
BENCH = ROOT / "docs" / "bench" / "local_cold.json"


def run_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["estimate", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def value(out: dict, section: str, key: str) -> float:
    return out["sections"][section][key]["value"]


def test_seed_needs_external_kv_and_reload_wins_at_5_gbps() -> None:
    out = run_json(str(EXAMPLE))
    assert out["verdicts"]["needs_external_kv"] is True
    assert out["verdicts"]["reload_wins"] is True
    assert out["verdicts"]["weights_fit"] is True
    # 16 concurrent 128Ki contexts do not all fit beside 960 GB of weights on 8 x 192 GiB
    assert value(out, "kv", "contexts_fit") < 16 < value(out, "kv", "stored_contexts") + 1
    assert value(out, "model", "weight_bytes") == pytest.approx(960e9, rel=0.01)
    # R2: cold restore TTFT p50 7.53-26.35 s with the store; 149.5 s recomputing at conc. 16
    reload = value(out, "offload", "reload")
    assert 1 < reload < 30 and 1 < value(out, "offload", "ttft_with") < 30
    assert 10 < value(out, "offload", "recompute") < value(out, "offload", "burst_without")
    assert 100 < value(out, "offload", "burst_without") < 1000
    assert value(out, "offload", "reload_speedup") > 1
    # R9's 70B took 1399 s over NFS and 150 s from the store: a 480B takes about 7 times that
    assert value(out, "load", "nfs") == pytest.approx(7 * 1399, rel=0.05)


def test_seed_at_the_unpatched_098_gbps_moves_the_break_even() -> None:
    out = run_json(str(EXAMPLE), "--set", "store.read_bandwidth=0.98 GB/s")
    even = out["verdicts"]["break_even_tokens"]
    assert 50_000 < even < 100_000  # recompute wins below, reload above
    assert out["inputs"]["store.read_bandwidth"] == {
        "value": 0.98e9,
        "from": "--set store.read_bandwidth",
    }


def test_docs_worked_example_matches_the_code() -> None:
    doc = DOC.read_text()
    block = doc.split("<!-- example:start -->")[1].split("<!-- example:end -->")[0]
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", block, re.MULTILINE)
    assert rows[0] == ("figure", "value") and rows[1] == ("weights", "960 GB")
    rows = rows[1:]
    assert len(rows) > 20
    values, _ = collect(EXAMPLE)
    result = estimate(values)
    shown = {r.label: text(r) for rows_ in result.sections.values() for r in rows_}
    for label, expected in rows:
        assert shown[label] == expected, label
    assert "74,681 tokens" in doc
    slow, _ = collect(EXAMPLE, sets=("store.read_bandwidth=0.98 GB/s",))
    assert estimate(slow).verdicts["break_even_tokens"] == 74_681


def test_docs_list_every_input_with_its_default() -> None:
    doc = DOC.read_text()
    for spec in FIELDS:
        default = spec.default if spec.default is not None else "-"
        assert f"| `{spec.key}` | {spec.kind} | {default} |" in doc, spec.key


def test_table_output_names_the_verdicts() -> None:
    result = CliRunner().invoke(cli, ["estimate", str(EXAMPLE)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for title in ("Model", "KV cache", "Offload break-even", "Load time", "Cost"):
        assert title in result.output
    assert "needs external KV capacity: yes" in result.output
    assert "reload wins" in result.output


def test_bench_load_results_set_the_load_bandwidths() -> None:
    summaries = {s["method"]: s for s in json.loads(BENCH.read_text())["summaries"]}
    out = run_json(str(EXAMPLE), "--from-results", str(BENCH))
    nfs, store = out["inputs"]["load.nfs_bandwidth"], out["inputs"]["load.store_bandwidth"]
    assert nfs["value"] == pytest.approx(summaries["baseline"]["gbps_median"] * 1e9)
    assert store["value"] == pytest.approx(summaries["fxkit"]["gbps_median"] * 1e9)
    assert "baseline gbps_median" in nfs["from"]
    weights = value(out, "model", "weight_bytes")
    assert value(out, "load", "nfs") == pytest.approx(weights / nfs["value"])


def test_gate_results_take_the_median_and_skip_errors() -> None:
    # fixtures that follow the fxkit-gate-result/1 contract of issue 12 (not real gate runs)
    out = run_json(
        str(EXAMPLE),
        "--from-results", str(DATA / "gate_g1_fixture.json"),
        "--from-results", str(DATA / "gate_g2_fixture.json"),
    )  # fmt: skip
    inputs = out["inputs"]
    assert inputs["store.read_bandwidth"]["value"] == pytest.approx(5.5e9)  # 6.1, 5.5, 4.9
    assert "median of 3 hosts" in inputs["store.read_bandwidth"]["from"]
    assert inputs["store.latency"]["value"] == pytest.approx(0.21e-3)  # null and SKIP skipped
    # the fleet read's aggregate GB/s from its measurement, not its value (percent of line rate)
    assert inputs["load.store_shared_bandwidth"]["value"] == pytest.approx(12.05e9)
    g1 = out["results"][0]
    assert len(g1["skipped"]) == 3 and any("ERROR" in s for s in g1["skipped"])
    assert value(out, "offload", "measured_ttft") == pytest.approx(11.85)
    assert value(out, "load", "measured_load_time_nfs") == 1399
    assert value(out, "offload", "measured_throughput") == 74.9


def test_inputs_remember_their_file_and_line() -> None:
    out = run_json(str(EXAMPLE))
    lines = EXAMPLE.read_text().splitlines()
    origin = out["inputs"]["workload.concurrency"]["from"]
    path, line = origin.rsplit(":", 1)
    assert Path(path) == EXAMPLE and lines[int(line) - 1].strip() == "concurrency: 16"
    assert out["inputs"]["gpu.flops"]["from"] == "default"


@pytest.mark.parametrize(
    ("yaml_text", "says"),
    [
        ("gpu:\n  memroy: 192 GiB\n", "2: unknown input 'gpu.memroy'"),
        ("gpu:\n  memory: 192 GiBs\n", "2: gpu.memory: 'GiBs' is not a size unit"),
        ("store:\n  read_bandwidth: 5 GB\n", "2: store.read_bandwidth: 'GB' is not a bandwidth"),
        ("gpus:\n  memory: 1 GB\n", "1: unknown section 'gpus'"),
        ("workload: 16\n", "1: section workload must be a mapping"),
        ("cost:\n  external_price: 300 USD/TB\n", "cost.external_price is in USD"),
        ("gpu:\n  memory: [1\n", "invalid YAML"),
    ],
)
def test_bad_inputs_are_errors_at_file_line(yaml_text: str, says: str, tmp_path: Path) -> None:
    path = tmp_path / "inputs.yml"
    path.write_text(yaml_text)
    with pytest.raises(EstimateError) as caught:
        values, _ = collect(path, model=ROOT / "tests/data/model_configs/mistral-7b-v0.1.json")
        estimate(values)
    assert says in str(caught.value)
    assert str(path) in str(caught.value) or "cost." in says


def test_cli_errors_print_one_message_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "inputs.yml"
    path.write_text("model:\n  config: nosuch.json\n")
    done = subprocess.run(
        [sys.executable, "-m", "fxkit", "estimate", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "cannot read model config" in done.stderr and "Traceback" not in done.stderr
    unknown = tmp_path / "other.json"
    unknown.write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "fxkit", "estimate", str(EXAMPLE), "--from-results", str(unknown)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "not a results file fxkit knows" in done.stderr


def test_no_model_is_a_clear_error() -> None:
    values, _ = collect(None)
    with pytest.raises(EstimateError, match="no model config"):
        estimate(values)


def test_an_empty_model_config_is_no_model_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "inputs.yml"
    path.write_text("model:\n  config:\n")
    values, _ = collect(path)
    with pytest.raises(EstimateError, match="no model config"):
        estimate(values)


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("workload.context_tokens=0", "'0' is outside its plausible range 1 to 1Gi"),
        ("store.read_bandwidth=0 GB/s", "'0 GB/s' is outside its plausible range 1 MB/s to"),
        ("gpu.efficiency=150%", "'150%' is outside its plausible range 1% to 100%"),
        ("model.kv_cache_dtype=fp5", "model.kv_cache_dtype 'fp5'"),
        ("cost.tier=FX999", "cost.tier 'FX999' has no reference price"),
        ("nosuch=1", "unknown input 'nosuch'"),
        ("gpu.memory", "is not KEY=VALUE"),
    ],
)
def test_set_items_are_checked(item: str, says: str) -> None:
    with pytest.raises(EstimateError) as caught:
        values, _ = collect(EXAMPLE, sets=(item,))
        estimate(values)
    assert says in str(caught.value)


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_bench_kv_results_set_the_store_read(tmp_path: Path) -> None:
    """A real ``fxkit bench kv --json`` run (LMCache 0.5.6's backend, a small sweep here): its
    best GB/s, the threads and the chunk that reached it become the KV store's inputs."""
    report = tmp_path / "kv.json"
    model = ROOT / "tests" / "data" / "model_configs" / "mistral-7b-v0.1.json"
    args = ["bench", "kv", str(tmp_path), "--model", str(model), "--size", "16 MiB",
            "--chunk-size", "64", "--threads", "1,2", "--odirect", "off", "--rounds", "1",
            "--json", str(report)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(report.read_text())["summary"]
    out = run_json(str(EXAMPLE), "--from-results", str(report))
    inputs = out["inputs"]
    assert inputs["store.read_bandwidth"]["value"] == pytest.approx(summary["best_gbps"] * 1e9)
    threads = summary["role_vars"]["vllm_lmcache_disk_io_threads"]
    assert inputs["store.reads_in_flight"]["value"] == threads
    assert inputs["store.chunk_tokens"]["value"] == 64
    assert summary["best"] in inputs["store.read_bandwidth"]["from"]
    assert out["results"][0]["kind"] == "bench kv" and not out["results"][0]["skipped"]


def test_a_bench_kv_report_without_a_best_read_is_skipped(tmp_path: Path) -> None:
    failed = tmp_path / "kv.json"
    failed.write_text(json.dumps({"kind": "fxkit-bench-kv", "summary": {
        "error": "no LMCache run succeeded"}, "chunk": {"dims": [2, 62, 256, 128]}}))  # fmt: skip
    out = run_json(str(EXAMPLE), "--from-results", str(failed))
    assert out["inputs"]["store.read_bandwidth"]["value"] == pytest.approx(5e9)  # the example's
    assert out["results"][0]["skipped"] == ["no best_gbps ('no LMCache run succeeded')"]
