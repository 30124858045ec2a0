"""fxkit.loader: a parallel safetensors loader; it imports nothing from fxkit's engine.

``load`` / ``iter_tensors`` read a model; ``open_checkpoint`` validates and describes it (a
``Checkpoint``) without reading tensor data; ``model_files`` lists the files a model path names,
as every load finds them (``ModelFiles``); ``make_checkpoint`` writes a synthetic one. For cold and
hot measurements, ``evict_all`` drops files from the page cache (mincore-verified) and ``warm``
reads them in. torch is imported on first use.

    from fxkit.loader import LoadOptions, load, iter_tensors, open_checkpoint
    tensors = load("/models/llama", threads=8, chunk_size=32 << 20)   # {name: CPU tensor}
    tensors = load("/models/llama", options=LoadOptions(threads=16))  # the same, as one value
    for name, tensor in iter_tensors("/models/llama", device="cuda:0"):  # streamed, in file order
        ...

In vLLM (the ``vllm.general_plugins`` entry point registers the load format)::

    vllm serve MODEL --load-format fxkit --model-loader-extra-config '{"threads": 16}'

These names (``__all__``) are the loader's interface: fxkit itself (its CLI, ``fxkit bench load``
in :mod:`fxkit.loadbench`) calls nothing else (tests/test_loader_public.py).
"""

from __future__ import annotations

from typing import Any

from .errors import LoaderError

__all__ = [
    "Checkpoint",
    "LoadOptions",
    "LoaderError",
    "ModelFiles",
    "evict_all",
    "iter_tensors",
    "load",
    "make_checkpoint",
    "model_files",
    "open_checkpoint",
    "touch",
    "warm",
]

_LAZY = {
    "LoadOptions": "fxkit.loader.options",
    "load": "fxkit.loader.api",
    "iter_tensors": "fxkit.loader.api",
    "open_checkpoint": "fxkit.loader.format",
    "make_checkpoint": "fxkit.loader.checkpoint",
    "Checkpoint": "fxkit.loader.format",
    "model_files": "fxkit.loader.files",
    "ModelFiles": "fxkit.loader.files",
    "evict_all": "fxkit.loader.cache",
    "warm": "fxkit.loader.cache",
    "touch": "fxkit.loader.cache",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fxkit.loader' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
