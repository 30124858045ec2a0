"""``vllm_bench`` and ``load_bench``: serving numbers for G2 and G3.

    measure: {vllm_bench: {result: /srv/g2/bench.json}}                # a result file on the host
    measure: {vllm_bench: {result: /srv/g2/bench.json, run: "vllm bench serve ... --save-result
              --result-dir /srv/g2 --result-filename bench.json"}}      # run it, then read it
    measure: {load_bench: {model: /mnt/models/Llama-3.1-70B}}

``vllm_bench`` reads the JSON that vLLM's ``vllm bench serve --save-result`` writes (the keys of
``vllm/benchmarks/serve.py``: ``median_ttft_ms``, ``p99_ttft_ms``, ``output_throughput``...;
tests/test_gate_serving_fidelity.py checks them against vLLM's source) and gives them fxkit's
names (``ttft_median_ms``...). ``load_bench`` runs ``fxkit bench load MODEL --methods
baseline,fxkit`` on the host: the NFS baseline (safetensors' ``load_file``) and fxkit's loader
over the same files, interleaved and cold, and gives their load times and fxkit's speedup.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind

#: fxkit's name -> the key ``vllm bench serve`` writes (vllm/benchmarks/serve.py, 0.20.1+).
VLLM_KEYS = {
    "ttft_median_ms": "median_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "ttft_mean_ms": "mean_ttft_ms",
    "tpot_median_ms": "median_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "tpot_mean_ms": "mean_tpot_ms",
    "output_throughput": "output_throughput",
    "request_throughput": "request_throughput",
    "completed": "completed",
    "failed": "failed",
}
#: Keys without which a result is not one to judge TTFT and throughput by.
VLLM_REQUIRED = ("completed", "output_throughput", "median_ttft_ms")
#: What else of the result is kept (which run it was).
VLLM_ABOUT = ("date", "backend", "model_id", "num_prompts", "request_rate", "max_concurrency")


class VllmBenchParams(Params):
    #: The result file on the host (what --result-dir/--result-filename name).
    result: str
    #: A command that writes it (``vllm bench serve ... --save-result``); none: read it as is.
    run: str | None = None


@kind("vllm_bench", VllmBenchParams)
def vllm_bench(node: MeasuredHost, p: VllmBenchParams) -> dict[str, Any]:
    """vLLM's ``vllm bench serve`` result: TTFT, TPOT (ms) and throughput (tok/s, req/s)."""
    path = shlex.quote(p.result)
    if p.run:
        started = int(node.output("date +%s").strip())
        node.output(p.run)
        mtime = node.run(f"stat -c %Y {path}")
        if not mtime.ok or int(mtime.stdout.strip() or 0) < started:
            raise MeasureError(
                f"the benchmark command did not write {p.result} (give it --save-result "
                f"--result-dir and --result-filename naming that file)"
            )
    found = node.run(f"cat {path}")
    if not found.ok:
        why = found.stderr.strip()[-200:]
        raise MeasureError(f"no vLLM benchmark result {p.result} on {node.host}: {why}")
    return parse_vllm_result(found.stdout, p.result)


