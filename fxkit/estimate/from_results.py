"""``--from-results``: measured figures from ``fxkit bench load --json``, ``fxkit bench kv
--json`` or gate results JSON.

A load benchmark's ``summaries`` give the NFS baseline's and fxkit's median GB/s (decimal) as
``load.nfs_bandwidth`` and ``load.store_bandwidth``. A KV benchmark (``kind``
``fxkit-bench-kv``) gives LMCache's best cold read as ``store.read_bandwidth``, with the setting
that reached it: its ``disk_io_threads`` as ``store.reads_in_flight`` and its chunk's tokens as
``store.chunk_tokens``. A gate result (schema
``fxkit-gate-result/1``) gives the checks in :data:`GATE_CHECKS`, the median across hosts of
those with a number and a status other than ERROR or SKIP (for the checks in
:data:`GATE_MEASURED`, a figure of their measurement). Each file says which figures it gave and
which checks it skipped, and why.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxkit.estimate.errors import EstimateError
from fxkit.estimate.inputs import BY_KEY, Inputs, in_bounds
from fxkit.estimate.units import UnitError, parse
from fxkit.gate.verdicts import SCHEMA, CheckStatus
from fxkit.yamlfile import read_json, short

#: Gate check id -> the input it sets (its unit comes from the check's ``unit``).
GATE_CHECKS = {
    "storage_read_bandwidth": "store.read_bandwidth",  # g1: fio seq 1 MiB QD32 O_DIRECT read
    "storage_read_latency": "store.latency",  # g1: mean completion latency
    "storage_fleet_read_bandwidth": "load.store_shared_bandwidth",  # g1: all nodes at once
    "kv_read_bandwidth": "store.read_bandwidth",  # g2: LMCache's cold read (fxkit bench kv)
    "load_time_nfs": "measured.load_time_nfs",  # g2
    "load_time_fxkit": "measured.load_time_fxkit",
    "ttft_median": "measured.ttft",
    "output_throughput": "measured.output_throughput",
}

#: Gate check id -> (the figure of its measurement's data, its unit), where the check's value is
#: not the figure the input takes (g1's fleet read is judged in percent of the line rate).
GATE_MEASURED = {"storage_fleet_read_bandwidth": ("aggregate_gbps", "GB/s")}

#: ``fxkit bench kv --json``'s ``kind``.
KV_KIND = "fxkit-bench-kv"

#: Benchmark method -> the input its median bandwidth sets.
BENCH_METHODS = {"baseline": "load.nfs_bandwidth", "fxkit": "load.store_bandwidth"}


@dataclass
class Used:
    """What one results file gave: (input, value as written, check) and skipped checks."""

    path: Path
    kind: str  # "bench" or "gate g1"...
    figures: list[tuple[str, str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def apply(path: Path, inputs: Inputs) -> Used:
    """Set ``inputs`` from the results file at ``path``; what it used and skipped."""
    data = read_json(
        path, EstimateError, "results", "give the JSON of fxkit bench load --json or of a gate run"
    )
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        return _gate(path, data, inputs)
    if isinstance(data, dict) and data.get("kind") == KV_KIND:
        return _kv(path, data, inputs)
    if isinstance(data, dict) and isinstance(data.get("summaries"), list):
        return _bench(path, data, inputs)
    raise EstimateError(
        "not a results file fxkit knows",
        where=str(path),
        hint=f"give fxkit bench load --json or bench kv --json output, or a gate result ({SCHEMA})",
    )


def _bench(path: Path, data: dict[str, Any], inputs: Inputs) -> Used:
    used = Used(path, "bench load")
    for method, key in BENCH_METHODS.items():
        rows = [s for s in data["summaries"] if isinstance(s, dict) and s.get("method") == method]
        gbps = rows[0].get("gbps_median") if rows else None
        if not isinstance(gbps, int | float) or isinstance(gbps, bool) or gbps <= 0:
            used.skipped.append(f"{method}: no gbps_median")
            continue
        inputs.set(key, f"{gbps!r} GB/s", f"{path} ({method} gbps_median)")
        used.figures.append((key, f"{gbps:.4g} GB/s", f"{method} gbps_median"))
    return used


def _kv(path: Path, data: dict[str, Any], inputs: Inputs) -> Used:
    """LMCache's best setting: its GB/s, its threads, the chunk it read."""
    used = Used(path, "bench kv")
    summary = _mapping(data.get("summary"))
    dims = _mapping(data.get("chunk")).get("dims")
    figures = {  # input -> (the figure, its unit, what it is)
        "store.read_bandwidth": (summary.get("best_gbps"), " GB/s", "best_gbps"),
        "store.reads_in_flight": (
            _mapping(summary.get("role_vars")).get("vllm_lmcache_disk_io_threads"),
            "",
            "best disk_io_threads",
        ),
        "store.chunk_tokens": (dims[2] if isinstance(dims, list) and len(dims) > 2 else None,
                               "", "chunk tokens"),
    }  # fmt: skip
    if not _positive(summary.get("best_gbps")):
        used.skipped.append(f"no best_gbps ({short(summary.get('error'))})")
        return used
    where = f"{path} ({summary.get('best')})"
    for key, (figure, unit, what) in figures.items():
        if not _positive(figure):
            used.skipped.append(f"{what}: {short(figure)}")
            continue
        inputs.set(key, f"{figure!r}{unit}", where)
        used.figures.append((key, f"{figure:.4g}{unit}", what))
    return used


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _gate(path: Path, data: dict[str, Any], inputs: Inputs) -> Used:
    used = Used(path, f"gate {data.get('gate', '?')}")
    hosts = data.get("hosts")
    if not isinstance(hosts, dict):
        raise EstimateError("gate result has no hosts mapping", where=str(path))
    found: dict[str, list[tuple[float, float, str]]] = {}  # check -> (base value, value, unit)
    for host, body in hosts.items():
        checks = body.get("checks") if isinstance(body, dict) else None
        for check in checks if isinstance(checks, list) else []:
            check_id = check.get("id") if isinstance(check, dict) else None
            if not isinstance(check_id, str) or check_id not in GATE_CHECKS:
                continue
            key = GATE_CHECKS[check_id]
            value, status = check.get("value"), check.get("status")
            unit = str(check.get("unit") or "")
            if check_id in GATE_MEASURED and status not in (CheckStatus.ERROR, CheckStatus.SKIP):
                figure, unit = GATE_MEASURED[check_id]
                value = _measured(body, check).get(figure)
            if status in (CheckStatus.ERROR, CheckStatus.SKIP) or value is None:
                used.skipped.append(
                    f"{host} {check_id}: status {short(status)}, value {short(value)}"
                )
                continue
            try:
                base = _base(key, value, unit)
            except UnitError as exc:
                used.skipped.append(f"{host} {check_id}: {exc}")
                continue
            found.setdefault(check_id, []).append((base, value, unit))
    for check_id, values in found.items():
        key = GATE_CHECKS[check_id]
        inputs.values[key] = statistics.median(v[0] for v in values)
        inputs.origins[key] = f"{path} ({check_id}, median of {len(values)} hosts)"
        units_ = {v[2] for v in values}
        shown = statistics.median(v[1] for v in values) if len(units_) == 1 else None
        text = f"{shown:g} {units_.pop()}".strip() if shown is not None else "median"
        used.figures.append((key, text, f"{check_id}, {len(values)} hosts"))
    return used


def _measured(host: dict[str, Any], check: dict[str, Any]) -> dict[str, Any]:
    """The data of ``check``'s measurement on ``host`` (empty where the file has none)."""
    at, measurements = check.get("measurement"), host.get("measurements")
    if not isinstance(at, int) or not isinstance(measurements, list) or at >= len(measurements):
        return {}
    data = measurements[at].get("data") if isinstance(measurements[at], dict) else None
    return data if isinstance(data, dict) else {}


def _base(key: str, value: Any, unit: str) -> float:
    """A check's value in the base unit of ``key``'s kind (its unit as written in the check),
    within the input's plausible range."""
    spec = BY_KEY[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnitError(f"{short(value)} is not a number")
    raw = f"{value} {unit}" if unit and spec.kind != "number" else value
    return float(in_bounds(spec, raw, parse(raw, spec.kind)))
