"""The whole estimate from the inputs: model, KV, offload break-even, load time and cost, as
sections of rows (a key, a label, a value in a base unit) and a few verdicts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxkit.estimate import cost, kv, load, offload, serving, weights
from fxkit.estimate.errors import EstimateError
from fxkit.estimate.inputs import TIER_PRICES, Inputs
from fxkit.estimate.model import DTYPE_BYTES, ModelShape, read_config
from fxkit.estimate.units import parse_price


@dataclass(frozen=True)
class Row:
    """One figure: ``unit`` is B, B/s, s, FLOP, FLOP/s, tokens, a currency, x or '' (a count)."""

    key: str
    label: str
    value: float | int | str | bool | None
    unit: str = ""


@dataclass
class Estimate:
    """The estimate's sections (name -> rows) and verdicts."""

    sections: dict[str, list[Row]] = field(default_factory=dict)
    verdicts: dict[str, Any] = field(default_factory=dict)

    def value(self, section: str, key: str) -> Any:
        return next(r.value for r in self.sections[section] if r.key == key)


def shape_from(inputs: Inputs) -> ModelShape:
    config = inputs.optional("model.config")
    if not config:
        raise EstimateError(
            "no model config",
            hint="give --model CONFIG.json, or model: {config: PATH} in the inputs file",
        )
    return read_config(
        Path(config), inputs.optional("model.dtype"), inputs.optional("model.weight_dtype")
    )


def kv_bytes(inputs: Inputs, shape: ModelShape) -> float:
    name = inputs.optional("model.kv_cache_dtype") or "auto"
    if name == "auto":
        return shape.dtype_bytes
    if name not in DTYPE_BYTES:
        raise EstimateError(
            f"model.kv_cache_dtype {name!r} is not a dtype the calculator knows",
            where=inputs.origins.get("model.kv_cache_dtype"),
            hint="auto, bf16, fp16 or fp8",
        )
    return DTYPE_BYTES[name]


def prices(inputs: Inputs) -> tuple[float, float, str]:
    """(external tier, GPU memory) prices per byte and their currency; mixed currencies fail."""
    currency = inputs.optional("cost.currency") or "CNY"
    tier = inputs.optional("cost.tier") or "FX100"
    external = inputs.price("cost.external_price")
    if external is None:
        if tier not in TIER_PRICES:
            raise EstimateError(
                f"cost.tier {tier!r} has no reference price",
                where=inputs.origins.get("cost.tier"),
                hint=f"one of {', '.join(TIER_PRICES)}, or set cost.external_price",
            )
        external = parse_price(TIER_PRICES[tier])
    gpu = inputs.price("cost.gpu_memory_price")
    assert gpu is not None  # it has a default
    for key, (_, unit) in (("cost.external_price", external), ("cost.gpu_memory_price", gpu)):
        if unit not in (None, currency):
            raise EstimateError(
                f"{key} is in {unit}, cost.currency is {currency}",
                where=inputs.origins.get(key),
                hint="give every price in one currency",
            )
    return external[0], gpu[0], currency


def estimate(inputs: Inputs) -> Estimate:
    """Every section of the estimate for ``inputs``."""
    shape = shape_from(inputs)
    params = weights.count(shape)
    weight_bytes = weights.weight_bytes(shape, params)
    tp = inputs.whole("gpu.tensor_parallel")
    layout = kv.KVLayout(shape, tp, kv_bytes(inputs, shape))
    context = inputs.whole("workload.context_tokens")
    concurrency = inputs.whole("workload.concurrency")
    stored = inputs.optional("workload.stored_contexts")
    cap = kv.capacity(
        layout,
        weight_bytes,
        gpu_memory=inputs.number("gpu.memory"),
        utilization=inputs.number("gpu.memory_utilization"),
        reserve=inputs.number("gpu.reserve"),
        context_tokens=context,
        concurrency=concurrency,
        stored_contexts=int(stored) if stored is not None else concurrency,
    )
    flops_per_s = tp * inputs.number("gpu.flops") * inputs.number("gpu.efficiency")
    compute = offload.Compute(layout, params.active_per_token, flops_per_s)
    tier = offload.Tier(
        bandwidth=inputs.number("store.read_bandwidth"),
        latency=inputs.number("store.latency"),
        chunk_tokens=inputs.whole("store.chunk_tokens"),
        in_flight=inputs.whole("store.reads_in_flight"),
    )
    result = Estimate()
    result.sections["model"] = _model_rows(shape, params, weight_bytes)
    result.sections["kv"] = _kv_rows(layout, cap, context)
    result.sections["offload"] = _offload_rows(inputs, compute, tier, cap, context)
    result.sections["load"] = _load_rows(inputs, weight_bytes)
    result.sections["cost"] = _cost_rows(inputs, cap, weight_bytes)
    result.verdicts = {
        "weights_fit": cap.kv_per_gpu > 0,
        "needs_external_kv": cap.needs_external,
        "reload_wins": result.value("offload", "reload") < result.value("offload", "recompute"),
        "break_even_tokens": result.value("offload", "break_even_tokens"),
    }
    return result