def parse_vllm_result(text: str, where: str) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` file as fxkit's values (the last result of a file
    written with --append-result, one JSON object a line)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            data = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError as exc:
            raise MeasureError(f"{where} is not a vLLM result (not JSON: {exc.msg})") from None
    if not isinstance(data, dict):
        raise MeasureError(f"{where} is not a vLLM result (no JSON object)")
    missing = [key for key in VLLM_REQUIRED if key not in data]
    if missing:
        raise MeasureError(
            f"{where} has no {', '.join(missing)}: not a `vllm bench serve --save-result` file "
            "of a generation benchmark (TTFT needs --percentile-metrics with ttft)"
        )
    if not data["completed"]:
        raise MeasureError(f"{where}: no request completed ({data.get('failed', '?')} failed)")
    values = {ours: data[theirs] for ours, theirs in VLLM_KEYS.items() if theirs in data}
    return {**values, **{key: data[key] for key in VLLM_ABOUT if key in data}}


class LoadBenchParams(Params):
    #: The model's folder on the host, on the fast store (safetensors files).
    model: str
    #: The same model on NFS, for the baseline; none: the baseline reads ``model`` too.
    nfs_model: str | None = None
    #: Interleaved rounds (``--runs``).
    runs: int = 3
    #: Evict the files from the page cache before every run (root: the gate's become).
    cold: bool = True
    #: How fxkit is started on the host.
    fxkit: str = "fxkit"


@kind("load_bench", LoadBenchParams)
def load_bench(node: MeasuredHost, p: LoadBenchParams) -> dict[str, Any]:
    """Model load time, NFS baseline vs fxkit's loader (``fxkit bench load``), and the speedup."""
    if not p.model:
        raise MeasureError("no model folder to load (the gate's model variable is empty)")
    node.require(shlex.split(p.fxkit)[0])
    if not p.nfs_model:
        return parse_load_report(_bench(node, p, p.model, "baseline,fxkit"), p.model)
    nfs = parse_load_report(_bench(node, p, p.nfs_model, "baseline"), p.nfs_model, ("baseline",))
    fast = parse_load_report(_bench(node, p, p.model, "fxkit"), p.model, ("fxkit",))
    nfs_s, fxkit_s = nfs["load_time_nfs_s"], fast["load_time_fxkit_s"]
    return {**nfs, **fast, "speedup": nfs_s / fxkit_s, "nbytes": fast["nbytes"]}


def _bench(node: MeasuredHost, p: LoadBenchParams, model: str, methods: str) -> str:
    """``fxkit bench load``'s JSON report (written to a temporary file on the host, removed)."""
    argv = [*shlex.split(p.fxkit), "bench", "load", model, "--methods", methods]
    argv += ["--runs", str(p.runs), "--cold" if p.cold else "--hot"]
    command = " ".join(shlex.quote(a) for a in argv)
    script = (
        f'f=$(mktemp) && {command} --json "$f" >/dev/null; rc=$?; '
        '[ $rc -eq 0 ] && cat "$f"; rm -f "$f"; exit $rc'
    )
    return node.output(script)


def parse_load_report(
    text: str, model: str, methods: tuple[str, ...] = ("baseline", "fxkit")
) -> dict[str, Any]:
    """``fxkit bench load --json``'s report: load times (s) of its ``methods`` and, with both,
    fxkit's speedup (its own ratio: the median of the within-round ratios)."""
    try:
        report = json.loads(text)
        nbytes = int(report["nbytes"])
        summaries = {s["method"]: s for s in report["summaries"]}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise MeasureError(f"fxkit bench load {model}: not its JSON report ({exc})") from None
    names = {"baseline": "nfs", "fxkit": "fxkit"}
    out: dict[str, Any] = {
        "nbytes": nbytes,
        "rounds": report.get("rounds"),
        "cold": report.get("cold"),
    }
    for method in methods:
        summary = summaries.get(method) or {}
        if summary.get("skipped") or not summary.get("gbps_median"):
            why = summary.get("skipped") or "; ".join(summary.get("errors") or []) or "missing"
            raise MeasureError(f"fxkit bench load {model}: no {method} runs ({why})")
        if summary.get("checksum_ok") is False:
            raise MeasureError(f"fxkit bench load {model}: {method} loaded wrong bytes")
        out[f"load_time_{names[method]}_s"] = nbytes / (summary["gbps_median"] * 1e9)
        out[f"gbps_{names[method]}"] = summary["gbps_median"]
    if len(methods) == 2:
        ratio = summaries["fxkit"].get("vs_baseline")
        out["speedup"] = ratio or out["load_time_nfs_s"] / out["load_time_fxkit_s"]
    return out
