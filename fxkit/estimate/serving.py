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

import functools
import math
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
    (reloaded: ``ready`` says when; None: nothing cached, all recomputed). Requests are served in
    arrival order, so the steps are taken a request at a time: the head request's prefill takes
    ``ceil(left / (budget - decodes))`` steps, each also running one decode token of every
    request before it (at most ``budget - 1``: a step always prefills), and the spare tokens
    of its last step go to the requests after it that are ready."""
    if budget < 1 or requests < 1:
        raise ValueError("the token budget and the requests must be at least 1")
    ready = ready or [0.0] * requests
    flops = functools.cache(compute.flops)
    decode = flops(prompt, prompt + 1)
    first: list[float] = []
    now, head = 0.0, cached  # head: tokens in of the first request not yet finished
    while len(first) < requests:
        k = len(first)
        now = max(now, ready[k])
        decodes = min(k, budget - 1)
        per_step = budget - decodes
        steps = math.ceil((prompt - head) / per_step)
        work = flops(head, prompt) + steps * decodes * decode
        spare, finished, head = steps * per_step - (prompt - head), 1, cached
        while spare and k + finished < requests and ready[k + finished] <= now:
            take = min(spare, prompt - head)
            work += flops(head, head + take)
            spare, head = spare - take, head + take
            if head < prompt:
                break
            finished, head = finished + 1, cached
        now += work / compute.flops_per_s
        first += [now] * finished
    return Served(tuple(first))
