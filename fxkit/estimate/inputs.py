"""The estimator's inputs: a YAML file with units, ``--set key=value`` items and measured figures.

Every input has a default and a source (docs/ESTIMATOR.md lists them, from :data:`FIELDS`).
Later layers win: defaults, then the inputs file, then ``--from-results``, then ``--set``; each
value remembers where it came from (``default``, ``FILE:LINE``, ``--set``, a results file). A
wrong key or value is an :class:`EstimateError` at file:line naming the key and what it expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxkit.estimate import units
from fxkit.estimate.errors import EstimateError
from fxkit.yamlfile import Marked, read_yaml, short, type_name


@dataclass(frozen=True)
class Field:
    """One input: its dotted key, its kind (a :mod:`units` kind, ``price``, ``text`` or
    ``path``), its default as written in a file (None: none), the plausible range of a quantity
    written like a value (prices: per decimal TB), and where the default comes from."""

    key: str
    kind: str
    default: str | None
    bounds: tuple[str, str] | None
    source: str


FIELDS = [
    Field("model.config", "path", None, None,
          "a Hugging Face config.json; relative to the inputs file"),
    Field("model.dtype", "text", None, None, "overrides the config's torch_dtype"),
    Field("model.weight_dtype", "text", None, None,
          "overrides the decoder layers' linear weights' dtype and declared quantization"),
    Field("model.kv_cache_dtype", "text", "auto", None,
          "vLLM's --kv-cache-dtype: auto is the model's dtype; fp8 halves bf16's cache"),
    Field("gpu.memory", "bytes", "192 GiB", ("1 GiB", "1 PiB"),
          "MI308X: 192 GB HBM3 per GPU (FACTS.md; 8 stacks of 24 GiB, vLLM logs ~191.98 GiB)"),
    Field("gpu.tensor_parallel", "count", "8", ("1", "1024"),
          "TP8 on 8 x MI308X, the field's layout (MISSION.md)"),
    Field("gpu.memory_utilization", "fraction", "0.9", ("1%", "100%"),
          "vLLM's --gpu-memory-utilization default"),
    Field("gpu.reserve", "bytes", "0 GiB", ("0 GiB", "1 PiB"),
          "activations and graphs per GPU, outside the KV cache: vLLM measures it at start-up"),
    Field("gpu.flops", "flops", "174.364 TFLOP/s", ("1 GFLOP/s", "1000 PFLOP/s"),
          "MI308X BF16 GEMM: ROCm Validation Suite GST target gst-174Tflops-4K4K8K-rand-bf16 "
          "(reference/rvs/MI308X_gst_single.conf); a sustained GEMM figure, below the peak"),
    Field("gpu.efficiency", "fraction", "0.5", ("1%", "100%"),
          "assumption: the share of gpu.flops a whole prefill (attention, MoE routing) reaches"),
    Field("workload.context_tokens", "tokens", "131072", ("1", "1Gi"),
          "assumption: a long context (128Ki tokens) reused across turns"),
    Field("workload.new_tokens", "tokens", "1024", ("0", "1Gi"),
          "assumption: new prompt tokens after it"),
    Field("workload.concurrency", "count", "16", ("1", "1000000"),
          "the field's concurrency 16 (report R2)"),
    Field("workload.stored_contexts", "count", None, ("0", "1000000000"),
          "contexts kept for reuse (the working set); default: the concurrency"),
    Field("workload.hit_rate", "fraction", "0.9", ("0%", "100%"),
          "assumption: share of returning contexts the external tier still holds"),
    Field("workload.max_tokens", "tokens", "1Mi", ("1", "1Gi"),
          "the longest context the break-even search tries"),
    Field("workload.step_tokens", "tokens", "8192", ("1", "1Gi"),
          "assumption: vLLM's --max-num-batched-tokens, the token budget of a step (chunked "
          "prefill); set the server's"),
    Field("store.read_bandwidth", "bandwidth", "5.23 GB/s", ("1 MB/s", "1 PB/s"),
          "LMCache cold read with the parallel-read patch (report R1; FACTS.md)"),
    Field("store.latency", "time", "0.1 ms", ("0 s", "1 min"),
          "per chunk read: the top of NVMe's 10-100 us (MISSION.md); NVMe-oF adds a little"),
    Field("store.chunk_tokens", "tokens", "256", ("1", "1Mi"),
          "LMCache's chunk_size default (FACTS.md)"),
    Field("store.shared_bandwidth", "bandwidth", "12.5 GB/s", ("1 MB/s", "1 PB/s"),
          "assumption: concurrent requests' reloads, in flight together, reach one 100GbE "
          "port's line rate (MISSION.md's test platform); a lone reload reads at read_bandwidth"),
    Field("store.reads_in_flight", "count", "1", ("1", "65536"),
          "assumption: chunk reads one after another"),
    Field("load.nfs_bandwidth", "bandwidth", "0.1 GB/s", ("1 MB/s", "1 PB/s"),
          "from report R9: a 70B model's 141 GB of BF16 weights in 1399 s over NFS"),
    Field("load.store_bandwidth", "bandwidth", "0.94 GB/s", ("1 MB/s", "1 PB/s"),
          "from report R9: the same 141 GB in 150 s from the fast store"),
    Field("load.instances", "count", "1", ("1", "1000000"),
          "instances that load at the same time"),
    Field("load.nfs_shared_bandwidth", "bandwidth", "1.25 GB/s", ("1 MB/s", "1 PB/s"),
          "assumption: the NFS server's link (10 GbE) shared by all instances"),
    Field("load.store_shared_bandwidth", "bandwidth", "12.5 GB/s", ("1 MB/s", "1 PB/s"),
          "one 100GbE port (MISSION.md) at line rate, shared by all instances"),
    Field("load.overhead", "time", "0 s", ("0 s", "24 h"),
          "start-up beside reading weights (graphs, warm-up)"),
    Field("cost.currency", "text", "CNY", None, "the vendor's reference prices are in CNY"),
    Field("cost.tier", "text", "FX100", None, "the external tier: FX100, FX200 or FX300"),
    Field("cost.external_price", "price", None, ("0", "1e9"),
          "default: the tier's reference price"),
    Field("cost.gpu_memory_price", "price", "14000 CNY/TB", ("0", "1e9"),
          "HBM3e reference price (MISSION.md)"),
    Field("measured.load_time_nfs", "time", None, ("0 s", "1000 h"),
          "G2 load_time_nfs, shown beside the estimate"),
    Field("measured.load_time_fxkit", "time", None, ("0 s", "1000 h"), "G2 load_time_fxkit"),
    Field("measured.ttft", "time", None, ("0 s", "1 h"), "G2 ttft_median"),
    Field("measured.output_throughput", "number", None, ("0", "1e9"),
          "G2 output_throughput (tok/s)"),
]  # fmt: skip

#: The vendor's reference prices of the external tiers (MISSION.md), CNY per decimal TB.
TIER_PRICES = {"FX100": "2014 CNY/TB", "FX200": "1797 CNY/TB", "FX300": "5014 CNY/TB"}

BY_KEY = {f.key: f for f in FIELDS}
SECTIONS = sorted({f.key.split(".")[0] for f in FIELDS})
HINT = "see docs/ESTIMATOR.md for every input, its unit and default"


@dataclass
class Inputs:
    """Input values in base units (bytes, B/s, s, FLOP/s, money per byte) and their origins."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)

    def number(self, key: str) -> float:
        value = self.values.get(key)
        if not isinstance(value, float):
            raise EstimateError(f"input {key} is not set", hint=HINT)
        return value

    def whole(self, key: str) -> int:
        return int(self.number(key))

    def optional(self, key: str) -> Any:
        return self.values.get(key)

    def price(self, key: str) -> tuple[float, str | None] | None:
        """A price input as (money per byte, its currency or None)."""
        value = self.values.get(key)
        return value if isinstance(value, tuple) else None

    def set(self, key: str, raw: Any, origin: str) -> None:
        """Parse ``raw`` as the kind of ``key``; ``origin`` names it in errors and the output."""
        spec = BY_KEY.get(key)
        if spec is None:
            section = key.partition(".")[0]
            known = [k for k in BY_KEY if k.startswith(f"{section}.")] or SECTIONS
            raise EstimateError(
                f"unknown input {key!r}", where=origin, hint=f"known: {', '.join(known)}"
            )
        self.values[key] = parse_value(spec, raw, origin)
        self.origins[key] = origin


