"""``fxkit serve-probe``: a small real service that stands in for ``vllm serve`` where no GPU is.

It loads a checkpoint first, with fxkit's loader or with the baseline (``safetensors.torch.
load_file`` per file, one after another), and keeps the tensors in memory as a server keeps its
weights. Only then does it listen, so a readiness probe never sees the port before the weights are
in. It serves what a rollout checks, with uvicorn and starlette (vLLM's own server libraries):

- ``GET /health``: 200, empty (liveness);
- ``GET /v1/models``: vLLM's ``ModelList`` of one ``ModelCard`` (readiness), the fields of
  ``vllm/entrypoints/openai/engine/protocol.py`` at 0.20.1;
- ``GET /metrics``: Prometheus text: ``fxkit_load_seconds``, ``fxkit_load_bytes``,
  ``fxkit_load_tensors``, ``fxkit_load_end_time_seconds`` and ``fxkit_load_info{format=...}``,
  and vLLM's ``vllm:num_requests_running{model_name=...}`` (a gauge, vLLM's docs/source/design/
  v1/metrics.md): the requests being answered, which a rollout's drain waits on;
- ``POST /v1/completions``: an answer of vLLM's ``CompletionResponse`` shape (``id``,
  ``object: text_completion``, ``model``, ``choices[].text`` and ``finish_reason``, ``usage``),
  after ``PROBE_COMPLETION_SECONDS`` of its environment (default 0.05): the time a server
  decodes, during which the request counts as running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from fxkit.errors import FxkitError

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from fxkit.loader import Checkpoint, LoadOptions

LOAD_FORMATS = ("fxkit", "safetensors")
OWNED_BY = "fxkit"
#: The environment variable that says how long an answer takes (seconds).
COMPLETION_SECONDS = "PROBE_COMPLETION_SECONDS"


@dataclass(frozen=True)
class Loaded:
    """A checkpoint's tensors in memory, and how they got there."""

    model: str
    tensors: dict[str, Any]
    nbytes: int
    seconds: float
    load_format: str
    finished: float  # the Unix time the load ended

    def line(self) -> str:
        """The line logged after loading (parsed by the rollout's readiness check)."""
        return (
            f"fxkit serve-probe: loaded {len(self.tensors)} tensors, {self.nbytes} bytes in "
            f"{self.seconds:.3f} s ({self.load_format})"
        )


def _baseline(checkpoint: Checkpoint) -> Iterator[tuple[str, Any]]:
    from safetensors.torch import load_file

    for header in checkpoint.files:
        yield from load_file(header.path).items()


def load_weights(model: str, load_format: str, options: LoadOptions) -> Loaded:
    """Every tensor of ``model`` on the CPU, each page touched, as a copy to a GPU would read it.

    A missing or malformed model raises the loader's ``LoaderError`` before a byte is read. The
    imports are done before the clock starts (torch and safetensors take a second or more)."""
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401

    from fxkit.loader import iter_tensors, open_checkpoint, touch

    checkpoint = open_checkpoint(model)
    started = time.perf_counter()
    if load_format == "fxkit":
        stream = iter_tensors(checkpoint, "cpu", options=options)
    else:
        stream = _baseline(checkpoint)
    tensors = {}
    for name, tensor in stream:
        touch(tensor)
        tensors[name] = tensor
    seconds = time.perf_counter() - started
    nbytes = sum(t.nbytes for t in tensors.values())
    return Loaded(model, tensors, nbytes, seconds, load_format, time.time())


def model_list(name: str, root: str) -> dict[str, Any]:
    """``GET /v1/models``: vLLM's ``ModelList`` as ``show_available_models`` builds it (one card,
    one ``ModelPermission``; ``max_model_len`` unknown without a model config)."""
    now = int(time.time())
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": now,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": name,
        "object": "model",
        "created": now,
        "owned_by": OWNED_BY,
        "root": root,
        "parent": None,
        "max_model_len": None,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


def completion(name: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """``POST /v1/completions``' answer: vLLM's ``CompletionResponse`` fields, one choice whose
    text is ``max_tokens`` words (the prompt's first word, repeated)."""
    word = (prompt.split() or ["probe"])[0]
    prompt_tokens = len(prompt.split())
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [
            {"index": 0, "text": " ".join([word] * max_tokens), "logprobs": None,
             "finish_reason": "length", "stop_reason": None}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        },
    }  # fmt: skip


def make_app(loaded: Loaded, served_name: str) -> Starlette:
    """The service: its routes and a metrics registry of its own."""
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Gauge,
        Info,
        ProcessCollector,
        generate_latest,
    )
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    gauges = {
        "seconds": ("Seconds the weights took to load.", loaded.seconds),
        "bytes": ("Tensor bytes loaded.", loaded.nbytes),
        "tensors": ("Tensors loaded.", len(loaded.tensors)),
        "end_time_seconds": ("Unix time the load ended.", loaded.finished),
    }
    for name, (documentation, value) in gauges.items():
        Gauge(f"fxkit_load_{name}", documentation, registry=registry).set(value)
    info = Info("fxkit_load", "How the weights were loaded.", registry=registry)
    info.info({"format": loaded.load_format, "model": served_name})
    running = Gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        ["model_name"],
        registry=registry,
    ).labels(model_name=served_name)
    delay = float(os.environ.get(COMPLETION_SECONDS, "0.05"))

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse(model_list(served_name, loaded.model))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def completions(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            model, prompt = body["model"], str(body.get("prompt", ""))
            max_tokens = int(body.get("max_tokens", 16))
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": {"message": "bad request body"}}, status_code=400)
        if model != served_name:
            message = f"The model `{model}` does not exist."
            return JSONResponse({"error": {"message": message}}, status_code=404)
        running.inc()
        try:
            await asyncio.sleep(delay)
            return JSONResponse(completion(served_name, prompt, max(1, min(max_tokens, 64))))
        finally:
            running.dec()

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/metrics", metrics),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``host:port``, or a clear error."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise FxkitError(f"cannot listen on {host}:{port}: {exc}", hint="check --host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise FxkitError(
            f"cannot listen on {host}:{port}: {exc.strerror}",
            hint="choose a free --port (another instance may hold this one)",
        ) from None
    return sock


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM while loading (or once the server has shut down): a clean exit."""
    raise SystemExit(0)


def serve_probe(
    model: str, host: str, port: int, served_name: str, load_format: str, options: LoadOptions
) -> None:
    """Load ``model``, then serve until SIGTERM or SIGINT, its connections bounded
    (:mod:`fxkit.serve_probe_guard`)."""
    import uvicorn

    from fxkit.serve_probe_guard import ACCEPT_BATCH, GuardedConfig, max_connections

    signal.signal(signal.SIGTERM, _stop)
    loaded = load_weights(model, load_format, options)
    print(loaded.line(), file=sys.stderr, flush=True)
    sock = listen(host, port, ACCEPT_BATCH)
    print(
        f"fxkit serve-probe: serving {served_name!r} on {host}:{port}", file=sys.stderr, flush=True
    )
    config = GuardedConfig(
        make_app(loaded, served_name),
        max_connections=max_connections(),
        log_level="info",
        access_log=False,
        lifespan="off",
    )
    uvicorn.Server(config).run(sockets=[sock])
