"""KV-cache sizes: per token, per request at a context length, for a concurrency, and what fits
in GPU memory beside the weights at a tensor-parallel layout.

Per layer and token a GQA layer keeps K and V for its KV heads (``2 x kv_heads x head_dim``
values); an MLA layer keeps one compressed latent and the rotary key (``kv_lora_rank +
qk_rope_head_dim`` values). With tensor parallelism every rank keeps ``ceil(kv_heads / tp)``
heads (heads are replicated when ``tp > kv_heads``) and MLA's latent is replicated on every rank,
as vLLM lays them out. A sliding layer keeps at most its window of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxkit.estimate.model import ModelShape


@dataclass(frozen=True)
class KVLayout:
    """The KV cache of one model at one tensor-parallel size, in bytes."""

    shape: ModelShape
    tp: int
    kv_bytes: float  # per cached value (2 for bf16, 1 for fp8)

    @property
    def per_token_layer(self) -> float:
        """Bytes per token and layer, summed over the ``tp`` ranks."""
        if self.shape.mla:
            values = self.tp * (self.shape.mla.kv_lora_rank + self.shape.mla.qk_rope_head_dim)
        else:
            heads = self.tp * math.ceil(self.shape.kv_heads / self.tp)
            values = 2 * heads * self.shape.head_dim
        return values * self.kv_bytes

    @property
    def per_token(self) -> float:
        """Bytes per token over all layers, as if no layer slid (the most a token costs)."""
        return self.shape.layers * self.per_token_layer

    def request(self, tokens: int) -> float:
        """Bytes of one request's cache at ``tokens`` of context (sliding layers capped)."""
        kept = sum(tokens if w is None else min(tokens, w) for w in self.shape.window)
        return kept * self.per_token_layer


@dataclass(frozen=True)
class Capacity:
    """GPU memory left for the KV cache, and what it holds of a workload."""

    weights_per_gpu: float
    kv_per_gpu: float  # may be negative: the weights do not fit
    kv_total: float  # over the tp GPUs
    request: float  # one request's cache
    contexts_fit: int  # whole requests the KV memory holds at once
    concurrency: int
    stored_contexts: int  # contexts kept for reuse (the working set)
    external_needed: float  # bytes of the working set beyond GPU memory

    @property
    def demand(self) -> float:
        """Bytes of the concurrent requests' caches."""
        return self.concurrency * self.request

    @property
    def overflow(self) -> float:
        """Bytes of the concurrent requests' caches GPU memory cannot hold at once."""
        return max(0.0, self.demand - self.kv_total)

    @property
    def needs_external(self) -> bool:
        return self.external_needed > 0

    @property
    def gpu_resident(self) -> float:
        """The share of the working set GPU memory holds (0..1)."""
        return min(1.0, self.contexts_fit / self.stored_contexts) if self.stored_contexts else 1.0


def capacity(
    layout: KVLayout,
    weight_bytes: float,
    *,
    gpu_memory: float,
    utilization: float,
    reserve: float,
    context_tokens: int,
    concurrency: int,
    stored_contexts: int,
) -> Capacity:
    """What fits: per GPU ``gpu_memory x utilization - weights / tp - reserve`` for the cache."""
    weights_per_gpu = weight_bytes / layout.tp
    kv_per_gpu = gpu_memory * utilization - weights_per_gpu - reserve
    kv_total = max(0.0, kv_per_gpu) * layout.tp
    request = layout.request(context_tokens)
    fit = int(kv_total // request) if request else 0
    return Capacity(
        weights_per_gpu=weights_per_gpu,
        kv_per_gpu=kv_per_gpu,
        kv_total=kv_total,
        request=request,
        contexts_fit=fit,
        concurrency=concurrency,
        stored_contexts=stored_contexts,
        external_needed=max(0.0, stored_contexts * request - kv_total),
    )
