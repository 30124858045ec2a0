"""KV offload break-even: reloading a context's cache from the external tier against
recomputing it (prefill), the context length above which reloading wins, and the expected TTFT
with and without offload at a hit rate.

Recompute: the prefill FLOPs over the effective FLOP/s of the tensor-parallel group. Per token
``2 x active parameters`` (the top-k experts of MoE layers), plus attention: each query and each
key it sees costs ``2 x (qk_head_dim + v_head_dim)`` per head (QK^T and AV), causal, sliding
layers seeing at most their window. Reload: a latency per chunk (chunks read ``in_flight`` at a
time) plus the cache's bytes over the tier's bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxkit.estimate.kv import KVLayout


def _pairs(end: int, window: int | None) -> int:
    """Query-key pairs of positions 0..end-1, causal, each key within ``window`` of its query."""
    if window is None or end <= window:
        return end * (end + 1) // 2
    return window * (window + 1) // 2 + (end - window) * window


@dataclass(frozen=True)
class Compute:
    """Prefill FLOPs of a model, and the FLOP/s that run them."""

    layout: KVLayout
    active_params: int  # per token, decoder layers
    flops_per_s: float  # effective, over the tensor-parallel group

    def flops(self, start: int, end: int) -> float:
        """FLOPs to prefill positions start..end-1 after a cached prefix of ``start`` tokens."""
        shape = self.layout.shape
        per_pair = 2 * shape.heads * (shape.head_dim + shape.v_head_dim)
        pairs = sum(_pairs(end, w) - _pairs(start, w) for w in shape.window)
        return 2.0 * self.active_params * (end - start) + per_pair * pairs

    def seconds(self, start: int, end: int) -> float:
        return self.flops(start, end) / self.flops_per_s


@dataclass(frozen=True)
class Tier:
    """The external KV tier as the reload sees it."""

    bandwidth: float  # B/s
    latency: float  # s per chunk read
    chunk_tokens: int
    in_flight: int

    def reload_seconds(self, layout: KVLayout, tokens: int) -> float:
        chunks = math.ceil(tokens / self.chunk_tokens)
        return chunks * self.latency / self.in_flight + layout.request(tokens) / self.bandwidth


def break_even(compute: Compute, tier: Tier, max_tokens: int) -> int | None:
    """The shortest context from which on reloading beats recomputing (1: at every length),
    or None when recomputing wins up to ``max_tokens``. Recomputing grows faster than linearly
    and reloading linearly, so the first length where reloading wins is found by bisection."""

    def reload_wins(tokens: int) -> bool:
        return tier.reload_seconds(compute.layout, tokens) < compute.seconds(0, tokens)

    if not reload_wins(max_tokens):
        return None
    low, high = 0, max_tokens  # reload loses at low (or low is 0), wins at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reload_wins(middle) else (middle, high)
    return high


@dataclass(frozen=True)
class TTFT:
    """Time to first token of a returning request: its context cached or not."""

    recompute: float  # the whole prompt prefilled
    reload: float  # the context reloaded from the external tier
    suffix: float  # the new tokens after a cached context
    gpu_resident: float  # share of contexts still in GPU memory
    hit_rate: float  # share of the others the external tier holds

    @property
    def without_offload(self) -> float:
        g = self.gpu_resident
        return g * self.suffix + (1 - g) * self.recompute

    @property
    def with_offload(self) -> float:
        g, h = self.gpu_resident, self.hit_rate
        missed = h * (self.reload + self.suffix) + (1 - h) * self.recompute
        return g * self.suffix + (1 - g) * missed


def ttft(
    compute: Compute,
    tier: Tier,
    *,
    context: int,
    new: int,
    gpu_resident: float,
    hit_rate: float,
) -> TTFT:
    """The :class:`TTFT` of a request with ``context`` cached-or-not tokens and ``new`` ones."""
    return TTFT(
        recompute=compute.seconds(0, context + new),
        reload=tier.reload_seconds(compute.layout, context),
        suffix=compute.seconds(context, context + new),
        gpu_resident=gpu_resident,
        hit_rate=hit_rate,
    )


def burst(seconds: float, requests: int) -> float:
    """Mean TTFT of ``requests`` equal prefills arriving at once, served one after another:
    the k-th finishes at k x seconds, so the mean is (requests + 1) / 2 x seconds."""
    return (requests + 1) / 2 * seconds