def parse_value(spec: Field, raw: Any, where: str) -> Any:
    """``raw`` as ``spec`` asks: a quantity in base units within its range, a text or a path."""
    if raw is None:
        return None
    if spec.kind in ("text", "path"):
        if not isinstance(raw, str) or not raw:
            raise EstimateError(
                f"{spec.key} must be a text, not {type_name(raw)}", where=where, hint=HINT
            )
        return raw
    try:
        return in_bounds(spec, raw, _parse(spec.kind, raw))
    except units.UnitError as exc:
        raise EstimateError(f"{spec.key}: {exc}", where=where, hint=HINT) from None


def in_bounds(spec: Field, raw: Any, value: Any) -> Any:
    """``value`` (``raw`` parsed) when it lies in ``spec``'s plausible range, else a
    :class:`~fxkit.estimate.units.UnitError` naming both."""
    assert spec.bounds is not None  # every quantity has one (tests/test_estimate_hostile.py)
    low, high = (_number(_parse(spec.kind, bound)) for bound in spec.bounds)
    if not low <= _number(value) <= high:
        raise units.UnitError(
            f"{short(raw)} is outside its plausible range {spec.bounds[0]} to {spec.bounds[1]}"
        )
    return value


def _parse(kind: str, raw: Any) -> Any:
    return units.parse_price(raw) if kind == "price" else units.parse(raw, kind)


