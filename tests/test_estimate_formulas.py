"""The estimator's formulas on hand-computed cases: KV capacity, prefill FLOPs, reload against
recompute and their break-even, TTFT at a hit rate, load time for N instances, cost."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fxkit.estimate import cost, kv, load, offload, serving, weights
from fxkit.estimate.model import read_config

CONFIGS = Path(__file__).parent / "data" / "model_configs"
LLAMA = read_config(CONFIGS / "llama-3.1-70b-instruct.json")
QWEN = read_config(CONFIGS / "qwen3-coder-480b-a35b-instruct.json")
MISTRAL = read_config(CONFIGS / "mistral-7b-v0.1.json")
GiB = 2**30


def test_capacity_by_hand() -> None:
    layout = kv.KVLayout(LLAMA, tp=8, kv_bytes=2)
    w = weights.weight_bytes(LLAMA, weights.count(LLAMA))
    cap = kv.capacity(
        layout, w, gpu_memory=192 * GiB, utilization=0.9, reserve=4 * GiB,
        context_tokens=131072, concurrency=16, stored_contexts=64,
    )  # fmt: skip
    per_gpu = 192 * GiB * 0.9 - w / 8 - 4 * GiB
    request = 131072 * 327_680
    assert cap.kv_per_gpu == pytest.approx(per_gpu)
    assert cap.request == request
    assert cap.contexts_fit == math.floor(8 * per_gpu / request) == 30
    assert cap.overflow == 0 and cap.demand == 16 * request
    assert cap.external_needed == pytest.approx(64 * request - 8 * per_gpu)
    assert cap.gpu_resident == 30 / 64 and cap.needs_external


def test_weights_that_do_not_fit_leave_no_kv_memory() -> None:
    layout = kv.KVLayout(QWEN, tp=4, kv_bytes=2)  # 960 GB over 4 x 192 GiB
    w = weights.weight_bytes(QWEN, weights.count(QWEN))
    cap = kv.capacity(
        layout, w, gpu_memory=192 * GiB, utilization=0.9, reserve=0,
        context_tokens=1024, concurrency=1, stored_contexts=1,
    )  # fmt: skip
    assert cap.kv_per_gpu < 0 and cap.kv_total == 0 and cap.contexts_fit == 0


def test_sliding_pairs_match_a_brute_force_count() -> None:
    for end, window in [(10, 4), (4, 10), (4096, 4096), (5000, 4096), (1, None), (77, None)]:
        brute = sum(i + 1 if window is None else min(i + 1, window) for i in range(end))
        assert offload._pairs(end, window) == brute


def test_prefill_flops_by_hand() -> None:
    layout = kv.KVLayout(LLAMA, tp=8, kv_bytes=2)
    active = weights.count(LLAMA).active_per_token
    compute = offload.Compute(layout, active, flops_per_s=1e15)
    # linear layers 2 x active per token; attention 2 x (128 + 128) per head, query and key
    expected = 2 * active * 1000 + 80 * 64 * 2 * 256 * (1000 * 1001 // 2)
    assert compute.flops(0, 1000) == expected
    assert compute.seconds(0, 1000) == expected / 1e15
    # a suffix after a cached prefix costs the difference
    assert compute.flops(1000, 1500) == compute.flops(0, 1500) - compute.flops(0, 1000)


def test_sliding_layers_attend_to_their_window_only() -> None:
    compute = offload.Compute(kv.KVLayout(MISTRAL, 1, 2), 0, 1.0)
    per_pair = 2 * 32 * 256
    long = 8192
    assert compute.flops(0, long) == 32 * per_pair * offload._pairs(long, 4096)
    assert compute.flops(0, long) < 32 * per_pair * long * (long + 1) // 2


def test_reload_time_by_hand() -> None:
    layout = kv.KVLayout(QWEN, tp=8, kv_bytes=2)
    tier = offload.Tier(bandwidth=5e9, latency=1e-4, chunk_tokens=256, in_flight=4)
    tokens = 1000  # 4 chunks, the last one partial
    expected = 4 * 1e-4 / 4 + tokens * 62 * 2 * 8 * 128 * 2 / 5e9
    assert tier.reload_seconds(layout, tokens) == pytest.approx(expected, rel=1e-12)


def test_break_even_is_where_reloading_starts_to_win() -> None:
    layout = kv.KVLayout(QWEN, tp=8, kv_bytes=2)
    active = weights.count(QWEN).active_per_token
    compute = offload.Compute(layout, active, flops_per_s=8 * 174.364e12 * 0.5)
    slow = offload.Tier(bandwidth=0.98e9, latency=1e-4, chunk_tokens=256, in_flight=1)
    even = offload.break_even(compute, slow, 2**20)
    assert even is not None

    def wins(tokens: int) -> bool:
        return slow.reload_seconds(layout, tokens) < compute.seconds(0, tokens)

    assert wins(even) and not wins(even - 1)
    # without the chunk latency the break-even solves 2A/F + P L/F = b/B (A active params,
    # P = 62 x 96 x 2 x 256 FLOPs per query-key pair over 2 for causality, b bytes per token)
    a = 2 * active / compute.flops_per_s
    p = 62 * 96 * 2 * 256 / compute.flops_per_s
    b = layout.per_token / 0.98e9
    closed = (b - a) / (p / 2)
    assert even == pytest.approx(closed, rel=0.02)
    # at the field's 5 GB/s reloading wins at any length (per token it beats recomputing)
    fast = offload.Tier(bandwidth=5e9, latency=1e-4, chunk_tokens=256, in_flight=1)
    assert (offload.break_even(compute, fast, 2**20) or 10**9) < 256
    # a tier slower than any recompute up to the limit never wins
    assert offload.break_even(compute, offload.Tier(1e6, 1e-4, 256, 1), 4096) is None


def test_ttft_at_a_hit_rate_by_hand() -> None:
    t = offload.TTFT(recompute=50.0, reload=6.0, suffix=0.5, gpu_resident=0.25, hit_rate=0.9)
    assert t.without_offload == 0.25 * 0.5 + 0.75 * 50.0
    assert t.with_offload == pytest.approx(0.25 * 0.5 + 0.75 * (0.9 * 6.5 + 0.1 * 50.0))
    assert offload.burst(10.0, 16) == 85.0  # (1 + ... + 16) x 10 / 16


def test_load_time_shares_the_link() -> None:
    w = 141.1e9  # Llama-3.1-70B in BF16
    # R9: 1399 s from NFS; at the default 0.1 GB/s (derived from it) 1411 s
    assert load.load_seconds(w, 0.1e9, 1.25e9, 1, 0) == pytest.approx(1399, rel=0.01)
    assert load.load_seconds(w, 0.94e9, 12.5e9, 1, 0) == pytest.approx(150, rel=0.01)
    # 20 instances on one 100GbE port: 12.5 / 20 = 0.625 GB/s each, below 0.94
    assert load.load_seconds(w, 0.94e9, 12.5e9, 20, 30) == pytest.approx(30 + w / 0.625e9)


def test_cost_by_hand() -> None:
    c = cost.Cost(capacity=1.5e12, external_price=2014e-12, gpu_price=14000e-12)
    assert c.external == pytest.approx(1.5 * 2014)
    assert c.in_gpu_memory == pytest.approx(1.5 * 14000)
    assert c.ratio == pytest.approx(14000 / 2014)


def test_served_in_steps_by_hand() -> None:
    """Two requests of 1,000 tokens, a budget of 600 per step (fxkit/estimate/serving.py):
    step 1 prefills 0..600 of the first; step 2 its 600..1000 and 0..200 of the second (the
    spare tokens); step 3 one decode token of the first and 200..799 of the second; step 4 a
    decode and 799..1000. The first token of each comes at the end of steps 2 and 4."""
    compute = offload.Compute(kv.KVLayout(LLAMA, tp=8, kv_bytes=2), 1000, flops_per_s=1e12)
    f, decode = compute.flops, compute.flops(1000, 1001)
    served = serving.serve(compute, requests=2, cached=0, prompt=1000, budget=600)
    first = (f(0, 1000) + f(0, 200)) / 1e12
    second = first + (f(200, 1000) + 2 * decode) / 1e12
    assert served.ttft == pytest.approx((first, second))
    assert served.mean == pytest.approx((first + second) / 2)


def test_reloads_queue_at_the_tier_and_overlap_compute() -> None:
    """A slow tier: each request starts when its context is in, the GPU idle between, so the
    k-th first token is k x the reload plus its suffix (decodes of the earlier ones aside)."""
    compute = offload.Compute(kv.KVLayout(LLAMA, tp=8, kv_bytes=2), 1000, flops_per_s=1e15)
    ready = serving.reloads_ready(3, nbytes=1e9, chunks=4, bandwidth=1e8, latency=0.01,
                                  in_flight=2)  # fmt: skip
    assert ready == pytest.approx([10.02, 20.04, 30.06])
    served = serving.serve(compute, requests=3, cached=900, prompt=1000, budget=8192, ready=ready)
    suffix = compute.seconds(900, 1000)
    assert served.ttft[0] == pytest.approx(10.02 + suffix)
    assert served.ttft[2] == pytest.approx(30.06 + suffix, rel=1e-3)
    with pytest.raises(ValueError, match="at least 1"):
        serving.serve(compute, requests=1, cached=0, prompt=10, budget=0)
