"""fxkit.loader: a parallel safetensors loader; it imports nothing from fxkit's engine.

``load`` / ``iter_tensors`` read a model; ``open_checkpoint`` validates and describes it without
reading tensor data; ``make_checkpoint`` writes a synthetic one. torch is imported on first use.

    from . import LoadOptions, load, iter_tensors, open_checkpoint
    tensors = load("/models/llama", threads=8, chunk_size=32 << 20)   # {name: CPU tensor}
    tensors = load("/models/llama", options=LoadOptions(threads=16))  # the same, as one value
    for name, tensor in iter_tensors("/models/llama", device="cuda:0"):  # streamed, in file order
        ...

In vLLM (the ``vllm.general_plugins`` entry point registers the load format)::

    vllm serve MODEL --load-format fxkit --model-loader-extra-config '{"threads": 16}'
"""

from __future__ import annotations

from typing import Any

from .errors import LoaderError

__all__ = [
    "LoadOptions",
    "LoaderError",
    "iter_tensors",
    "load",
    "make_checkpoint",
    "open_checkpoint",
]

_LAZY = {
    "LoadOptions": "fxkit.loader.options",
    "load": "fxkit.loader.api",
    "iter_tensors": "fxkit.loader.api",
    "open_checkpoint": "fxkit.loader.format",
    "make_checkpoint": "fxkit.loader.checkpoint",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fxkit.loader' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
