"""Requests served as vLLM schedules them: chunked prefill under a token budget per step, and
KV reloads that overlap the GPU's compute (docs/ESTIMATOR.md, "Serving several requests").

``requests`` equal requests arrive at once. Each step of the engine the scheduler gives every
request that has finished its prefill one decode token, then fills the rest of the step's token
budget (vLLM's ``--max-num-batched-tokens``) with prefill chunks, first come first served; a step
takes its FLOPs over the effective FLOP/s. With offload, each request's context is read from the
tier before its prefill may start (LMCache's load, the request waiting for its KV) and the reads
are all issued at arrival: they queue at the tier, which serves them one after another at its
shared bandwidth, while the GPU computes the requests whose context is in. A request's first
token comes at the end of the step that runs its last prefill chunk.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from fxkit.estimate.offload import Compute


@dataclass(frozen=True)
class Served:
    """The time to first token of each request, in order of arrival."""

    ttft: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.ttft)

    @property
    def median(self) -> float:
        return statistics.median(self.ttft)


def reloads_ready(
    requests: int, nbytes: float, chunks: int, bandwidth: float, latency: float, in_flight: int
) -> list[float]:
    """When each request's context is in: the reads queue at the tier, served in arrival order,
    each its chunks' latency (``in_flight`` at a time) plus its bytes at the shared bandwidth."""
    one = chunks * latency / in_flight + nbytes / bandwidth
    return [one * (k + 1) for k in range(requests)]


def serve(
    compute: Compute,
    *,
    requests: int,
    cached: int,
    prompt: int,
    budget: int,
    ready: list[float] | None = None,
) -> Served:
    """Serve ``requests`` prompts of ``prompt`` tokens, the first ``cached`` of each already in
    (reloaded: ``ready`` says when; None: nothing cached, all recomputed)."""
    if budget < 1 or requests < 1:
        raise ValueError("the token budget and the requests must be at least 1")
    ready = ready or [0.0] * requests
    done = [cached] * requests  # tokens of each prompt in the cache
    first: list[float | None] = [None] * requests
    now = 0.0
    while any(t is None for t in first):
        flops, left = 0.0, budget
        for k in range(requests):  # decodes first: one token each
            if first[k] is not None and left:
                flops += compute.flops(prompt, prompt + 1)
                left -= 1
        finishing = []
        for k in range(requests):  # then prefill chunks, first come first served
            if first[k] is not None or ready[k] > now or not left:
                continue
            take = min(left, prompt - done[k])
            flops += compute.flops(done[k], done[k] + take)
            done[k] += take
            left -= take
            if done[k] == prompt:
                finishing.append(k)
        if flops == 0.0:  # nothing to run: wait for the next context to come in
            now = min(r for k, r in enumerate(ready) if first[k] is None and r > now)
            continue
        now += flops / compute.flops_per_s
        for k in finishing:
            first[k] = now
    return Served(tuple(t for t in first if t is not None))