def _model_rows(shape: ModelShape, params: weights.Params, weight_bytes: float) -> list[Row]:
    attention = f"MLA (latent {shape.mla.kv_lora_rank})" if shape.mla else "GQA"
    moe = shape.moe
    return [
        Row("name", "model", shape.name),
        Row("layers", "layers", shape.layers),
        Row("attention", "attention", attention),
        Row("heads", "attention heads / KV heads", f"{shape.heads} / {shape.kv_heads}"),
        Row("sliding_layers", "sliding-window layers", shape.sliding_layers),
        Row("experts", "experts (active per token)",
            f"{moe.experts} ({moe.experts_per_token})" if moe else "dense"),
        Row("params", "parameters", params.total),
        Row("active_params", "active per token (decoder layers)", params.active_per_token),
        Row("dtype", "dtype / quantization",
            f"{shape.dtype} / {shape.quantization.method if shape.quantization else 'none'}"),
        Row("weight_bytes", "weights", weight_bytes, "B"),
    ]  # fmt: skip


def _kv_rows(layout: kv.KVLayout, cap: kv.Capacity, context: int) -> list[Row]:
    return [
        Row("per_token", "KV per token (no sliding)", layout.per_token, "B"),
        Row("per_request", f"KV per request at {context:,} tokens", cap.request, "B"),
        Row("demand", f"KV for {cap.concurrency} concurrent requests", cap.demand, "B"),
        Row("weights_per_gpu", "weights per GPU", cap.weights_per_gpu, "B"),
        Row("kv_per_gpu", "KV memory per GPU", cap.kv_per_gpu, "B"),
        Row("kv_total", f"KV memory over TP{layout.tp}", cap.kv_total, "B"),
        Row("contexts_fit", "concurrent contexts that fit", cap.contexts_fit),
        Row("overflow", "concurrent KV beyond GPU memory", cap.overflow, "B"),
        Row("stored_contexts", "contexts kept for reuse", cap.stored_contexts),
        Row("external_needed", "external KV capacity needed", cap.external_needed, "B"),
    ]


def _served_rows(
    inputs: Inputs, compute: offload.Compute, tier: offload.Tier, n: int, context: int, new: int
) -> list[Row]:
    """``n`` requests at once as vLLM schedules them (fxkit/estimate/serving.py): every context
    recomputed, or every context reloaded from the tier while the GPU computes."""
    budget, prompt = inputs.whole("workload.step_tokens"), context + new
    # n reloads in flight: n x a lone reload's bandwidth, up to the shared figure
    shared = min(max(inputs.number("store.shared_bandwidth"), tier.bandwidth), n * tier.bandwidth)
    chunks = math.ceil(context / tier.chunk_tokens)
    ready = serving.reloads_ready(n, compute.layout.request(context), chunks, shared,
                                  tier.latency, tier.in_flight)  # fmt: skip
    without = serving.serve(compute, requests=n, cached=0, prompt=prompt, budget=budget)
    with_ = serving.serve(compute, requests=n, cached=context, prompt=prompt, budget=budget,
                          ready=ready)  # fmt: skip
    return [
        Row("served_without", f"mean TTFT, {n} at once as vLLM schedules them, recomputed",
            without.mean, "s"),
        Row("served_with", f"mean TTFT, {n} at once as vLLM schedules them, reloaded",
            with_.mean, "s"),
    ]  # fmt: skip


