"""Synthetic checkpoints: Llama-style names and shapes scaled to a size, sharded, with an index.

Weights are bfloat16 and norms float32, as in published checkpoints. Values are cheap
pseudo-random numbers: one seeded pool of normal values, repeated at a different rotation for
every tensor, so gigabytes are written at memory speed and the same seed gives the same bytes.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import LoaderError
from .files import INDEX_NAME

if TYPE_CHECKING:
    import torch

POOL_ELEMENTS = 1 << 22
SHARD_TARGET = 1_500_000_000

#: (hidden size, vocabulary) from large to small; the first whose embeddings fit is used.
LADDER = [(8192, 128256), (4096, 128256), (2048, 32000), (1024, 32000), (512, 32000),
          (256, 8192), (128, 4096), (64, 1024)]  # fmt: skip


@dataclass(frozen=True)
class Spec:
    """One tensor to generate."""

    name: str
    shape: tuple[int, ...]
    float32: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * (4 if self.float32 else 2)


def _layer(i: int, hidden: int, kv: int, inter: int) -> list[Spec]:
    p = f"model.layers.{i}."
    return [
        Spec(p + "input_layernorm.weight", (hidden,), float32=True),
        Spec(p + "self_attn.q_proj.weight", (hidden, hidden)),
        Spec(p + "self_attn.k_proj.weight", (kv, hidden)),
        Spec(p + "self_attn.v_proj.weight", (kv, hidden)),
        Spec(p + "self_attn.o_proj.weight", (hidden, hidden)),
        Spec(p + "post_attention_layernorm.weight", (hidden,), float32=True),
        Spec(p + "mlp.gate_proj.weight", (inter, hidden)),
        Spec(p + "mlp.up_proj.weight", (inter, hidden)),
        Spec(p + "mlp.down_proj.weight", (hidden, inter)),
    ]


def llama_layout(size_bytes: int) -> list[Spec]:
    """Llama-style tensors adding up to about ``size_bytes`` (at least one layer)."""
    for hidden, vocab in LADDER:
        if 2 * vocab * hidden * 2 <= size_bytes // 2:
            break
    kv = max(hidden // 4, 64)
    inter = math.ceil(hidden * 8 / 3 / 256) * 256
    per_layer = sum(s.nbytes for s in _layer(0, hidden, kv, inter))
    layers = max(1, round((size_bytes - 2 * vocab * hidden * 2) / per_layer))
    specs = [Spec("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        specs += _layer(i, hidden, kv, inter)
    specs.append(Spec("model.norm.weight", (hidden,), float32=True))
    specs.append(Spec("lm_head.weight", (vocab, hidden)))
    return specs


def _split(specs: list[Spec], shards: int) -> list[list[Spec]]:
    """Consecutive groups of about equal bytes (never an empty group)."""
    shards = max(1, min(shards, len(specs)))
    target = sum(s.nbytes for s in specs) / shards
    groups: list[list[Spec]] = [[]]
    filled = 0
    for i, spec in enumerate(specs):
        left = len(specs) - i
        behind = filled >= target * len(groups) or left <= shards - len(groups)
        if groups[-1] and len(groups) < shards and behind:
            groups.append([])
        groups[-1].append(spec)
        filled += spec.nbytes
    return groups


def _fill(pool: torch.Tensor, spec: Spec, rotation: int) -> torch.Tensor:
    import torch

    n = math.prod(spec.shape)
    rotated = torch.cat([pool[rotation:], pool[:rotation]])
    flat = rotated.repeat(math.ceil(n / pool.numel()))[:n] if n else rotated[:0]
    if spec.float32:
        return (1.0 + flat.float()).reshape(spec.shape)
    return flat.reshape(spec.shape).clone()


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """``path`` whole or not at all: ``write`` fills a new temporary file beside it (made
    exclusively, so a link planted at some name is never followed), which then replaces it; on
    any failure or interrupt the temporary file goes and ``path`` is as it was."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        tmp.chmod(0o644)  # readable like any model directory (mkstemp makes it 0600)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def make_checkpoint(
    directory: str | os.PathLike,
    size_bytes: int,
    layout: str = "llama",
    shards: int | None = None,
    seed: int = 0,
) -> Path:
    """Write a sharded checkpoint of about ``size_bytes`` and its index; return the directory."""
    import torch
    from safetensors.torch import save_file

    if layout != "llama":
        raise LoaderError(f"unknown layout {layout!r} (known: llama)")
    if size_bytes <= 0:
        raise LoaderError(f"size must be positive, got {size_bytes}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specs = llama_layout(size_bytes)
    groups = _split(specs, shards or max(1, round(size_bytes / SHARD_TARGET)))
    generator = torch.Generator().manual_seed(seed)
    pool = (torch.randn(POOL_ELEMENTS, generator=generator) * 0.02).to(torch.bfloat16)
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, start=1):
        name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors = {
            s.name: _fill(pool, s, (number * 7919 + i * 104729) % POOL_ELEMENTS)
            for i, s in enumerate(group)
        }
        write_atomic(directory / name, partial(save_file, tensors, metadata={"format": "pt"}))
        weight_map.update(dict.fromkeys(tensors, name))
        del tensors
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": weight_map}
    text = json.dumps(index, indent=2) + "\n"
    write_atomic(directory / INDEX_NAME, lambda p: p.write_text(text))
    return directory