def _number(value: Any) -> float:
    """A quantity's number: a price's money per byte."""
    return float(value[0] if isinstance(value, tuple) else value)


def defaults() -> Inputs:
    """Every input at its default."""
    inputs = Inputs()
    for spec in FIELDS:
        if spec.default is not None:
            inputs.set(spec.key, spec.default, "default")
    return inputs


def read_file(path: Path, inputs: Inputs) -> None:
    """Set ``inputs`` from the YAML file at ``path`` (sections of keys, values with units)."""
    data = read_yaml(path, EstimateError, what="estimate inputs", hint=HINT)
    if data is None:
        return
    if not isinstance(data, Marked):
        raise EstimateError("estimate inputs must be a mapping of sections", where=str(path))
    for section, body in data.items():
        line = data.line_of(section)
        if section not in SECTIONS:
            raise EstimateError(
                f"unknown section {section!r}",
                where=f"{path}:{line}",
                hint=f"sections: {', '.join(SECTIONS)}",
            )
        if section == "model" and isinstance(body, str):
            body = {"config": body}
        if not isinstance(body, dict):
            raise EstimateError(
                f"section {section} must be a mapping, not {type_name(body)}",
                where=f"{path}:{line}",
                hint=HINT,
            )
        for key, raw in body.items():
            key_line = body.line_of(key) if isinstance(body, Marked) else line
            dotted = f"{section}.{key}"
            inputs.set(dotted, raw, f"{path}:{key_line}")
            if BY_KEY[dotted].kind == "path" and raw is not None:
                inputs.values[dotted] = str((path.parent / raw).resolve())


def apply_sets(items: tuple[str, ...], inputs: Inputs) -> None:
    """``--set gpu.tensor_parallel=4`` items."""
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise EstimateError(
                f"--set {item!r} is not KEY=VALUE", hint="e.g. --set store.read_bandwidth='5 GB/s'"
            )
        inputs.set(key.strip(), raw.strip(), f"--set {key.strip()}")