def _offload_rows(
    inputs: Inputs, compute: offload.Compute, tier: offload.Tier, cap: kv.Capacity, context: int
) -> list[Row]:
    new = inputs.whole("workload.new_tokens")
    times = offload.ttft(
        compute,
        tier,
        context=context,
        new=new,
        gpu_resident=cap.gpu_resident,
        hit_rate=inputs.number("workload.hit_rate"),
    )
    reload_s = tier.reload_seconds(compute.layout, context)
    recompute_s = compute.seconds(0, context)
    even = offload.break_even(compute, tier, inputs.whole("workload.max_tokens"))
    rows = [
        Row("effective_flops", "effective FLOP/s (TP group)", compute.flops_per_s, "FLOP/s"),
        Row("prefill_flops", f"prefill FLOPs at {context:,} tokens", compute.flops(0, context),
            "FLOP"),
        Row("recompute", f"recompute {context:,} tokens", recompute_s, "s"),
        Row("reload", f"reload {context:,} tokens", reload_s, "s"),
        Row("reload_speedup", "recompute / reload", recompute_s / reload_s, "x"),
        Row("break_even_tokens", "reload wins from (tokens)", even, "tokens"),
        Row("gpu_resident", "contexts still in GPU memory", cap.gpu_resident),
        Row("ttft_without", "TTFT without offload", times.without_offload, "s"),
        Row("ttft_with", "TTFT with offload", times.with_offload, "s"),
        Row("burst_without", f"mean TTFT, {cap.concurrency} at once, without",
            offload.burst(times.without_offload, cap.concurrency), "s"),
        Row("burst_with", f"mean TTFT, {cap.concurrency} at once, with",
            offload.burst(times.with_offload, cap.concurrency), "s"),
        *_served_rows(inputs, compute, tier, cap.concurrency, context, new),
    ]  # fmt: skip
    measured = inputs.optional("measured.ttft")
    if measured is not None:
        rows.append(Row("measured_ttft", "measured TTFT (gate)", measured, "s"))
    throughput = inputs.optional("measured.output_throughput")
    if throughput is not None:
        rows.append(Row("measured_throughput", "measured output tok/s (gate)", throughput))
    return rows


def _load_rows(inputs: Inputs, weight_bytes: float) -> list[Row]:
    n = inputs.whole("load.instances")
    overhead = inputs.number("load.overhead")
    nfs, store = (inputs.number(k) for k in ("load.nfs_bandwidth", "load.store_bandwidth"))
    nfs_shared = inputs.number("load.nfs_shared_bandwidth")
    store_shared = inputs.number("load.store_shared_bandwidth")
    one_nfs = load.load_seconds(weight_bytes, nfs, nfs_shared, 1, overhead)
    one_store = load.load_seconds(weight_bytes, store, store_shared, 1, overhead)
    rows = [
        Row("nfs", "one instance from NFS", one_nfs, "s"),
        Row("store", "one instance from the fast store", one_store, "s"),
        Row("speedup", "NFS / fast store", one_nfs / one_store, "x"),
        Row("instances", "instances loading at once", n),
        Row("ready_nfs", f"{n} ready from NFS",
            load.load_seconds(weight_bytes, nfs, nfs_shared, n, overhead), "s"),
        Row("ready_store", f"{n} ready from the fast store",
            load.load_seconds(weight_bytes, store, store_shared, n, overhead), "s"),
    ]  # fmt: skip
    for key, label in (("load_time_nfs", "measured NFS"), ("load_time_fxkit", "measured fxkit")):
        measured = inputs.optional(f"measured.{key}")
        if measured is not None:
            rows.append(Row(f"measured_{key}", f"{label} load (gate)", measured, "s"))
    return rows


def _cost_rows(inputs: Inputs, cap: kv.Capacity, weight_bytes: float) -> list[Row]:
    external, gpu, currency = prices(inputs)
    kv_cost = cost.Cost(cap.external_needed, external, gpu)
    store_cost = cost.Cost(weight_bytes, external, gpu)
    return [
        Row("external_price", "external tier per TB", external * 1e12, f"{currency}/TB"),
        Row("gpu_price", "GPU memory per TB", gpu * 1e12, f"{currency}/TB"),
        Row("ratio", "GPU memory / external tier", kv_cost.ratio, "x"),
        Row("kv_capacity", "external KV capacity needed", cap.external_needed, "B"),
        Row("kv_external", "that capacity on the external tier", kv_cost.external, currency),
        Row("kv_in_gpu", "the same in GPU memory", kv_cost.in_gpu_memory, currency),
        Row("model_store", "model weights on the fast store", store_cost.external, currency),
    ]
